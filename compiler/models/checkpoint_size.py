"""Bytes one checkpoint save writes, the disk `train.checkpoint.keep_last_k` of them hold, and how long a
save keeps the ranks waiting.

What a save writes (runtime/train/checkpoint.py lays it out) is the full training state, not the
weights alone, so a resumed run continues bit for bit:

- Megatron (`dist_checkpointing.save` of `{"model": sharded_state_dict, "optimizer":
  optimizer.sharded_state_dict}`, torch_dist format): the model's weights in the training dtype,
  plus the optimizer's state: fp32 master weights and Adam's exp_avg and exp_avg_sq. Every tensor
  is written once (replicas are deduplicated by replica id), whatever TP/PP/EP/DP shard it, so the
  bytes do not depend on the layout. bf16 (and fp8: TE casts FP8 copies from the bf16 weights on the
  fly and saves only their scales) with Adam: 2 + 4 + 4 + 4 = 14 B/param.
- DeepSpeed (`engine.save_checkpoint`): ZeRO 0-2 write the 16-bit module once (model_states) and
  the fp32 partitions with Adam's moments (optim_states), 14 B/param too; ZeRO-3 as emitted
  (stage3_gather_16bit_weights_on_model_save=False) writes no 16-bit weights, only the fp32
  partitions and moments: 12 B/param.
- fp32 training holds no master copy (the weights are it, as compiler/models/train_memory.py counts
  the state): 4 + 8 = 12 B/param with Adam. SGD keeps one moment instead of two.

The parameters are the model's total plus its multi-token-prediction module (trained and saved with
it, not in the published size; its embedding and head are the model's, saved once). Per-rank trainer
state (step, RNG, scheduler) and metadata are kilobytes and not counted.

A save holds the ranks in collectives twice (runtime/train/checkpoint.py): every rank writes its
shards and waits for the others (the storage's aggregate write bandwidth,
`cluster.storage_write_gb_per_s`, bounds that), then rank 0 fsyncs and sha256-hashes every file of
the step for its manifest while all other ranks wait in a barrier (one process reading it back:
MANIFEST_HASH_BYTES_PER_S). Both waits count against the collective timeout
(`cluster.nccl.timeout_minutes`), which rules/checkpoint.py compares with their sum.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmspec.compiler.backends import backend_of
from lmspec.compiler.models.params import ParamCounts, count_params
from lmspec.compiler.models.train_memory import optimizer_states
from lmspec.compiler.models.units import FP32_BYTES, GB, SECONDS_PER_MINUTE, precision_bytes
from lmspec.compiler.spec.sections import TrainingSpec

# One process reading a step back and hashing it with hashlib's sha256 (SHA-NI: ~1.8 GB/s on one core
# of the machine this was measured on; reading back from a parallel filesystem is of the same order).
MANIFEST_HASH_BYTES_PER_S = 1.5 * GB


@dataclass(frozen=True, kw_only=True)
class CheckpointSize:
    """One save of a training job, and the disk its kept saves need."""

    params: int  # model total + MTP module
    weight_bytes_per_param: int  # the weights in the training dtype (0 under ZeRO-3 as emitted)
    master_bytes_per_param: int  # fp32 master weights (mixed precision; ZeRO-3's fp32 partitions); 0 for fp32
    moments: int  # optimizer states per parameter: Adam's exp_avg and exp_avg_sq, SGD's momentum
    moment_bytes_per_param: int  # those states, fp32
    bytes_per_save: int
    saves_kept: int  # train.checkpoint.keep_last_k
    kept_bytes: int  # keep_last_k complete saves
    peak_bytes: int  # during a save: the kept ones and the one being written (pruned after it completes)
    storage_write_bytes_per_s: float  # cluster.storage_write_gb_per_s
    write_s: float  # every rank's shards written, at the storage's aggregate bandwidth
    manifest_s: float  # rank 0 hashing the step for its manifest, the others in a barrier
    timeout_s: float  # cluster.nccl.timeout_minutes

    @property
    def optimizer_bytes_per_param(self) -> int:
        return self.master_bytes_per_param + self.moment_bytes_per_param

    @property
    def bytes_per_param(self) -> int:
        return self.weight_bytes_per_param + self.optimizer_bytes_per_param

    @property
    def save_s(self) -> float:
        """How long one save holds the ranks in collectives."""
        return self.write_s + self.manifest_s

    @property
    def outlasts_timeout(self) -> bool:
        return self.save_s > self.timeout_s


def checkpoint_bytes_per_param(spec: TrainingSpec) -> tuple[int, int]:
    """(weight bytes, fp32 master bytes) one save writes per parameter, beside the optimizer's moments."""
    t, p = spec.train, spec.parallel
    if backend_of(spec).zero_sharding and p.zero_stage == 3:
        # the 16-bit weights are not gathered on save; the fp32 partitions (the weights under fp32) are
        return 0, FP32_BYTES
    return precision_bytes(t.precision), FP32_BYTES if t.precision != "fp32" else 0


def checkpoint_size(spec: TrainingSpec, counts: ParamCounts | None = None) -> CheckpointSize:
    counts = counts if counts is not None else count_params(spec.model)
    params = counts.total + counts.mtp
    weights, master = checkpoint_bytes_per_param(spec)
    moments = optimizer_states(spec)
    per_save = params * (weights + master + moments * FP32_BYTES)
    keep = spec.train.checkpoint.keep_last_k
    bandwidth = spec.cluster.storage_write_gb_per_s * GB
    return CheckpointSize(
        params=params,
        weight_bytes_per_param=weights,
        master_bytes_per_param=master,
        moments=moments,
        moment_bytes_per_param=moments * FP32_BYTES,
        bytes_per_save=per_save,
        saves_kept=keep,
        kept_bytes=keep * per_save,
        peak_bytes=(keep + 1) * per_save,
        storage_write_bytes_per_s=bandwidth,
        write_s=per_save / bandwidth,
        manifest_s=per_save / MANIFEST_HASH_BYTES_PER_S,
        timeout_s=spec.cluster.nccl.timeout_minutes * SECONDS_PER_MINUTE,
    )
