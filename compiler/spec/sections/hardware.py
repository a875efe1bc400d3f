"""The `hardware` group: the accelerator, the nodes and the links between them, as the presets in
specs/hardware/ state them from datasheets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import key


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One accelerator, as its vendor datasheet states it (dense, no sparsity)."""

    name: str = key("Accelerator name.", example="H100-SXM-80GB", kind=kinds.LABEL)
    memory_gib: float = key(
        "Device memory in GiB as labelled (usable memory is lower; see the memory model's reserve).",
        example=80,
        exclusive_minimum=0,
        maximum=kinds.MEMORY_GIB_MAX,
    )
    bf16_tflops: float = key("Dense bf16 peak, TFLOP/s.", example=989, minimum=kinds.RATE_MIN, maximum=kinds.RATE_MAX)
    hbm_gb_per_s: float = key("Memory bandwidth, GB/s.", example=3350, minimum=kinds.RATE_MIN, maximum=kinds.RATE_MAX)
    fp8_tflops: float | None = key(
        "Dense FP8 tensor-core peak, TFLOP/s; null = no FP8 tensor cores (A100, CPU).",
        example=1979,
        minimum=kinds.RATE_MIN,
        maximum=kinds.RATE_MAX,
    )
    generation: Literal["ampere", "ada", "hopper", "cpu"] = key(
        "Architecture generation: picks the step-time model's GEMM and attention efficiencies calibrated on "
        "published runs of that generation (bench/steptime_published.py); ada and cpu, which no published "
        "run calibrates, take ampere's.",
        example="hopper",
    )
    sustained_fraction: float = key(
        "Share of the datasheet peaks (bf16 and fp8) the part sustains through a training run: 1.0 = its "
        "rated clocks hold (an H100 SXM at 700 W); lower where the power limit or clocks are capped below "
        "the datasheet's (Meta's Grand Teton H100 at 500 W). MFU stays quoted on the datasheet peak.",
        example=1.0,
        exclusive_minimum=0,
        maximum=1,
    )


@dataclass(frozen=True, kw_only=True)
class IntraNodeSpec:
    """Link between the GPUs of one node."""

    link: Literal["nvlink", "pcie", "shm"] = key(
        "Kind of link: NVLink, PCIe only, or host shared memory (CPU ranks).", example="nvlink"
    )
    gb_per_s: float = key(
        "Per-GPU bandwidth of the link, GB/s, as the datasheet states it.",
        example=900,
        minimum=kinds.RATE_MIN,
        maximum=kinds.RATE_MAX,
    )


@dataclass(frozen=True, kw_only=True)
class InterNodeSpec:
    """Network between nodes; drives nccl.env and the communication estimate."""

    fabric: Literal["ib", "roce", "ethernet"] = key("InfiniBand, RoCE, or plain TCP Ethernet.", example="ib")
    gbit_per_s_per_nic: float = key(
        "Line rate of one NIC, Gbit/s.", example=400, minimum=kinds.RATE_MIN, maximum=kinds.RATE_MAX
    )
    nics_per_node: int = key("NICs per node used by NCCL.", example=8, minimum=1, maximum=kinds.NICS_MAX)
    hca: list[str] = key(
        "RDMA devices for NCCL_IB_HCA (empty = let NCCL choose).",
        example=["mlx5_0", "mlx5_1"],
        kind=kinds.RDMA_DEVICE,
        max_items=kinds.NICS_MAX,
    )
    socket_ifname: str | None = key(
        "Interface for NCCL/gloo bootstrap and TCP traffic (NCCL_SOCKET_IFNAME); null = auto.",
        example="eth0",
        kind=kinds.INTERFACE,
    )


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """The machines a job runs on."""

    name: str = key("Hardware preset name.", example="h100_80g", kind=kinds.PLAIN_NAME)
    gpu: GpuSpec = key("The accelerator.")
    gpus_per_node: int = key("Accelerators (ranks) per node.", example=8, minimum=1, maximum=kinds.GPUS_PER_NODE_MAX)
    nodes: int = key("Nodes in the job.", example=1, minimum=1, maximum=kinds.NODES_MAX)
    host_memory_gib: float | None = key(
        "Host (CPU) memory of one node, GiB, as the system's datasheet states it: a checkpoint save stages "
        "each rank's share there (REPORT.md's checkpoint section checks it fits); null = unknown, not checked.",
        example=2048,
        exclusive_minimum=0,
        maximum=kinds.MEMORY_GIB_MAX,
    )
    intra_node: IntraNodeSpec = key("Link inside a node.")
    inter_node: InterNodeSpec = key("Network between nodes.")
