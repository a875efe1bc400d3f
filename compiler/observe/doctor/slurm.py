"""Slurm or the kernel ending the job: the time limit, preemption, or an OOM killer on host memory.

Formats: slurmstepd (src/slurmd/slurmstepd/req.c: ``slurmstepd: error: *** JOB 4151016 ON node01
CANCELLED AT 2026-01-25T14:35:32 DUE TO TIME LIMIT ***``, ``... DUE TO PREEMPTION ***``, ``... DUE TO
JOB REQUEUE ***``; submitit's ``Caught signal SIGUSR2 on node7: this job is preempted.``; task/cgroup:
``error: Detected 1 oom_kill event in StepId=22035606.1. Some of the step tasks have been OOM
Killed.``; other versions write ``events`` or ``event(s)``: ``slurmstepd: error: Detected 1 oom-kill event(s)
in step 3495064.0 cgroup.``, https://github.com/hafs-community/HAFS/issues/101; srun's ``srun: error:
Orion-01-01: task 4: Out Of Memory``), lmspec's own stop before the time limit (runtime/train/loop.py:
``lmspec: SIGUSR1 received: checkpointed at step 5; exit 3 (requeue)``; launch/sbatch.sh: ``sbatch.sh:
checkpoint requested before the time limit; requeueing job 1``), the kernel's ``Out of memory: Killed
process 4242 (python)``, a shell's ``Killed``, and torchrun's ``failed (exitcode: -9) local_rank: 1`` /
``Signal 9 (SIGKILL) received``: SIGKILL, which nothing but the OOM
killer or an operator sends a training process.
"""

from __future__ import annotations

import re

from lmspec.compiler.launchers import launcher_of
from lmspec.compiler.observe.doctor.findings import Finding, Fix, LogText, Signature, Watch
from lmspec.compiler.observe.logs.context import RunContext

_TIME_LIMIT = re.compile(r"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED (?:AT \S+ )?DUE TO TIME LIMIT \*\*\*")
_PREEMPTED = re.compile(
    r"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED (?:AT \S+ )?DUE TO (?:PREEMPTION|JOB REQUEUE) \*\*\*"
    r"|this job is preempted"
)
_STOPPED = re.compile(r"lmspec: (SIG\w+) received: checkpointed at step (\d+); exit \d+ \(requeue\)")
_REQUEUED = re.compile(r"sbatch\.sh: checkpoint requested before the time limit; requeueing job (\d+)")
# Slurm's task/cgroup counts the kills as ``event``, ``events`` or ``event(s)``, by version; srun then reports
# the task: ``srun: error: node01: task 4: Out Of Memory``
_OOM_KILL = re.compile(
    r"Detected \d+ oom[_-]kill event(?:s|\(s\))? in \S+|Out of memory: Killed process \d+"
    r"|\btask \d+: Out Of Memory\b"
)
# a shell reporting its child's SIGKILL: a bare ``Killed``, or ``run.sh: line 3: 4242 Killed  python ...``
_SHELL_KILLED = re.compile(r"^\s*Killed\s*$|^(?:\S+: line \d+: )?\d+ Killed\s")
_SIGKILL = re.compile(r"\(exitcode: -9\)|exitcode\s*: -9\b|Signal 9 \(SIGKILL\) received")


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


class SlurmPreemption:
    name = "slurm_preemption"
    watches = (Watch(_PREEMPTED, (b" DUE TO PREEMPTION ***", b" DUE TO JOB REQUEUE ***", b"this job is preempted")),)

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_PREEMPTED)
        if not hits:
            return None
        slurm = context.spec.cluster.slurm if context else None
        ckpt = context.spec.train.checkpoint if context and context.spec.train else None
        fixes = (
            []
            if slurm is not None and slurm.requeue
            else [
                Fix(
                    "cluster.slurm.requeue",
                    "true",
                    "a preempted job goes back to the queue and resumes from its checkpoint",
                )
            ]
        )
        fixes.append(
            Fix(
                "train.checkpoint.interval",
                str(max(ckpt.interval // 2, 1)) if ckpt else "<half of now>",
                "preemption gives no notice past the partition's grace time: less work lost",
            )
        )
        fixes.append(Fix("cluster.slurm.qos", "<a non-preemptible QOS, if the site has one>", "ask the site"))
        return Finding(
            self.name,
            "Slurm preempted the job",
            "A higher-priority job took the nodes: Slurm cancelled (or requeued) this one; it did not fail.",
            tuple(e for e, _ in hits),
            tuple(fixes),
        )


class StoppedForRequeue:
    """The trainer checkpointed on Slurm's pre-timeout USR1 (or a SIGTERM) and stopped to be requeued: torchrun
    then reports its exit code 3 as a failure, which it is not."""

    name = "stopped_for_requeue"
    watches = (
        Watch(_STOPPED, (b" received: checkpointed at step ",)),
        Watch(_REQUEUED, (b"sbatch.sh: checkpoint requested before the time limit; requeueing job ",)),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        stopped = log.find(_STOPPED, limit=1)
        if not stopped:
            return None
        requeued = log.find(_REQUEUED, limit=1)
        signal, step = stopped[0][1].groups()
        slurm = context.spec.cluster.slurm if context else None
        if requeued:
            cause = (
                f"{signal} asked the trainer to stop; it saved a checkpoint at step {step} and Slurm requeued job "
                f"{requeued[0][1].group(1)}, whose next run resumes from it (the same log goes on after a "
                "'restart 1' line; each rank's files are under runs/<name>/rank_logs/job<id>-restart1/). "
                "The run did not fail."
            )
        else:
            cause = (
                f"{signal} asked the trainer to stop; it saved a checkpoint at step {step} and exited to be "
                "requeued: `lmspec run` again (or the requeued job) resumes from it. The run did not fail."
            )
        fixes = []
        # Slurm's keys only where the build runs under Slurm: a Kubernetes pod's stop is pod.sh's forwarded SIGTERM
        if context is None or launcher_of(context.spec.cluster).doctor_module == __name__:
            if slurm is not None and not slurm.requeue:
                fixes.append(Fix("cluster.slurm.requeue", "true", "Slurm requeues the job itself after the checkpoint"))
            fixes.append(
                Fix(
                    "cluster.slurm.time",
                    "<longer, if the partition allows>" + (f" (now {slurm.time})" if slurm else ""),
                    "fewer stops and restarts, if the job hit its time limit (USR1 comes signal_seconds before it)",
                )
            )
        evidence = tuple(e for e, _ in stopped + requeued)
        return Finding(self.name, f"checkpointed at step {step} and stopped for requeue", cause, evidence, tuple(fixes))


class HostOutOfMemory:
    name = "host_oom"
    watches = (
        Watch(_OOM_KILL, (b"oom_kill event", b"oom-kill event", b"Out of memory: Killed process", b": Out Of Memory")),
        Watch(_SIGKILL, (b"exitcode: -9", b"exitcode  : -9", b"Signal 9 (SIGKILL)")),
        Watch(_SHELL_KILLED, (b"Killed",)),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_OOM_KILL) or log.find(_SIGKILL) or log.find(_SHELL_KILLED)
        if not hits:
            return None
        parallel = context.spec.parallel if context else None
        fixes = []
        if parallel is None or parallel.offload_params:
            fixes.append(Fix("parallel.offload_params", "false", "parameters offloaded to host RAM"))
        if parallel is None or parallel.offload_optimizer:
            fixes.append(Fix("parallel.offload_optimizer", "false", "fp32 optimizer states held in host RAM"))
        slurm = context.spec.cluster.slurm if context else None
        if slurm is None or str(slurm.mem) != "0":
            fixes.append(Fix("cluster.slurm.mem", "0", "--mem=0: the job may use all of each node's memory"))
        killed = hits[0][1].re is not _OOM_KILL
        return Finding(
            self.name,
            "host out of memory (SIGKILL)" if killed else "host out of memory (OOM killer)",
            (
                "A rank was killed with SIGKILL, most often by the kernel's OOM killer (`dmesg` or the node's "
                "journal says so): "
                if killed
                else "A task used more host RAM than the node or the job's cgroup allows: "
            )
            + "CPU offload, data loader workers, every rank loading a full checkpoint, or a checkpoint gathered "
            "in host memory.",
            tuple(e for e, _ in hits),
            tuple(fixes),
        )


# the slurm launcher's own signatures (lmspec.compiler.launchers.slurm names this module), in the doctor's
# table order; HostOutOfMemory is the kernel's, seen under any launcher, and stays in the doctor's own list
SIGNATURES: tuple[Signature, ...] = (SlurmTimeLimit(), SlurmPreemption(), StoppedForRequeue())
