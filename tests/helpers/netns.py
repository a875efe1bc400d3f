"""Several "hosts" on this machine: network namespaces joined by veth pairs to one bridge.

Each host is a namespace with its own address on an interface of the same name in every host
(IFNAME), so one spec's hardware.inter_node.socket_ifname names it on all of them, as on a real
cluster. The bridge lives in a namespace of its own (the "switch"); taking a host's port down there
is a cable pulled. Nothing touches the machine's own network: every device is created inside these
namespaces, and deleting them removes everything. Needs root and iproute2.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

IFNAME = "lmspec0"  # the interface every host reaches the others by
SUBNET = "10.213.0"  # a /24 of private addresses, only inside these namespaces
STOP_TIMEOUT_S = 10.0


def netns_missing_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed: apt-get install iproute2"
    return None


@dataclass(frozen=True)
class Host:
    """One namespace: `address` on IFNAME, its switch port `port` (in the switch namespace)."""

    netns: str
    address: str
    switch: str
    port: str

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's namespace (file system and processes are shared)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def unplug(self) -> None:
        """The cable pulled: the host keeps its address, but nothing reaches the others any more."""
        _ip("-n", self.switch, "link", "set", self.port, "down")

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True, check=False)
        return [int(pid) for pid in out.stdout.split()]

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        """Every process of this host: what a node failing looks like to the others."""
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def hosts(count: int, tag: str = "") -> Iterator[list[Host]]:
    """`count` hosts at SUBNET.1, .2, ...; every process left in them is killed and the namespaces
    deleted on the way out."""
    prefix = f"lms{tag}{os.getpid() % 100000}"
    switch = f"{prefix}sw"
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        nodes = []
        for i in range(count):
            netns, port = f"{prefix}n{i}", f"p{i}"
            _ip("netns", "add", netns)
            made.append(netns)
            _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", IFNAME, "netns", netns)
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            address = f"{SUBNET}.{i + 1}"
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", IFNAME)
            _ip("-n", netns, "link", "set", IFNAME, "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            nodes.append(Host(netns, address, switch, port))
        yield nodes
    finally:
        for netns in reversed(made):
            _stop(netns)
            subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)


def _stop(netns: str) -> None:
    host = Host(netns, "", "", "")
    host.kill_all(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while host.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    host.kill_all(signal.SIGKILL)
