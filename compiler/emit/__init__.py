"""Emitters: one pure function per artifact kind, Plan -> {relative path: text}.

EMITTERS is a plain table; `emit_all` runs each and refuses two emitters writing one path.
"""

from __future__ import annotations

from collections.abc import Callable

from compiler.emit.conversion import emit_conversion
from compiler.emit.deepspeed_config import emit_ds_config
from compiler.emit.launch import emit_launch
from compiler.emit.memory_chart import emit_memory_chart
from compiler.emit.nccl import emit_nccl_env
from compiler.emit.report import emit_report
from compiler.emit.serve import emit_serve
from compiler.emit.spec_files import emit_plan_json, emit_resolved_spec
from compiler.plan import Plan

Emitter = Callable[[Plan], dict[str, str]]

EMITTERS: tuple[Emitter, ...] = (emit_resolved_spec, emit_plan_json, emit_report,
                                  emit_ds_config, emit_launch, emit_nccl_env, emit_serve, emit_conversion,
                                  emit_memory_chart)


def emit_all(plan: Plan) -> dict[str, str]:
    files: dict[str, str] = {}
    for emitter in EMITTERS:
        produced = emitter(plan)
        clash = files.keys() & produced.keys()
        if clash:
            raise RuntimeError(f"{emitter.__name__} rewrites {sorted(clash)}: two emitters own one path")
        files.update(produced)
    return dict(sorted(files.items()))
