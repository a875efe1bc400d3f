"""Bytes one checkpoint save writes, the disk `train.checkpoint.keep_last_k` of them hold, how long a
save stops training, and how often to save.

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

A save has two parts (runtime/train/checkpoint.py):

- staging: each rank copies its share of the step to host memory. The fully parallel strategy
  spreads the replicated shards over the data-parallel replicas, so a share is about
  bytes_per_save / world; it moves over the GPU's host link (HOST_COPY_BYTES_PER_S), on CPU ranks
  as a memory copy. The ranks are stopped for it, and the staged copies take host memory on every
  node (hardware.host_memory_gib).
- persist: every rank writes its staged share (all ranks at once, bounded by the storage's aggregate
  write bandwidth, `cluster.storage_write_gb_per_s`) and digests the bytes it writes as it writes
  them (xxh3_128, DIGEST_BYTES_PER_S, one core per rank, overlapped with the write); the manifest
  gathers the digests and the step is committed. No rank reads the step back.

Synchronous (train.checkpoint.async_save=false), the ranks wait for both, inside collectives.
Asynchronous (megatron-core's async save), training resumes after staging while a background process
persists; the next save waits for that persist if it is not done, and the wait is exposed again.
What is exposed is what the collective timeout (`cluster.nccl.timeout_minutes`) must cover
(rules/checkpoint.py). The interval that loses the least time to saves and to the work redone after
an interruption is Young's and Daly's, sqrt(2 x save cost x job MTBF) - save cost (`checkpoint_cadence`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.backends import backend_of
from lmspec.compiler.models.dims import device_kind, world_size
from lmspec.compiler.models.params import ParamCounts, count_params
from lmspec.compiler.models.train_memory import optimizer_states
from lmspec.compiler.models.units import FP32_BYTES, GB, GIB, SECONDS_PER_MINUTE, precision_bytes
from lmspec.compiler.spec.sections import TrainingSpec

SECONDS_PER_HOUR = 3600
# Device -> host, per GPU, every GPU of a node copying its share at once (pinned memory: megatron-core
# stages with tensor.to("cpu", non_blocking=True)). PCIe x16 per direction: Gen5 64 GB/s, Gen4 32 GB/s
# raw, about 50 and 25 GB/s in NVIDIA's bandwidthTest; halved for two GPUs behind one x16 switch uplink
# to the CPU, as DGX A100 and HGX H100 boards are built (and 8-card Ada servers behind their switches).
# HGX B200 and the MI300X/MI355X platforms put their GPUs on PCIe Gen5 behind switches as HGX H100 does.
# GB200's Grace reaches its GPUs over NVLink-C2C (900 GB/s), which no key states yet: priced as PCIe Gen5.
HOST_COPY_BYTES_PER_S = {
    "ampere": 12 * GB,
    "ada": 12 * GB,
    "hopper": 25 * GB,
    "blackwell": 25 * GB,
    "cdna3": 25 * GB,
    "cdna4": 25 * GB,
}
# CPU ranks: the share is in host memory already; staging is at most one copy of it (the fork's
# copy-on-write snapshot copies the pages training overwrites), read and written: half the memory bandwidth.
CPU_COPY_READS_AND_WRITES = 2
# xxhash's xxh3_128 on one core, measured for issue 40 on this project's CI machine (hashlib's sha256
# on the same core: 1.79 GB/s; blake3, one thread: 4.57 GB/s).
DIGEST_BYTES_PER_S = 25.8 * GB


@dataclass(frozen=True, kw_only=True)
class CheckpointSize:
    """One save of a training job, the disk its kept saves need, and the time it stops training."""

    params: int  # model total + MTP module
    weight_bytes_per_param: int  # the weights in the training dtype (0 under ZeRO-3 as emitted)
    master_bytes_per_param: int  # fp32 master weights (mixed precision; ZeRO-3's fp32 partitions); 0 for fp32
    moments: int  # optimizer states per parameter: Adam's exp_avg and exp_avg_sq, SGD's momentum
    moment_bytes_per_param: int  # those states, fp32
    bytes_per_save: int
    saves_kept: int  # train.checkpoint.keep_last_k
    kept_bytes: int  # keep_last_k complete saves
    peak_bytes: int  # during a save: the kept ones and the one being written (pruned after it completes)
    async_save: bool  # train.checkpoint.async_save
    ranks: int  # the world: every rank stages and writes a share
    bytes_per_rank: float  # one rank's share: bytes_per_save / ranks (the fully parallel strategy)
    host_copy_bytes_per_s: float  # one rank's device -> host copy (HOST_COPY_BYTES_PER_S; CPU: a memory copy)
    staging_s: float  # the ranks stopped while each copies its share to host memory
    host_bytes_per_node: int  # the staged shares of one node's ranks, in its host memory
    host_memory_bytes: int | None  # hardware.host_memory_gib; None = unknown
    storage_write_bytes_per_s: float  # cluster.storage_write_gb_per_s
    write_s: float  # every rank's share written, at the storage's aggregate bandwidth
    digest_s: float  # one rank digesting its share (xxh3_128) as it writes it, overlapped with the write
    timeout_s: float  # cluster.nccl.timeout_minutes

    @property
    def optimizer_bytes_per_param(self) -> int:
        return self.master_bytes_per_param + self.moment_bytes_per_param

    @property
    def bytes_per_param(self) -> int:
        return self.weight_bytes_per_param + self.optimizer_bytes_per_param

    @property
    def persist_s(self) -> float:
        """The staged step written, digested and committed: the write, or the digest where it is slower."""
        return max(self.write_s, self.digest_s)

    @property
    def exposed_s(self) -> float:
        """How long one save stops training (before any wait for the previous save's persist)."""
        return self.staging_s if self.async_save else self.staging_s + self.persist_s

    @property
    def overlapped_s(self) -> float:
        """The part of a save that runs while training continues: the persist, when asynchronous."""
        return self.persist_s if self.async_save else 0.0

    def exposed_at(self, interval_s: float) -> float:
        """One save's exposed time when saves start `interval_s` apart: an asynchronous save also waits
        for the previous one's persist when that outlasts the interval."""
        return self.exposed_s + (max(0.0, self.persist_s - interval_s) if self.async_save else 0.0)

    @property
    def host_fits(self) -> bool | None:
        """Whether one node's staged shares fit its host memory; None when hardware.host_memory_gib is unknown."""
        return None if self.host_memory_bytes is None else self.host_bytes_per_node <= self.host_memory_bytes


def checkpoint_bytes_per_param(spec: TrainingSpec) -> tuple[int, int]:
    """(weight bytes, fp32 master bytes) one save writes per parameter, beside the optimizer's moments."""
    t, p = spec.train, spec.parallel
    if backend_of(spec).zero_sharding and p.zero_stage == 3:
        # the 16-bit weights are not gathered on save; the fp32 partitions (the weights under fp32) are
        return 0, FP32_BYTES
    return precision_bytes(t.precision), FP32_BYTES if t.precision != "fp32" else 0


def host_copy_bytes_per_s(spec: TrainingSpec) -> float:
    gpu = spec.hardware.gpu
    if device_kind(spec) == "cpu":
        return gpu.hbm_gb_per_s * GB / CPU_COPY_READS_AND_WRITES
    return HOST_COPY_BYTES_PER_S.get(gpu.generation, HOST_COPY_BYTES_PER_S["ampere"])


def checkpoint_size(spec: TrainingSpec, counts: ParamCounts | None = None) -> CheckpointSize:
    counts = counts if counts is not None else count_params(spec.model)
    params = counts.total + counts.mtp
    weights, master = checkpoint_bytes_per_param(spec)
    moments = optimizer_states(spec)
    per_save = params * (weights + master + moments * FP32_BYTES)
    keep = spec.train.checkpoint.keep_last_k
    hw = spec.hardware
    ranks = world_size(hw.gpus_per_node, hw.nodes)
    per_rank = per_save / ranks
    copy_rate = host_copy_bytes_per_s(spec)
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
        async_save=spec.train.checkpoint.async_save,
        ranks=ranks,
        bytes_per_rank=per_rank,
        host_copy_bytes_per_s=copy_rate,
        staging_s=per_rank / copy_rate,
        host_bytes_per_node=math.ceil(per_rank * hw.gpus_per_node),
        host_memory_bytes=round(hw.host_memory_gib * GIB) if hw.host_memory_gib is not None else None,
        storage_write_bytes_per_s=bandwidth,
        write_s=per_save / bandwidth,
        digest_s=per_rank / DIGEST_BYTES_PER_S,
        timeout_s=spec.cluster.nccl.timeout_minutes * SECONDS_PER_MINUTE,
    )


@dataclass(frozen=True, kw_only=True)
class CheckpointCadence:
    """The saves of a run at the estimated step time: what each stops training for, and the interval that
    loses the least to saves and to the work redone after an interruption (Young 1974; Daly 2006 to first
    order: sqrt(2 x C x MTBF) - C, C being what a save exposes at that interval)."""

    step_s: float  # the estimated step time (compiler/models/steptime.py)
    interval_steps: int  # train.checkpoint.interval
    wait_s: float  # an asynchronous save waiting for the previous persist: persist - interval, when positive
    exposed_per_save_s: float  # staging (+ the persist when synchronous) + wait: what the collective timeout covers
    job_mtbf_s: float  # cluster.node_mtbf_hours / hardware.nodes
    young_interval_s: float  # sqrt(2 x C x job MTBF) - C, C a save's exposed time without any wait
    advised_interval_s: float  # Young/Daly's, or for an asynchronous save the persist where that is shorter
    advice: Advice  # which bound advised_interval_s is (young_daly_interval_s)
    advised_interval_steps: int  # the advice in whole steps, at least 1
    lost_share: float  # of the run's time, at train.checkpoint.interval: saves + half an interval redone per failure
    advised_lost_share: float  # the same at advised_interval_steps

    @property
    def interval_s(self) -> float:
        return self.interval_steps * self.step_s


def lost_share(c: CheckpointSize, interval_s: float, job_mtbf_s: float) -> float:
    """The run's time lost, to first order (Daly 2006): a cycle is the interval's training plus a save's exposed
    time; each cycle loses that exposed time, and each interruption (one per job MTBF) half a cycle of work
    redone. At most the whole run."""
    exposed = c.exposed_at(interval_s)
    cycle = interval_s + exposed
    return min(1.0, exposed / cycle + cycle / (2 * job_mtbf_s))


Advice = Literal["young", "persist"]


def young_daly_interval_s(c: CheckpointSize, job_mtbf_s: float) -> tuple[float, Advice]:
    """The interval minimising `lost_share`, and which bound it is. With a save exposing C: Daly's first order,
    sqrt(2 x C x M) - C ("young"). Asynchronous, C is the staging while the interval outlasts the persist; below
    it a cycle is staging + persist whatever the interval, and a longer interval only waits less: the persist
    itself ("persist") where Young/Daly's interval is shorter."""
    young = max(0.0, math.sqrt(2 * c.exposed_s * job_mtbf_s) - c.exposed_s)
    if c.async_save and young < c.persist_s:
        return c.persist_s, "persist"
    return young, "young"


def checkpoint_cadence(c: CheckpointSize, spec: TrainingSpec, step_s: float) -> CheckpointCadence:
    interval = spec.train.checkpoint.interval
    interval_s = interval * step_s
    mtbf = spec.cluster.node_mtbf_hours * SECONDS_PER_HOUR / spec.hardware.nodes
    advised_s, advice = young_daly_interval_s(c, mtbf)
    # the whole number of steps either side of it that loses less (below the persist a save would wait)
    advised_steps = min(
        {max(1, math.floor(advised_s / step_s)), max(1, math.ceil(advised_s / step_s))},
        key=lambda n: lost_share(c, n * step_s, mtbf),
    )
    return CheckpointCadence(
        step_s=step_s,
        interval_steps=interval,
        wait_s=c.exposed_at(interval_s) - c.exposed_s,
        exposed_per_save_s=c.exposed_at(interval_s),
        job_mtbf_s=mtbf,
        young_interval_s=max(0.0, math.sqrt(2 * c.exposed_s * mtbf) - c.exposed_s),
        advised_interval_s=advised_s,
        advice=advice,
        advised_interval_steps=advised_steps,
        lost_share=lost_share(c, interval_s, mtbf),
        advised_lost_share=lost_share(c, advised_steps * step_s, mtbf),
    )
