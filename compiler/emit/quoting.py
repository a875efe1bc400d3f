"""How a value is placed in a generated file: every placement goes through one of these.

`Quoted` marks text already made safe for the place a template puts it. The templates of
scripts and configs (lmspec.compiler.emit.render) accept only `Quoted` text and plain integers in their
`{{ ... }}`, so a value that reaches a shell line, an `#SBATCH` line, a comment or a YAML
value without passing here fails the compile instead of being written:
- `shell`: one shell word, shlex.quote (inside single quotes nothing expands), with each `$` and
  backtick escaped outside the quotes instead, so shellcheck reads no would-be expansion (SC2016);
- `word`: verbatim, for places that do not parse shell quotes (#SBATCH lines, variable names,
  a default inside "${X:-...}"): refused unless every character is one shlex leaves unquoted;
- `double_quoted`: text inside a double-quoted word beside expansions ("$DIR,...") with `"`, `\\`, `$`
  and backtick escaped, so nothing of it expands;
- `directive`: the rest of an `#SBATCH` line, which sbatch (not bash) reads: printable ASCII as it is;
- `comment`: text inside a `#` comment: every character that is not printable (a newline
  above all, which would end the comment) is written as an escape, so a comment stays one line;
- `json_scalar`: a JSON value (a YAML scalar too), never NaN or infinity.
"""

from __future__ import annotations

import re
import shlex


class Quoted(str):
    """Text made safe for where a template places it (by one of this module's functions)."""


class UnsafeValue(ValueError):
    """A value an emitter was asked to place verbatim that is not plain; the spec's kinds
    (lmspec.compiler.spec.kinds) keep every spec value from getting here, so this is lmspec's own bug."""


SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")  # what shlex.quote leaves as it is
_EXPANDING = re.compile(r"([$`])")


def shell(value: str | int) -> Quoted:
    """One shell word holding `value` exactly."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise UnsafeValue(f"shell() takes a string or an int, not {value!r}")
    parts = _EXPANDING.split(str(value))
    if len(parts) == 1:
        return Quoted(shlex.quote(parts[0]))
    return Quoted("".join(f"\\{part}" if part in ("$", "`") else shlex.quote(part) for part in parts if part))


def word(value: str | int) -> Quoted:
    """`value` verbatim, where quotes would not be read as quotes; only plain text passes."""
    text = str(value)
    if isinstance(value, bool) or SAFE_WORD.fullmatch(text, 0) is None:
        raise UnsafeValue(f"{text!r} cannot be placed unquoted (only letters, digits and _@%+=:,./- can)")
    return Quoted(text)


_DOUBLE_QUOTE_SPECIAL = re.compile(r'(["\\$`])')


def double_quoted(value: str) -> Quoted:
    """`value` as part of a double-quoted word: its `"`, `\\`, `$` and backticks escaped (the caller writes
    the surrounding quotes); one line only, as a newline there would be a part of the word."""
    if "\n" in value or "\x00" in value:
        raise UnsafeValue(f"{value!r} cannot be placed inside double quotes on one line")
    return Quoted(_DOUBLE_QUOTE_SPECIAL.sub(r"\\\1", value))


def directive(value: str) -> Quoted:
    """`value` after `#SBATCH `: bash reads the line as a comment and sbatch splits it itself, so it goes as it
    is; the spec's kinds admit only printable ASCII there (a newline would end the directive)."""
    if not isinstance(value, str) or not value.isascii() or not value.isprintable():
        raise UnsafeValue(f"{value!r} cannot follow #SBATCH (printable ASCII only)")
    return Quoted(value)


def _escaped(ch: str) -> str:
    if ch.isprintable():
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def comment(value: str | int) -> Quoted:
    """`value` as text inside a `#` comment: one line whatever it holds."""
    return Quoted("".join(_escaped(ch) for ch in str(value)))


def shell_comment(value: str | int) -> Quoted:
    """A spec value shown in a comment: shell-quoted as it would be in code, and one line."""
    return comment(shell(value))


def json_scalar(value: object) -> Quoted:
    """A JSON (and YAML) scalar, by lmspec.compiler.emit.spec_files (the one JSON dumper: NaN and infinity
    are refused, as JSON has no such values)."""
    from lmspec.compiler.emit.spec_files import dump_json_scalar  # spec_files imports the Plan; quoting does not

    return Quoted(dump_json_scalar(value))
