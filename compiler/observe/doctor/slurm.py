"""Slurm ending the job: the time limit, or the cgroup OOM killer on host memory.

Formats: slurmstepd (src/slurmd/slurmstepd/req.c: ``slurmstepd: error: *** JOB 4151016 ON node01
CANCELLED AT 2026-01-25T14:35:32 DUE TO TIME LIMIT ***``; task/cgroup: ``error: Detected 1 oom_kill
event in StepId=22035606.1. Some of the step tasks have been OOM Killed.``).
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.doctor.findings import Finding, Fix, LogText, Watch
from lmspec.compiler.observe.logs.context import RunContext

_TIME_LIMIT = re.compile(r"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED (?:AT \S+ )?DUE TO TIME LIMIT \*\*\*")
_OOM_KILL = re.compile(r"Detected \d+ oom[_-]kill events? in \S+")


class SlurmTimeLimit:
    name = "slurm_time_limit"
    watches = (Watch(_TIME_LIMIT, (b" DUE TO TIME LIMIT ***",)),)

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_TIME_LIMIT)
        if not hits:
            return None
        slurm = context.spec.cluster.slurm if context else None
        ckpt = context.spec.train.checkpoint if context and context.spec.train else None
        fixes = [
            Fix("cluster.slurm.requeue", "true", "requeue after the pre-timeout checkpoint; training resumes"),
            Fix(
                "cluster.slurm.signal_seconds",
                str(max(slurm.signal_seconds, 600)) if slurm else "600",
                "USR1 this long before the limit: time to finish a checkpoint save",
            ),
            Fix(
                "train.checkpoint.interval",
                str(max(ckpt.interval // 2, 1)) if ckpt else "<half of now>",
                "less work lost when a job is cut off",
            ),
            Fix(
                "cluster.slurm.time",
                "<longer, if the partition allows>",
                f"now {slurm.time}" if slurm else "the job's wall-clock limit",
            ),
        ]
        if slurm is not None and slurm.requeue:
            fixes = fixes[1:]
        return Finding(
            self.name,
            "Slurm time limit",
            "Slurm cancelled the job at its --time limit.",
            tuple(e for e, _ in hits),
            tuple(fixes),
        )


class HostOutOfMemory:
    name = "host_oom"
    watches = (Watch(_OOM_KILL, (b"oom_kill event", b"oom-kill event")),)

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_OOM_KILL)
        if not hits:
            return None
        parallel = context.spec.parallel if context else None
        fixes = []
        if parallel is None or parallel.offload_params:
            fixes.append(Fix("parallel.offload_params", "false", "parameters offloaded to host RAM"))
        if parallel is None or parallel.offload_optimizer:
            fixes.append(Fix("parallel.offload_optimizer", "false", "fp32 optimizer states held in host RAM"))
        return Finding(
            self.name,
            "host out of memory (Slurm cgroup OOM killer)",
            "A task used more host RAM than the job's cgroup allows: CPU offload, data loader workers or "
            "a checkpoint gathered in host memory. Ask Slurm for more memory (--mem) if none applies.",
            tuple(e for e, _ in hits),
            tuple(fixes),
        )
