"""Write a synthetic Megatron torch_dist checkpoint for a build, sharded as its mapping says.

    torchrun --nproc-per-node=<tp> bench/synthetic_checkpoint.py <build dir>

Each TP rank saves, through megatron-core's own dist_checkpointing, random data for the
regions of every model tensor that its rank holds (`Transform.boxes`): the stored
chunks, keys (stacked layer axis included) and offsets are those of a real TP-sharded
training checkpoint, without training. It goes to `<train.checkpoint.dir>/step_1/torch_dist`,
written by the trainer's own Checkpoints (manifest, run id, `latest`). For memory and throughput
tests of the converter, not for its correctness (that is what the logits tests are for).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lmspec.compiler.conversion.document import tensors  # noqa: E402

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sharded_state(doc: dict, tp_rank: int) -> dict:
    from megatron.core.dist_checkpointing import ShardedTensor

    todo = tensors(doc)
    lead_sizes: dict[str, list[int]] = {}  # sizes of each key's leading (stacked layer, expert) axes
    for t in todo:
        sizes = lead_sizes.setdefault(t.key, [0] * len(t.index))
        lead_sizes[t.key] = [max(s, i + 1) for s, i in zip(sizes, t.index)]
    state = {}
    for n, t in enumerate(todo):
        tr = t.transform
        for b, box in enumerate(tr.boxes(tp_rank)):
            if tr.split_dim is None and tp_rank > 0:
                continue  # replicated: rank 0's copy is the stored one
            local = tuple(hi - lo for lo, hi in box)
            gen = torch.Generator().manual_seed(n * 1000 + tp_rank * 10 + b)
            data = torch.randn(local, generator=gen, dtype=torch.float32).to(_DTYPES[t.dtype])
            lead = tuple(1 for _ in t.index)
            data = data.reshape(lead + local)
            offsets = [(i, idx, size) for i, (idx, size) in enumerate(zip(t.index, lead_sizes[t.key]))]
            if tr.split_dim is not None:
                d = tr.split_dim
                length = box[d][1] - box[d][0]
                offsets.append((len(lead) + d, box[d][0] // length, tr.shape[d] // length))
            state[f"{t.label}#{b}"] = ShardedTensor.from_rank_offsets(t.key, data, *offsets, replica_id=0)
    return state


def main(build_dir: Path) -> None:
    from megatron.core import dist_checkpointing

    from lmspec.compiler.build.files import DIST_CKPT_DIR
    from lmspec.compiler.build.reader import Build
    from lmspec.runtime.compat.megatron import megatron_on_cpu
    from lmspec.runtime.train.checkpoint import Checkpoints

    dist.init_process_group("gloo")
    build = Build.open(build_dir)
    ckpts = Checkpoints(Path(build.training().train.checkpoint.dir), keep_last_k=1)
    tmp = ckpts.begin_save(1)  # the trainer's own writer: manifest, run id, `latest`
    target = tmp / DIST_CKPT_DIR
    if dist.get_rank() == 0:
        target.mkdir()
    dist.barrier()
    with megatron_on_cpu():  # dist_checkpointing asks for a CUDA device; on a CPU machine it gets the CPU
        dist_checkpointing.save(sharded_state(build.mapping, dist.get_rank()), str(target))
    final = ckpts.commit(1, tmp) / DIST_CKPT_DIR
    if dist.get_rank() == 0:
        size = sum(p.stat().st_size for p in final.iterdir())
        print(json.dumps({"checkpoint": str(final), "bytes": size}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]))
