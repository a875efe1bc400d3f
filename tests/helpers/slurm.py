"""A real Slurm (Debian's slurmctld + slurmd + munge) in a temp directory: one node on this machine, a
controller alone over declared nodes (for sbatch --test-only), or one node per network-namespace host.

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

from helpers.netns import Host
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


def this_node() -> tuple[str, str]:
    """(this machine's node name as slurmd reports it, the rest of its node line: CPUs, memory, ...)."""
    line = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    name, _, attributes = line.partition(" ")
    return name.removeprefix("NodeName="), attributes


class LocalSlurm:
    """One slurmctld and one slurmd for this machine's node; with `declared_nodes` (a node line's name and
    attributes, e.g. `fake[1-4] CPUs=128 Gres=gpu:8`) a controller alone, whose partition is those declared
    nodes: sbatch --test-only schedules against them, and nothing runs."""

    def __init__(self, root: Path, declared_nodes: str | None = None) -> None:
        self.root = root
        self.declared_nodes = declared_nodes
        self.conf = root / "slurm.conf"
        self.munge_dir = root / "munge"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    # -- what a variant changes ------------------------------------------------------------------------------
    def controller_address(self) -> str:
        return "127.0.0.1"

    def node_lines(self) -> list[str]:
        host, attributes = this_node()
        if self.declared_nodes is None:
            return [
                f"NodeName={host} {attributes} NodeAddr=127.0.0.1",
                f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            ]
        name = self.declared_nodes.split()[0]
        return [
            "GresTypes=gpu",
            f"NodeName={self.declared_nodes} NodeAddr=127.0.0.1 State=IDLE",
            f"PartitionName=debug Nodes={name} Default=YES MaxTime=INFINITE State=UP",
        ]

    def client(self, argv: list[str]) -> list[str]:
        """`argv` (sbatch, squeue, scontrol, ...) where it reaches the controller."""
        return argv

    def start_daemons(self) -> None:
        subprocess.run(["slurmctld", "-c", "-f", str(self.conf)], check=True, env=self.env)
        if self.declared_nodes is None:
            subprocess.run(["slurmd", "-f", str(self.conf)], check=True, env=self.env)

    # -- shared ----------------------------------------------------------------------------------------------
    def _write_conf(self) -> None:
        r, sock = self.root, self.munge_dir / "munge.socket"
        controller = os.uname().nodename  # slurmctld checks it runs on the host its line names
        lines = [
            "ClusterName=lmspec",
            f"SlurmctldHost={controller}({self.controller_address()})",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={sock}",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool-%n",  # %n: each slurmd of the cluster its own
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/slurmctld.log",
            f"SlurmdLogFile={r}/slurmd-%n.log",
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
            *self.node_lines(),
            "",
        ]
        self.conf.write_text("\n".join(lines))

    def start(self) -> None:
        self.root.chmod(0o755)
        for sub in ("state", "munge"):
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
        self.start_daemons()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            state = subprocess.run(
                self.client(["sinfo", "--noheader", "--format=%T"]),
                capture_output=True,
                text=True,
                env=self.env,
                check=False,
            ).stdout.strip()
            if state == "idle":
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"Slurm did not become idle in {START_TIMEOUT_S} s (last state {state!r}); logs in {self.root}"
        )

    def stop(self) -> None:
        pid_files = [
            *sorted(self.root.glob("slurmd-*.pid")),
            self.root / "slurmctld.pid",
            self.munge_dir / "munged.pid",
        ]
        for pid_file in pid_files:
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


class NamespaceSlurm(LocalSlurm):
    """A node per network-namespace host (helpers.netns), NodeName n1, n2, ... at the host's address: slurmctld
    in the first host's network, a slurmd in each (`slurmd -N`). Each slurmd gets a private mount namespace with
    a sysfs of its own network (torchrun.sh reads the interfaces under /sys/class/net), this machine's cgroup
    mounts (slurmd needs them), and an /etc/hosts that names the nodes (the batch script's MASTER_ADDR is a node
    name). Jobs started by a slurmd run in its namespaces."""

    def __init__(self, root: Path, hosts: list[Host]) -> None:
        super().__init__(root)
        self.hosts = hosts
        self.names = [f"n{i + 1}" for i in range(len(hosts))]

    def controller_address(self) -> str:
        return self.hosts[0].address

    def node_lines(self) -> list[str]:
        _, attributes = this_node()
        lines = [f"NodeName={n} {attributes} NodeAddr={h.address}" for n, h in zip(self.names, self.hosts, strict=True)]
        return [*lines, f"PartitionName=debug Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE State=UP"]

    def client(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.hosts[0].netns}", *argv]

    def start_daemons(self) -> None:
        subprocess.run(self.client(["slurmctld", "-c", "-f", str(self.conf)]), check=True, env=self.env)
        names = "".join(f"{h.address} {n}\n" for n, h in zip(self.names, self.hosts, strict=True))
        etc_hosts = self.root / "hosts"
        etc_hosts.write_text(f"127.0.0.1 localhost\n{names}")
        for name, host in zip(self.names, self.hosts, strict=True):
            cgroups = self.root / f"cgroup-{name}"
            cgroups.mkdir(exist_ok=True)
            mounts = (
                f"set -e; mount --make-rprivate /; mount --rbind /sys/fs/cgroup {cgroups}; "
                f"mount -t sysfs sysfs /sys; mount --rbind {cgroups} /sys/fs/cgroup; "
                f"mount --bind {etc_hosts} /etc/hosts; exec slurmd -N {name} -f {self.conf}"
            )
            subprocess.run(
                ["nsenter", f"--net=/run/netns/{host.netns}", "unshare", "--mount", "bash", "-c", mounts],
                check=True,
                env=self.env,
            )


def _alive(pid: int) -> bool:
    """Running, not a zombie (a daemon's zombie lingers where nothing reaps orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
