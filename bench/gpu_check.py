"""The driver of bench/gpu_check.sh: the variants it trains, their builds, and the table of measured
peak memory and step time next to lmspec's estimates.

    python bench/gpu_check.py variants --gpus N [--te] [--fp8]   # names, one a line, that fit N GPUs
    python bench/gpu_check.py compile --hardware PRESET --work DIR [--te] VARIANT...   # DIR/build/<name>
    python bench/gpu_check.py table --work DIR [--json]

Each variant trains a ~320M-parameter Llama-shaped model (16 layers, hidden 1024, GQA 16/8 heads,
vocab 32768) at seq 2048 for STEPS steps on one node of PRESET: bf16 on 1 GPU, FP8 (delayed and
blockwise scaling) where Transformer Engine runs on a Hopper GPU, and with 2 GPUs TP2+SP, PP2, CP2
(TE only) and DP2 with the distributed optimizer. Without TE every variant runs megatron-core's local
path. The estimate is the Plan's: the worst GPU's training memory (compiler/models/train_memory.py)
and the step time `lmspec plan` prices the layout at (compiler/models/steptime.py); the measurement is
the run's metrics.jsonl: peak torch.cuda.max_memory_allocated and the median step time after the
first WARMUP_STEPS steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = 10
WARMUP_STEPS = 3  # CUDA/TE kernel selection, allocator growth and the first all-gathers
GIB = 2**30
MODEL = [
    "model=tiny",
    "model.num_layers=16",
    "model.hidden_size=1024",
    "model.ffn_hidden_size=4096",
    "model.num_attention_heads=16",
    "model.num_kv_heads=8",
    "model.head_dim=64",
    "model.vocab_size=32768",
    "model.max_position_embeddings=2048",
]
TRAIN = [
    "train.seq_length=2048",
    "serve.max_model_len=2048",
    "train.micro_batch_size=2",
    "train.global_batch_size=8",
    f"train.steps={STEPS}",
    "train.log_interval=1",
    "train.eval_iters=0",
    f"train.checkpoint.interval={STEPS}",
    "train.checkpoint.resume=never",
    "train.lr_schedule.warmup_steps=2",
]


@dataclass(frozen=True)
class Variant:
    name: str
    gpus: int
    overrides: tuple[str, ...]
    needs_te: bool = False  # context parallelism runs only through TE's attention
    fp8: bool = False  # FP8 GEMMs: TE on a Hopper GPU


VARIANTS = (
    Variant("tp1_bf16", 1, ()),
    Variant("tp1_fp8_delayed", 1, ("train.precision=fp8", "train.fp8_recipe=delayed"), needs_te=True, fp8=True),
    Variant("tp1_fp8_blockwise", 1, ("train.precision=fp8", "train.fp8_recipe=blockwise"), needs_te=True, fp8=True),
    Variant("tp2_sp_bf16", 2, ("parallel.tp=2", "parallel.sequence_parallel=true")),
    Variant("pp2_bf16", 2, ("parallel.pp=2",)),
    Variant("cp2_bf16", 2, ("parallel.cp=2",), needs_te=True),
    Variant("dp2_distopt_bf16", 2, ("parallel.distributed_optimizer=true",)),
)
BY_NAME = {v.name: v for v in VARIANTS}
LOCAL = ("train.transformer_impl=local", "train.flash_attention=false")  # the local path stores the scores


def build_name(variant: str) -> str:
    return f"gpu_check_{variant}"


def runnable(gpus: int, te: bool, fp8: bool) -> list[Variant]:
    return [v for v in VARIANTS if v.gpus <= gpus and (te or not v.needs_te) and (fp8 or not v.fp8)]


def overrides(variant: Variant, hardware: str, te: bool) -> list[str]:
    impl = [] if te else list(LOCAL)
    node = [f"hardware={hardware}", f"hardware.gpus_per_node={variant.gpus}", "hardware.nodes=1"]
    return [*MODEL, *node, *TRAIN, *impl, *variant.overrides, f"name={build_name(variant.name)}"]


def compile_variant(variant: Variant, hardware: str, te: bool, work: Path) -> Path:
    from lmspec.compiler.build.writer import write_build
    from lmspec.compiler.emit.manifest import build_files
    from lmspec.compiler.pipeline import make_plan

    plan = make_plan(overrides(variant, hardware, te), None)
    target = work / "build" / plan.name
    write_build(target, build_files(plan))
    return target


def _measured(metrics: Path) -> tuple[float, float] | None:
    """(peak GiB, median step s) of a run's metrics.jsonl; None when it logged no step past the warm-up."""
    if not metrics.is_file():
        return None
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.startswith("{")]
    steps = [r for r in records if "step_time_s" in r and r.get("step", 0) > WARMUP_STEPS]
    if not steps:
        return None
    peak = max(r["peak_memory_bytes"] for r in steps) / GIB
    return peak, statistics.median(r["step_time_s"] for r in steps)


def rows(work: Path) -> list[dict[str, object]]:
    from lmspec.compiler.build.reader import Build
    from lmspec.compiler.models.steptime import estimate_step_time

    out: list[dict[str, object]] = []
    for variant in VARIANTS:
        root = work / "build" / build_name(variant.name)
        if not root.is_dir():
            continue
        plan = Build.open(root).plan
        t, layout = plan.spec.train, plan.trained().layout
        step = estimate_step_time(plan.spec, plan.trained().memory)
        measured = _measured(work / "runs" / plan.name / "metrics.jsonl")
        status_file = work / "status" / variant.name  # bench/gpu_check.sh writes the run's outcome there
        status = status_file.read_text().strip() if status_file.is_file() else "-"
        out.append(
            {
                "variant": variant.name,
                "layout": f"tp{layout.tp} pp{layout.pp} cp{layout.cp} dp{layout.dp}",
                "impl": t.transformer_impl,
                "precision": t.precision if t.fp8_recipe is None else f"{t.precision}/{t.fp8_recipe}",
                "estimated_gib": plan.trained().memory.worst.total_bytes / GIB,
                "peak_gib": None if measured is None else measured[0],
                "estimated_step_s": None if step is None else float(step.total),
                "step_s": None if measured is None else measured[1],
                "status": status,
            }
        )
    return out


def _cell(value: object, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(found: list[dict[str, object]]) -> str:
    columns = ("variant", "layout", "impl", "precision", "est. GiB", "peak GiB", "est. step s", "step s", "run")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in found:
        cells = [r["variant"], r["layout"], r["impl"], r["precision"]]
        cells += [_cell(r["estimated_gib"], 2), _cell(r["peak_gib"], 2)]
        cells += [_cell(r["estimated_step_s"], 3), _cell(r["step_s"], 3), r["status"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    listing = sub.add_parser("variants")
    listing.add_argument("--gpus", type=int, required=True)
    listing.add_argument("--te", action="store_true")
    listing.add_argument("--fp8", action="store_true")
    compiling = sub.add_parser("compile")
    compiling.add_argument("--hardware", required=True)
    compiling.add_argument("--work", type=Path, required=True)
    compiling.add_argument("--te", action="store_true")
    compiling.add_argument("variant", nargs="+", choices=sorted(BY_NAME))
    tabling = sub.add_parser("table")
    tabling.add_argument("--work", type=Path, required=True)
    tabling.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.verb == "variants":
        print("\n".join(v.name for v in runnable(args.gpus, args.te, args.fp8)))
    elif args.verb == "compile":
        for name in args.variant:
            print(compile_variant(BY_NAME[name], args.hardware, args.te, args.work))
    else:
        found = rows(args.work)
        print(json.dumps(found, indent=2) if args.json else table(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
