"""REPORT.md: the human summary reviewed in pull requests. Small and stable on purpose.

Every section is a function of the Plan alone. The data section (lmspec.compiler.emit.report_data)
shows what the compile's inputs step (lmspec.compiler.inputs) read of the tokenizer directory and the
datasets' sidecars where the compile ran: the one part of a build that depends on files outside the spec,
so a compile without the data (CI) reports less.
"""

from __future__ import annotations

from typing import Any

from lmspec.compiler.backends import backend_of
from lmspec.compiler.backends.backend import load
from lmspec.compiler.build.files import MEMORY_CHART, REPORT
from lmspec.compiler.capabilities import grouped_gemm, target_of
from lmspec.compiler.emit.render import render
from lmspec.compiler.emit.report_checkpoint import checkpoint_rows
from lmspec.compiler.emit.report_data import SOURCE_COLUMNS, data_section
from lmspec.compiler.emit.report_format import (
    MEMORY_DECIMALS,
    amount,
    count,
    days,
    flops,
    gib_gb,
    memory_unit,
    percent,
    rate,
    seconds,
)
from lmspec.compiler.emit.report_quantize import quantize_rows
from lmspec.compiler.emit.report_serve_perf import serve_perf_rows
from lmspec.compiler.emit.serve import serve_report_rows
from lmspec.compiler.launchers import launcher_of
from lmspec.compiler.models.recipes import recipe_of
from lmspec.compiler.models.summary import step_estimate
from lmspec.compiler.models.train_memory import TERMS
from lmspec.compiler.models.units import gib
from lmspec.compiler.plan import Plan

# REPORT.md's names of the step-time terms (compiler/models/summary.py STEP_TERMS)
STEP_TERM_LABELS = {
    "compute": "compute",
    "tp_comm": "tp",
    "ep_comm": "ep",
    "cp_comm": "cp",
    "pp_comm": "pp",
    "bubble": "pipeline bubble",
    "dp_comm": "dp",
    "optimizer": "optimizer step",
}


def emit_report(plan: Plan) -> dict[str, str]:
    s, launcher = plan.spec, launcher_of(plan.spec.cluster)
    return {
        REPORT: render(
            "report.md.j2",
            name=plan.name,
            model=s.model.name,
            hardware=s.hardware.name,
            job=_job_line(plan),
            training=_training(plan) if plan.train is not None else None,
            params_rows=_params_rows(plan),
            quantize_rows=quantize_rows(plan),
            serve_rows=[*serve_report_rows(plan), *_serve_rows(plan)] if plan.serve is not None else None,
            launcher=load(launcher.report)(plan) if launcher.report is not None else None,
            warnings=[w.message for w in plan.warnings],
        )
    }


def _job_line(plan: Plan) -> str:
    t, v = plan.spec.train, plan.spec.serve
    if t is None:
        return "Serve-only job (train: null): serve.model_path is served with vLLM; nothing is trained."
    trained = f"trained with {t.backend} in {t.precision}"
    return trained + ("; then served with vLLM." if v is not None else "; not served (serve: null).")


def _training(plan: Plan) -> dict[str, Any]:
    """The training sections of the report: layout, batch, data, memory, FLOPs."""
    train = plan.trained()
    s, layout = train.spec, train.layout
    backend = backend_of(s)
    rows = [
        ("world size", f"{count(layout.world_size)} = {count(layout.nodes)} node(s) x {count(layout.gpus_per_node)}"),
        ("tp x pp x dp x cp", " x ".join(count(n) for n in (layout.tp, layout.pp, layout.dp, layout.cp))),
        ("ep x etp (expert dp)", f"{count(layout.ep)} x {count(layout.etp)} ({count(layout.expert_dp)})"),
        ("layers per stage", ", ".join(map(str, layout.stage_layers))),
        ("sequence parallel", "yes" if layout.sequence_parallel else "no"),
        ("optimizer sharding", backend.sharding_summary(layout.zero_stage, layout.distributed_optimizer)),
    ]
    if backend.optimizer_summary is not None:
        rows.append(("optimizer", load(backend.optimizer_summary)(plan)))
    batch = train.batch
    batch_rows = [
        (
            "micro batch x grad accum x dp",
            f"{count(batch.micro_batch_size)} x {count(batch.grad_accum_steps)} x {count(layout.dp)} "
            f"= {count(batch.global_batch_size)} sequences",
        ),
        ("sequence length", count(batch.seq_length)),
        ("tokens per step", count(batch.tokens_per_step)),
    ]
    return {
        "target": _target_line(plan),
        "layout_rows": rows,
        "batch_rows": batch_rows,
        "data": data_section(plan),
        "source_columns": SOURCE_COLUMNS,
        "memory_unit": _memory_unit(plan),
        "memory_rows": _memory_rows(plan),
        "memory_note": _memory_note(plan),
        "chart": MEMORY_CHART,
        "flops_rows": _flops_rows(plan),
        "checkpoint_rows": checkpoint_rows(plan),
    }


def _target_line(plan: Plan) -> str:
    """The code that trains the build (compiler/capabilities.py) and the kernels it picks."""
    s = plan.trained().spec
    t = target_of(s)
    uses = ["fused attention" if s.train.flash_attention else "unfused attention (stores the s x s scores)"]
    if s.model.moe is not None:
        uses.append("grouped-GEMM experts" if grouped_gemm(s) else "experts one after another")
    recipe = recipe_of(s)
    if recipe is not None:
        uses.append(f"{s.train.precision.upper()} GEMMs ({recipe.name} scaling: {recipe.summary})")
    return f"Target: {t.backend}, train.transformer_impl={t.impl}, {t.device}; {', '.join(uses)}."


def _b(n: float) -> str:
    """A parameter count in billions or millions."""
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.2f} M" if n >= 1e6 else f"{n:,}"


def _memory_unit(plan: Plan) -> tuple[str, str]:
    """The memory table's units, chosen by its worst stage (the CPU presets' megabytes stay visible)."""
    unit = memory_unit(plan.trained().memory.worst.total_bytes)
    return unit.binary, unit.decimal


def _params_rows(plan: Plan) -> list[tuple[str, str]]:
    p = plan.params
    rows = [("total", _b(p.total)), ("activated per token", _b(p.active))]
    rows += [
        (name.replace("_", " "), _b(getattr(p, name)))
        for name in (
            "embedding",
            "output_head",
            "attention",
            "dense_mlp",
            "shared_experts",
            "routed_experts",
            "router",
            "norms",
        )
        if getattr(p, name)
    ]
    if p.mtp:  # trained and converted with the model, but not part of its published size
        rows.append(("MTP module (not in total)", _b(p.mtp)))
        rows.append(("total with MTP module", _b(p.total + p.mtp)))
    return rows


def _memory_rows(plan: Plan) -> list[tuple[str, str, str]]:
    worst = plan.trained().memory.worst
    unit = memory_unit(worst.total_bytes)

    def both(n_bytes: float) -> tuple[str, str]:
        return amount(n_bytes, unit), amount(n_bytes, unit, decimal=True)

    rows = [(term, *both(value)) for term, value in worst.terms().items()]
    total_binary, total_decimal = both(worst.total_bytes)
    rows.append(("**total**", f"**{total_binary}**", f"**{total_decimal}**"))
    rows.append(("usable (device minus reserve)", *both(plan.trained().memory.budget_bytes)))
    if worst.host_bytes:
        rows.append(("offloaded to host", *both(worst.host_bytes)))
    return rows


def _memory_note(plan: Plan) -> str:
    m = plan.trained().memory
    worst = m.worst
    where = f"pipeline stage {worst.stage} of {len(m.stages)}" if len(m.stages) > 1 else "every GPU"
    verdict = "fits" if m.fits else "does NOT fit"
    return (
        f"Worst GPU: {where} ({worst.layers} layers, {worst.in_flight:g} micro-batch(es) in flight, "
        f"recompute {plan.trained().spec.train.recompute}); {verdict}. Terms: {', '.join(TERMS)}."
    )


def _flops_rows(plan: Plan) -> list[tuple[str, str]]:
    """FLOPs, the step-time floor (100% MFU), the one estimated step time (`lmspec plan`'s and `lmspec
    explain`'s) with its terms, and the step's communication with nothing overlapped."""
    train = plan.trained()
    f, c = train.flops, train.comm
    est = step_estimate(f, train.step_time)
    rows = [
        ("model FLOPs per token", flops(f.per_token)),
        ("hardware FLOPs per token (with recompute)", flops(f.hardware_per_token)),
        (
            "step time at 100% MFU (the floor)",
            f"{seconds(f.ideal_step_time_s)} ({count(f.n_gpus)} x {f.peak_tflops_per_gpu:g} TFLOP/s)",
        ),
        (
            "**estimated step time**",
            f"**{seconds(est.step_time_s)}**: {rate(est.tokens_per_s)} tokens/s, {rate(est.tokens_per_s_per_gpu)} "
            f"tokens/s per GPU, MFU {percent(est.mfu)} (HFU {percent(est.hfu)}), "
            f"{days(est.days_per_trillion_tokens)} per 1T tokens",
        ),
        (
            "estimated step time, by term",
            ", ".join(
                f"{STEP_TERM_LABELS[term]} {seconds(value)} ({percent(value / est.step_time_s)})"
                for term, value in est.terms_s.items()
                if value
            )
            + " (exposed time: overlapped communication hidden; compiler/models/steptime.py)",
        ),
        (
            "communication per step (nothing overlapped)",
            ", ".join(
                f"{k} {seconds(v)}"
                for k, v in (("tp", c.tp_s), ("dp", c.dp_s), ("ep", c.ep_s), ("cp", c.cp_s), ("pp", c.pp_s))
                if v
            )
            + f" = {percent(c.ratio_to_compute)} of the estimated step's {seconds(c.compute_s)} of compute "
            "(the communication warning weighs what overlap leaves exposed: the terms above)"
            if c.total_s
            else "none",
        ),
    ]
    gpu = plan.spec.hardware.gpu
    precision = train.spec.train.precision
    peak = {"fp8": gpu.fp8_tflops, "fp4": gpu.fp4_tflops}.get(precision)
    if peak is not None:
        rows.append(
            (
                f"MFU with {precision.upper()} GEMMs",
                f"quoted against the bf16 peak ({gpu.bf16_tflops:g} TFLOP/s), as DeepSeek-V3 and Megatron report "
                f"FP8 runs; the GEMMs run at up to {peak:g} TFLOP/s",
            )
        )
    return rows


def _serve_rows(plan: Plan) -> list[tuple[str, str]]:
    """Serving memory and throughput, from lmspec.compiler.models (serve_memory, serve_roles): per GPU,
    per engine (one data-parallel rank), per node role, then its performance under serve.workload."""
    served = plan.served()
    v, s, numbers = served.memory, served.spec.serve, served.numbers
    rows = [
        (
            "weights per GPU",
            f"{gib_gb(v.weights_bytes_per_gpu)}, tp {s.tp} x pp {s.pp}",
        ),
        ("KV cache per token per GPU", f"{count(v.kv_cache_bytes_per_token)} bytes"),
        (
            "taken besides weights per GPU",
            f"{gib(v.activation_reserve_bytes, MEMORY_DECIMALS)}: activation peak "
            f"{gib(v.activation_peak_bytes, MEMORY_DECIMALS)}, CUDA graphs {gib(v.cudagraph_bytes, MEMORY_DECIMALS)}, "
            f"outside torch {gib(v.non_torch_bytes, MEMORY_DECIMALS)}, NCCL {gib(v.nccl_bytes, MEMORY_DECIMALS)}",
        ),
        ("KV cache per GPU", gib(v.cache_budget_bytes, MEMORY_DECIMALS)),
        ("tokens in cache (per engine)", count(v.max_tokens_in_cache)),
        (f"concurrent sequences of {count(s.max_model_len)} tokens (per engine)", count(v.max_concurrent_seqs)),
    ]
    for role in numbers.roles:
        nodes = ", ".join(map(str, role.nodes))
        if role.dp_ranks_per_node:
            held = (
                f"{role.dp_ranks_per_node} engine(s): {role.tokens_in_cache_per_node:,} tokens, "
                f"{role.concurrent_seqs_per_node:,} sequences of {s.max_model_len:,}"
            )
        else:
            held = "ranks only: its GPUs run ranks of node 0's engine (mp or Ray), no engine of its own"
        rows.append((f"node role {role.role} (node {nodes})", f"{role.gpus_per_node} GPU(s) used per node; {held}"))
    rows += serve_perf_rows(plan)
    return rows
