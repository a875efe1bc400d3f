"""Every layout `lmspec check` accepts trains, and its losses equal the single-rank reference (issue 17).

CI runs helpers.parity_sweep.SAMPLE, one layout per feature, in one torchrun per world size (and
one layout through `lmspec run`, the path a user takes, which must give the same losses);
`pytest -m parity_full tests/parity` runs every layout the validator accepts for tiny and tiny_moe
on 2 and 4 CPU ranks (helpers.parity_layouts). The data-parallel slicing every layout relies on
(DP ranks take disjoint slices of one global batch) is tests/runtime/test_data.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.cli import LMSPEC, CliResult
from helpers.parity_layouts import MODELS, WORLDS, enumerate_layouts
from helpers.parity_sweep import RELATIVE_TOLERANCE, SAMPLE, Outcome, run_sweep, table

from lmspec.compiler.backends import BACKENDS
from lmspec.compiler.capabilities import requested_features
from lmspec.compiler.pipeline import make_plan

Rows = list[tuple[Outcome, float | None]]
# What the fixed sample must cover (helpers.parity_sweep.SAMPLE), by the capability table's names.
SAMPLE_FEATURES = {
    "tensor_parallel",
    "sequence_parallel",
    "pipeline_parallel",
    "interleaved_pipeline",
    "expert_parallel",
    "mtp",
    "recompute_selective",
    "recompute_full",
    "zero_2",
    "zero_3",
    "offload_optimizer",
    "init_from",
}


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Rows]:
    root = tmp_path_factory.mktemp("parity")
    return root, run_sweep(root, SAMPLE)


def _failures(rows: Rows) -> list[str]:
    return [o.layout.name for o, dev in rows if dev is None or dev > RELATIVE_TOLERANCE]


def test_the_sample_is_accepted_by_check_and_covers_every_feature(lmspec: Callable[..., CliResult]) -> None:
    covered: set[str] = {"init_from"}  # every megatron layout starts from its seed's checkpoint
    for layout in SAMPLE:
        result = lmspec("check", *layout.overrides())
        assert result.code == 0, f"{layout.name}: {result.err}"
        covered.update(requested_features(make_plan(layout.overrides()).spec))
    assert SAMPLE_FEATURES <= covered, SAMPLE_FEATURES - covered
    assert {lay.backend for lay in SAMPLE} == set(BACKENDS)  # every backend trains in the sample
    assert {lay.world for lay in SAMPLE} == set(WORLDS)


@pytest.mark.slow
def test_each_sample_layout_equals_the_single_rank_reference(sample: tuple[Path, Rows]) -> None:
    _, rows = sample
    assert not _failures(rows), table(rows)
    assert all(len(o.losses) == o.layout.steps for o, _ in rows)


@pytest.mark.slow
def test_lmspec_run_trains_a_sample_build_to_the_workers_losses(sample: tuple[Path, Rows], tmp_path: Path) -> None:
    """The sweep's worker runs many builds per torchrun; the user's path (`lmspec run`, the emitted
    launch/torchrun.sh, one process group per build) must give the very same losses."""
    root, rows = sample
    outcome = rows[0][0]
    assert outcome.layout.backend == "megatron" and outcome.layout.init_from is not None
    result = subprocess.run(
        [LMSPEC, "run", str(root / "builds" / outcome.layout.name), "--stage", "train"],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "runs" / outcome.layout.name / "metrics.jsonl").open()]
    assert [m["loss"] for m in metrics if "loss" in m] == outcome.losses


@pytest.mark.parity_full
def test_every_layout_check_accepts_equals_the_single_rank_reference(tmp_path: Path) -> None:
    layouts = []
    for model in MODELS:
        for world in WORLDS:
            found = enumerate_layouts(model, world)
            assert found.accepted, f"{model} on {world} ranks: check accepted no layout"
            layouts += found.accepted
    rows = run_sweep(tmp_path, layouts)
    assert not _failures(rows), table(rows)
