"""`lmspec doctor`: known failure signatures of training and serving runs, each mapped to the
spec keys to change. SIGNATURES is the plain table of them, checked in order."""

from __future__ import annotations

import dataclasses
import importlib

from lmspec.compiler.launchers import LAUNCHERS
from lmspec.compiler.observe.doctor.checkpoint import CheckpointLoadFailure
from lmspec.compiler.observe.doctor.comm import TpSlowdown
from lmspec.compiler.observe.doctor.crash import UnrecognisedFailure
from lmspec.compiler.observe.doctor.findings import Finding, LogText, Signature, Watch
from lmspec.compiler.observe.doctor.layout import ParallelLayout
from lmspec.compiler.observe.doctor.memory import CudaOutOfMemory, HipOutOfMemory
from lmspec.compiler.observe.doctor.nccl import NcclConnectionError, NcclInterface, NcclTimeout
from lmspec.compiler.observe.doctor.numerics import NonFiniteLoss
from lmspec.compiler.observe.doctor.rccl import RcclError
from lmspec.compiler.observe.doctor.rendezvous import RendezvousFailure, WorldSizeMismatch
from lmspec.compiler.observe.doctor.serving import VllmKvCacheTooSmall, VllmParallelNotDividing
from lmspec.compiler.observe.doctor.slurm import HostOutOfMemory
from lmspec.compiler.observe.logs.context import RunContext

# every launcher's own signatures (lmspec.compiler.launchers), in the registry's order: a log is read
# whatever launcher wrote it, and often without its build
LAUNCHER_SIGNATURES: tuple[Signature, ...] = tuple(
    signature
    for launcher in LAUNCHERS.values()
    if launcher.doctor_module is not None
    for signature in importlib.import_module(launcher.doctor_module).SIGNATURES
)

SIGNATURES: tuple[Signature, ...] = (
    RcclError(),  # a failure inside HIP or RCCL: the cause of the collectives' errors after it
    NcclTimeout(),
    NcclConnectionError(),
    NcclInterface(),
    CudaOutOfMemory(),
    HipOutOfMemory(),
    HostOutOfMemory(),
    WorldSizeMismatch(),
    ParallelLayout(),
    RendezvousFailure(),
    *LAUNCHER_SIGNATURES,
    NonFiniteLoss(),
    CheckpointLoadFailure(),
    TpSlowdown(),
    VllmKvCacheTooSmall(),
    VllmParallelNotDividing(),
)

UNRECOGNISED = UnrecognisedFailure()  # a traceback or non-zero exit that no signature above explains

# every pattern any signature reads, each once: the one pass over the log looks for all of them
WATCHES: tuple[Watch, ...] = tuple(
    dict.fromkeys((*(w for signature in SIGNATURES for w in signature.watches), *UNRECOGNISED.watches))
)


def diagnose(log: LogText, context: RunContext | None) -> list[Finding]:
    """Every signature that matches, in table order, each with its evidence in log order; when none
    does, the unrecognised failure a traceback or non-zero exit shows."""
    found = [f for signature in SIGNATURES if (f := signature.detect(log, context)) is not None]
    if not found and (crash := UNRECOGNISED.detect(log)) is not None:
        found = [crash]
    return [dataclasses.replace(f, evidence=tuple(sorted(set(f.evidence), key=lambda e: e.line))) for f in found]
