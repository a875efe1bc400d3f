"""What a MoE layer of the runtime's own megatron GPTModel keeps, per rank, under expert parallelism.

The model is helpers.megatron_activations's (tiny_moe, megatron-core's local path, fp32), built at
ep=EP with `moe_token_dispatcher_type` set to the dispatcher measured. One forward and backward;
for each MoE layer two figures, per rank:

- saved: what autograd saves for backward (helpers.saved_tensors), charged to the decoder layer
  (`layer N`, attention and norms) and to its MoE block (`moe N`: router, dispatcher, experts);
- transient: the most the tensors alive held while the MoE block ran its forward (or its backward),
  above what they held when it began (LiveBytes: every op's new output storage, counted until a weak
  reference says it was freed). The test subtracts the block's saved bytes from the forward's figure.
  gloo's worker thread releases a collective's buffers when it gets to it, sometimes after the next op,
  which inflates one bracket's peak or, held in the level a bracket begins at, deflates it: of PASSES
  forward-backward passes the median figure is kept. Parameter gradients are dropped as soon as
  they are accumulated, as megatron's DDP moves them into its preallocated main-gradient buffer (priced
  as the gradients term).

Also, per MoE layer: the routed copies this rank's experts received (the load the estimate is held
to: the imbalance between ranks is priced apart, compiler/models/moe_load.py) and the tokens per rank.

As a torchrun worker: `python -m torch.distributed.run --nproc-per-node=2 -m helpers.megatron_moe
OUT.json DISPATCHER EP [OVERRIDE ...]` writes every rank's measurement (a list, rank order).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from helpers.megatron_activations import megatron_spec
from helpers.saved_tensors import saved_bytes
from lmspec.compiler.spec.sections import Spec

PASSES = 5  # forward-backward passes whose median transient figure is kept


class LiveBytes:
    """Bytes of tensor storages alive, as every op's outputs allocate them and their storages die
    (torch.utils._python_dispatch: an op's new output storage counts from the op; a weak reference
    to the storage tells when it is freed, on whichever thread drops it: gloo's frees its
    collectives' buffers). The most held in each open bracket above its level at the bracket's
    begin, one figure a pass, the median of the passes kept per bracket."""

    def __init__(self) -> None:
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        self.live = 0
        self.open: dict[str, list[int]] = {}  # bracket -> [level at begin, peak]
        self.closed: dict[str, list[int]] = {}  # bracket -> its figure in each pass
        self._alive: set[int] = set()
        tracker = self

        def dead(ptr: int, nbytes: int) -> None:
            tracker._alive.discard(ptr)
            tracker.live -= nbytes

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                import torch

                out = func(*args, **(kwargs or {}))
                if any(r.alias_info is not None for r in func._schema.returns):
                    return out  # a view or an in-place op: no new storage
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                        storage = t.untyped_storage()
                        ptr = storage.data_ptr()
                        if ptr and ptr not in tracker._alive and storage.nbytes():
                            tracker._alive.add(ptr)
                            tracker.live += storage.nbytes()
                            weakref.finalize(storage, dead, ptr, storage.nbytes())
                            for bracket in tracker.open.values():
                                bracket[1] = max(bracket[1], tracker.live)
                return out

        self.mode = Mode()

    def begin(self, name: str) -> None:
        self.open[name] = [self.live, self.live]

    def end(self, name: str) -> None:
        base, peak = self.open.pop(name)
        self.closed.setdefault(name, []).append(peak - base)

    def above(self, name: str) -> int:
        return statistics.median_low(self.closed[name])  # gloo frees late, on its own thread, either way


def _bracket(moe: Any, index: int, tracker: LiveBytes) -> list[Any]:
    """Hooks that bracket the block's forward (pre/post hooks) and backward (its output's gradient
    arriving, its input's gradient made)."""

    def pre(_module: Any, args: Any) -> None:
        tracker.begin(f"forward {index}")
        if args[0].requires_grad:
            args[0].register_hook(lambda g: tracker.end(f"backward {index}"))

    def post(_module: Any, _args: Any, output: Any) -> None:
        tracker.end(f"forward {index}")
        out = output[0] if isinstance(output, tuple) else output
        out.register_hook(lambda g: tracker.begin(f"backward {index}"))

    return [moe.register_forward_pre_hook(pre), moe.register_forward_hook(post)]


def measure_moe(spec: Spec, degrees: Any, dispatcher: str, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """One forward and backward of this rank's GPTModel; per MoE layer its saved and transient bytes."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from lmspec.compiler.backends.megatron_config import model_settings
    from lmspec.runtime.compat.megatron import megatron_on_cpu
    from lmspec.runtime.train.megatron.model import build_model

    b, s = spec.train.micro_batch_size, spec.train.seq_length
    document = model_settings(spec, degrees)
    document["transformer_config"].update(moe_token_dispatcher_type=dispatcher, **(settings or {}))
    with megatron_on_cpu():
        ps.initialize_model_parallel(tensor_model_parallel_size=degrees.tp, expert_model_parallel_size=degrees.ep)
        try:
            tensor_parallel.model_parallel_cuda_manual_seed(0)
            model = build_model(document, pre_process=True, post_process=True)
            model.train()
            for p in model.parameters():  # as megatron's DDP: into main_grad, then dropped
                p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
            rank = torch.distributed.get_rank()
            generator = torch.Generator().manual_seed(rank)  # each rank its own micro-batch (expert-dp)
            tokens = torch.randint(0, spec.model.vocab_size, (b, s), generator=generator)
            labels = torch.randint(0, spec.model.vocab_size, (b, s), generator=generator)
            position_ids = torch.arange(s).unsqueeze(0).expand(b, s)
            mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
            layers = list(model.decoder.layers)
            moe_layers = [i for i, layer in enumerate(layers) if hasattr(layer.mlp, "token_dispatcher")]
            received: dict[int, int] = {}

            def count(i: int) -> Any:
                def hook(_module: Any, args: Any, _output: Any) -> None:
                    received.setdefault(i, int(args[1].sum()))  # tokens_per_expert, first pass

                return hook

            tracker = LiveBytes()
            handles = []
            for i in moe_layers:
                handles += _bracket(layers[i].mlp, i, tracker)
                handles.append(layers[i].mlp.experts.register_forward_hook(count(i)))
            parts = [
                ("embedding", model.embedding),
                ("head", model.decoder.final_layernorm),
                *((f"layer {i}", layer) for i, layer in enumerate(layers)),
                *((f"moe {i}", layers[i].mlp) for i in moe_layers),
            ]
            excluded = [*model.parameters(), position_ids, mask, labels]
            with tracker.mode:
                with saved_bytes(parts, excluded, outside="head") as saved:
                    loss = model(tokens, position_ids, mask, labels=labels).float().mean()
                loss.backward()
                for _ in range(PASSES - 1):  # the transient again: the median of the passes is kept
                    model(tokens, position_ids, mask, labels=labels).float().mean().backward()
            for handle in handles:
                handle.remove()
            totals = dict(saved.totals)
            return {
                "tokens": b * s // degrees.tp,
                "saved": totals,
                "moe": {
                    str(i): {
                        "received": received[i],
                        "forward_above": tracker.above(f"forward {i}"),
                        "backward_above": tracker.above(f"backward {i}"),
                    }
                    for i in moe_layers
                },
            }
        finally:
            ps.destroy_model_parallel()


def main() -> int:
    import torch.distributed as dist

    from lmspec.compiler.backends.megatron_config import ParallelDegrees

    out, dispatcher, ep, overrides = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    dist.init_process_group("gloo")
    try:
        settings = json.loads(overrides[0]) if overrides and overrides[0].startswith("{") else {}
        spec = megatron_spec("tiny_moe", "none", f"parallel.ep={ep}", *overrides[1 if settings else 0 :])
        measured = measure_moe(spec, ParallelDegrees(ep=ep), dispatcher, settings)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, measured)
        if dist.get_rank() == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
