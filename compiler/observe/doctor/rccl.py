"""RCCL failures on AMD Instinct GPUs: what ROCm's NCCL reports that NVIDIA's does not, or not in those words.

RCCL keeps NCCL's messages (ncclGetErrorString, ``NCCL WARN`` lines, torch's ``NCCL error in: ...``), so its
connection failures, timeouts and interface problems are NcclConnectionError's, NcclTimeout's and
NcclInterface's, and their fixes (the NIC, the IB keys) hold for it unchanged. What is RCCL's own is a failure
inside HIP or RCCL itself, told apart by where it happened: a log that names RCCL (``RCCL version 2.16.5+hip5.6``
at init; ``librccl``; the ``.../rccl/.../hipify/src/...`` paths of its ``NCCL WARN`` lines) or a build for AMD
hardware (compiler/models/vendor.py), and one of

- ``NCCL WARN hipIpcGetMemHandle failed : invalid argument`` / ``NCCL WARN Cuda failure 'invalid argument'`` in
  src/transport/p2p.cc (ROCm/rccl-tests#120, #162): the ranks of a node could not map each other's GPU memory;
- ``unhandled cuda error`` (ncclUnhandledCudaError, RCCL's name for a failed HIP call; ROCm/rccl#1454);
- ``internal error - please report this issue to the NCCL developers`` (ncclInternalError: RCCL's own checks,
  its topology search among them; ROCm/rccl#1728 on 4 of a node's 8 MI300X).
"""

from __future__ import annotations

import re

from lmspec.compiler.models.vendor import vendor_of
from lmspec.compiler.observe.doctor.findings import Finding, Fix, LogText, Watch
from lmspec.compiler.observe.logs.context import RunContext

_RCCL = re.compile(r"RCCL version|librccl|/rccl/")
_P2P = re.compile(r"NCCL WARN hipIpc\w* failed|transport/p2p\.cc:\d+ NCCL WARN (?:Cuda|HIP) failure")
_HIP_CALL = re.compile(r"unhandled cuda error|NCCL WARN (?:Cuda|HIP) failure")
_INTERNAL = re.compile(r"internal error - please report this issue to the NCCL developers")
_INFO = re.compile(r"NCCL INFO ")


class RcclError:
    name = "rccl_error"
    watches = (
        Watch(_RCCL, (b"RCCL version", b"librccl", b"/rccl/"), keep=1),
        Watch(_P2P, (b"NCCL WARN ",), starts=((b"NCCL WARN hipIpc", r"\w*"), (b"transport/p2p.cc:", r"\d*"))),
        Watch(_HIP_CALL, (b"unhandled cuda error", b"NCCL WARN ")),
        Watch(_INTERNAL, (b"internal error - please report this issue to the NCCL developers",)),
        Watch(_INFO, (b"NCCL INFO ",), keep=1),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        p2p, hip, internal = log.find(_P2P), log.find(_HIP_CALL), log.find(_INTERNAL)
        named = log.find(_RCCL, 1)
        amd = context is not None and vendor_of(context.spec.hardware) == "amd"
        if not (p2p or hip or internal) or not (named or amd):
            return None
        if p2p:
            cause = (
                "RCCL's peer-to-peer transport could not map one GPU's memory into another rank's process on the "
                "same node (a HIP IPC call failed): the amdgpu kernel driver does not match the ROCm user space "
                "(install the amdgpu-dkms of that ROCm), the GPUs have no large-BAR peer access, or a container "
                "sees only some of the node's GPUs (/dev/kfd and every /dev/dri render node must be passed)."
            )
        elif internal:
            cause = (
                "RCCL stopped at one of its own checks (ncclInternalError); the NCCL WARN line or the 'Last error' "
                "line under it says which. A topology check that finds no path between two of a node's GPUs "
                "means some GPUs of the xGMI mesh are hidden from the job: give every rank all of the node's GPUs."
            )
        else:
            cause = (
                "A HIP call inside RCCL failed (ncclUnhandledCudaError is RCCL's name for it); the NCCL WARN line "
                "before it names the call: the ROCm runtime, driver and RCCL versions disagree, or a GPU is gone."
            )
        fixes = []
        if not log.find(_INFO, 1):
            fixes.append(Fix("cluster.nccl.debug", "INFO", "rerun once with INFO: RCCL then logs the failing HIP call"))
        if p2p:
            fixes.append(
                Fix(
                    "cluster.env",
                    "[NCCL_P2P_DISABLE=1]",
                    "only to confirm the diagnosis: RCCL then moves intra-node data through host memory, far slower",
                )
            )
        hits = p2p or internal or hip
        evidence = [e for e, _ in named + hits[:2]]
        return Finding(self.name, "RCCL error", cause, tuple(evidence), tuple(fixes))
