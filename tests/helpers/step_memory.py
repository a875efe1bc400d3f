"""One training step's peak of allocated bytes per rank, measured through the runtime's own trainer on CPU.

    python -m torch.distributed.run --nproc-per-node=W -m helpers.step_memory RESULTS BUILD

What a GPU's `torch.cuda.max_memory_allocated` reports, counted exactly on CPU: each build's trainer
(lmspec.runtime.train.loop.make_trainer, as `lmspec run` makes it) trains step 1 on random tokens, so
that every buffer and optimizer state a step keeps exists; then, at the start of step 2, the live bytes of
every tensor storage Python can reach (gc, each storage once) are the level the step begins at, and the
CPU allocator's own events (torch.profiler, profile_memory) during step 2 give the peak above it. On a
GPU the same two numbers are memory_allocated() before the step and max_memory_allocated() after.
One build a process: what an earlier trainer leaves (megatron-core's global buffers, DeepSpeed's engine
registry) would count in the next one's level. Rank r writes RESULTS.r: {"stage", "start", "peak", "end"}
(bytes) and "where" (the ops running at the peak).
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from lmspec.runtime.compat.megatron import megatron_on_cpu
from lmspec.runtime.train.data import Batch
from lmspec.runtime.train.loop import init_distributed, load_build, make_trainer


def live_tensor_bytes() -> int:
    """Bytes of every CPU tensor storage reachable from Python, each storage once."""
    gc.collect()
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.is_meta:
            try:
                storage = obj.untyped_storage()
                pointer = storage.data_ptr()
            except (RuntimeError, NotImplementedError):  # a fake tensor (traced code) or a subclass without storage
                continue
            storages[pointer] = max(storages.get(pointer, 0), storage.nbytes())
    return sum(storages.values())


def _ops(node: object) -> list[str]:
    """The names of the ops a profiler event ran under, outermost first."""
    names = []
    parent = getattr(node, "parent", None)
    while parent is not None:
        names.append(parent.name)
        parent = parent.parent
    return names[::-1]


def _inside_gloo(ops: list[str]) -> bool:
    """gloo's own staging copies, made inside a c10d collective (NCCL on a GPU makes none)."""
    return any(op.startswith(("c10d::", "gloo:")) for op in ops)


def peak_above_start(profiler: profile) -> tuple[int, str]:
    """The highest running sum of the allocator's events, in time order: the peak above the level the
    profiled region began at; and the ops running when it was reached, outermost first.

    Two things gloo does on CPU that NCCL does not are left out: the copies a collective makes of its
    tensors inside the c10d op, and their frees, which gloo's worker thread makes where the profiler does not
    follow. A tensor whose last reference that thread drops has no free event either: when its address is
    allocated again, the old block is taken off first (the allocator cannot hand out a live address)."""
    allocations = []
    pending = list(profiler.profiler.kineto_results.experimental_event_tree())
    while pending:
        node = pending.pop()
        if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu":
            allocations.append(node)
        pending.extend(node.children)
    live: dict[int, int] = {}
    staging: set[int] = set()
    level = peak = 0
    at: list[str] = []
    for node in sorted(allocations, key=lambda n: n.start_time_ns):
        event = node.typed[1]
        if event.alloc_size > 0:
            level -= live.pop(event.ptr, 0)
            staging.discard(event.ptr)
            ops = _ops(node)
            if _inside_gloo(ops):
                staging.add(event.ptr)
                continue
            level += event.alloc_size
            live[event.ptr] = event.alloc_size
        elif event.ptr in staging:
            staging.discard(event.ptr)
            continue
        else:  # a block the step made, or one it began with (the previous step's gradients)
            level -= live.pop(event.ptr, -event.alloc_size)
            ops = []
        if level > peak:
            peak, at = level, ops
    return peak, " > ".join(at)


def _staged(collective: Callable[..., Any], outputs: int) -> Callable[..., Any]:
    """`collective` run on private copies of its tensor arguments (the first `outputs` of them written
    back), made inside a `c10d::` region peak_above_start leaves out, and completed before it returns.

    gloo's work object holds the tensors it is given, and its worker thread may drop the last reference to
    one: a free the profiler does not record, so the block would stay live in the replay (a row-parallel
    output, a column-parallel input gradient, an all-to-all's buffers, at random). With the copies every
    block the step allocates is freed on the main thread; NCCL on a GPU frees them with their last Python
    reference as here. DDP's coalesced bucket reduction (its persistent grad buffer) runs as it is."""

    def run(*args: Any, async_op: bool = False, **kwargs: Any) -> Any:
        if dist.distributed_c10d._world.pg_coalesce_state:
            return collective(*args, async_op=async_op, **kwargs)
        with torch.profiler.record_function("c10d::staging"):
            staged = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            work = collective(*staged, async_op=True, **kwargs)
            work.wait()
            for tensor, copy in list(zip(args, staged))[:outputs]:
                tensor.copy_(copy)
            del staged
        return work if async_op else None

    return run


def _stage_collectives() -> None:
    """Route the collectives megatron-core and DeepSpeed call through `_staged` (they look them up on
    torch.distributed at each call)."""
    for name in ("all_reduce", "all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor"):
        setattr(dist, name, _staged(getattr(dist, name), outputs=1))


def _batches(vocab: int, micro_batch_size: int, seq_length: int, count: int) -> list[Batch]:
    generator = torch.Generator().manual_seed(dist.get_rank())
    out = []
    for _ in range(count):
        tokens = torch.randint(0, vocab, (micro_batch_size, seq_length + 1), generator=generator)
        out.append(Batch(tokens=tokens[:, :-1].contiguous(), labels=tokens[:, 1:].contiguous()))
    return out


def measure(build_dir: Path) -> dict[str, int | str]:
    build = load_build(build_dir)
    spec = build.training()
    trainer = make_trainer(build)
    stage = getattr(trainer, "pp_rank", None)  # the torchtitan trainer's pipeline rank
    stage = _pipeline_rank() if stage is None else stage
    t = spec.train
    batches = _batches(spec.model.vocab_size, trainer.micro_batch_size, t.seq_length, trainer.num_micro_batches)
    trainer.train_step(batches, 1)
    start = live_tensor_bytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        trainer.train_step(batches, 2)
    peak, where = peak_above_start(prof)
    end = live_tensor_bytes()
    trainer.close()
    return {"stage": stage, "start": start, "peak": start + peak, "end": end, "where": where}


def _pipeline_rank() -> int:
    """This rank's pipeline stage as megatron-core placed it; 0 where there is no model-parallel state
    (DeepSpeed). (The torchtitan trainer says its own: `pp_rank`.)"""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0
    return int(parallel_state.get_pipeline_model_parallel_rank())


def main(argv: list[str]) -> int:
    results, build_dir = Path(argv[0]), Path(argv[1])
    build = load_build(build_dir)
    init_distributed(build.training(), build.plan)
    _stage_collectives()
    with megatron_on_cpu():
        record = measure(build_dir)
    Path(f"{results}.{dist.get_rank()}").write_text(json.dumps(record) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
