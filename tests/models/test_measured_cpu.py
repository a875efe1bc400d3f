"""lmspec's estimates against what torch really holds, measured on this CPU for the tiny presets.

The models are the HuggingFace classes the DeepSpeed backend trains (LlamaForCausalLM for
`tiny`, DeepseekV3ForCausalLM for `tiny_moe`), built in fp32 as the CPU preset trains them.
Attention: `train.flash_attention=false` (the CPU preset) is HF's "eager" implementation,
which stores the s x s scores (the 5as/h term); `true` is "sdpa", whose CPU flash kernel
keeps Q, K, V, the output and the log-sum-exp instead.

Model state is measured from the tensors after one AdamW step: parameters, gradients, and
the optimizer's exp_avg and exp_avg_sq (its per-tensor `step` counters, 4 bytes per
parameter tensor, are bookkeeping and not counted). Activations are the bytes of every
tensor saved for backward (torch.autograd.graph.saved_tensors_hooks), deduplicated by
storage, parameters excluded.
"""

from __future__ import annotations

from functools import cache

import pytest
from helpers.hf import hf_model
from helpers.specs import spec_of

from lmspec.compiler.models.train_memory import estimate_train_memory

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ACTIVATION_TOLERANCE = 0.10


def _measure(spec, attn_implementation: str) -> dict[str, int]:  # noqa: ANN001
    return dict(_measure_once(spec.model, spec.train.micro_batch_size, spec.train.seq_length, attn_implementation))


@cache
def _measure_once(model_spec, micro_batch_size: int, seq_length: int, attn_implementation: str):  # noqa: ANN001, ANN202
    """One forward, backward and AdamW step; the backend does not change what torch holds."""
    torch.manual_seed(0)
    model = hf_model(model_spec, device="cpu", attn_implementation=attn_implementation)
    model.train()
    ids = torch.randint(0, model_spec.vocab_size, (micro_batch_size, seq_length))
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):  # noqa: ANN001, ANN202
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in param_storages:
            saved.setdefault(storage.data_ptr(), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    nbytes = lambda x: x.numel() * x.element_size()  # noqa: E731
    return tuple(
        {
            "weights": sum(nbytes(p) for p in model.parameters()),
            "gradients": sum(nbytes(p.grad) for p in model.parameters()),
            "optimizer": sum(nbytes(s[k]) for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")),
            "activations": sum(saved.values()),
        }.items()
    )


CASES = [
    pytest.param("tiny", "eager", [], id="tiny-eager"),
    pytest.param("tiny", "sdpa", ["train.flash_attention=true"], id="tiny-sdpa"),
    pytest.param("tiny_moe", "eager", [], id="tiny_moe-eager"),
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


@pytest.mark.parametrize(("preset", "attn", "extra"), CASES)
def test_activations_within_ten_percent(preset: str, attn: str, extra: list[str]) -> None:
    spec = spec_of(f"model={preset}", "train.backend=deepspeed", *extra)  # DeepSpeed trains the HF model
    memory = estimate_train_memory(spec)
    assert memory is not None
    estimate = memory.stages[0].activations_bytes
    measured = _measure(spec, attn)["activations"]
    print(
        f"\n{preset} ({attn}): activations estimate {estimate:,} B, measured {measured:,} B, "
        f"{estimate / measured - 1:+.1%}"
    )
    assert estimate == pytest.approx(measured, rel=ACTIVATION_TOLERANCE)
