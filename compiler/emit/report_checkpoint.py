"""REPORT.md's checkpoint section: what one save writes, the part that stops training (exposed) apart from
the part that runs beside it (the persist, when asynchronous), the host memory it stages in, and the
interval against Young/Daly's (compiler/models/checkpoint_size.py prices them all)."""

from __future__ import annotations

from lmspec.compiler.emit.report_format import count, percent, seconds, storage
from lmspec.compiler.models.checkpoint_size import DIGEST_BYTES_PER_S, CheckpointSize
from lmspec.compiler.models.units import GB, GIB, held_precision
from lmspec.compiler.plan import Plan, TrainPlan
from lmspec.compiler.rules.checkpoint import advice_text

SECONDS_PER_HOUR = 3600


def _gb_per_s(rate: float) -> str:
    return f"{rate / GB:,.2f} GB/s"


def _host(c: CheckpointSize, gpus_per_node: int) -> str:
    staged = f"{storage(c.host_bytes_per_node)} per node ({gpus_per_node} ranks' shares)"
    if c.host_memory_bytes is None:
        return f"{staged}; hardware.host_memory_gib=null: not checked"
    share = c.host_bytes_per_node / c.host_memory_bytes
    return f"{staged}, {percent(share)} of hardware.host_memory_gib={c.host_memory_bytes / GIB:g}"


def checkpoint_rows(plan: Plan) -> list[tuple[str, str]]:
    """What one save writes, what it stops training for, and how often to save."""
    train = plan.trained()
    c, s, timed = train.checkpoint, train.spec, train.cadence
    t, cluster = s.train, s.cluster
    parts = [
        f"{c.weight_bytes_per_param} B {held_precision(t.precision)} weights" if c.weight_bytes_per_param else "",
        f"{c.master_bytes_per_param} B fp32 master weights" if c.master_bytes_per_param else "",
        f"{c.moment_bytes_per_param} B fp32 optimizer moments ({c.moments} per parameter)",
    ]
    state = " + ".join(part for part in parts if part)
    staging = (
        f"each of {count(c.ranks)} ranks copies its share, {storage(c.bytes_per_rank)}, to host memory at "
        f"{_gb_per_s(c.host_copy_bytes_per_s)}"
    )
    written = f"written at cluster.storage_write_gb_per_s={cluster.storage_write_gb_per_s:g}"
    digest = f"xxh3_128 at {_gb_per_s(DIGEST_BYTES_PER_S)}: {seconds(c.digest_s)}"
    persist = (
        f"{seconds(c.persist_s)}: {written}, each rank digesting its share as it writes it ({digest}, inside the write)"
        if c.digest_s <= c.write_s
        else f"{seconds(c.persist_s)}: each rank digesting its share as it writes it ({digest}) outlasts the write "
        f"({seconds(c.write_s)} {written})"
    )
    if c.async_save:
        exposed = f"**{seconds(timed.exposed_per_save_s)}** (train.checkpoint.async_save=true): {staging}" + (
            f", then waits {seconds(timed.wait_s)} for the previous save's persist (it outlasts the interval)"
            if timed.wait_s > 0
            else "; training then continues"
        )
        persist_row = ("save, persisted in the background", persist)
    else:
        exposed = (
            f"**{seconds(c.exposed_s)}** (train.checkpoint.async_save=false): {staging} ({seconds(c.staging_s)}), "
            f"then every rank waits for the persist"
        )
        persist_row = ("save, persisted while training waits", persist)
    hours = timed.job_mtbf_s / SECONDS_PER_HOUR
    return [
        ("parameters saved", f"{count(c.params)}" + (" (with the MTP module)" if plan.params.mtp else "")),
        ("bytes per parameter", f"{c.bytes_per_param} = {state}"),
        ("per save", storage(c.bytes_per_save)),
        (
            f"kept (train.checkpoint.keep_last_k={c.saves_kept})",
            f"{storage(c.kept_bytes)}; {storage(c.peak_bytes)} while the next save is written",
        ),
        ("save, exposed (training stops)", exposed),
        persist_row,
        ("staged in host memory", _host(c, s.hardware.gpus_per_node)),
        (
            "collective timeout",
            f"{seconds(c.timeout_s)} (cluster.nccl.timeout_minutes={cluster.nccl.timeout_minutes}): "
            + (
                "a save's exposed time outlasts it (see the warnings)"
                if timed.exposed_per_save_s > c.timeout_s
                else "a save's exposed time ends inside it"
            ),
        ),
        (
            f"interval (train.checkpoint.interval={t.checkpoint.interval})",
            f"{seconds(timed.interval_s)} at the estimated step time; loses {percent(timed.lost_share)} of the "
            f"run to saves and to work redone after interruptions (one every {hours:,.1f} h: "
            f"cluster.node_mtbf_hours={cluster.node_mtbf_hours:g} / {count(s.hardware.nodes)} node(s))",
        ),
        (
            "advised interval (Young/Daly)",
            f"{count(timed.advised_interval_steps)} steps: loses {percent(timed.advised_lost_share)} "
            f"({advice_text(timed)})",
        ),
    ]


def checkpoint_line(train: TrainPlan) -> str:
    """One line for `lmspec explain`: the exposed save apart from the overlapped persist, and the interval."""
    c, timed = train.checkpoint, train.cadence
    persist = (
        f"{seconds(c.persist_s)} persisted in the background"
        if c.async_save
        else f"{seconds(c.persist_s)} of it the persist, waited for"
    )
    wait = f", {seconds(timed.wait_s)} of it waiting for the previous persist" if timed.wait_s > 0 else ""
    return (
        f"checkpoint save (train.checkpoint.async_save={str(c.async_save).lower()}): "
        f"{seconds(timed.exposed_per_save_s)} exposed (training stops{wait}), {persist}; "
        f"every {count(timed.interval_steps)} steps ({seconds(timed.interval_s)}), Young/Daly advises "
        f"{count(timed.advised_interval_steps)}"
    )
