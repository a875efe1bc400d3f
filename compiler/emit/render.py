"""Jinja2 for human-facing artifacts: templates format, Python decides and quotes.

Scripts and configs (every template but the Markdown report) are rendered strictly: each
`{{ ... }}` must give text placed by lmspec.compiler.emit.quoting (`Quoted`) or a plain integer, so
an unquoted string can never reach a shell line, an #SBATCH line, a comment or a YAML value.
The quoting functions are the templates' filters (`{{ name | shell_comment }}`).

Jinja2 compiles the templates again in every `lmspec compile`: ~15 ms CPU (the emitters
timed in fresh processes), within the noise of bench/compile_speed.py (rebuild 1.34x of the
floor with a bytecode cache and without). No cache, then: it would be a write outside the
build a compile was asked for (Jinja2's lands in the system temp dir).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2

from lmspec.compiler.emit.quoting import Quoted, comment, directive, json_scalar, shell, shell_comment, word
from lmspec.compiler.paths import TEMPLATES_DIR

PROSE_SUFFIX = ".md.j2"  # Markdown: read by people, not parsed by a shell or a YAML loader


class UnquotedValue(TypeError):
    """A strict template was given a value no quoting function placed: lmspec's own bug."""


def _strict(value: Any) -> Any:
    if isinstance(value, Quoted) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise UnquotedValue(
        f"a template got {type(value).__name__} {value!r} unquoted; place it with lmspec.compiler.emit.quoting"
    )


@lru_cache(maxsize=2)
def _environment(strict: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        finalize=_strict if strict else None,
    )
    env.filters.update(
        shell=shell, word=word, directive=directive, comment=comment, shell_comment=shell_comment, json=json_scalar
    )
    return env


def render(template: str, **values: Any) -> str:
    return _environment(not template.endswith(PROSE_SUFFIX)).get_template(template).render(**values)
