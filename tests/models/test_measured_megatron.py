"""The megatron activation estimate against the runtime's own layers, measured on this CPU.

The model is lmspec.runtime.train.megatron.model.build_model's GPTModel (megatron-core's local
path: torch RMSNorm, DotProductAttention, LatentCoreAttention for MLA, SequentialMLP experts and
the all-to-all token dispatcher, fused SwiGLU) for `tiny` (dense GQA) and `tiny_moe` (MLA, MoE and
a dense first layer), fp32 as the CPU preset trains it, one process (world 1). One forward and
backward; what autograd saves (helpers.saved_tensors: by storage, parameters and the trainer's
position ids and mask excluded) is charged to the embedding, each decoder layer, the head (final
norm, output layer, loss) and, under full recompute, to the decoder's checkpoints of the layer
inputs, and compared with compiler/models/activations.py for each recompute kind.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import pytest
from helpers.ports import free_port
from helpers.saved_tensors import saved_bytes
from helpers.specs import spec_of

from lmspec.compiler.models.activations import (
    embedding_activation_bytes,
    head_activation_bytes,
    layer_activation_bytes,
    layer_shape,
)
from lmspec.compiler.models.params import is_moe_layer
from lmspec.compiler.models.train_memory import activation_setting
from lmspec.compiler.spec.sections import Spec

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
dist = pytest.importorskip("torch.distributed")

ACTIVATION_TOLERANCE = 0.10
# (preset, measured part) -> decoder layer index whose kind it is; None: not a layer
PARTS = {
    "tiny": {"embedding": None, "dense GQA layer": 0, "head": None},
    "tiny_moe": {"dense MLA layer": 0, "MoE MLA layer": 1, "head": None},
}


@pytest.fixture(scope="module", autouse=True)
def one_rank() -> Iterator[None]:
    """megatron's parallel state over a group of one, as `torchrun --nproc-per-node=1` gives."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _spec(preset: str, recompute: str) -> Spec:
    return spec_of(f"model={preset}", "train.backend=megatron", f"train.recompute={recompute}")


@cache
def _measure(preset: str, recompute: str) -> dict[str, int]:
    """Bytes saved for backward per part of the runtime's GPTModel: one forward + backward."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from lmspec.runtime.compat.megatron import megatron_on_cpu
    from lmspec.runtime.train.megatron.config import ParallelDegrees
    from lmspec.runtime.train.megatron.model import build_model

    spec = _spec(preset, recompute)
    b, s = spec.train.micro_batch_size, spec.train.seq_length
    with megatron_on_cpu():
        ps.initialize_model_parallel()
        try:
            tensor_parallel.model_parallel_cuda_manual_seed(0)
            model = build_model(spec, pre_process=True, post_process=True, degrees=ParallelDegrees())
            model.train()
            tokens = torch.randint(0, spec.model.vocab_size, (b, s))
            labels = torch.randint(0, spec.model.vocab_size, (b, s))
            position_ids = torch.arange(s).unsqueeze(0).expand(b, s)
            mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)  # the trainer's, held all run
            parts = [
                ("embedding", model.embedding),
                ("decoder", model.decoder),
                ("head", model.decoder.final_layernorm),
                *((f"layer {i}", layer) for i, layer in enumerate(model.decoder.layers)),
            ]
            excluded = [*model.parameters(), position_ids, mask, labels]
            with saved_bytes(parts, excluded, outside="head") as saved:
                loss = model(tokens, position_ids, mask, labels=labels).float().mean()
            loss.backward()
            return dict(saved.totals)
        finally:
            ps.destroy_model_parallel()


def _estimate(spec: Spec, part: str, layer: int | None) -> float:
    m, act = spec.model, activation_setting(spec)
    if part == "embedding":
        return embedding_activation_bytes(act)
    if part == "head":
        return head_activation_bytes(m, act)
    assert layer is not None
    return layer_activation_bytes(layer_shape(m, is_moe_layer(m, layer)), act)


def _report(preset: str, recompute: str, part: str, measured: int, estimate: float) -> None:
    print(
        f"\n{preset} recompute={recompute} {part}: measured {measured:,} B, estimate {estimate:,.0f} B, "
        f"ratio {estimate / measured:.3f}"
    )


@pytest.mark.parametrize("recompute", ["none", "selective"])
@pytest.mark.parametrize(("preset", "part"), [(p, part) for p, parts in PARTS.items() for part in parts])
def test_runtime_layer_activations_within_ten_percent(preset: str, part: str, recompute: str) -> None:
    spec = _spec(preset, recompute)
    layer = PARTS[preset][part]
    measured = _measure(preset, recompute)[
        "embedding" if part == "embedding" else f"layer {layer}" if layer is not None else part
    ]
    estimate = _estimate(spec, part, layer)
    _report(preset, recompute, part, measured, estimate)
    assert estimate == pytest.approx(measured, rel=ACTIVATION_TOLERANCE)


@pytest.mark.parametrize("preset", list(PARTS))
def test_full_recompute_keeps_each_layer_input_only(preset: str) -> None:
    """megatron checkpoints the decoder layer by layer: only each layer's input stays (charged to the
    decoder, outside every layer), and nothing inside a layer."""
    spec = _spec(preset, "full")
    m = spec.model
    measured = _measure(preset, "full")
    layers = sum(measured.get(f"layer {i}", 0) for i in range(m.num_layers))
    estimate = sum(_estimate(spec, "layer", i) for i in range(m.num_layers))
    _report(preset, "full", "decoder (all layers)", measured["decoder"], estimate)
    _report(preset, "full", "head", measured["head"], head_activation_bytes(m, activation_setting(spec)))
    assert layers == 0
    assert estimate == pytest.approx(measured["decoder"], rel=ACTIVATION_TOLERANCE)
    assert head_activation_bytes(m, activation_setting(spec)) == pytest.approx(
        measured["head"], rel=ACTIVATION_TOLERANCE
    )
