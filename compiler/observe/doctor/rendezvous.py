"""Ranks that never meet: a world size other than the spec's, or a rendezvous that cannot connect.

Formats: torch's TCPStore (torch/csrc/distributed/c10d/TCPStore.cpp: ``Timed out after 301 seconds
waiting for clients. 1/2 clients joined.``; socket.cpp: ``The client socket has timed out after
600000ms while trying to connect to (10.0.0.1, 29500).``, older ``connect() timed out. Original timeout
was 60000 ms.``, ``The server socket has failed to listen on
any local network address.``), torch.distributed.elastic.rendezvous.api (RendezvousTimeoutError,
RendezvousConnectionError, RendezvousClosedError), megatron/core/parallel_state.py (``world_size (8)
is not divisible by 6``) and deepspeed/runtime/config.py (``train_batch_size is not equal to
micro_batch_per_gpu * gradient_acc_step * world_size 16 != 4 * 2 * 1``, which a rich console wraps
over lines).
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.doctor.findings import Finding, Fix, LogText, Watch
from lmspec.compiler.observe.logs.context import RunContext

_CLIENTS = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined")
_MEGATRON = re.compile(r"world_size \((\d+)\) is not divisible by (?:\w+ size \()?(\d+)")
_DEEPSPEED = re.compile(
    r"train_batch_size\s+is\s+not\s+equal\s+to\s+micro_batch_per_gpu\s*\*\s*gradient_acc_step\s*\*\s*"
    r"world_size\s+(\d+)\s*!=\s*(\d+)\s*\*\s*(\d+)\s*\*\s*(\d+)"
)
_DEEPSPEED_START = re.compile(r"train_batch_size is not\b")  # where a console may wrap the rest
_WRAPPED_LINES = 3
_CONNECT = re.compile(
    r"The client socket has timed out after (\S++) while trying to connect to \(([^,]++), (\d+)\)"
    r"|Rendezvous(?:Timeout|Connection|Closed)Error|connect\(\) timed out\. Original timeout was \d+ ms"
)
_LISTEN = re.compile(
    r"The server socket has failed to listen on any local network address"
    r"|[Aa]ddress already in use"
)


SINGLE_NODE_MAX_RANKS = 8  # fewer ranks than a node's GPUs: read as one node


def _nodes_fix(world: int, context: RunContext | None) -> list[Fix]:
    if context is None:
        if world <= SINGLE_NODE_MAX_RANKS:
            why = f"only if {world} GPU(s) is all the job has; else start every rank (the emitted launch script does)"
            return [Fix("hardware.nodes", "1", why), Fix("hardware.gpus_per_node", str(world), why)]
        return [Fix("hardware.nodes", f"<{world} / gpus_per_node>", f"the job really started {world} ranks")]
    per_node = context.spec.hardware.gpus_per_node
    if world % per_node == 0:
        return [
            Fix(
                "hardware.nodes",
                str(world // per_node),
                f"{world} ranks started = {world // per_node} nodes x {per_node}; or start all "
                f"{context.spec.hardware.nodes} nodes",
            )
        ]
    return [
        Fix(
            "hardware.gpus_per_node",
            str(world // context.spec.hardware.nodes),
            f"{world} ranks over {context.spec.hardware.nodes} nodes",
        )
    ]


class WorldSizeMismatch:
    name = "world_size_mismatch"
    watches = (
        Watch(_CLIENTS, (b" seconds waiting for clients. ",)),
        Watch(_DEEPSPEED_START, (b"train_batch_size is not",)),
        Watch(_MEGATRON, (b"world_size (",)),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        expected_world = context.n_gpus if context and context.trains else None
        if hits := log.find(_CLIENTS):
            joined, expected = int(hits[0][1].group(2)), int(hits[0][1].group(3))
            cause = (
                f"The rendezvous waited for {expected} ranks but only {joined} joined: some nodes or "
                f"processes were not started (different --nnodes/--nproc-per-node per node, a failed srun "
                f"task) or cannot reach MASTER_ADDR."
            )
            return Finding(
                self.name, "world size mismatch", cause, tuple(e for e, _ in hits), tuple(_nodes_fix(joined, context))
            )
        if (start := log.find(_DEEPSPEED_START, 1)) and (
            m := _DEEPSPEED.search(log.joined(start[0][0].line, _WRAPPED_LINES))
        ):
            hits = start
            batch, micro, accumulation, world = (int(g) for g in m.groups())
            planned = batch // (micro * accumulation) if micro * accumulation else None
            cause = (
                f"DeepSpeed ran with world size {world}, but ds_config's train_batch_size {batch} = "
                f"{micro} x {accumulation} x world size was computed for "
                f"{expected_world or planned or 'another number of'} ranks: the launch started "
                f"{'fewer' if planned and world < planned else 'other'} processes than the build planned."
            )
            return Finding(
                self.name, "world size mismatch", cause, tuple(e for e, _ in hits), tuple(_nodes_fix(world, context))
            )
        if hits := log.find(_MEGATRON):
            world, model = int(hits[0][1].group(1)), int(hits[0][1].group(2))
            cause = (
                f"Megatron ran with world size {world}, which tp x pp (x cp) = {model} does not divide"
                + (f"; the spec expects {expected_world} ranks" if expected_world else "")
                + "."
            )
            fixes = (
                _nodes_fix(world, context)
                if expected_world and expected_world != world
                else [
                    Fix("parallel.tp", "<a divisor of the world size>", f"tp x pp x cp must divide {world}"),
                    *(_nodes_fix(world, context) if context is None and world < model else []),
                ]
            )
            return Finding(self.name, "world size mismatch", cause, tuple(e for e, _ in hits), tuple(fixes))
        return None


class RendezvousFailure:
    name = "rendezvous"
    watches = (
        Watch(
            _LISTEN, (b"The server socket has failed to listen on any local network address", b"ddress already in use")
        ),
        Watch(_CONNECT, (b"The client socket has timed out after ", b"Rendezvous", b"connect() timed out")),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        port = context.spec.cluster.master_port if context else None
        if hits := log.find(_LISTEN):
            return Finding(
                self.name,
                "rendezvous port unavailable",
                "The master could not listen on its port: another job (or a leftover process) holds it.",
                tuple(e for e, _ in hits),
                (
                    Fix(
                        "cluster.master_port",
                        str(port + 1) if port else "<a free port>",
                        "each concurrent job on a node needs its own port",
                    ),
                ),
            )
        if hits := log.find(_CONNECT):
            match = hits[0][1]
            where = f" {match.group(2)}:{match.group(3)}" if match.group(2) else ""
            cause = (
                f"Ranks could not reach the rendezvous{where}: MASTER_ADDR is not the first node's "
                "address on a routable interface, a firewall blocks the port, or the master died."
            )
            fixes = [
                Fix(
                    "hardware.inter_node.socket_ifname",
                    "<the NIC with the MASTER_ADDR subnet>",
                    "gloo/NCCL bootstrap binds there",
                ),
                Fix(
                    "cluster.master_port",
                    str(port) if port else "<an open port>",
                    "must be open between nodes and the same on every node",
                ),
            ]
            return Finding(self.name, "rendezvous failed", cause, tuple(e for e, _ in hits), tuple(fixes))
        return None
