"""Ranks that never meet: a world size other than the spec's, or a rendezvous that cannot connect.

Formats: torch's TCPStore (torch/csrc/distributed/c10d/TCPStore.cpp: ``Timed out after 301 seconds
waiting for clients. 1/2 clients joined.``; socket.cpp: ``The client socket has timed out after
600000ms while trying to connect to (10.0.0.1, 29500).``, older ``connect() timed out. Original timeout
was 60000 ms.``, ``The server socket has failed to listen on
any local network address.``), torch.distributed.elastic.rendezvous.api (RendezvousTimeoutError,
RendezvousConnectionError, RendezvousClosedError), megatron/core/parallel_state.py (``world_size (8)
is not divisible by 6``; older releases name each size: ``world_size (8) is not divisible by
tensor_model_parallel_size (2) x pipeline_model_parallel_size (3) x context_parallel_size (1)``, each
mapped to its key; the expert layers' ``world_size (8) is not divisible by
expert_tensor_model_pipeline_parallel size (16)``, https://github.com/THUDM/slime/issues/1818, to
parallel.ep and parallel.etp) and deepspeed/runtime/config.py (``train_batch_size is not equal to
micro_batch_per_gpu * gradient_acc_step * world_size 16 != 4 * 2 * 1``, which a rich console wraps
over lines).
"""

from __future__ import annotations

import math
import re

from lmspec.compiler.observe.doctor.findings import Finding, Fix, Hit, LogText, Watch
from lmspec.compiler.observe.logs.context import RunContext

_CLIENTS = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined")
# Megatron's parallel_state.py, by version: ``world_size (1) is not divisible by 2``, ``world_size (8) is not
# divisible by tensor_model_parallel_size (2) x pipeline_model_parallel_size (3) x context_parallel_size (1)``
# (Megatron-DeepSpeed: ``x sequence_parallel_size (2)``), the expert groups' ``decoder world_size (8) is not
# divisible by expert_tensor_model_pipeline_parallel size (16)``; the sizes after "by" are read by _FACTOR
_MEGATRON = re.compile(
    r"world_size`? \((\d+)\) is not divisible by (?P<by>\d+|\w+?[_ ]size \(\d+\)(?: x \w+?[_ ]size \(\d+\))*)"
)
_FACTOR = re.compile(r"(\w+?)[_ ]size \((\d+)\)")
# a size Megatron names, by the first words of its name: how the cause writes it and the spec keys that set it
_FACTOR_KEYS = (
    ("expert_tensor_model_pipeline", "etp x ep x pp", ("parallel.ep", "parallel.etp")),  # the expert layers' product
    ("expert_tensor", "etp", ("parallel.etp",)),
    ("expert", "ep", ("parallel.ep",)),
    ("tensor", "tp", ("parallel.tp",)),
    ("pipeline", "pp", ("parallel.pp",)),
    ("context", "cp", ("parallel.cp",)),
    ("sequence", "cp", ("parallel.cp",)),  # Megatron-DeepSpeed's sequence (Ulysses) parallel size splits the sequence
)
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
        Watch(_MEGATRON, (b"world_size (", b"world_size` (")),
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
            return self._megatron(hits, expected_world, context)
        return None

    def _megatron(self, hits: list[Hit], expected_world: int | None, context: RunContext | None) -> Finding:
        """Megatron's world size that its parallel sizes do not divide: the keys of the sizes it names."""
        match = hits[0][1]
        world, by = int(match.group(1)), match.group("by")
        factors = [(*_named(name), int(size)) for name, size in _FACTOR.findall(by)]
        model = math.prod(size for *_, size in factors) if factors else int(by)
        expert = any("parallel.ep" in keys for _, keys, _ in factors)
        sizes = " x ".join(f"{label} {size}" if len(factors) > 1 else label for label, _, size in factors)
        cause = (
            f"Megatron ran with world size {world}, which "
            + ("the expert layers' " if expert else "")
            + f"{sizes or 'tp x pp (x cp)'} = {model} does not divide"
            + (f"; the spec expects {expected_world} ranks" if expected_world else "")
            + "."
        )
        if expected_world and expected_world != world:
            fixes = _nodes_fix(world, context)
        elif not factors or not any(keys for _, keys, _ in factors):
            fixes = [
                Fix("parallel.tp", "<a divisor of the world size>", f"tp x pp x cp must divide {world}"),
                *(_nodes_fix(world, context) if context is None and world < model else []),
            ]
        else:
            fixes = _factor_fixes(world, model, factors)
            if not expert and context is None:  # or the world is not the one the layout was meant for
                fixes += (
                    _nodes_fix(world, context)
                    if world < model
                    else [
                        Fix(
                            "hardware.nodes",
                            f"<nodes x gpus_per_node a multiple of {model}>",
                            f"or keep the layout and start a world of ranks that {model} divides",
                        )
                    ]
                )
        return Finding(self.name, "world size mismatch", cause, tuple(e for e, _ in hits), tuple(fixes))


def _named(name: str) -> tuple[str, tuple[str, ...]]:
    """How the cause writes a parallel size Megatron names (``tensor_model_parallel``,
    ``expert_tensor_model_pipeline_parallel``), and the spec keys that set it."""
    return next(((label, keys) for words, label, keys in _FACTOR_KEYS if name.startswith(words)), (name, ()))


def _factor_fixes(world: int, model: int, factors: list[tuple[str, tuple[str, ...], int]]) -> list[Fix]:
    """One fix per key of the named sizes: the largest value up to the current one that, with the others kept,
    divides the world; a size of 1 cannot shrink and is left out (unless every size is 1)."""
    fixes: dict[str, Fix] = {}
    for label, keys, size in factors:
        if size == 1 and any(other > 1 for *_, other in factors):
            continue
        rest = model // size
        fitting = next((d for d in range(size, 0, -1) if world % (rest * d) == 0), None)
        for key in keys:
            if len(keys) > 1:  # a product of several keys: which to lower is the user's choice
                value = f"<so that {label} divides {world}>"
            else:
                value = str(fitting) if fitting else f"<with the other sizes, a divisor of {world}>"
            why = (
                f"{label} {size} is in the product {model} that must divide world size {world}"
                if len(factors) > 1
                else f"{label} = {size} must divide world size {world}"
            )
            fixes.setdefault(key, Fix(key, value, why))
    return list(fixes.values())


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
