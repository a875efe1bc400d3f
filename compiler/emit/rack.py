"""What an NVLink domain larger than a host asks of the launch (hardware.nvlink_domain > gpus_per_node: GB200 and
GB300 NVL72, 72 GPUs on 18 hosts of 4): Slurm's `--segment` in both batch scripts, NCCL's multi-node NVLink in
launch/nccl.env. The domain's nodes and the segment come from compiler/models/dims (`nodes_per_domain`,
`segment_nodes`), the numbers the rules and the communication model price the job with.

- `#SBATCH --segment=N` (Slurm's topology/block plugin, slurm.schedmd.com/topology.html): the job's nodes are
  allocated in segments of N nodes, each segment inside one block (one NVL72 rack); N divides --nodes (Slurm
  refuses it otherwise) and is no larger than the rack, so each domain the job fills holds the same nodes and the
  tensor and expert parallel groups the plan keeps inside a domain really are.
- `NCCL_MNNVL_ENABLE=1`, `NCCL_CUMEM_ENABLE=1` (NCCL src/init.cc, src/mnnvl.cc): NCCL's default (2) uses
  multi-node NVLink when it finds it and falls back to the network silently; 1 makes NCCL check for it on every
  communicator and fail at init when the IMEX channel (/dev/nvidia-caps-imex-channels/channel0, which Slurm's
  switch/nvidia_imex plugin creates for the job) or the IMEX daemon is missing, instead of running at the
  InfiniBand speed the plan did not price. MNNVL buffers are cuMem allocations with FABRIC handles: NCCL skips
  MNNVL when cuMem is off.
"""

from __future__ import annotations

from lmspec.compiler.emit.quoting import Quoted, directive, shell
from lmspec.compiler.models.dims import nodes_per_domain, segment_nodes
from lmspec.compiler.models.vendor import vendor_of
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.sections import HardwareSpec


def domain_nodes(hardware: HardwareSpec) -> int:
    """Hosts one NVLink domain joins: 1 unless hardware.nvlink_domain spans hosts."""
    return nodes_per_domain(hardware.gpus_per_node, hardware.nvlink_domain)


def segment_options(plan: Plan, nodes: int) -> list[Quoted]:
    """`--segment` for a job of `nodes` nodes on a rack-scale NVLink domain; nothing for one node, or where the
    domain is one host."""
    per_domain = domain_nodes(plan.spec.hardware)
    if per_domain == 1 or nodes == 1:
        return []
    return [directive(f"--segment={segment_nodes(nodes, per_domain)}")]


def job_nodes(plan: Plan) -> int:
    """The most nodes any part of the job (training, the serving engine) spans: nccl.env serves both."""
    parts = [plan.train.layout.nodes if plan.train else 1, plan.serve.layout.nodes if plan.serve else 1]
    return max(parts)


def mnnvl_settings(plan: Plan) -> list[tuple[str, str, Quoted]]:
    """NCCL's multi-node NVLink settings, where the job's nodes share an NVLink domain."""
    hw = plan.spec.hardware
    per_domain = domain_nodes(hw)
    if vendor_of(hw) != "nvidia" or per_domain == 1 or job_nodes(plan) == 1:
        return []
    segment = segment_nodes(job_nodes(plan), per_domain)
    why = (
        f"hardware.nvlink_domain={hw.nvlink_domain} joins {per_domain} hosts of {hw.gpus_per_node} GPUs: ranks on "
        f"the {segment} nodes of each rack talk over NVLink, as the plan priced them; 1 (not NCCL's default 2, "
        "which falls back to the network silently) fails at init when the IMEX daemon or the job's IMEX channel "
        "(/dev/nvidia-caps-imex-channels/channel0, mounted into a container) is missing"
    )
    return [
        (why, "NCCL_MNNVL_ENABLE", shell(1)),
        (
            "multi-node NVLink shares buffers as cuMem allocations with FABRIC handles; NCCL skips MNNVL with "
            "cuMem off",
            "NCCL_CUMEM_ENABLE",
            shell(1),
        ),
    ]
