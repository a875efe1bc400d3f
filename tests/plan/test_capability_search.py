"""`lmspec plan` searches only layouts its target runs (compiler/capabilities.py), and prints
overrides that `lmspec check` accepts as they are, deepspeed's train.transformer_impl=local included."""

from __future__ import annotations

import shlex
from collections.abc import Callable

import numpy as np
from helpers.cli import CliResult
from helpers.specs import spec_of

from lmspec.compiler.search.legality import BACKENDS, RECOMPUTE
from lmspec.compiler.search.space import default_axes, enumerate_legal

Lmspec = Callable[..., CliResult]
LLAMA_32K = ["model=llama3_8b", "hardware=h100_80g", "train.seq_length=32768", "train.global_batch_size=64"]


def _legal(*overrides: str, backends: tuple[str, ...] = BACKENDS):
    spec = spec_of(*overrides)
    return enumerate_legal(spec, default_axes(spec, [2], backends))


def test_context_parallel_only_where_transformer_engine_runs_it() -> None:
    te = _legal(*LLAMA_32K, backends=("megatron",)).legal
    local = _legal(*LLAMA_32K, "train.transformer_impl=local", "train.flash_attention=false", backends=("megatron",))
    assert te.size and np.any(te.cp > 1)
    assert local.legal.size and not np.any(local.legal.cp > 1)
    # local attention is unfused (flash_attention=false), and ring attention needs flash attention
    assert local.rejected["layout.cp_needs_flash_attention"] > 0


def test_deepspeed_candidates_are_data_parallel_without_selective_recompute() -> None:
    found = _legal(*LLAMA_32K, backends=("deepspeed",))
    c = found.legal
    assert c.size and np.all(c.backend == BACKENDS.index("deepspeed"))
    assert not np.any((c.tp > 1) | (c.pp > 1) | (c.cp > 1) | (c.ep > 1) | c.sequence_parallel)
    assert not np.any(c.recompute == RECOMPUTE.index("selective"))
    assert sum(found.rejected.values()) + c.size == found.raw_size


def test_cpu_search_finds_no_mixed_precision_megatron() -> None:
    """On the cpu hardware megatron-core trains fp32 only: a bf16 job leaves deepspeed and torchtitan
    candidates (transformers' modeling code on CPU, in bf16), both of them."""
    c = _legal("train.precision=bf16").legal
    assert c.size and set(c.backend.tolist()) == {BACKENDS.index("deepspeed"), BACKENDS.index("torchtitan")}


def test_deepspeed_winner_says_local_and_check_accepts_it(lmspec: Lmspec) -> None:
    result = lmspec("plan", "model=llama3_8b", "hardware=h100_80g", "hardware.nodes=2", "--backend", "deepspeed")
    assert result.code == 0, result.err
    winner = next(line for line in result.out.splitlines() if line.startswith("winner: lmspec compile "))
    args = shlex.split(winner.removeprefix("winner: lmspec compile "))
    assert "train.backend=deepspeed" in args and "train.transformer_impl=local" in args
    checked = lmspec("check", *args)
    assert checked.code == 0, checked.err
