"""ds_config.json judged by DeepSpeed's own config classes, for every deepspeed variant."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from lmspec.compiler.build.files import DS_CONFIG, REPORT
from lmspec.compiler.emit.deepspeed_config import TOP_LEVEL_KEYS
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.errors import SpecError
from lmspec.compiler.pipeline import make_plan

deepspeed_config = pytest.importorskip("deepspeed.runtime.config", reason="DeepSpeed not installed (train extra)")
torch = pytest.importorskip("torch")

DS = ["train.backend=deepspeed"]
VARIANTS = {
    "zero0-fp32": DS + ["parallel.zero_stage=0"],
    "zero1-bf16": DS + ["parallel.zero_stage=1", "train.precision=bf16"],
    "zero2-fp16": DS  # fp16 kernels need a GPU (the capability table: DeepSpeed's CPU accelerator has none)
    + [
        "hardware=a100_80g",
        "train.transformer_impl=local",
        "train.recompute=full",
        "train.seq_length=1024",
        "serve.max_model_len=1024",
        "parallel.zero_stage=2",
        "train.precision=fp16",
    ],
    "zero3-bf16": DS + ["parallel.zero_stage=3", "train.precision=bf16"],
    "zero3-fp32-offload": DS
    + ["parallel.zero_stage=3", "parallel.offload_optimizer=true", "parallel.offload_params=true"],
    "zero2-bf16-offload-optimizer": DS
    + ["parallel.zero_stage=2", "train.precision=bf16", "parallel.offload_optimizer=true"],
    "zero1-adam-linear": DS
    + [
        "parallel.zero_stage=1",
        "train.optimizer.name=adam",
        "train.lr_schedule.decay=linear",
        "train.optimizer.min_lr=0",
    ],
    "zero2-sgd-constant-recompute": DS
    + ["parallel.zero_stage=2", "train.optimizer.name=sgd", "train.lr_schedule.decay=constant", "train.recompute=full"],
    "zero3-no-warmup": DS + ["parallel.zero_stage=3", "train.lr_schedule.warmup_steps=0"],
    "zero3-nothing-overlapped": DS
    + ["parallel.zero_stage=3", "parallel.overlap.grad_reduce=false", "parallel.overlap.param_gather=false"],
    "llama3_70b-h100-zero3": DS
    + [
        "model=llama3_70b",
        "hardware=h100_80g",
        "train.transformer_impl=local",
        "hardware.nodes=8",
        "cluster=slurm",
        "parallel.zero_stage=3",
        "train.recompute=full",
        "train.global_batch_size=512",
    ],
    "deepseek_v2_lite-a100-zero3": DS
    + [
        "model=deepseek_v2_lite",
        "hardware=a100_80g",
        "train.transformer_impl=local",
        "parallel.zero_stage=3",
        "train.recompute=full",
        "train.global_batch_size=256",
        "serve.tp=1",
    ],
}
PRESET = "tiny_deepspeed_zero3_2rank_cpu_fp32"


class _ReadTracking(dict):
    """A dict that records which of its keys were looked up (copy.copy shares the record)."""

    def __init__(self, data: dict) -> None:
        super().__init__(data)
        self.read: set[str] = set()

    def __getitem__(self, key):  # noqa: ANN001, ANN204
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):  # noqa: ANN001, ANN201
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:  # noqa: ANN001
        self.read.add(key)
        return super().__contains__(key)


def _plan_and_config(overrides: list[str], spec: Path | None = None):
    plan = make_plan(overrides, spec)
    text = build_files(plan)[DS_CONFIG]
    return plan, json.loads(text)


def _deepspeed_config(config: dict, dp: int, monkeypatch: pytest.MonkeyPatch):
    """DeepSpeedConfig offline: the data-parallel world size comes from the Plan."""
    monkeypatch.setattr(deepspeed_config.dist, "get_world_size", lambda group=None: dp)
    monkeypatch.setattr(deepspeed_config.dist, "get_rank", lambda group=None: 0)
    return deepspeed_config.DeepSpeedConfig(config)


CASES = [pytest.param(v, None, id=k) for k, v in VARIANTS.items()] + [pytest.param([], PRESET, id=PRESET)]


@pytest.mark.parametrize(("overrides", "spec"), CASES)
def test_deepspeed_accepts_emitted_config(
    overrides: list[str], spec: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan, config = _plan_and_config(overrides, Path(spec) if spec else None)
    tracked = _ReadTracking(config)
    ds = _deepspeed_config(tracked, plan.trained().layout.dp, monkeypatch)

    assert ds.world_size == plan.trained().layout.dp
    assert ds.train_batch_size == plan.trained().batch.global_batch_size
    assert ds.train_micro_batch_size_per_gpu == plan.trained().batch.micro_batch_size
    assert ds.gradient_accumulation_steps == plan.trained().batch.grad_accum_steps
    assert ds.zero_optimization_stage == plan.trained().layout.zero_stage
    assert ds.bfloat16_config.enabled == (plan.spec.train.precision == "bf16")
    assert ds.float16_config.enabled == (plan.spec.train.precision == "fp16")
    assert ds.gradient_clipping == plan.spec.train.grad_clip
    # DeepSpeed ignores unknown top-level keys silently: every key we write must be one it reads.
    assert set(config) <= TOP_LEVEL_KEYS
    assert set(config) - tracked.read == set(), "ds_config keys DeepSpeedConfig never reads"
    # No "auto" anywhere: every value is concrete.
    assert '"auto"' not in json.dumps(config)


@pytest.mark.parametrize(("overrides", "spec"), CASES)
def test_optimizer_is_real_and_accepts_its_params_and_no_scheduler_is_configured(
    overrides: list[str], spec: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeepSpeed takes any optimizer name silently; build it from its own tables. No scheduler: the trainer
    hands DeepSpeed the spec's (tests/runtime/test_lr_schedule.py), which none of DeepSpeed's can express."""
    plan, config = _plan_and_config(overrides, Path(spec) if spec else None)
    ds = _deepspeed_config(config, plan.trained().layout.dp, monkeypatch)
    name = ds.optimizer_name
    params = dict(ds.optimizer_params)
    assert name in deepspeed_config.DEEPSPEED_OPTIMIZERS or hasattr(torch.optim, name), name
    weights = [torch.nn.Parameter(torch.zeros(2))]
    if name in ("adam", "adamw"):
        adam_w = params.pop(deepspeed_config.ADAM_W_MODE)
        assert adam_w == (plan.spec.train.optimizer.name == "adamw")
        if plan.spec.parallel.offload_optimizer:
            # No torch_adam: DeepSpeed builds DeepSpeedCPUAdam, whose signature takes these params (binding
            # them needs no cpu_adam op, which building the optimizer would JIT-compile).
            assert deepspeed_config.TORCH_ADAM_PARAM not in params
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            inspect.signature(DeepSpeedCPUAdam).bind(weights, **params, adamw_mode=adam_w)
        else:
            # What DeepSpeed builds with torch_adam=true: torch's Adam or AdamW (adam_w_mode decides).
            assert params.pop(deepspeed_config.TORCH_ADAM_PARAM) is True
        optimizer_class = torch.optim.AdamW if adam_w else torch.optim.Adam
    else:
        optimizer_class = getattr(torch.optim, name)
    optimizer_class(weights, **params)
    assert ds.scheduler_name is None and "scheduler" not in config


def test_zero_buckets_follow_hidden_size_like_hf_auto() -> None:
    plan, config = _plan_and_config(VARIANTS["llama3_70b-h100-zero3"])
    hidden = plan.spec.model.hidden_size
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == hidden * hidden
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * hidden * hidden)
    assert zero["stage3_param_persistence_threshold"] == 10 * hidden


def test_overlap_keys_are_deepspeeds_overlap_comm_and_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    """parallel.overlap.grad_reduce is zero_optimization.overlap_comm; param_gather=false turns ZeRO-3's
    prefetch off (each layer gathers its weights when it runs), as DeepSpeed's own config reads them."""
    plan, config = _plan_and_config(VARIANTS["zero3-nothing-overlapped"])
    ds = _deepspeed_config(config, plan.trained().layout.dp, monkeypatch)
    assert ds.zero_config.overlap_comm is False
    assert ds.zero_config.prefetch_bucket_size == 0
    plan, config = _plan_and_config(VARIANTS["zero3-bf16"])
    ds = _deepspeed_config(config, plan.trained().layout.dp, monkeypatch)
    assert ds.zero_config.overlap_comm is True and ds.zero_config.prefetch_bucket_size > 0


def test_deepspeed_judge_is_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """The validator used above really rejects bad configs (so its silence means something)."""
    plan, config = _plan_and_config(VARIANTS["zero3-bf16"])
    broken = json.loads(json.dumps(config))
    broken["zero_optimization"]["stage3_prefech_bucket_size"] = 1  # typo inside a section
    with pytest.raises(Exception, match="stage3_prefech_bucket_size"):
        _deepspeed_config(broken, plan.trained().layout.dp, monkeypatch)
    wrong_batch = dict(config, train_batch_size=config["train_batch_size"] + 1)
    with pytest.raises(AssertionError, match="train_batch_size"):
        _deepspeed_config(wrong_batch, plan.trained().layout.dp, monkeypatch)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("parallel.offload_params=true", "parallel.offload_params"),
        ("parallel.zero_stage=5", "parallel.zero_stage"),
        ("train.grad_clip=-1", "train.grad_clip"),
        ("train.optimizer.name=lion", "train.optimizer.name"),
    ],
)
def test_bad_values_are_caught_by_lmspec_first(override: str, key: str) -> None:
    with pytest.raises(SpecError) as caught:
        make_plan(DS + ["parallel.zero_stage=2", override])
    assert key in {p.key for p in caught.value.problems}, caught.value


def test_megatron_builds_have_no_ds_config() -> None:
    assert DS_CONFIG not in build_files(make_plan([]))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_activation_checkpointing_section_only_for_full_recompute(
    recompute: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The section is what the trainer hands deepspeed.checkpointing.configure: present exactly when asked."""
    plan, config = _plan_and_config(DS + ["parallel.zero_stage=2", f"train.recompute={recompute}"])
    assert ("activation_checkpointing" in config) == (recompute == "full")
    checkpointing = _deepspeed_config(config, plan.trained().layout.dp, monkeypatch).activation_checkpointing_config
    if recompute == "full":
        assert checkpointing.number_checkpoints == plan.spec.model.num_layers
        assert not checkpointing.partition_activations and not checkpointing.cpu_checkpointing


@pytest.mark.parametrize(
    ("variant", "cpu_adam"),
    [
        ("zero2-bf16-offload-optimizer", True),
        ("zero3-fp32-offload", True),
        ("zero2-fp16", False),
        ("zero1-bf16", False),
    ],
)
def test_offloaded_adam_asks_for_deepspeed_cpu_adam(variant: str, cpu_adam: bool) -> None:
    from lmspec.runtime.train.deepspeed.cpu_adam import wants_cpu_adam

    plan, config = _plan_and_config(VARIANTS[variant])
    assert wants_cpu_adam(config) is cpu_adam
    report = build_files(plan)[REPORT]
    expected = "DeepSpeedCPUAdam (AdamW, offloaded; torch's AdamW where its cpu_adam op cannot be built)"
    assert (expected in report) is cpu_adam
    assert ("| optimizer | torch AdamW |" in report) is not cpu_adam


def test_cpu_adam_that_cannot_build_falls_back_to_torch_adam(monkeypatch: pytest.MonkeyPatch) -> None:
    """The op's build is the machine's fact: when it fails, torch's AdamW runs, the reason is returned for the
    run log, and DeepSpeed's own config classes accept the changed config."""
    from deepspeed.ops.op_builder import CPUAdamBuilder

    from lmspec.runtime.train.deepspeed.cpu_adam import with_available_optimizer

    def no_compiler(self, verbose: bool = True):  # noqa: ANN001, ANN202
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(CPUAdamBuilder, "load", no_compiler)
    plan, config = _plan_and_config(VARIANTS["zero2-bf16-offload-optimizer"])
    ran, reason = with_available_optimizer(config)
    assert reason is not None and "Ninja is required" in reason and "falls back to torch's AdamW" in reason
    assert ran["optimizer"]["params"]["torch_adam"] is True and "torch_adam" not in config["optimizer"]["params"]
    ds = _deepspeed_config(ran, plan.trained().layout.dp, monkeypatch)
    assert ds.optimizer_params[deepspeed_config.TORCH_ADAM_PARAM] is True
