"""Several "hosts" on this machine: network namespaces joined by veth pairs to one bridge.

Each host is a namespace with its own address on an interface of the same name in every host
(IFNAME), so one spec's hardware.inter_node.socket_ifname names it on all of them, as on a real
cluster. The bridge lives in a namespace of its own (the "switch"); taking a host's port down there
is a cable pulled. Nothing touches the machine's own network: every device is created inside these
namespaces, and deleting them removes everything. Needs root and iproute2.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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


# A client on another host than the server's: what `curl http://HEAD:PORT/...` is on a cluster.
CLIENT = """\
import json, sys, urllib.request
url, body = sys.argv[1], sys.argv[2]
request = urllib.request.Request(url, data=body.encode() or None, headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=120) as response:
    sys.stdout.write(response.read().decode())
"""


def ask(client: Host, url: str, body: dict | None = None) -> subprocess.CompletedProcess[str]:
    """GET `url` (POST `body` as JSON) from `client`'s namespace; the response body on stdout."""
    data = json.dumps(body) if body is not None else ""
    return subprocess.run(
        client.command([sys.executable, "-c", CLIENT, url, data]), capture_output=True, text=True, timeout=180
    )


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


NETNS_ETC = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/hosts over /etc/hosts


def _name_hosts(netns: list[str], addresses: list[str], names: list[list[str]]) -> list[Path]:
    """Every host resolves every host's `names` to its address, as a cluster's DNS resolves pods' names: a
    hosts file per namespace, which `ip netns exec` mounts over /etc/hosts inside it alone. The folders made."""
    lines = ["127.0.0.1 localhost"] + [f"{a} {' '.join(n)}" for a, n in zip(addresses, names, strict=True) if n]
    made = []
    for ns in netns:
        folder = NETNS_ETC / ns
        folder.mkdir(parents=True)
        made.append(folder)
        (folder / "hosts").write_text("\n".join(lines) + "\n")
    return made


@contextmanager
def hosts(count: int, tag: str = "", names: list[list[str]] | None = None) -> Iterator[list[Host]]:
    """`count` hosts at SUBNET.1, .2, ...; with `names`, host i is also reachable from every host by the
    names names[i] (DNS as Kubernetes' gives pods). Every process left in them is killed, the namespaces
    and their hosts files deleted on the way out."""
    prefix = f"lms{tag}{os.getpid() % 100000}"
    switch = f"{prefix}sw"
    made: list[str] = []
    named: list[Path] = []
    etc_made = not NETNS_ETC.exists()
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
        if names is not None:
            named = _name_hosts([n.netns for n in nodes], [n.address for n in nodes], names)
        yield nodes
    finally:
        for netns in reversed(made):
            _stop(netns)
            subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)
        for folder in named:
            shutil.rmtree(folder, ignore_errors=True)
        if etc_made and NETNS_ETC.is_dir() and not any(NETNS_ETC.iterdir()):
            NETNS_ETC.rmdir()


def _stop(netns: str) -> None:
    host = Host(netns, "", "", "")
    host.kill_all(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while host.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    host.kill_all(signal.SIGKILL)
