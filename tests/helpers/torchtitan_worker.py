"""Train a few steps with the torchtitan backend's trainer, outside `lmspec run` (HSDP, TP, resumes at any step).

    python -m torch.distributed.run --nproc-per-node=W -m helpers.torchtitan_worker JOB.json

JOB.json: {"overrides": [...], "replicate": R, "tp": T, "pp": P, "virtual_stages": V|null,
"activation_checkpoint": "none"|"full"|"selective",
"first_step": F, "last_step": K, "save_after": k|null, "load": DIR|null,
"init_from": DIR|null, "checkpoints": DIR, "results": FILE}.
Each rank compiles the built-in spec with the overrides as a torchtitan job on W ranks (fully sharded; T-way
tensor and sequence parallelism, a P-stage pipeline (V stages per rank: Interleaved1F1B) and full activation
checkpointing where asked) and trains with the document its build would hold, R-way replication of
W/(R T P)-way shards written over it. The samples are a pure function of their global index (`SyntheticTokens`)
and each rank takes its data-parallel rank's micro-batches of the global batch as the runtime's loop does
(lmspec.runtime.train.data.micro_batches), so 1, 2 and 4 ranks train on the same global batches. Steps F..K
run; after step k the trainer saves into DIR/step_k; with `load` it first loads that directory (F is then
k + 1); with `init_from` it starts from that step directory's weights alone. Rank 0 writes FILE: {"losses",
"grad_norms", "lrs"} keyed by step, "eval_loss" (after the last step, the same samples on any layout),
"checkpointed" (the decoder layers in checkpoint_wrapper), "seconds".
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from lmspec.compiler.emit.torchtitan_config import torchtitan_config
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan
from lmspec.runtime.train.data import micro_batches
from lmspec.runtime.train.torchtitan.trainer import TorchtitanTrainer

EVAL_SAMPLES = 8  # after the last step, the loss over samples VALID_FIRST... (a multiple of micro x world)
VALID_FIRST = 1_000_000


class SyntheticTokens:
    """Sample i: an arithmetic sequence modulo the vocabulary whose start and stride come from a generator
    seeded with i, so a model can learn it (the loss falls) and every rank reads the same sample i."""

    def __init__(self, vocab: int, seq_length: int) -> None:
        self.vocab, self.seq_length = vocab, seq_length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(1_000_003 + index)
        start, stride = (int(v) for v in torch.randint(0, self.vocab, (2,), generator=generator))
        tokens = (start + (1 + stride % 7) * torch.arange(self.seq_length + 1)) % self.vocab
        return {"tokens": tokens[:-1].contiguous(), "labels": tokens[1:].contiguous()}


def job_config(plan: Plan, replicate: int) -> dict[str, Any]:
    """torchtitan.json as a build of `plan` holds it (compiler/emit/torchtitan_config.py), with `replicate`-way
    HSDP replication of its shards written over the degrees where asked (no spec key asks for it yet)."""
    document = torchtitan_config(plan)
    if replicate > 1:
        layout = plan.trained().layout
        shards = layout.world_size // (replicate * layout.tp * layout.pp)
        document["parallelism"].update(data_parallel_replicate_degree=replicate, data_parallel_shard_degree=shards)
    return document


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    recompute = job["activation_checkpoint"]  # train.recompute's values are torchtitan's modes
    sharding = "parallel.zero_stage=3" if world > 1 else "parallel.zero_stage=0"
    tp = [f"parallel.tp={job['tp']}", f"parallel.sequence_parallel={str(job['tp'] > 1).lower()}"]
    virtual = "null" if job["virtual_stages"] is None else job["virtual_stages"]
    pp = [f"parallel.pp={job['pp']}", f"parallel.virtual_stages={virtual}"]
    init_from = [] if job["init_from"] is None else [f"train.init_from={job['init_from']}"]
    plan = make_plan(
        ["train.backend=torchtitan", sharding, f"train.recompute={recompute}", f"hardware.gpus_per_node={world}"]
        + tp
        + pp
        + init_from
        + job["overrides"]
    )
    spec = plan.trained().spec
    trainer = TorchtitanTrainer(spec, plan, job_config(plan, job["replicate"]))
    checkpoints = Path(job["checkpoints"])
    if job["load"] is not None:
        trainer.load(Path(job["load"]))
    if job["init_from"] is not None:
        trainer.init_from(Path(job["init_from"]))
    data = SyntheticTokens(spec.model.vocab_size, spec.train.seq_length)
    record: dict[str, dict[int, float]] = {"losses": {}, "grad_norms": {}, "lrs": {}}
    started = time.perf_counter()
    for step in range(job["first_step"], job["last_step"] + 1):
        consumed = (step - 1) * spec.train.global_batch_size
        batches = micro_batches(
            data, consumed, trainer.micro_batch_size, trainer.dp_rank, trainer.dp_size, trainer.num_micro_batches
        )
        loss, grad_norm, lr = trainer.train_step(batches, step)
        for key, value in (("losses", loss), ("grad_norms", grad_norm), ("lrs", lr)):
            record[key][step] = value
        if step == job["save_after"]:
            trainer.save(checkpoints / f"step_{step}")
    seconds = time.perf_counter() - started
    count = EVAL_SAMPLES // (trainer.micro_batch_size * trainer.dp_size)  # the same samples on any layout
    valid = micro_batches(data, VALID_FIRST, trainer.micro_batch_size, trainer.dp_rank, trainer.dp_size, count)
    eval_loss = trainer.eval_loss(valid)
    checkpointed = sum(isinstance(m, CheckpointWrapper) for part in trainer.model_parts for m in part.modules())
    trainer.close()
    if dist.get_rank() == 0:
        summary = {"eval_loss": eval_loss, "checkpointed": checkpointed, "seconds": seconds}
        Path(job["results"]).write_text(json.dumps({**record, **summary}) + "\n")
    # every rank done with its collectives before any destroys its gloo pairs: without it a rank's teardown
    # aborted in 1-2 of 5 four-rank runs ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
