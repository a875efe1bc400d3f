"""A real single-node Slurm (Debian's slurmctld + slurmd + munge) in a temp directory.

Its own munge key and socket, free ports, state and logs under the directory, so it never
touches a system Slurm. Setup and pitfalls: ../shared/NOTES-deps.md (Slurm section).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from helpers.ports import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")
MUNGE_KEY_BYTES = 1024
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def slurm_missing_reason() -> str | None:
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd runs jobs as any user)"
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return (
            f"Slurm not installed ({', '.join(missing)} missing): apt-get install slurmctld slurmd slurm-client munge"
        )
    return None


class LocalSlurm:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.munge_dir = root / "munge"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def _write_conf(self) -> None:
        node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
        host = node.split()[0].removeprefix("NodeName=")
        r, sock = self.root, self.munge_dir / "munge.socket"
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=lmspec",
                    f"SlurmctldHost={host}(127.0.0.1)",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={sock}",
                    f"StateSaveLocation={r}/state",
                    f"SlurmdSpoolDir={r}/spool",
                    f"SlurmctldPidFile={r}/slurmctld.pid",
                    f"SlurmdPidFile={r}/slurmd.pid",
                    f"SlurmctldLogFile={r}/slurmctld.log",
                    f"SlurmdLogFile={r}/slurmd.log",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "MailProg=/bin/true",
                    "SchedulerParameters=batch_sched_delay=0",
                    "MinJobAge=4",
                    f"{node} NodeAddr=127.0.0.1",
                    f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def start(self) -> None:
        self.root.chmod(0o755)
        for sub in ("state", "spool", "munge"):
            (self.root / sub).mkdir(mode=0o755, exist_ok=True)
        key = self.munge_dir / "munge.key"
        key.write_bytes(os.urandom(MUNGE_KEY_BYTES))
        key.chmod(0o400)
        self._write_conf()
        m = self.munge_dir
        subprocess.run(
            [
                "munged",
                "--force",
                f"--socket={m / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={m / 'munged.pid'}",
                f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
            check=True,
        )
        subprocess.run(["slurmctld", "-c", "-f", str(self.conf)], check=True, env=self.env)
        subprocess.run(["slurmd", "-f", str(self.conf)], check=True, env=self.env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            state = subprocess.run(
                ["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, env=self.env, check=False
            ).stdout.strip()
            if state == "idle":
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"local Slurm did not become idle in {START_TIMEOUT_S} s (last state {state!r}); logs in {self.root}"
        )

    def stop(self) -> None:
        for pid_file in (self.root / "slurmd.pid", self.root / "slurmctld.pid", self.munge_dir / "munged.pid"):
            try:
                pid = int(pid_file.read_text().strip())
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError):
                continue
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running, not a zombie (a daemon's zombie lingers where nothing reaps orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
