"""NCCL failures: watchdog timeouts, connection/system errors, and the wrong network interface.

Formats: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (``[Rank 0] Watchdog caught collective
operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, ..., Timeout(ms)=600000) ran for 600081
milliseconds before timing out.``, also read from its work record alone (``WorkNCCL(...) ran for ...``)
and from a ``what():`` message a terminal wrapped mid-word, ``Watchdog caught colle`` / ``ctive operation
timeout: WorkNCCL(SeqNum=4, ...``, https://github.com/huggingface/open-r1/issues/620; ``Some NCCL
operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, ...``), NCCL's
`ncclGetErrorString` (src/init.cc: ``unhandled system error (run with NCCL_DEBUG=INFO for details)``,
``remote process exited or there was a network error``) and NCCL_DEBUG=INFO lines (``NCCL INFO NET/Socket
: Using [0]eth0:10.0.0.1<0>``, ``NCCL INFO Using network Socket``, ``NCCL INFO NET/IB : No device
found.``, and ``Bootstrap : no socket interface found`` when no interface passes NCCL_SOCKET_IFNAME;
gloo's ``Unable to find address for: bond1``). A hung collective also shows as the heartbeat monitor's
``ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress`` and, on gloo groups
(gloo/transport/tcp/unbound_buffer.cc), ``Timed out waiting 1800000ms for recv operation to complete``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lmspec.compiler.observe.doctor.findings import Evidence, Finding, Fix, Hit, LogText, Watch
from lmspec.compiler.observe.logs.context import RunContext

# The watchdog's sentence, or the work record on its own (a wrapped or cut sentence leaves it on a line of its
# own), where what follows it says it timed out: ``WorkNCCL(SeqNum=4, OpType=BROADCAST, ..., Timeout(ms)=1800000) ran
# for 1800011 milliseconds``, ``Work WorkNCCL(...) timed out in blocking wait``
_WATCHDOG = re.compile(
    r"(?P<said>Watchdog caught collective operation timeout: )?WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r".*?Timeout\(ms\)=(?P<ms>\d+)\)(?(said)|\s+(?:ran for \d|timed out))"
)
# a C++ exception's message (``what():``) or the watchdog's sentence, where a terminal may have wrapped it
_WRAPPED_START = re.compile(r"\bwhat\(\):\s|Watchdog caught")
_WRAPPED_LINES = 4  # the start and the lines a wrap at a console's width (80 to 200 columns) spreads the rest over
# _WATCHDOG read on lines joined as they were wrapped: a wrap at a space may have lost the space
_WATCHDOG_UNWRAPPED = re.compile(
    r"Watchdog\s*caught\s*collective\s*operation\s*timeout:\s*WorkNCCL\(SeqNum=(?P<seq>\d+),\s*OpType=(?P<op>\w+)"
    r".*?Timeout\(ms\)=(?P<ms>\d+)\)"
)
_FAILED_OR_TIMED_OUT = re.compile(r"Some NCCL operations have failed or timed out")
_STUCK = re.compile(r"watchdog got stuck for (\d+) seconds|Heartbeat monitor timed out")
_GLOO = re.compile(r"Timed out waiting (\d+)ms for (\w+) operation to complete")
_NO_IFACE = re.compile(
    r"Bootstrap : no socket interface found|NET/Socket : No usable listening interface found"
    r"|Unable to find address for: (?P<gloo>\S+)"  # gloo: no such NIC (GLOO_SOCKET_IFNAME), or an unresolved host
    r"|torchrun\.sh: no network interface (?P<preflight>\S+) on "  # lmspec's own check, before the rendezvous
)
_CONNECTION = re.compile(
    r"unhandled system error \(run with NCCL_DEBUG=INFO|remote process exited or there was a network error"
    r"|NCCL WARN .*(?:[Cc]onnect|[Ss]ocket|NET/IB|[Tt]imeout)|transport retry counter exceeded"
    r"|ibv_\w++ failed|Connection reset by peer"  # \w++: the word must end at " failed" anyway
    r"|Connection closed by peer"  # gloo (tcp/pair.cc): the rank at the other end is gone
)
_SOCKET_USING = re.compile(r"NCCL INFO NET/Socket : Using (.+)$")
_IFACE = re.compile(r"\[\d+\]([^:\s]+):(\S+?)<\d+>")
_NETWORK = re.compile(r"NCCL INFO Using network (\w+)")
_NNODES = re.compile(r"NCCL INFO .*\bnNodes (\d+)")
_IB_NONE = re.compile(r"NCCL INFO NET/IB : No device found")

_NIC_WATCHES = (
    Watch(_SOCKET_USING, (b"NCCL INFO NET/Socket : Using ",)),
    Watch(_NETWORK, (b"NCCL INFO Using network ",)),
    Watch(_NNODES, (b"nNodes ",), starts=((b"NCCL INFO ", ".*"),)),
    Watch(_IB_NONE, (b"NCCL INFO NET/IB : No device found",)),
)

MIN_SUGGESTED_TIMEOUT_MINUTES = 30  # outlasts most checkpoint saves; torch's own default is 10 min
IB_TIMEOUT_SUGGESTED = 22  # 4.096 us x 2^22 = 17 s per IB transport attempt (NCCL's default is 20)
IB_RETRY_CNT_MAX = 7
# Interfaces NCCL should never carry multi-node traffic over: loopback, container/VM bridges, Wi-Fi, VPN.
_BAD_IFACE = re.compile(r"^(?:lo|docker\d*|virbr\d*|veth\w*|br-\w+|wl\w*|tailscale\d*|zt\w*)$")


@dataclass(frozen=True)
class NicChoice:
    interfaces: list[str]  # every interface NCCL listed as usable, in its order
    network: str | None  # "Socket" or "IB" (NCCL INFO Using network ...)
    nodes: int | None
    evidence: list[Evidence]


def nic_choice(log: LogText) -> NicChoice | None:
    """What NCCL_DEBUG=INFO says NCCL picked; None when the log has no INFO lines."""
    using = log.find(_SOCKET_USING, limit=1)
    network = log.find(_NETWORK, limit=1)
    nodes = log.find(_NNODES, limit=1)
    if not using and not network:
        return None
    ifaces = [m.group(1) for m in _IFACE.finditer(using[0][1].group(1))] if using else []
    evidence = [e for e, _ in using + network + log.find(_IB_NONE, limit=1)]
    return NicChoice(
        interfaces=ifaces,
        network=network[0][1].group(1) if network else None,
        nodes=int(nodes[0][1].group(1)) if nodes else None,
        evidence=evidence,
    )


def _multi_node(choice: NicChoice | None, context: RunContext | None) -> bool | None:
    if context is not None:
        return context.spec.hardware.nodes > 1
    return choice.nodes > 1 if choice is not None and choice.nodes is not None else None


def _socket_fix(choice: NicChoice | None, why: str) -> Fix:
    good = [i for i in (choice.interfaces if choice else []) if not _BAD_IFACE.match(i)]
    value = good[0] if good else "^lo,docker0"
    return Fix("hardware.inter_node.socket_ifname", value, why)


def _ib_fixes(context: RunContext | None) -> list[Fix]:
    if context is not None and context.spec.hardware.inter_node.fabric == "ethernet":
        return []
    nccl = context.spec.cluster.nccl if context is not None else None
    fixes = []
    if nccl is None or nccl.ib_timeout < IB_TIMEOUT_SUGGESTED:
        fixes.append(
            Fix(
                "cluster.nccl.ib_timeout",
                str(IB_TIMEOUT_SUGGESTED),
                "longer IB transport timeout (4.096 us x 2^n) rides out fabric hiccups",
            )
        )
    if nccl is None or nccl.ib_retry_cnt < IB_RETRY_CNT_MAX:
        fixes.append(
            Fix("cluster.nccl.ib_retry_cnt", str(IB_RETRY_CNT_MAX), "the most IB retries before NCCL gives up")
        )
    if context is None or (
        context.spec.hardware.inter_node.fabric == "roce" and (nccl is None or nccl.ib_gid_index is None)
    ):
        fixes.append(Fix("cluster.nccl.ib_gid_index", "3", "RoCEv2 GID on most NICs; a wrong GID cannot connect"))
    return fixes


def _debug_fix(choice: NicChoice | None) -> list[Fix]:
    if choice is not None:
        return []
    return [
        Fix(
            "cluster.nccl.debug",
            "INFO",
            "rerun once with INFO: the log then shows which NIC and "
            "transport NCCL picked, and `lmspec doctor` checks them",
        )
    ]


class NcclTimeout:
    name = "nccl_timeout"
    watches = (
        Watch(_WATCHDOG, (b"WorkNCCL(SeqNum=",)),
        Watch(_WRAPPED_START, (b"what():", b"Watchdog caught")),
        Watch(_FAILED_OR_TIMED_OUT, (b"Some NCCL operations have failed or timed out",)),
        Watch(_STUCK, (b"watchdog got stuck for ", b"Heartbeat monitor timed out")),
        Watch(_GLOO, (b"Timed out waiting ",)),
        *_NIC_WATCHES,
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_WATCHDOG) or _unwrapped_watchdog(log)
        gloo = log.find(_GLOO, limit=1)
        others = log.find(_FAILED_OR_TIMED_OUT, limit=1) + log.find(_STUCK, limit=2)
        if not hits and not gloo and not others:
            return None
        choice = nic_choice(log)
        seq = int(hits[0][1].group("seq")) if hits else None
        first = seq is not None and seq <= 1
        timeout_ms: int | None = None
        if hits:
            timeout_ms = ms = int(hits[0][1].group("ms"))
            cause = f"{hits[0][1].group('op')} (collective #{seq}) did not finish within {_minutes(ms)} on some rank. "
        elif gloo:
            timeout_ms = ms = int(gloo[0][1].group(1))
            cause = f"A gloo {gloo[0][1].group(2)} waited {_minutes(ms)} for its peer. "
        else:
            cause = "NCCL aborted collectives that failed, timed out or hung (its watchdog stopped making progress). "

        cause += (
            "It was the first collective: ranks never connected, which is a network path problem "
            "(wrong NIC, firewall, IB not usable), not a slow step."
            if first
            else "One rank stopped joining: it crashed, hung (data loader, checkpoint save longer than the "
            "timeout) or lost its network path. Look above for the first error of any rank."
        )
        fixes = [*_debug_fix(choice)]
        if choice is not None and choice.interfaces and _BAD_IFACE.match(choice.interfaces[0]):
            fixes.append(_socket_fix(choice, f"NCCL picked {choice.interfaces[0]}, which cannot reach other nodes"))
        elif gloo and context is not None and context.spec.hardware.nodes > 1:
            # gloo names no NIC: on several nodes a peer that went silent is the link first
            ifname = context.spec.hardware.inter_node.socket_ifname or "^lo,docker0"
            fixes.append(
                Fix(
                    "hardware.inter_node.socket_ifname",
                    ifname,
                    f"keep it only if {ifname} is up on every node and reaches node 0 (gloo binds to it); a node "
                    "whose link went down leaves the others waiting until the timeout",
                )
            )
        current = context.spec.cluster.nccl.timeout_minutes if context else (timeout_ms or 0) // 60000
        if not first and 0 < current < MIN_SUGGESTED_TIMEOUT_MINUTES * 2:
            fixes.append(
                Fix(
                    "cluster.nccl.timeout_minutes",
                    str(max(2 * current, MIN_SUGGESTED_TIMEOUT_MINUTES)),
                    f"only if a checkpoint save or first-step compile legitimately outlasts the current {current} min",
                )
            )
        evidence = [e for e, _ in hits + gloo + others] + (choice.evidence if choice else [])
        return Finding(self.name, "collective timed out (watchdog)", cause, tuple(evidence), tuple(fixes))


def _unwrapped_watchdog(log: LogText) -> list[Hit]:
    """The watchdog's sentence a terminal wrapped over lines (``... Watchdog caught colle`` / ``ctive operation
    timeout: WorkNCCL(...``), read from the first of its starts (``what():`` or ``Watchdog caught``) that holds it."""
    for evidence, _ in log.find(_WRAPPED_START):
        if match := _WATCHDOG_UNWRAPPED.search(log.unwrapped(evidence.line, _WRAPPED_LINES)):
            return [(evidence, match)]
    return []


def _minutes(ms: int) -> str:
    return f"{ms / 60000:g} min"


class NcclConnectionError:
    name = "nccl_connection"
    watches = (
        Watch(
            _CONNECTION,
            (
                b"unhandled system error (run with NCCL_DEBUG=INFO",
                b"remote process exited or there was a network error",
                b"NCCL WARN ",
                b"transport retry counter exceeded",
                b"ibv_",
                b"Connection reset by peer",
                b"Connection closed by peer",
            ),
            # each branch begins with its first word; a failed "NCCL WARN .*" fails at every later
            # "NCCL WARN " too, a failed "ibv_\w++ failed" at every later "ibv_" in the same word
            starts=(
                b"unhandled system error (run with NCCL_DEBUG=INFO",
                b"remote process exited or there was a network error",
                (b"NCCL WARN ", ".*"),
                b"transport retry counter exceeded",
                (b"ibv_", r"\w*"),
                b"Connection reset by peer",
                b"Connection closed by peer",
            ),
        ),
        *_NIC_WATCHES,
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_CONNECTION)
        if not hits:
            return None
        choice = nic_choice(log)
        cause = (
            "NCCL (or gloo) could not open or keep a connection between ranks: a peer died first (check the "
            "other ranks' first error: each rank's output is under runs/<name>/rank_logs/), or the NIC/IB settings "
            "do not reach the other nodes."
        )
        fixes = [
            *_debug_fix(choice),
            _socket_fix(choice, "bootstrap and socket traffic on the NIC that routes between nodes"),
            *_ib_fixes(context),
        ]
        evidence = [e for e, _ in hits] + (choice.evidence if choice else [])
        return Finding(self.name, "NCCL connection / system error", cause, tuple(evidence), tuple(fixes))


class NcclInterface:
    """NCCL_DEBUG=INFO shows a NIC or transport that cannot be right for this job."""

    name = "nccl_interface"
    watches = (
        *_NIC_WATCHES,
        Watch(
            _NO_IFACE,
            (
                b"no socket interface found",
                b"No usable listening interface",
                b"Unable to find address for: ",
                b"torchrun.sh: no network interface ",
            ),
        ),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        if none := log.find(_NO_IFACE):
            wanted = context.spec.hardware.inter_node.socket_ifname if context else None
            return Finding(
                self.name,
                "NCCL found no network interface",
                (
                    f"launch/torchrun.sh found no interface {name} on this node"
                    if (name := none[0][1].group("preflight"))
                    else f"gloo found no address for {name}: no interface of that name here, or (with no "
                    "GLOO_SOCKET_IFNAME) a hostname that does not resolve to this node"
                    if (name := none[0][1].group("gloo"))
                    else "No interface of this node passes NCCL_SOCKET_IFNAME"
                )
                + (f" ({wanted}, from hardware.inter_node.socket_ifname)" if wanted else "")
                + ", so the bootstrap has nothing to bind to.",
                tuple(e for e, _ in none),
                (
                    Fix(
                        "hardware.inter_node.socket_ifname",
                        "<an interface `ip -brief addr` lists, or null>",
                        "a prefix of a NIC every node has (eth, ens, ib); null lets NCCL pick",
                    ),
                ),
            )
        choice = nic_choice(log)
        if choice is None:
            return None
        multi = _multi_node(choice, context)
        problems = []
        picked = choice.interfaces[0] if choice.interfaces else None
        if picked and _BAD_IFACE.match(picked) and multi is not False:
            problems.append(f"NCCL_SOCKET_IFNAME resolved to {picked}, an interface other nodes cannot reach")
        if context is not None:
            wanted = context.spec.hardware.inter_node.socket_ifname
            if wanted and picked and not wanted.startswith("^") and not picked.startswith(wanted):
                problems.append(
                    f"the spec asks for {wanted} (hardware.inter_node.socket_ifname) but NCCL used {picked}"
                )
            fabric = context.spec.hardware.inter_node.fabric
            if multi and fabric in ("ib", "roce") and choice.network == "Socket":
                problems.append(
                    f"the spec's fabric is {fabric} but NCCL fell back to TCP sockets (no usable "
                    "IB device), several times slower between nodes"
                )
        if not problems:
            return None
        fixes = [_socket_fix(choice, "pin NCCL and gloo to the inter-node NIC")]
        if context is not None and choice.network == "Socket" and context.spec.hardware.inter_node.fabric != "ethernet":
            fixes.append(
                Fix(
                    "hardware.inter_node.hca",
                    "[mlx5_0,...]",
                    "name the RDMA devices (`ibv_devices`) so NCCL_IB_HCA selects them",
                )
            )
        return Finding(
            self.name, "NCCL picked the wrong network", "; ".join(problems) + ".", tuple(choice.evidence), tuple(fixes)
        )
