"""`lmspec plan` searches parallel.overlap.moe_a2a (MoE models only) and uneven model chunks: only where the
rules accept them, with the rejection counts still adding up to the raw space, and the winner's command and
--write file carry the overlap."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml
from helpers.cli import CliResult
from helpers.specs import spec_of

from lmspec.compiler.search.legality import BACKENDS, RECOMPUTE
from lmspec.compiler.search.space import default_axes, enumerate_legal
from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.typed import from_dict

Lmspec = Callable[..., CliResult]
MIXTRAL = ["model=mixtral_8x7b", "hardware=h100_80g", "train.global_batch_size=96"]
DEEPSEEK = "specs/deepseek_v3_pretrain_2048gpu_h800_bf16.yaml"


def test_a_dense_model_does_not_search_the_overlap() -> None:
    spec = spec_of("model=llama3_8b", "hardware=h100_80g")
    axes = default_axes(spec, [2], BACKENDS)
    assert axes.moe_a2a == (False,)
    others = (axes.nodes, axes.tp, axes.pp, axes.cp, axes.ep, axes.micro_batch_size, axes.virtual_stages)
    tail = (axes.shardings, axes.sequence_parallel, axes.recompute)
    assert axes.raw_size == math.prod(len(v) for v in (*others, *tail))
    found = enumerate_legal(spec, axes)
    assert not found.legal.moe_a2a.any()


def test_the_overlap_is_searched_where_its_rules_allow_it() -> None:
    spec = spec_of(*MIXTRAL)
    axes = default_axes(spec, [4], BACKENDS)
    assert axes.moe_a2a == (False, True)
    found = enumerate_legal(spec, axes)
    c = found.legal
    on = c.moe_a2a.astype(bool)
    assert on.any() and (~on).any()
    # rules/overlap.py: ep > 1, no full recompute, virtual stages on a pipeline; the capability table: megatron
    assert np.all(c.ep[on] > 1) and not np.any(c.recompute[on] == RECOMPUTE.index("full"))
    assert np.all((c.pp[on] == 1) | (c.virtual_stages[on] > 1))
    assert np.all(c.backend[on] == BACKENDS.index("megatron"))
    assert found.rejected["overlap.moe_a2a_needs_its_layout"] > 0
    assert sum(found.rejected.values()) + c.size == found.raw_size


def test_settings_megatron_refuses_beside_the_overlap_leave_it_unsearched() -> None:
    for setting, rule in (
        ("train.moe.dispatcher=allgather", "moe_settings.a2a_overlap_has_an_all_to_all"),
        ("train.moe.shared_expert_overlap=true", "moe_settings.shared_expert_overlap_has_its_layout"),
    ):
        spec = spec_of("model=deepseek_v2_lite", "hardware=h100_80g", "train.global_batch_size=64", setting)
        found = enumerate_legal(spec, default_axes(spec, [2], BACKENDS))
        assert found.legal.size and not found.legal.moe_a2a.any(), setting
        assert found.rejected[rule] > 0, setting
        assert sum(found.rejected.values()) + found.legal.size == found.raw_size


def test_cpu_ranks_never_overlap() -> None:
    spec = spec_of("model=tiny_moe", "hardware=cpu")
    found = enumerate_legal(spec, default_axes(spec, [1], BACKENDS))
    assert found.legal.size and not found.legal.moe_a2a.any()


def test_61_layers_interleave_in_uneven_chunks() -> None:
    """DeepSeek-V3 on PP16 (stages of 3 and 4 layers): 2 to 4 chunks per rank, with the overlap; 5 would leave
    every stage an empty chunk (a warning the search drops)."""
    spec = from_dict(Spec, compose_spec(["train.global_batch_size=16384"], Path(DEEPSEEK)).spec)
    found = enumerate_legal(spec, default_axes(spec, [256], ("megatron",)))
    c = found.legal
    ours = (c.pp == 16) & (c.tp == 1) & (c.cp == 1) & (c.ep == 64) & (c.micro_batch_size == 1)
    assert set(np.unique(c.virtual_stages[ours]).tolist()) == {1, 2, 3, 4}
    assert np.any(ours & (c.virtual_stages == 3) & c.moe_a2a.astype(bool))
    assert found.rejected["layout.virtual_stages_have_layers"] > 0


def test_the_winner_and_its_written_spec_carry_the_overlap(lmspec: Lmspec, tmp_path: Path) -> None:
    written = tmp_path / "deepseek_planned.yaml"
    result = lmspec("plan", "--spec", DEEPSEEK, "hardware.nodes=128", "--top", "1", "--write", str(written))
    assert result.code == 0, result.err
    winner = next(line for line in result.out.splitlines() if line.startswith("winner: lmspec compile "))
    assert "parallel.overlap.moe_a2a=true" in winner.split()
    assert yaml.safe_load(written.read_text())["parallel"]["overlap"]["moe_a2a"] is True
    assert lmspec("check", "--spec", str(written)).code == 0
