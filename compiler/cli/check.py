"""`lmspec check`: validate a spec and report every problem at once; writes nothing."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmspec.compiler.cli.help_text import described
from lmspec.compiler.cli.spec_args import add_spec_args
from lmspec.compiler.cli.spec_repo import check_specs, repo_specs
from lmspec.compiler.errors import EXIT_OK, print_problems
from lmspec.compiler.plan import Plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="validate only: every problem at once",
        **described(
            "Compose the spec (lmspec's defaults, your --spec, then the overrides), check its shape against the "
            "schema and every rule (world size, divisibility, TP inside a node, the memory budget, ...), and "
            "print every problem with the key, where its value came from, and the fix. Writes nothing; exit 1 "
            "on an error. In a spec repository (lmspec init) without --spec, every spec in specs/ is checked.",
            "lmspec check",
            "lmspec check model=llama3_8b hardware=h100_80g hardware.nodes=2 parallel.tp=8",
            "lmspec check --spec specs/llama3_8b_pretrain_8gpu_h100_bf16.yaml train.seq_length=8192",
            "lmspec check --spec specs/llama3_8b_pretrain_8gpu_h100_bf16.yaml hardware.nodes=4 "
            "--resume-from runs/llama3_8b_pretrain_8gpu_h100_bf16/checkpoints",
        ),
    )
    add_spec_args(p)
    p.add_argument(
        "--resume-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="also say whether this spec can resume from the checkpoint in DIR (a train.checkpoint.dir: the step "
        "a run would resume from; or one step_<N> directory), e.g. at another parallel layout, and why not; exit 1 "
        "when it cannot",
    )
    p.set_defaults(handler=_cmd_check)


def _cmd_check(args: argparse.Namespace) -> int:
    from lmspec.compiler.pipeline import make_plan

    if args.resume_from is None and (specs := repo_specs(args.spec, list(args.overrides), "check")):
        return check_specs(specs, Path("build"), compile_check=False)
    plan = make_plan(list(args.overrides), args.spec)
    print_problems(plan.warnings)
    print(f"{plan.name}: valid ({'; '.join(_parts(plan))}; {len(plan.warnings)} warnings)")
    if args.resume_from is not None:
        from lmspec.compiler.cli.check_resume import check_resume

        return check_resume(plan, args.resume_from)
    return EXIT_OK


def _parts(plan: Plan) -> list[str]:
    """What the job does, one phrase per part it has."""
    parts = []
    if plan.train is not None:
        t = plan.train.layout
        parts.append(f"trains on {t.world_size} ranks: tp {t.tp} x pp {t.pp} x dp {t.dp} x cp {t.cp}")
    if plan.serve is not None:
        v, layout = plan.serve.spec.serve, plan.serve.layout
        nodes = f" on {layout.nodes} nodes ({layout.mode.replace('_', ' ')})" if layout.nodes > 1 else ""
        parts.append(f"serves on {layout.gpus} GPU(s): tp {v.tp} x pp {v.pp} x dp {v.dp}{nodes}")
    return parts
