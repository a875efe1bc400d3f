"""Emitters: one pure function per artifact kind, Plan -> {relative path: text}.

Plain tables, one per part of the job (the whole spec, training, conversion, serving); `emit_all` runs
those of the parts the spec has, then the files only the spec's launcher writes (its `files`, given the
others: Kubernetes' pods list every file they mount), and refuses two emitters writing one path.
The memory chart is called apart: its matplotlib import costs more than the rest of a
compile, so a caller holding a chart drawn from the same numbers (the writer, from the build
it replaces) passes it in and it is not drawn again.
"""

from __future__ import annotations

from collections.abc import Callable

from lmspec.compiler.backends.backend import load
from lmspec.compiler.build.files import MEMORY_CHART
from lmspec.compiler.emit.backend_config import emit_backend_config
from lmspec.compiler.emit.conversion import emit_conversion
from lmspec.compiler.emit.launch import emit_launch
from lmspec.compiler.emit.memory_chart import emit_memory_chart
from lmspec.compiler.emit.nccl import emit_nccl_env
from lmspec.compiler.emit.report import emit_report
from lmspec.compiler.emit.serve import emit_serve
from lmspec.compiler.emit.spec_files import emit_plan_json, emit_resolved_spec
from lmspec.compiler.launchers import launcher_of
from lmspec.compiler.plan import Plan

Emitter = Callable[[Plan], dict[str, str]]

EMITTERS: tuple[Emitter, ...] = (emit_resolved_spec, emit_plan_json, emit_report, emit_nccl_env)
TRAINING_EMITTERS: tuple[Emitter, ...] = (emit_backend_config, emit_launch)  # when the spec trains
CONVERSION_EMITTERS: tuple[Emitter, ...] = (emit_conversion,)  # when it trains and converts
SERVING_EMITTERS: tuple[Emitter, ...] = (emit_serve,)  # when it serves


def _emitters(plan: Plan) -> tuple[Emitter, ...]:
    trains, converts = plan.train is not None, plan.train is not None and plan.spec.convert is not None
    return (
        *EMITTERS,
        *(TRAINING_EMITTERS if trains else ()),
        *(CONVERSION_EMITTERS if converts else ()),
        *(SERVING_EMITTERS if plan.serve is not None else ()),
    )


def emit_all(plan: Plan, chart: str | None = None) -> dict[str, str]:
    """Every artifact of the parts the job has; `chart`, when given, is report/memory.svg already drawn
    from this plan's numbers (training memory: a serve-only job has none)."""
    outputs = [(emitter.__name__, emitter(plan)) for emitter in _emitters(plan)]
    if plan.train is not None:
        outputs.append(
            (emit_memory_chart.__name__, {MEMORY_CHART: chart} if chart is not None else emit_memory_chart(plan))
        )
    files: dict[str, str] = {}
    for name, produced in outputs:
        _add(files, name, produced)
    launcher = launcher_of(plan.spec.cluster)
    if launcher.files is not None:
        _add(files, launcher.files, load(launcher.files)(plan, dict(files)))
    return dict(sorted(files.items()))


def _add(files: dict[str, str], name: str, produced: dict[str, str]) -> None:
    clash = files.keys() & produced.keys()
    if clash:
        raise RuntimeError(f"{name} rewrites {sorted(clash)}: two emitters own one path")
    files.update(produced)
