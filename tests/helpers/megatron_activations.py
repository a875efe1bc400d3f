"""What the runtime's own megatron GPTModel saves for backward, per part, on this rank.

The model is lmspec.runtime.train.megatron.model.build_model's, from the settings megatron/config.json
would hold (lmspec.compiler.backends.megatron_config.model_settings) at the given degrees, inside
megatron_on_cpu with megatron's parallel state initialised to them (torch.distributed must be up:
one process in tests/models, two under torchrun in `python -m helpers.megatron_activations`). One
forward and backward; helpers.saved_tensors charges each saved storage to the embedding, a decoder
layer (`layer N`), the head (final norm, output layer, loss) or the decoder outside its layers
(full recompute's checkpointed layer inputs). Parameters and the trainer's position ids, mask and
labels (held all run) are not counted.

As a torchrun worker: `python -m torch.distributed.run --nproc-per-node=2 -m helpers.megatron_activations
OUT.json PRESET RECOMPUTE TP` writes rank 0's measurement at tp=TP with sequence parallelism.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from helpers.saved_tensors import saved_bytes
from helpers.specs import spec_of
from lmspec.compiler.spec.sections import Spec


def megatron_spec(preset: str, recompute: str, *overrides: str) -> Spec:
    return spec_of(f"model={preset}", "train.backend=megatron", f"train.recompute={recompute}", *overrides)


def measure(spec: Spec, degrees: Any) -> dict[str, int]:
    """Bytes saved for backward per part of this rank's GPTModel: one forward + backward."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from lmspec.compiler.backends.megatron_config import model_settings
    from lmspec.runtime.compat.megatron import megatron_on_cpu
    from lmspec.runtime.train.megatron.model import build_model

    b, s = spec.train.micro_batch_size, spec.train.seq_length
    with megatron_on_cpu():
        ps.initialize_model_parallel(tensor_model_parallel_size=degrees.tp)
        try:
            tensor_parallel.model_parallel_cuda_manual_seed(0)
            model = build_model(model_settings(spec, degrees), pre_process=True, post_process=True)
            model.train()
            generator = torch.Generator().manual_seed(0)  # the same tokens on every rank
            tokens = torch.randint(0, spec.model.vocab_size, (b, s), generator=generator)
            labels = torch.randint(0, spec.model.vocab_size, (b, s), generator=generator)
            position_ids = torch.arange(s).unsqueeze(0).expand(b, s)
            mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
            parts = [
                ("embedding", model.embedding),
                ("decoder", model.decoder),
                ("head", model.decoder.final_layernorm),
                *((f"layer {i}", layer) for i, layer in enumerate(model.decoder.layers)),
            ]
            with saved_bytes(parts, [*model.parameters(), position_ids, mask, labels], outside="head") as saved:
                loss = model(tokens, position_ids, mask, labels=labels).float().mean()
            loss.backward()
            return dict(saved.totals)
        finally:
            ps.destroy_model_parallel()


def main() -> int:
    import torch.distributed as dist

    from lmspec.compiler.backends.megatron_config import ParallelDegrees

    out, preset, recompute, tp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    dist.init_process_group("gloo")
    try:
        spec = megatron_spec(preset, recompute, f"parallel.tp={tp}", "parallel.sequence_parallel=true")
        measured = measure(spec, ParallelDegrees(tp=tp, sequence_parallel=True))
        if dist.get_rank() == 0:
            Path(out).write_text(json.dumps(measured))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
