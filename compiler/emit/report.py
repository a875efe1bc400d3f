"""REPORT.md: the human summary reviewed in pull requests. Small and stable on purpose.

Every section but one is a function of the Plan alone. The data section
(lmspec.compiler.emit.report_data) also reads the tokenizer directory and the datasets' sidecars
where the compile runs: the one part of a build that depends on files outside the spec, so a
compile without the data (CI) reports less.
"""

from __future__ import annotations

from typing import Any

from lmspec.compiler.build.files import MEMORY_CHART, REPORT
from lmspec.compiler.capabilities import capabilities_of, target_of
from lmspec.compiler.emit.deepspeed_config import optimizer_summary
from lmspec.compiler.emit.render import render
from lmspec.compiler.emit.report_data import SOURCE_COLUMNS, data_section
from lmspec.compiler.emit.serve import serve_report_rows
from lmspec.compiler.models.train_memory import TERMS
from lmspec.compiler.models.units import GB, GIB
from lmspec.compiler.plan import Plan


def emit_report(plan: Plan) -> dict[str, str]:
    s = plan.spec
    return {
        REPORT: render(
            "report.md.j2",
            name=plan.name,
            model=s.model.name,
            hardware=s.hardware.name,
            job=_job_line(plan),
            training=_training(plan) if plan.train is not None else None,
            params_rows=_params_rows(plan),
            serve_rows=[*serve_report_rows(plan), *_serve_rows(plan)] if plan.serve is not None else None,
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
    rows = [
        ("world size", f"{layout.world_size} = {layout.nodes} node(s) x {layout.gpus_per_node}"),
        ("tp x pp x dp x cp", f"{layout.tp} x {layout.pp} x {layout.dp} x {layout.cp}"),
        ("ep x etp (expert dp)", f"{layout.ep} x {layout.etp} ({layout.expert_dp})"),
        ("layers per stage", ", ".join(map(str, layout.stage_layers))),
        ("sequence parallel", "yes" if layout.sequence_parallel else "no"),
        ("optimizer sharding", _sharding(plan)),
    ]
    if s.train.backend == "deepspeed":
        rows.append(("optimizer", optimizer_summary(plan)))
    batch = train.batch
    batch_rows = [
        (
            "micro batch x grad accum x dp",
            f"{batch.micro_batch_size} x {batch.grad_accum_steps} x {layout.dp} = {batch.global_batch_size} sequences",
        ),
        ("sequence length", f"{batch.seq_length:,}"),
        ("tokens per step", f"{batch.tokens_per_step:,}"),
    ]
    return {
        "target": _target_line(plan),
        "layout_rows": rows,
        "batch_rows": batch_rows,
        "data": data_section(plan),
        "source_columns": SOURCE_COLUMNS,
        "memory_rows": _memory_rows(plan),
        "memory_note": _memory_note(plan),
        "chart": MEMORY_CHART,
        "flops_rows": _flops_rows(plan),
    }


def _target_line(plan: Plan) -> str:
    """The code that trains the build (compiler/capabilities.py) and the kernels it picks."""
    s = plan.trained().spec
    t, caps = target_of(s), capabilities_of(s)
    uses = ["fused attention" if s.train.flash_attention else "unfused attention (stores the s x s scores)"]
    if s.model.moe is not None:
        grouped = caps is not None and caps.runs("grouped_gemm_experts")
        uses.append("grouped-GEMM experts" if grouped else "experts one after another")
    if s.train.precision == "fp8":
        uses.append(f"FP8 GEMMs ({s.train.fp8_recipe} scaling)")
    return f"Target: {t.backend}, train.transformer_impl={t.impl}, {t.device}; {', '.join(uses)}."


def _b(n: float) -> str:
    """A parameter count in billions or millions."""
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.2f} M" if n >= 1e6 else f"{n:,}"


def _gib_gb(n_bytes: float) -> tuple[str, str]:
    """Two decimals, or four significant digits below 1 (the CPU presets' megabytes stay visible)."""

    def fmt(x: float) -> str:
        return f"{x:,.2f}" if x >= 1 or x == 0 else f"{x:.4g}"

    return fmt(n_bytes / GIB), fmt(n_bytes / GB)


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
    rows = [(term, *_gib_gb(value)) for term, value in worst.terms().items()]
    total_gib, total_gb = _gib_gb(worst.total_bytes)
    rows.append(("**total**", f"**{total_gib}**", f"**{total_gb}**"))
    rows.append(("usable (device minus reserve)", *_gib_gb(plan.trained().memory.budget_bytes)))
    if worst.host_bytes:
        rows.append(("offloaded to host", *_gib_gb(worst.host_bytes)))
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
    f = plan.trained().flops
    rows = [
        ("model FLOPs per token", f"{f.per_token:.4g}"),
        ("hardware FLOPs per token (with recompute)", f"{f.hardware_per_token:.4g}"),
        ("step time at 100% MFU", f"{f.ideal_step_time_s:.4g} s ({f.n_gpus} x {f.peak_tflops_per_gpu:g} TFLOP/s)"),
    ]
    c = plan.trained().comm
    rows.append(
        (
            "communication per step (nothing overlapped)",
            ", ".join(
                f"{k} {v:.3g} s" for k, v in (("tp", c.tp_s), ("dp", c.dp_s), ("ep", c.ep_s), ("pp", c.pp_s)) if v
            )
            + f" = {c.ratio_to_compute:.0%} of compute time"
            if c.total_s
            else "none",
        )
    )
    gpu = plan.spec.hardware.gpu
    if plan.trained().spec.train.precision == "fp8":
        rows.append(
            (
                "MFU with FP8 GEMMs",
                f"quoted against the bf16 peak ({gpu.bf16_tflops:g} TFLOP/s), as DeepSeek-V3 and Megatron report "
                f"FP8 runs; the GEMMs run at up to {gpu.fp8_tflops:g} TFLOP/s",
            )
        )
    for point in (0.5, 0.4):
        at = f.at(f.ideal_step_time_s / point)
        rows.append(
            (
                f"at {point:.0%} MFU",
                f"{at['step_time_s']:.4g} s/step, {at['tokens_per_s']:,.0f} tokens/s, "
                f"{at['days_per_trillion_tokens']:,.4g} days per 1T tokens",
            )
        )
    return rows


def _serve_rows(plan: Plan) -> list[tuple[str, str]]:
    """Serving memory and throughput, from lmspec.compiler.models (serve_memory, serve_decode): per GPU,
    per engine (one data-parallel rank), per node role, and the decode bound."""
    served = plan.served()
    v, s, numbers = served.memory, served.spec.serve, served.numbers
    rows = [
        (
            "weights per GPU",
            f"{v.weights_bytes_per_gpu / GIB:,.2f} GiB ({v.weights_bytes_per_gpu / GB:,.2f} GB), tp {s.tp} x pp {s.pp}",
        ),
        ("KV cache per token per GPU", f"{v.kv_cache_bytes_per_token:,} bytes"),
        ("KV cache per GPU", f"{v.cache_budget_bytes / GIB:,.2f} GiB"),
        ("tokens in cache (per engine)", f"{v.max_tokens_in_cache:,}"),
        (f"concurrent sequences of {s.max_model_len:,} tokens (per engine)", f"{v.max_concurrent_seqs:,}"),
    ]
    for role in numbers.roles:
        nodes = ", ".join(map(str, role.nodes))
        if role.dp_ranks_per_node:
            held = (
                f"{role.dp_ranks_per_node} engine(s): {role.tokens_in_cache_per_node:,} tokens, "
                f"{role.concurrent_seqs_per_node:,} sequences of {s.max_model_len:,}"
            )
        else:
            held = "Ray worker: its GPUs run ranks of node 0's engine, no engine of its own"
        rows.append((f"node role {role.role} (node {nodes})", f"{role.gpus_per_node} GPU(s) used per node; {held}"))
    bandwidth = plan.spec.hardware.gpu.hbm_gb_per_s
    for label, bound in (("batch 1", numbers.batch1), (f"batch {numbers.full_batch.batch}", numbers.full_batch)):
        rows.append(
            (
                f"decode bound, {label}",
                f"<= {bound.tokens_per_s:,.1f} tokens/s per engine, {bound.deployment_tokens_per_s:,.1f} for "
                f"all {s.dp} engine(s) (bound: {bound.weights_read_bytes / GIB:,.2f} GiB of weights + "
                f"{bound.kv_read_bytes / GIB:,.2f} GiB of KV read per GPU per step at {bandwidth:,g} GB/s, "
                f"{s.pp} stage(s) in turn; compute and communication ignored)",
            )
        )
    return rows


def _sharding(plan: Plan) -> str:
    train = plan.trained()
    if train.spec.train.backend == "deepspeed":
        return f"DeepSpeed ZeRO stage {train.layout.zero_stage}"
    return "Megatron distributed optimizer" if train.layout.distributed_optimizer else "none (Megatron DDP)"
