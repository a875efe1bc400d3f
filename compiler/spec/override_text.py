"""How a spec value reads as a command-line override: the one writer of `key=value` in a fix.

Rules, `lmspec doctor` and `lmspec plan` offer fixes a user pastes back onto the command line, so
each value is written as Hydra parses it: `null`, `true`/`false`, numbers and names as they are.
"""

from __future__ import annotations

from typing import Any


def override_value(value: Any) -> str:
    """`null`, `true`, `4`, `full`: `value` as the right-hand side of a Hydra override."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
