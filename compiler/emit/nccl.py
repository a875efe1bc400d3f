"""launch/nccl.env: collective-communication settings derived from the hardware's links.

NCCL on NVIDIA GPUs, RCCL (ROCm's NCCL, which reads the same NCCL_* and TORCH_NCCL_* names) on AMD Instinct GPUs
(compiler/models/vendor.py), both over InfiniBand, RoCE or plain TCP between nodes; gloo on the `cpu` hardware
(intra_node.link=shm). Then the library's own: RCCL's and ROCm's (compiler/emit/rccl.py), NCCL's multi-node
NVLink on a rack-scale NVLink domain (compiler/emit/rack.py). Every line carries the reason it is there. Values
are quoted here (lmspec.compiler.emit.quoting.shell); the file is bash, sourced by launch/torchrun.sh and the
serving scripts.
"""

from __future__ import annotations

from lmspec.compiler.build.files import NCCL_ENV
from lmspec.compiler.emit.kernel_env import kernel_settings
from lmspec.compiler.emit.quoting import Quoted, comment, shell
from lmspec.compiler.emit.rack import mnnvl_settings
from lmspec.compiler.emit.rccl import rccl_settings
from lmspec.compiler.emit.render import render
from lmspec.compiler.models.vendor import vendor_of
from lmspec.compiler.plan import Plan

LIBRARY = {"nvidia": "NCCL", "amd": "RCCL", "cpu": "gloo"}  # what reads the file, by vendor

SECONDS_PER_MINUTE = 60


def emit_nccl_env(plan: Plan) -> dict[str, str]:
    """The one environment file torchrun.sh sources (locally and under Slurm): NCCL's or RCCL's, then the
    kernels'."""
    settings = nccl_settings(plan) + rccl_settings(plan) + mnnvl_settings(plan) + kernel_settings(plan)
    library = comment(LIBRARY[vendor_of(plan.spec.hardware)])
    return {NCCL_ENV: render("nccl.env.j2", name=plan.name, library=library, settings=settings)}


def cpu_ranks(plan: Plan) -> bool:
    """The `cpu` hardware: ranks are processes on host cores talking over shared memory/gloo."""
    return plan.device == "cpu"


def nccl_settings(plan: Plan) -> list[tuple[str, str, Quoted]]:
    """(why, NAME, shell-quoted value) for every exported variable, in file order."""
    c, net = plan.spec.cluster, plan.spec.hardware.inter_node
    timeout_s = c.nccl.timeout_minutes * SECONDS_PER_MINUTE
    out: list[tuple[str, str, Quoted]] = []

    def put(why: str, name: str, value: str | int) -> None:
        out.append((why, name, shell(value)))

    if plan.train is not None:
        put(
            f"DeepSpeed's default collective timeout, minutes: cluster.nccl.timeout_minutes; it must "
            f"outlast the longest checkpoint save (saved every train.checkpoint.interval="
            f"{plan.train.spec.train.checkpoint.interval} steps)",
            "DEEPSPEED_TIMEOUT",
            c.nccl.timeout_minutes,
        )
    if cpu_ranks(plan):
        if net.socket_ifname:
            put(
                "gloo (CPU ranks) binds its TCP pairs to this interface: hardware.inter_node.socket_ifname",
                "GLOO_SOCKET_IFNAME",
                net.socket_ifname,
            )
        return out
    put(
        "NCCL log level: cluster.nccl.debug (WARN shows only problems; INFO prints the rings and transports)",
        "NCCL_DEBUG",
        c.nccl.debug,
    )
    put(
        "a failed collective aborts the process group and exits instead of hanging the job",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        1,
    )
    put(
        "watchdog heartbeat: no shorter than the collective timeout (cluster.nccl.timeout_minutes), "
        "so a rank blocked behind a checkpoint save is not killed early",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
        timeout_s,
    )
    if net.socket_ifname:
        put(
            "bootstrap and TCP traffic on this interface: hardware.inter_node.socket_ifname",
            "NCCL_SOCKET_IFNAME",
            net.socket_ifname,
        )
        put("gloo (used for CPU-side barriers) on the same interface", "GLOO_SOCKET_IFNAME", net.socket_ifname)
    if net.fabric == "ethernet":
        put("hardware.inter_node.fabric=ethernet: no RDMA; NCCL uses TCP sockets between nodes", "NCCL_IB_DISABLE", 1)
        return out
    put(f"hardware.inter_node.fabric={net.fabric}: RDMA verbs between nodes", "NCCL_IB_DISABLE", 0)
    if net.hca:
        put("RDMA devices NCCL may use: hardware.inter_node.hca", "NCCL_IB_HCA", ",".join(net.hca))
    put(
        "IB verbs timeout 4.096 us x 2^n: cluster.nccl.ib_timeout (larger survives congested fabrics)",
        "NCCL_IB_TIMEOUT",
        c.nccl.ib_timeout,
    )
    put("IB retransmissions before a link error: cluster.nccl.ib_retry_cnt", "NCCL_IB_RETRY_CNT", c.nccl.ib_retry_cnt)
    if net.fabric == "roce" and c.nccl.ib_gid_index is not None:
        put(
            "RoCE GID table entry (3 = RoCEv2 on most NICs): cluster.nccl.ib_gid_index",
            "NCCL_IB_GID_INDEX",
            c.nccl.ib_gid_index,
        )
    return out
