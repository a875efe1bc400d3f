"""Communication per optimizer step and GPU: bytes on the wire of each parallel dimension, and the links they cross.

Ring collectives: an all-reduce sends 2(n-1)/n of the buffer per GPU, a reduce-scatter or an
all-gather (n-1)/n, an all-to-all (n-1)/n. Traffic per step:

- TP (Megatron): 2 all-reduces per layer in forward and 2 in backward (SP turns each into a
  reduce-scatter + all-gather of the same volume) of s x b x h activations; full recompute
  repeats the forward ones.
- DP: `dp_traffic`, the collectives each backend really runs (see there); dense parameters over
  dp x cp, routed experts over the expert-data-parallel group.
- EP: dispatch and combine all-to-alls of the top-k token copies, forward and backward.
- PP: activations forward and their gradients backward between neighbouring stages.

A group stays on the intra-node link when its span fits in one NVLink domain (`ParallelDims`' spans: a node,
or the hosts of a rack NVLink joins). A ring that leaves the domain crosses the network once per node and
ring, so NCCL runs one ring per NIC: the group's members in one node share the node's NICs
(`Links.ring_bytes_per_s`). AMD's Infinity Fabric is no switch but a full mesh of point-to-point links, so a
group of n GPUs of a node uses n - 1 of each GPU's links (`Links.intra_for`). What is hidden behind compute, and
the seconds these volumes take, is the step-time model's (compiler/models/steptime_comm.py): plan.json's
`comm` is that computation's communication with nothing overlapped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models import larger, pick, smaller
from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.models.params import count_params, layer_params
from lmspec.compiler.models.stages import stage_params
from lmspec.compiler.models.train_memory import TrainMemory
from lmspec.compiler.models.units import FP32_BYTES, precision_bytes
from lmspec.compiler.spec.sections import TrainingSpec

COMM_SHARE_WARNING = 0.30  # the seed: communication above 30% of compute time is where TP stops paying


@dataclass(frozen=True, kw_only=True)
class CommEstimate:
    """Seconds per step of each dimension's communication with nothing overlapped, next to the step's compute."""

    tp_s: float
    dp_s: float
    ep_s: float
    pp_s: float
    compute_s: float
    cp_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.tp_s + self.dp_s + self.ep_s + self.pp_s + self.cp_s

    @property
    def ratio_to_compute(self) -> float:
        return self.total_s / self.compute_s if self.compute_s else 0.0

    @property
    def share_of_step(self) -> float:
        """Communication over (compute + communication): the step time with nothing overlapped."""
        step = self.compute_s + self.total_s
        return self.total_s / step if step else 0.0


@dataclass(frozen=True)
class Links:
    """Bytes/s one GPU moves inside its NVLink domain, and over its share of the node's NICs."""

    intra_bytes_per_s: float
    inter_bytes_per_s: float
    mesh_peers: int = 0  # a full mesh (xGMI): the peers each GPU has a link to; 0 = a switch (NVSwitch, PCIe)

    def intra_for(self, members: Any) -> Any:
        """Bus bandwidth among `members` GPUs of one domain: the whole link through a switch; on a full
        mesh the share of a GPU's links that reach the other members (an MI300X pair: 1 of 7 links)."""
        if not self.mesh_peers:
            return self.intra_bytes_per_s + 0 * members
        used = smaller(larger(members - 1, 1), self.mesh_peers)
        return self.intra_bytes_per_s * used / self.mesh_peers

    def ring_bytes_per_s(self, dims: ParallelDims, span: Any, stride: Any = 1) -> Any:
        """Bus bandwidth of a ring over a group whose members lie `stride` ranks apart within `span`
        consecutive ranks. Inside an NVLink domain: the intra-node link. Beyond it each ring crosses the
        network once per node, so the group's members in one node (gpus_per_node / stride of them,
        at least 1) drive that many GPUs' share of the NICs, up to the intra-node link's rate."""
        per_node = larger(smaller(dims.gpus_per_node // stride, span // stride), 1)
        in_domain = larger(smaller(dims.domain_gpus // stride, span // stride), 1)
        intra = self.intra_for(in_domain)
        inter = smaller(self.inter_bytes_per_s * per_node, intra)
        return pick(dims.spans_nodes(span), inter, intra)


def ring(n: Any) -> Any:
    """Share of a buffer each of n ranks sends in a reduce-scatter, all-gather or all-to-all (0 at n = 1).

    This and the volume functions below are plain arithmetic on ints or numpy arrays: `lmspec plan`
    prices its candidates' traffic with them (compiler/models/steptime_comm.py)."""
    return (n - 1) / n


def tp_bytes_per_micro_batch(
    layers: Any, full_recompute: Any, tp: Any, tokens: Any, hidden: int, element_bytes: int
) -> Any:
    """TP: 4 collectives per layer (6 with full recompute), each ~ an all-reduce of tokens x hidden."""
    return layers * (4 + 2 * full_recompute) * 2 * ring(tp) * tokens * hidden * element_bytes


def ep_bytes_per_micro_batch(
    moe_layers: Any, ep: Any, tokens: Any, tp_split: Any, top_k: int, hidden: int, element_bytes: int
) -> Any:
    """EP: dispatch and combine all-to-alls, forward and backward, of the top-k token copies."""
    return moe_layers * 4 * ring(ep) * tokens / tp_split * top_k * hidden * element_bytes


def pp_bytes_per_micro_batch(tokens: Any, tp_split: Any, hidden: int, element_bytes: int) -> Any:
    """PP: one activation forward and one gradient backward per stage boundary."""
    return 2 * tokens * hidden * element_bytes / tp_split


def dp_grad_bytes(in_fp32: Any, precision: str) -> Any:
    """Bytes per gradient element on the wire: fp32 where the backend reduces in fp32 (its
    `grad_reduce_in_fp32`: Megatron under bf16/fp16, megatron/config.json's DDP section), else the model's
    dtype (DeepSpeed's `communication_data_type` default)."""
    return pick(in_fp32, FP32_BYTES, precision_bytes(precision))


@dataclass(frozen=True)
class DpTraffic:
    """Bytes per parameter each data-parallel collective moves, in units of one reduce-scatter or
    all-gather ring share (n-1)/n, by when it runs in the step."""

    reduce: Any  # after the last micro-batch's backward: its window, with parallel.overlap.grad_reduce
    gather: Any  # before the next step's first forward: its window, with parallel.overlap.param_gather
    every: Any  # on every micro-batch (ZeRO-2 reduce-scatter, ZeRO-3 gathers)


def dp_traffic(
    zero_stage: Any, distributed_optimizer: Any, grad_bytes: Any, param_bytes: Any, every_micro_batch: Any = 0
) -> DpTraffic:
    """The collectives each sharding runs:

    - unsharded (Megatron DDP, DeepSpeed ZeRO-0): one all-reduce of the gradients per step
      (2 x grad bytes; Megatron bf16: 2 x 4 = 8). No weights travel: every rank updates all of them.
    - Megatron distributed optimizer, ZeRO-1: a reduce-scatter of the gradients, then an
      all-gather of the updated weights, once per step (grad + param bytes; Megatron bf16: 4 + 2 = 6).
    - ZeRO-2: gradients are reduce-scattered in backward on every micro-batch (its partitioned
      buffers hold no full gradients to accumulate in), weights all-gathered once after the step.
    - ZeRO-3: every micro-batch gathers the weights for forward and again for backward and
      reduce-scatters the gradients (grad + 2 x param bytes); nothing is left for the step.
    - `every_micro_batch` (FSDP2 as torchtitan runs it, TrainingBackend.fsdp): each
      micro-batch reduces its gradients into the sharded ones and the next forward gathers the weights, so
      replicated gradients are all-reduced per micro-batch (2 x grad bytes) and SHARD_GRAD_OP gathers its
      weights per micro-batch (grad + param bytes).
    """
    sharded = (distributed_optimizer != 0) | (zero_stage > 0)
    zero2, zero3 = zero_stage == 2, zero_stage == 3
    replicated_each = every_micro_batch * (zero_stage == 0)
    zero2_each = every_micro_batch * zero2
    reduce = pick(zero2 | zero3 | (replicated_each != 0), 0, pick(sharded, grad_bytes, 2 * grad_bytes))
    gather = pick(zero3 | (zero2_each != 0), 0, pick(sharded, param_bytes, 0))
    every = (
        pick(zero2, grad_bytes, pick(zero3, grad_bytes + 2 * param_bytes, 0))
        + replicated_each * 2 * grad_bytes
        + zero2_each * param_bytes
    )
    return DpTraffic(reduce, gather, every)


def dp_seconds_per_byte(dims: ParallelDims, dense_params: Any, expert_params: Any, links: Links) -> Any:
    """Seconds of one reduce-scatter (or all-gather) of one byte per parameter a GPU holds: dense
    parameters over dp x cp (Megatron's data-parallel group with context parallel), routed experts
    over the expert-data-parallel group (megatron-core gives expert parameters their own buffers on it)."""
    dense_dp = links.ring_bytes_per_s(dims, dims.dense_dp_span, dims.tp * dims.cp)
    expert_dp = links.ring_bytes_per_s(dims, dims.expert_dp_span, dims.etp * dims.ep)
    dense = ring(dims.dense_dp) * dense_params / dense_dp
    expert = ring(dims.expert_dp) * expert_params / expert_dp
    return dense + expert


def worst_gpu_params(spec: TrainingSpec, dims: ParallelDims, memory: TrainMemory) -> tuple[float, float]:
    """(dense, routed-expert) parameters on one GPU of the stage the memory model finds worst, unrounded:
    the parameters whose gradients the DP collectives move and whose optimizer step the GPU runs."""
    m, p = spec.model, spec.parallel
    worst = memory.worst.stage
    first = sum(dims.stage_layers[:worst])
    layers = [layer_params(m, i) for i in range(m.num_layers)]
    stage = stage_params(layers, count_params(m), first, first + dims.stage_layers[worst], p.pp)
    dense, expert = stage.per_gpu(p.tp, p.ep, p.etp)
    return float(dense), float(expert)
