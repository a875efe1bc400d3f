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
    fp4_tflops: float | None = key(
        "Dense FP4 tensor-core peak (NVFP4 on Blackwell, MXFP4 on CDNA4), TFLOP/s; null = no FP4 tensor "
        "cores (Hopper and older, CDNA3, CPU).",
        example=9000,
        minimum=kinds.RATE_MIN,
        maximum=kinds.RATE_MAX,
    )
    generation: Literal["ampere", "ada", "hopper", "blackwell", "cdna3", "cdna4", "cpu"] = key(
        "Architecture generation: NVIDIA's ampere, ada, hopper, blackwell; AMD Instinct's cdna3 (MI300X, "
        "MI325X) and cdna4 (MI355X); cpu. Picks the vendor (NCCL or RCCL, CUDA or ROCm), what the precision "
        "recipes run on, and the step-time model's GEMM and attention efficiencies calibrated on published "
        "runs of that generation (bench/steptime_published.py); a generation no published run calibrates "
        "takes the nearest one's (compiler/models/steptime_calibration.py says which).",
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

    link: Literal["nvlink", "nvlink5", "xgmi", "pcie", "shm"] = key(
        "Kind of link: nvlink = NVLink 3/4 through NVSwitch (A100, H100, H200), nvlink5 = NVLink 5 (Blackwell; "
        "across hosts in an NVL72 rack), xgmi = AMD Infinity Fabric, a full mesh of point-to-point links "
        "between a node's GPUs (a group of n GPUs uses n-1 of each GPU's links), pcie = PCIe only, shm = host "
        "shared memory (CPU ranks).",
        example="nvlink",
    )
    gb_per_s: float = key(
        "Per-GPU bandwidth of the link, GB/s, as the datasheet states it (both directions, all links).",
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
    nvlink_domain: int | None = key(
        "GPUs that reach each other over the intra-node link, across hosts where the rack joins them (GB200 "
        "NVL72: 72 GPUs on 18 hosts of 4); null = one node's (hardware.gpus_per_node). Rules, the "
        "communication model and `lmspec plan` keep TP and expert parallelism inside it in place of a node, "
        "and price what stays inside it at the link's speed; Slurm packs the job's nodes into blocks of it "
        "(--segment) and NCCL turns on multi-node NVLink (nccl.env).",
        example=72,
        minimum=1,
        maximum=kinds.NVLINK_DOMAIN_MAX,
    )
    host_memory_gib: float | None = key(
        "Host (CPU) memory of one node, GiB, as the system's datasheet states it: a checkpoint save stages "
        "each rank's share there (REPORT.md's checkpoint section checks it fits); null = unknown, not checked.",
        example=2048,
        exclusive_minimum=0,
        maximum=kinds.MEMORY_GIB_MAX,
    )
    intra_node: IntraNodeSpec = key("Link inside a node (and inside the NVLink domain).")
    inter_node: InterNodeSpec = key("Network between nodes.")
