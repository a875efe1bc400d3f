"""The Megatron backend's configuration as reviewed artifacts (train.backend=megatron only).

megatron/config.json is lmspec.compiler.backends.megatron_config's document, what the trainer builds every
megatron-core object from, as DeepSpeed's engine is built from ds_config.json; megatron/pretrain_gpt_args.sh
says the same to Megatron-LM (lmspec.compiler.backends.megatron_args), one quoted argument per line.
"""

from __future__ import annotations

from lmspec.compiler.backends.megatron_args import megatron_lm_args
from lmspec.compiler.backends.megatron_config import megatron_config
from lmspec.compiler.build.files import MEGATRON_ARGS, MEGATRON_CONFIG
from lmspec.compiler.emit.quoting import Quoted, shell, word
from lmspec.compiler.emit.render import render
from lmspec.compiler.emit.spec_files import dump_json
from lmspec.compiler.plan import Plan


def _lines(args: list[str]) -> list[Quoted]:
    """One line per flag with its value, if it takes one."""
    lines: list[Quoted] = []
    for arg in args:
        if arg.startswith("--"):
            lines.append(word(arg))
        else:
            lines[-1] = Quoted(f"{lines[-1]} {shell(arg)}")
    return lines


def emit_megatron_config(plan: Plan) -> dict[str, str]:
    """The Megatron backend's emitter (lmspec.compiler.backends.megatron names it)."""
    document = megatron_config(plan)
    args, notes = megatron_lm_args(plan, document)
    return {
        MEGATRON_CONFIG: dump_json(document),
        MEGATRON_ARGS: render("pretrain_gpt_args.sh.j2", name=plan.name, lines=_lines(args), notes=notes),
    }
