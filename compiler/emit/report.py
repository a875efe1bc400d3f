"""REPORT.md: the human summary reviewed in pull requests. Small and stable on purpose."""

from __future__ import annotations

from compiler.plan import Plan
from compiler.render import render


def emit_report(plan: Plan) -> dict[str, str]:
    s, layout = plan.spec, plan.layout
    rows = [
        ("world size", f"{layout.world_size} = {layout.nodes} node(s) x {layout.gpus_per_node}"),
        ("tp x pp x dp x cp", f"{layout.tp} x {layout.pp} x {layout.dp} x {layout.cp}"),
        ("ep x etp (expert dp)", f"{layout.ep} x {layout.etp} ({layout.expert_dp})"),
        ("layers per stage", ", ".join(map(str, layout.stage_layers))),
        ("sequence parallel", "yes" if layout.sequence_parallel else "no"),
        ("optimizer sharding", _sharding(plan)),
    ]
    batch = plan.batch
    batch_rows = [
        ("micro batch x grad accum x dp", f"{batch.micro_batch_size} x {batch.grad_accum_steps} x {layout.dp} = {batch.global_batch_size} sequences"),
        ("sequence length", f"{batch.seq_length:,}"),
        ("tokens per step", f"{batch.tokens_per_step:,}"),
    ]
    return {"REPORT.md": render(
        "report.md.j2", name=plan.name, model=s.model.name, hardware=s.hardware.name,
        backend=s.train.backend, precision=s.train.precision, layout_rows=rows, batch_rows=batch_rows,
        warnings=[w.message for w in plan.warnings])}


def _sharding(plan: Plan) -> str:
    if plan.spec.train.backend == "deepspeed":
        return f"DeepSpeed ZeRO stage {plan.layout.zero_stage}"
    return "Megatron distributed optimizer" if plan.layout.distributed_optimizer else "none (Megatron DDP)"
