"""RCCL's own settings in launch/nccl.env, on AMD Instinct hardware (compiler/models/vendor.py).

RCCL is ROCm's NCCL: it implements NCCL's API, reads the NCCL_* names nccl.py writes (NCCL_DEBUG,
NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT: RCCL's "RCCL environment
variables" reference), and torch on ROCm drives it through the same ProcessGroupNCCL (TORCH_NCCL_*). What ROCm
asks beyond those, each with its source:

- `HSA_NO_SCRATCH_RECLAIM=1` (ROCR-Runtime "Environment variables"): a kernel's scratch memory stays assigned to
  its queue instead of being handed back after every dispatch above HSA_SCRATCH_SINGLE_LIMIT; RCCL's init check
  (src/init.cc, checkHsaEnvSetting) stops the first collective with "HSA_NO_SCRATCH_RECLAIM=1 must be set" on
  the runtime and firmware versions that need it.
- `HSA_FORCE_FINE_GRAIN_PCIE=1` (RCCL "usage tips: enabling peer-to-peer transport"): fine-grained device memory
  over PCIe, which RCCL's peer-to-peer transport needs on PCIe-linked GPUs; RCCL's init warns "Missing
  HSA_FORCE_FINE_GRAIN_PCIE=1 from environment which can lead to low RCCL performance, system instability or
  hang!" without it, on xGMI nodes too (ROCm/rccl#1026).
- `TORCH_NCCL_HIGH_PRIORITY=1` (ROCm "AMD Instinct MI300X workload optimization: multi-node FSDP and RCCL
  settings"): RCCL's HIP streams at high priority, so communication kernels are not queued behind the compute
  kernels they should overlap with.
- `NCCL_MIN_NCHANNELS=112` on CDNA3 (the same guide, "RCCL in E2E workloads"): more channels than RCCL's
  default, so a collective spreads over more of the MI300X's compute units and xGMI links. No published value
  for CDNA4: not written there.

Not written: NVIDIA-only settings (NCCL_MNNVL_ENABLE, NCCL_NVLS_ENABLE: compiler/emit/rack.py); RCCL_MSCCL_ENABLE
and RCCL_MSCCLPP_ENABLE (MSCCL is on by default on MI300X, and RCCL removed MSCCL/MSCCL++ in ROCm 7.13, so the
names would be dead); GPU_MAX_HW_QUEUES (the guide's value 2 is for FSDP; Megatron's one-queue ordering is
compiler/emit/kernel_env.py's).
"""

from __future__ import annotations

from lmspec.compiler.emit.quoting import Quoted, shell
from lmspec.compiler.models.vendor import vendor_of
from lmspec.compiler.plan import Plan

# RCCL channels per collective the vendor's tuning guide gives, by generation; a generation it gives none for
# keeps RCCL's default
MIN_CHANNELS = {"cdna3": 112}


def rccl_settings(plan: Plan) -> list[tuple[str, str, Quoted]]:
    """(why, NAME, shell-quoted value) of ROCm's own variables, in file order; nothing off AMD hardware."""
    hw = plan.spec.hardware
    if vendor_of(hw) != "amd":
        return []
    out = [
        (
            "ROCm runtime: a kernel's scratch memory stays with its queue instead of being reclaimed after each "
            "dispatch; RCCL's init check refuses the first collective without it on the runtimes that need it",
            "HSA_NO_SCRATCH_RECLAIM",
            shell(1),
        ),
        (
            "fine-grained device memory over PCIe, which RCCL's peer-to-peer transport needs between PCIe-linked "
            "GPUs; RCCL's init warns of low performance, instability or hangs without it, on xGMI nodes too",
            "HSA_FORCE_FINE_GRAIN_PCIE",
            shell(1),
        ),
        (
            "RCCL's HIP streams at high priority: communication is not queued behind the compute it overlaps "
            "(ROCm's MI300X workload optimization guide)",
            "TORCH_NCCL_HIGH_PRIORITY",
            shell(1),
        ),
    ]
    channels = MIN_CHANNELS.get(hw.gpu.generation)
    if channels is not None:
        out.append(
            (
                f"hardware.gpu.generation={hw.gpu.generation}: AMD's MI300X tuning guide raises RCCL's channels "
                "to spread each collective over more compute units and xGMI links",
                "NCCL_MIN_NCHANNELS",
                shell(channels),
            )
        )
    return out
