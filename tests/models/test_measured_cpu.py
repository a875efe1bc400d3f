"""lmspec's estimates against what torch really holds, measured on this CPU for the tiny presets.

The models are the HuggingFace classes the DeepSpeed backend trains (LlamaForCausalLM for
`tiny`, DeepseekV3ForCausalLM for `tiny_moe`), built in fp32 as the CPU preset trains them.
Attention: `train.flash_attention=false` (the CPU preset) is HF's "eager" implementation,
which stores the s x s scores (the 5as/h term); `true` is "sdpa", whose CPU flash kernel
keeps Q, K, V, the output and the log-sum-exp instead.

Model state is measured from the tensors after one AdamW step: parameters, gradients, and
the optimizer's exp_avg and exp_avg_sq (its per-tensor `step` counters, 4 bytes per
parameter tensor, are bookkeeping and not counted). Activations are the bytes of every
tensor saved for backward (helpers.saved_tensors), deduplicated by storage, parameters
excluded. With train.recompute=full the model is checkpointed as the DeepSpeed trainer does it
(lmspec.runtime.train.deepspeed.activation_checkpointing, from the build's ds_config).
The runtime's megatron layers are measured in test_measured_megatron.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import pytest
from helpers.hf import hf_model
from helpers.ports import free_port
from helpers.saved_tensors import saved_bytes
from helpers.specs import spec_of

from lmspec.compiler.emit.deepspeed_config import ds_config
from lmspec.compiler.models.activations import (
    embedding_activation_bytes,
    head_activation_bytes,
    layer_activation_bytes,
    layer_shape,
)
from lmspec.compiler.models.params import is_moe_layer
from lmspec.compiler.models.train_memory import activation_setting, estimate_train_memory
from lmspec.compiler.pipeline import make_plan

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
dist = pytest.importorskip("torch.distributed")

ACTIVATION_TOLERANCE = 0.10


@pytest.fixture(scope="module", autouse=True)
def one_rank() -> Iterator[None]:
    """deepspeed.checkpointing.configure reads DeepSpeed's world: a group of one, as the trainer starts it
    under `torchrun --nproc-per-node=1`."""
    import deepspeed

    from lmspec.runtime.compat.deepspeed import no_cpu_shm_op_build

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    with no_cpu_shm_op_build():
        deepspeed.init_distributed(dist_backend="gloo")
    yield
    dist.destroy_process_group()


def _measure(spec, attn_implementation: str) -> dict[str, int]:  # noqa: ANN001
    t = spec.train
    return dict(_measure_once(spec.model, t.micro_batch_size, t.seq_length, attn_implementation, t.recompute))


@cache
def _measure_once(model_spec, micro_batch_size: int, seq_length: int, attn_implementation: str, recompute: str):  # noqa: ANN001, ANN202
    """One forward, backward and AdamW step; the backend does not change what torch holds."""
    from lmspec.runtime.train.deepspeed.activation_checkpointing import enable_activation_checkpointing

    torch.manual_seed(0)
    model = hf_model(model_spec, device="cpu", attn_implementation=attn_implementation)
    model.train()
    if recompute == "full":  # the trainer's own call, on the build's ds_config (one rank: dp 1)
        plan = make_plan(
            [f"model={model_spec.name}", "train.backend=deepspeed", "train.recompute=full", "hardware.gpus_per_node=1"]
        )
        assert enable_activation_checkpointing(model, ds_config(plan))
    ids = torch.randint(0, model_spec.vocab_size, (micro_batch_size, seq_length))
    with saved_bytes([], excluded=list(model.parameters())) as saved:
        loss = model(input_ids=ids, labels=ids).loss
    saved.add_held(loss.grad_fn, "deepspeed_saved_tensors", "outside")  # DeepSpeed's checkpointed layer inputs
    loss.backward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    nbytes = lambda x: x.numel() * x.element_size()  # noqa: E731
    return tuple(
        {
            "weights": sum(nbytes(p) for p in model.parameters()),
            "gradients": sum(nbytes(p.grad) for p in model.parameters()),
            "optimizer": sum(nbytes(s[k]) for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")),
            "activations": saved.totals["outside"],
        }.items()
    )


CASES = [
    pytest.param("tiny", "eager", [], id="tiny-eager"),
    pytest.param("tiny", "sdpa", ["train.flash_attention=true"], id="tiny-sdpa"),
    pytest.param("tiny_moe", "eager", [], id="tiny_moe-eager"),
]
FULL_RECOMPUTE = [
    pytest.param("tiny", "eager", ["train.recompute=full"], id="tiny-eager-full"),
    pytest.param("tiny_moe", "eager", ["train.recompute=full"], id="tiny_moe-eager-full"),
]


@pytest.mark.parametrize(("preset", "attn", "extra"), CASES)
@pytest.mark.parametrize("backend", ["deepspeed", "megatron"])
def test_model_state_bytes_are_exact(preset: str, attn: str, extra: list[str], backend: str) -> None:
    spec = spec_of(f"model={preset}", f"train.backend={backend}", *extra)
    memory = estimate_train_memory(spec)
    assert memory is not None and len(memory.stages) == 1
    estimate = memory.stages[0]
    measured = _measure(spec, attn)
    assert (estimate.weights_bytes, estimate.gradients_bytes, estimate.optimizer_bytes) == (
        measured["weights"],
        measured["gradients"],
        measured["optimizer"],
    )


@pytest.mark.parametrize(("preset", "attn", "extra"), CASES + FULL_RECOMPUTE)
def test_activations_within_ten_percent(preset: str, attn: str, extra: list[str]) -> None:
    """What one micro-batch saves for backward: every layer, the head and the embedding (under full recompute
    the layer being recomputed in backward is a transient the plan adds on top, not measured here)."""
    spec = spec_of(f"model={preset}", "train.backend=deepspeed", *extra)  # DeepSpeed trains the HF model
    m, act = spec.model, activation_setting(spec)
    layers = sum(layer_activation_bytes(layer_shape(m, is_moe_layer(m, i)), act) for i in range(m.num_layers))
    estimate = round(layers + head_activation_bytes(m, act) + embedding_activation_bytes(act))
    measured = _measure(spec, attn)["activations"]
    print(
        f"\n{preset} ({attn}, {spec.train.recompute}): activations estimate {estimate:,} B, measured {measured:,} B, "
        f"{estimate / measured - 1:+.1%}"
    )
    assert estimate == pytest.approx(measured, rel=ACTIVATION_TOLERANCE)
