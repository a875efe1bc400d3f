"""The megatron activation estimate against the runtime's own layers, measured on this CPU.

The model is lmspec.runtime.train.megatron.model.build_model's GPTModel (megatron-core's local
path: torch RMSNorm, DotProductAttention, LatentCoreAttention for MLA, SequentialMLP experts and
the all-to-all token dispatcher, fused SwiGLU) for `tiny` (dense GQA) and `tiny_moe` (MLA, MoE and
a dense first layer), fp32 as the CPU preset trains it, one process (world 1). One forward and
backward; what autograd saves (helpers.saved_tensors: by storage, parameters and the trainer's
position ids and mask excluded) is charged to the embedding, each decoder layer, the head (final
norm, output layer, loss) and, under full recompute, to the decoder's checkpoints of the layer
inputs, and compared with compiler/models/activations.py for each recompute kind. Tensor parallelism
with sequence parallelism needs two ranks: one slow test measures tp=2 under torchrun.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from helpers.megatron_activations import measure, megatron_spec
from helpers.paths import ROOT
from helpers.ports import free_port
from helpers.processes import run_in_group

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
# preset -> {measured part: the decoder layer whose kind it is, None for embedding and head}
PARTS = {
    "tiny": {"embedding": None, "dense GQA layer": 0, "head": None},
    "tiny_moe": {"dense MLA layer": 0, "MoE MLA layer": 1, "head": None},
}
TP_RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    """megatron's parallel state over a group of one, as `torchrun --nproc-per-node=1` gives."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@cache
def _measure(preset: str, recompute: str) -> dict[str, int]:
    from lmspec.compiler.backends.megatron_config import ParallelDegrees

    return measure(megatron_spec(preset, recompute), ParallelDegrees())


def _estimate(spec: Spec, part: str, layer: int | None) -> float:
    m, act = spec.model, activation_setting(spec)
    if part == "embedding":
        return embedding_activation_bytes(act)
    if part == "head":
        return head_activation_bytes(m, act)
    assert layer is not None
    return layer_activation_bytes(layer_shape(m, is_moe_layer(m, layer)), act)


def _key(part: str, layer: int | None) -> str:
    return part if layer is None else f"layer {layer}"


def _report(label: str, part: str, measured: int, estimate: float) -> None:
    print(f"\n{label} {part}: measured {measured:,} B, estimate {estimate:,.0f} B, ratio {estimate / measured:.3f}")


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("recompute", ["none", "selective"])
@pytest.mark.parametrize(("preset", "part"), [(p, part) for p, parts in PARTS.items() for part in parts])
def test_runtime_layer_activations_within_ten_percent(preset: str, part: str, recompute: str) -> None:
    spec = megatron_spec(preset, recompute)
    layer = PARTS[preset][part]
    measured = _measure(preset, recompute)[_key(part, layer)]
    estimate = _estimate(spec, part, layer)
    _report(f"{preset} recompute={recompute}", part, measured, estimate)
    assert estimate == pytest.approx(measured, rel=ACTIVATION_TOLERANCE)


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("preset", list(PARTS))
def test_full_recompute_keeps_each_layer_input_only(preset: str) -> None:
    """megatron checkpoints the decoder layer by layer: only each layer's input stays (charged to the
    decoder, outside every layer), and nothing inside a layer."""
    spec = megatron_spec(preset, "full")
    m = spec.model
    measured = _measure(preset, "full")
    layers = sum(measured.get(f"layer {i}", 0) for i in range(m.num_layers))
    estimate = sum(_estimate(spec, "layer", i) for i in range(m.num_layers))
    head = _estimate(spec, "head", None)
    _report(f"{preset} recompute=full", "decoder (all layers)", measured["decoder"], estimate)
    _report(f"{preset} recompute=full", "head", measured["head"], head)
    assert layers == 0
    assert estimate == pytest.approx(measured["decoder"], rel=ACTIVATION_TOLERANCE)
    assert head == pytest.approx(measured["head"], rel=ACTIVATION_TOLERANCE)


@pytest.mark.slow  # two ranks under torchrun (selective recompute measures within 0.001% too; one run here)
def test_tp2_sequence_parallel_rank_within_ten_percent(tmp_path: Path) -> None:
    """tiny at tp=2 with sequence parallelism: rank 0's layers, embedding and head against the estimate's
    TP/SP division (norms and the residual stream split over the sequence, attention and MLP over heads)."""
    recompute = "none"
    out = tmp_path / "measured.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}",
            "-m", "helpers.megatron_activations", out, "tiny", recompute, "2"]  # fmt: skip
    result = run_in_group(argv, cwd=tmp_path, timeout_s=TP_RUN_TIMEOUT_S, env=env, merge_stderr=True)
    assert result.returncode == 0, result.stdout[-4000:]
    measured = json.loads(out.read_text())
    spec = megatron_spec("tiny", recompute, "parallel.tp=2", "parallel.sequence_parallel=true")
    for part, layer in PARTS["tiny"].items():
        estimate = _estimate(spec, part, layer)
        _report(f"tiny tp=2 sp recompute={recompute}", part, measured[_key(part, layer)], estimate)
        assert estimate == pytest.approx(measured[_key(part, layer)], rel=ACTIVATION_TOLERANCE), part
