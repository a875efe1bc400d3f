"""How a vLLM engine sits on the nodes: the one owner of its GPU and node counts and node roles.

An engine of serve.tp x serve.pp x serve.dp GPUs that fits one node runs as one `vllm serve`.
A larger one spans nodes the three ways vLLM 0.32 runs (serve.multi_node):

- mp: vLLM's multiprocessing executor across nodes; every node runs `vllm serve
  --distributed-executor-backend mp --nnodes N --node-rank R --master-addr HEAD --master-port P`
  (the others also --headless), each starting its share of the tp x pp ranks, which meet in one
  torch.distributed group at node 0's store; node 0 also serves the API. vLLM needs --nnodes to
  divide the world size (every node the same number of ranks), and lmspec takes it for one engine
  (serve.dp=1): replicas of a multi-node engine are separate deployments (serve.replicas);
- ray: a Ray cluster (head on node 0, workers joining it); node 0 runs `vllm serve
  --distributed-executor-backend ray` and tensor/pipeline parallel crosses nodes;
- data_parallel: every node runs `vllm serve` with its share of the data-parallel ranks
  (--data-parallel-size-local); node 0 also serves the API, the others are --headless and
  start at their first rank (--data-parallel-start-rank). Each rank's tp x pp stays inside a node.

`auto` takes data_parallel where each rank fits a node (no collective of the forward pass crosses
nodes), else mp where it applies, and Ray only for what mp cannot run (serve.dp > 1 with tp x pp
across nodes, or nodes holding different numbers of ranks). Ray is the part of a multi-node vLLM
deployment teams report most trouble with: one more distributed system, installed at the same
version on every node, its own head and port, a cluster that must form before vLLM starts, and
placement-group and resource errors of its own. mp needs nothing but vLLM on every node: the same
`vllm serve` with a node rank, one TCP store, and no process that outlives the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.spec.sections import ServingSpec

Mode = Literal["single_node", "mp", "ray", "data_parallel"]
RoleName = Literal["serve", "head", "worker"]


@dataclass(frozen=True, kw_only=True)
class ServeRole:
    """What one kind of node runs: serve (a one-node engine), head (node 0) or worker (the others)."""

    name: RoleName
    nodes: tuple[int, ...]  # node ranks of this role
    gpus_per_node: int  # GPUs the engine uses on each of those nodes
    dp_ranks_per_node: int  # data-parallel ranks on each node (1 for mp and ray: the ranks span nodes)


@dataclass(frozen=True, kw_only=True)
class ServeLayout:
    gpus: int  # serve.tp x serve.pp x serve.dp
    nodes: int  # nodes the engine occupies
    mode: Mode
    dp_ranks_per_node: int  # data_parallel: --data-parallel-size-local; otherwise serve.dp
    roles: tuple[ServeRole, ...]

    @property
    def spans_nodes(self) -> bool:
        """One engine's tensor/pipeline ranks cross nodes (mp, ray): node 0 holds every engine's scheduler
        and KV cache accounting, the other nodes only ranks."""
        return self.mode in ("mp", "ray")


def engine_gpus(spec: ServingSpec) -> int:
    v = spec.serve
    return v.tp * v.pp * v.dp


def engine_nodes(spec: ServingSpec) -> int:
    return -(-engine_gpus(spec) // spec.hardware.gpus_per_node)


def data_parallel_applies(spec: ServingSpec) -> bool:
    """Every data-parallel rank (tp x pp GPUs) fits inside a node and the nodes split the ranks evenly."""
    v, per_node = spec.serve, spec.hardware.gpus_per_node
    rank_gpus = v.tp * v.pp
    if rank_gpus > per_node or per_node % rank_gpus:
        return False
    return v.dp % (per_node // rank_gpus) == 0 and v.dp > per_node // rank_gpus


def mp_applies(spec: ServingSpec) -> bool:
    """One engine (serve.dp=1) whose ranks split evenly over its nodes: vLLM refuses an --nnodes that
    does not divide the world size, and starts the same number of ranks on every node."""
    return spec.serve.dp == 1 and engine_gpus(spec) % engine_nodes(spec) == 0


def serve_mode(spec: ServingSpec) -> Mode:
    if engine_nodes(spec) == 1:
        return "single_node"
    chosen = spec.serve.multi_node
    if chosen == "auto":
        if data_parallel_applies(spec):
            return "data_parallel"
        return "mp" if mp_applies(spec) else "ray"
    return chosen


def serve_layout(spec: ServingSpec) -> ServeLayout:
    """The engine's layout; a `data_parallel` or `mp` choice where it does not apply is refused by
    rules.serving before a Plan is made."""
    v, per_node = spec.serve, spec.hardware.gpus_per_node
    gpus, nodes, mode = engine_gpus(spec), engine_nodes(spec), serve_mode(spec)
    if mode == "single_node":
        roles = (ServeRole(name="serve", nodes=(0,), gpus_per_node=gpus, dp_ranks_per_node=v.dp),)
        return ServeLayout(gpus=gpus, nodes=1, mode=mode, dp_ranks_per_node=v.dp, roles=roles)
    if mode == "data_parallel":
        local = per_node // (v.tp * v.pp)
        used = local * v.tp * v.pp
    elif mode == "mp":
        local, used = 1, gpus // nodes  # vLLM's local world size: the same on every node
    else:
        local, used = 1, per_node
    head = ServeRole(name="head", nodes=(0,), gpus_per_node=used, dp_ranks_per_node=local)
    last = gpus - used * (nodes - 1)  # ray: the last node may hold fewer of the engine's GPUs
    workers = ServeRole(
        name="worker",
        nodes=tuple(range(1, nodes)),
        gpus_per_node=last if mode == "ray" else used,
        dp_ranks_per_node=local,
    )
    return ServeLayout(gpus=gpus, nodes=nodes, mode=mode, dp_ranks_per_node=local, roles=(head, workers))
