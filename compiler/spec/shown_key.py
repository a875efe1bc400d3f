"""`parallel.tp=6 (command-line override)`: a key of the typed spec with its value and where it came from,
as every message about a spec names it.

The rules reach it through their context (compiler/rules/context.py, `SpecContext.show`); a check the
runtime repeats before it starts something (compiler/vllm_cpu.py) calls it with the build's origins, so
both say the same words without the runtime importing the rules (compiler/contract.py).
"""

from __future__ import annotations

import dataclasses
import json
from functools import reduce
from typing import Any

from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import Spec


def value_at(spec: Spec, key: str) -> Any:
    """The key's value; None under a section the spec sets to null (`train.seq_length` of train: null)."""
    return reduce(lambda node, part: None if node is None else getattr(node, part), key.split("."), spec)


def show_key(spec: Spec, origins: Origins, key: str) -> str:
    """`parallel.tp=6 (command-line override)`: the key, its value and its origin."""
    return f"{key}={json.dumps(plain(value_at(spec, key)))} ({origins.of(key)})"


def plain(value: Any) -> Any:
    """A typed value as JSON data: a section (e.g. a filled-in model.mla) as a mapping, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
