"""Jinja2 for human-facing artifacts: templates format, Python decides and quotes.

Compiling the templates to Python took a tenth of a compile's own time, paid again by
every short-lived `lmspec compile`; Jinja2's file-system bytecode cache (a private,
per-user directory under the system temp dir) keeps them between runs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2

from compiler.paths import TEMPLATES_DIR


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        bytecode_cache=jinja2.FileSystemBytecodeCache(),
    )


def render(template: str, **values: Any) -> str:
    return _environment().get_template(template).render(**values)
