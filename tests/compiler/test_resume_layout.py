"""Whether a spec can resume from a checkpoint written at another layout (lmspec.compiler.resume_layout), and
`lmspec check --resume-from DIR` on manifests written by hand. The runs that prove each allowed change
loads are tests/runtime/test_resume_layout.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from helpers.cli import CliResult

from lmspec.compiler.build.files import STEP_MANIFEST, TRAINER_STATE
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan
from lmspec.compiler.resume_layout import DISTRIB_OPTIM_SHARDING, FORMAT, resume_problems, saved_with

MOE = "tiny_moe_pretrain_2rank_cpu_fp32"
TP2_EP2 = ("parallel.tp=2", "parallel.ep=2", "parallel.sequence_parallel=true")
ON_4 = ("hardware.gpus_per_node=4",)
DEEPSPEED = ("train.backend=deepspeed",)


@cache
def _plan(spec: str | None, overrides: tuple[str, ...]) -> Plan:
    return make_plan([*overrides, "serve=null"], Path(spec) if spec else None)


def _record(spec: str | None, *overrides: str) -> dict:
    plan = _plan(spec, overrides)
    return saved_with(plan.trained().spec, plan)


def _problems(saved: dict | None, spec: str | None, *overrides: str) -> list[str]:
    plan = _plan(spec, overrides)
    return resume_problems(plan.trained().spec, plan, saved)


def test_saved_with_records_backend_layout_sharding_and_model() -> None:
    record = _record(MOE, *TP2_EP2)
    assert record["format"] == FORMAT and record["backend"] == "megatron"
    assert record["layout"] == {
        "world_size": 2,
        "tp": 2,
        "pp": 1,
        "dp": 1,
        "cp": 1,
        "ep": 2,
        "etp": 1,
        "virtual_stages": None,
        "stage_layers": [4],
    }
    assert record["sharding"] == {"distributed_optimizer": False, "distrib_optim_sharding_type": None}
    assert (record["precision"], record["transformer_impl"], record["optimizer"]) == ("fp32", "local", "adamw")
    assert record["model"]["hidden_size"] == 128 and record["model"]["moe.num_experts"] == 8
    assert record["model"]["mla.kv_lora_rank"] == 64
    assert json.loads(json.dumps(record)) == record  # plain JSON, as the manifest holds it
    assert _record(None, *DEEPSPEED)["sharding"] == {"zero_stage": 0}
    assert _record(None, *DEEPSPEED)["model"]["mla.kv_lora_rank"] is None  # a GQA model: no MLA


@pytest.mark.parametrize(
    ("saved", "now"),
    [
        pytest.param((MOE, TP2_EP2), (MOE, ("parallel.ep=2",)), id="tp2-dp1-to-tp1-dp2"),
        pytest.param((MOE, (*ON_4, *TP2_EP2)), (MOE, (*ON_4, "parallel.pp=2", "parallel.ep=2")), id="tp2-to-pp2-ep2"),
        pytest.param((MOE, (*ON_4, "parallel.ep=2")), (MOE, (*ON_4, "parallel.ep=4")), id="ep2-to-ep4"),
        pytest.param((None, ()), (None, ("hardware.gpus_per_node=1",)), id="dp2-to-world-1"),
        pytest.param((None, ("parallel.pp=2",)), (None, ("parallel.tp=2",)), id="pp2-to-tp2"),
        pytest.param((None, ()), (None, ("train.optimizer.lr=1e-4", "train.steps=60")), id="hyperparameters"),
    ],
)
def test_megatron_reshards(saved: tuple, now: tuple) -> None:
    assert _problems(_record(saved[0], *saved[1]), now[0], *now[1]) == []


@pytest.mark.parametrize(
    ("saved", "now", "fragments"),
    [
        pytest.param(
            (MOE, TP2_EP2),
            (MOE, ("parallel.pp=2", "parallel.ep=1")),
            ["parallel.ep is 1 here", "written at parallel.ep=2", "optimizer of their own", "train.init_from="],
            id="ep2-to-ep1",
        ),
        pytest.param(
            (None, ()),
            (None, ("model.hidden_size=512",)),
            ["model.hidden_size is 512 here but the checkpoint was written with 256", "train.checkpoint.resume=never"],
            id="model-shape",
        ),
        pytest.param(
            (None, ()),
            (None, ("train.optimizer.name=sgd",)),
            ["train.optimizer.name is sgd here but the checkpoint was written with adamw"],
            id="optimizer",
        ),
        pytest.param(
            (None, DEEPSPEED),
            (None, ()),
            ["train.backend is megatron here but the checkpoint was written with deepspeed", "train.backend=deepspeed"],
            id="backend",
        ),
        pytest.param(
            (None, DEEPSPEED),
            (None, (*DEEPSPEED, "parallel.zero_stage=1")),
            ["parallel.zero_stage is 1 here but the checkpoint was written with 0", "universal checkpoint"],
            id="deepspeed-zero-stage",
        ),
        pytest.param(
            (None, DEEPSPEED),
            (None, (*DEEPSPEED, "hardware.gpus_per_node=1")),
            ["parallel.dp is 1 here but the checkpoint was written with 2", "ds_to_universal.py", "keep parallel.dp=2"],
            id="deepspeed-dp",
        ),
    ],
)
def test_refused_with_the_reason_and_the_fix(saved: tuple, now: tuple, fragments: list[str]) -> None:
    problems = _problems(_record(saved[0], *saved[1]), now[0], *now[1])
    assert len(problems) == 1, problems
    for fragment in fragments:
        assert fragment in problems[0], problems[0]


def test_backend_change_offers_no_weights_only_start() -> None:
    (problem,) = _problems(_record(None, *DEEPSPEED), None)
    assert "train.init_from" not in problem  # init_from reads a torch_dist checkpoint, not DeepSpeed's


def test_distributed_optimizer_records_and_its_dp_only_shardings() -> None:
    """Judged on records alone: CPU ranks cannot run the distributed optimizer (the capability table)."""
    record = _record(MOE, *TP2_EP2)
    on = {**record, "sharding": {"distributed_optimizer": True, "distrib_optim_sharding_type": DISTRIB_OPTIM_SHARDING}}
    (problem,) = _problems(on, MOE, *TP2_EP2)
    assert "parallel.distributed_optimizer is false here but the checkpoint was written with true" in problem
    dp_only = {**record, "sharding": {"distributed_optimizer": False, "distrib_optim_sharding_type": "dp_reshardable"}}
    (problem,) = _problems(dp_only, MOE, "parallel.ep=2")
    assert "parallel.tp is 1 here but the checkpoint was written with 2" in problem and "keep parallel.tp=2" in problem
    assert _problems(dp_only, MOE, *TP2_EP2) == []


@pytest.mark.parametrize(
    "saved",
    [None, {"format": FORMAT + 1, "backend": "other"}],
    ids=["older-lmspec", "newer-format"],
)
def test_no_verdict_without_a_record_of_this_format(saved: dict | None) -> None:
    assert _problems(saved, None, "model.hidden_size=512") == []


def test_a_record_missing_keys_judges_what_it_has() -> None:
    record = _record(None)
    del record["layout"], record["model"]["hidden_size"]
    assert _problems(record, None, "model.hidden_size=512", "hardware.gpus_per_node=1") == []


# -- lmspec check --resume-from ------------------------------------------------------------------


def _write_step(root: Path, step: int, saved: dict | None) -> Path:
    """A step directory whose manifest lists a trainer state file, as the runtime writes it (no torch)."""
    path = root / f"step_{step}"
    (path / TRAINER_STATE).mkdir(parents=True)
    (path / TRAINER_STATE / "rank_0.pt").write_bytes(b"state")
    manifest = {"step": step, "run_id": "0" * 32, "files": {f"{TRAINER_STATE}/rank_0.pt": "0" * 64}}
    if saved is not None:
        manifest["saved_with"] = saved
    (path / STEP_MANIFEST).write_text(json.dumps(manifest))
    (root / "latest").write_text(f"step_{step}\n")
    return path


def test_check_resume_from_accepts_another_layout(lmspec: Callable[..., CliResult], tmp_path: Path) -> None:
    _write_step(tmp_path, 4, _record(MOE, *TP2_EP2))
    result = lmspec("check", "--spec", MOE, "serve=null", "parallel.ep=2", "--resume-from", str(tmp_path))
    assert result.code == 0, result.err
    assert f"can resume from {tmp_path / 'step_4'} (saved with megatron, 2 ranks: tp 2 x pp 1 x dp 1 x cp 1" in (
        result.out
    )
    assert "here megatron, 2 ranks: tp 1 x pp 1 x dp 2 x cp 1, ep 2" in result.out
    assert f"compile with train.checkpoint.dir={tmp_path}" in result.out  # not the spec's own directory


def test_check_resume_from_refuses_with_why(lmspec: Callable[..., CliResult], tmp_path: Path) -> None:
    step = _write_step(tmp_path, 2, _record(MOE, *TP2_EP2))
    result = lmspec("check", "--spec", MOE, "serve=null", "parallel.pp=2", "parallel.ep=1", "--resume-from", str(step))
    result.assert_reports(1, [f"error: cannot resume from {step}", "parallel.ep is 1 here", "train.init_from="])


def test_check_resume_from_an_older_manifest_cannot_tell(lmspec: Callable[..., CliResult], tmp_path: Path) -> None:
    _write_step(tmp_path, 2, None)
    result = lmspec("check", "serve=null", "--resume-from", str(tmp_path))
    result.assert_reports(0, ["its manifest has no saved_with (written by an older lmspec)", "cannot tell"])


def test_check_resume_from_nothing_to_resume(lmspec: Callable[..., CliResult], tmp_path: Path) -> None:
    lmspec("check", "serve=null", "--resume-from", str(tmp_path)).assert_reports(1, ["holds no checkpoint"])
    _write_step(tmp_path, 2, _record(None))
    (tmp_path / "step_2" / TRAINER_STATE / "rank_0.pt").unlink()
    lmspec("check", "serve=null", "--resume-from", str(tmp_path)).assert_reports(1, ["none verifies", "is missing"])
    lmspec("check", "serve=null", "--resume-from", str(tmp_path / "nowhere")).assert_reports(2, ["no such directory"])
