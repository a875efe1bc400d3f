"""A run saved at one layout resumes at another (megatron-core 0.16.1 dist_checkpointing resharding the model
and the optimizer; on the torchtitan backend DCP resharding FSDP2's DTensors; CPU fp32, gloo), and a layout it
cannot reshard to is refused before anything loads.

Each case trains 4 steps at layout A, checkpointing at step 2 and 4; the resumed run starts from A's step_2 at
layout B with the same global batch and continues to step 4. Losses 3 and 4 must match A's.

Tolerance: FP32_ABS = 1e-4 on losses of ~5.2 (as tests/runtime/test_megatron_parallel.py's TP2 -> TP1 resume).
The state loaded is the same (weights and Adam moments resharded, not recomputed); what differs is the order
of fp32 reductions (TP all-reduces, the pipeline's micro-batch order, the DP gradient all-reduce), so the
losses drift by rounding only: measured 1.2e-7 at step 3 and 4.4e-6 at step 4 for TP2 EP2 -> TP1 PP2 EP2,
and TP2 EP2 DP1 -> TP1 EP2 DP2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.torchrun import Run, run

from lmspec.compiler.build.reader import Build
from lmspec.compiler.resume_layout import saved_with

pytestmark = pytest.mark.slow

FP32_ABS = 1e-4
MOE = "tiny_moe_pretrain_2rank_cpu_fp32"
COMMON = [
    "train.steps=4",
    "train.checkpoint.interval=2",
    "train.log_interval=1",
    "train.eval_interval=100",
    "serve=null",
]
ON_4 = ["hardware.gpus_per_node=4"]  # PP2 beside EP2 needs 4 ranks: ep x etp divides dp x tp x cp per stage


def _train(root: Path, name: str, overrides: list[str], spec: str | None, nproc: int = 2) -> tuple[Path, Run]:
    build = compile_build(root / "build", [f"name={name}", *overrides, *COMMON], spec).dir
    return build, run(build, root, nproc=nproc)


def _saved(root: Path, name: str) -> tuple[Path, Run]:
    """A's run (4 steps) in `root`, whose checkpoints a resumed run reads from step_2."""
    build, result = _train(root, name, *_A[name])
    assert result.code == 0, result.output[-4000:]
    return build, result


def _resume_at_step_2(
    source: Run, name: str, tmp_path: Path, overrides: list[str], spec: str | None, nproc: int
) -> Run:
    """Layout B from a copy of the source's checkpoints rolled back to step_2."""
    ckpt = tmp_path / "runs" / "source" / "checkpoints"
    shutil.copytree(source.cwd / "runs" / _name(source) / "checkpoints", ckpt)
    shutil.rmtree(ckpt / "step_4")
    (ckpt / "latest").write_text("step_2\n")
    _, result = _train(tmp_path, name, [*overrides, "train.checkpoint.dir=runs/source/checkpoints"], spec, nproc)
    return result


def _name(source: Run) -> str:
    """The source run's name: its run directory is the only one in its working directory."""
    (run_dir,) = (source.cwd / "runs").iterdir()
    return run_dir.name


_A = {
    "tp2_ep2": (["parallel.tp=2", "parallel.ep=2", "parallel.sequence_parallel=true", *ON_4], MOE, 4),
    "dp2": ([], None, 2),
    "fsdp_dp2": (["train.backend=torchtitan", "parallel.zero_stage=3"], None, 2),
}


@pytest.fixture(scope="module")
def tp2_ep2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """tiny_moe at TP2 EP2 DP2 on 4 ranks (sequence parallel, as MoE under TP needs)."""
    return _saved(tmp_path_factory.mktemp("tp2_ep2"), "tp2_ep2")


@pytest.fixture(scope="module")
def dp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """The default tiny dense job at DP2 on 2 ranks."""
    return _saved(tmp_path_factory.mktemp("dp2"), "dp2")


@pytest.fixture(scope="module")
def fsdp_dp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """The tiny dense job on torchtitan, fully sharded over 2 ranks."""
    return _saved(tmp_path_factory.mktemp("fsdp_dp2"), "fsdp_dp2")


def _assert_continues(source: Run, resumed: Run, name: str) -> None:
    assert resumed.code == 0, resumed.output[-4000:]
    assert "resumed from runs/source/checkpoints/step_2 (step 2)" in resumed.output
    before, after = source.losses(_name(source)), resumed.losses(name)
    assert sorted(after) == [3, 4]
    for step in (3, 4):
        assert after[step] == pytest.approx(before[step], abs=FP32_ABS), (step, after[step] - before[step])


def test_manifest_records_what_wrote_it(tp2_ep2: tuple[Path, Run]) -> None:
    build, source = tp2_ep2
    manifest = json.loads((source.cwd / "runs" / "tp2_ep2" / "checkpoints" / "step_2" / "manifest.json").read_text())
    opened = Build.open(build)
    assert manifest["saved_with"] == saved_with(opened.training(), opened.plan)


def test_tp2_ep2_resumes_at_tp1_pp2(tp2_ep2: tuple[Path, Run], tmp_path: Path) -> None:
    _, source = tp2_ep2
    resumed = _resume_at_step_2(source, "tp1_pp2", tmp_path, ["parallel.pp=2", "parallel.ep=2", *ON_4], MOE, 4)
    assert "pipeline stage 1/2: 2 layers" in resumed.output
    _assert_continues(source, resumed, "tp1_pp2")


def test_dp2_resumes_on_one_rank(dp2: tuple[Path, Run], tmp_path: Path) -> None:
    """The cluster shrinks: DP2 on 2 ranks -> DP1 on 1, the same global batch in twice the micro-batches."""
    _, source = dp2
    resumed = _resume_at_step_2(source, "dp1", tmp_path, ["hardware.gpus_per_node=1"], None, 1)
    _assert_continues(source, resumed, "dp1")


def test_ep2_to_ep1_is_refused_before_loading(tp2_ep2: tuple[Path, Run], tmp_path: Path) -> None:
    """megatron-core cannot map an EP>1 optimizer state onto EP=1 (lmspec.compiler.resume_layout): the run stops
    with the reason and the fix instead of a KeyError deep in dist_checkpointing."""
    _, source = tp2_ep2
    refused = _resume_at_step_2(source, "ep1", tmp_path, ["parallel.pp=2", "parallel.ep=1", *ON_4], MOE, 4)
    assert refused.code != 0  # torchrun reports the workers' exit 1
    assert "lmspec: error: cannot resume from runs/source/checkpoints/step_2" in refused.output
    assert "parallel.ep is 1 here" in refused.output and "train.init_from=" in refused.output
    assert "KeyError" not in refused.output and "[rank0]: Traceback" not in refused.output


def test_fsdp2_resumes_on_four_ranks_at_another_stage(fsdp_dp2: tuple[Path, Run], tmp_path: Path) -> None:
    """torchtitan's DCP save of 2-way shards loads as 4-way SHARD_GRAD_OP shards (the same global batch)."""
    _, source = fsdp_dp2
    layout = ["train.backend=torchtitan", "parallel.zero_stage=2", *ON_4]
    resumed = _resume_at_step_2(source, "fsdp_dp4", tmp_path, layout, None, 4)
    _assert_continues(source, resumed, "fsdp_dp4")
