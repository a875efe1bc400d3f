"""Emitters: one pure function per artifact kind, Plan -> {relative path: text}.

EMITTERS is a plain table; `emit_all` runs each and refuses two emitters writing one path.
The memory chart is called apart: its matplotlib import costs more than the rest of a
compile, so a caller holding a chart drawn from the same numbers (the writer, from the build
it replaces) passes it in and it is not drawn again.
"""

from __future__ import annotations

from collections.abc import Callable

from lmspec.compiler.build.files import MEMORY_CHART
from lmspec.compiler.emit.conversion import emit_conversion
from lmspec.compiler.emit.deepspeed_config import emit_ds_config
from lmspec.compiler.emit.launch import emit_launch
from lmspec.compiler.emit.memory_chart import emit_memory_chart
from lmspec.compiler.emit.nccl import emit_nccl_env
from lmspec.compiler.emit.report import emit_report
from lmspec.compiler.emit.serve import emit_serve
from lmspec.compiler.emit.spec_files import emit_plan_json, emit_resolved_spec
from lmspec.compiler.plan import Plan

Emitter = Callable[[Plan], dict[str, str]]

EMITTERS: tuple[Emitter, ...] = (
    emit_resolved_spec,
    emit_plan_json,
    emit_report,
    emit_ds_config,
    emit_launch,
    emit_nccl_env,
    emit_serve,
    emit_conversion,
)


def emit_all(plan: Plan, chart: str | None = None) -> dict[str, str]:
    """Every artifact; `chart`, when given, is report/memory.svg already drawn from this plan's numbers."""
    outputs = [(emitter.__name__, emitter(plan)) for emitter in EMITTERS]
    outputs.append(
        (emit_memory_chart.__name__, {MEMORY_CHART: chart} if chart is not None else emit_memory_chart(plan))
    )
    files: dict[str, str] = {}
    for name, produced in outputs:
        clash = files.keys() & produced.keys()
        if clash:
            raise RuntimeError(f"{name} rewrites {sorted(clash)}: two emitters own one path")
        files.update(produced)
    return dict(sorted(files.items()))
