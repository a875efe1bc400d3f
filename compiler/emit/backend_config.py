"""The training backend's reviewed configuration: whatever its module names as its emitter
(lmspec.compiler.backends: ds_config.json for DeepSpeed; megatron/config.json and the Megatron-LM
arguments for Megatron), so the emitter table names no backend."""

from __future__ import annotations

from lmspec.compiler.backends import backend_of
from lmspec.compiler.backends.backend import load
from lmspec.compiler.plan import Plan


def emit_backend_config(plan: Plan) -> dict[str, str]:
    produced: dict[str, str] = load(backend_of(plan.trained().spec).emitter)(plan)
    return produced
