"""vLLM's own `vllm serve` argument parser as a judge of single options, and how vLLM turns one vllm.yaml
entry into command-line words.

serve.extra_args holds vLLM options lmspec has no key for; the compiler asks the installed vLLM's parser
(the one `vllm serve` builds, vllm.entrypoints.launchers.cli_args.make_arg_parser, vLLM 0.32) about each
one. Importing vLLM costs seconds, so it happens on the first question only, and only when a spec has
extra args; where vLLM is not installed `serve_parser` answers None and the rule says it could not check.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib.util
import json
import warnings
from dataclasses import dataclass
from typing import Any

SUGGESTIONS = 3


def yaml_entry(name: str, value: Any) -> tuple[str, Any]:
    """vllm.yaml's spelling of an option: false as `no-NAME: true`. vLLM 0.32's `vllm serve --config` expands
    the file with its top-level parser, which has no --no-NAME, so a `NAME: false` entry is dropped silently."""
    return (f"no-{name}", True) if value is False else (name, value)


def config_words(name: str, value: Any) -> list[str] | None:
    """The words `vllm serve --config` (vLLM 0.32, FlexibleArgumentParser.load_config_file) makes of the
    vllm.yaml entry `name: value`: true -> --name, a list -> --name and its items, a mapping -> --name and its
    JSON, anything else -> --name and its text. None where it drops the entry: false (see yaml_entry), or an
    empty list."""
    if isinstance(value, bool):
        return [f"--{name}"] if value else None
    if isinstance(value, list | tuple):
        return [f"--{name}", *map(str, value)] if value else None
    if isinstance(value, dict):
        return [f"--{name}", json.dumps(value)]
    return [f"--{name}", str(value)]


@dataclass(frozen=True)
class Verdict:
    """vLLM's parser on one option: its destination attribute, or the names near it when it has none, and
    vLLM's own message when it refuses the value."""

    dest: str | None
    near: tuple[str, ...] = ()
    error: str | None = None


class _Refused(Exception):
    """argparse's error() of the judging parser, raised instead of printing and exiting."""


def _refuse(message: str) -> None:
    raise _Refused(message)


@functools.cache
def serve_parser() -> argparse.ArgumentParser | None:
    """The installed vLLM's `vllm serve` parser, built once per process; None where vLLM is not installed.
    Its error() raises (this instance is lmspec's own), so a refusal is a message, never an exit."""
    if importlib.util.find_spec("vllm") is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    parser.error = _refuse  # type: ignore[method-assign,assignment]
    return parser


def long_options(parser: argparse.ArgumentParser) -> list[str]:
    """Every `--name` of the parser without the dashes, the names a vllm.yaml entry may have; a `--no-name`
    is left out where `--name` exists (false is how a vllm.yaml entry says it)."""
    options = parser._option_string_actions
    return sorted(o[2:] for o in options if o.startswith("--") and f"--{o.removeprefix('--no-')}" not in options)


def judge(parser: argparse.ArgumentParser, name: str, value: Any) -> Verdict:
    """Whether `vllm serve` takes the vllm.yaml entry `name: value`, parsed as vLLM parses its config file."""
    actions = parser._option_string_actions
    action = actions.get(f"--{name}")
    if action is None:
        near = difflib.get_close_matches(name, long_options(parser), n=SUGGESTIONS)
        return Verdict(dest=None, near=tuple(near))
    words = config_words(*yaml_entry(name, value))
    if words is None:
        return Verdict(dest=action.dest, error=f"vLLM drops `{name}: {json.dumps(value)}` from its config file")
    try:
        parser.parse_args(words)
    except _Refused as refused:
        return Verdict(dest=action.dest, error=_one_line(str(refused)))
    return Verdict(dest=action.dest)


def _one_line(message: str) -> str:
    """vLLM's message on one line, without pydantic's link to its documentation."""
    lines = [line.strip() for line in message.splitlines()]
    return "; ".join(line for line in lines if line and not line.startswith("For further information"))
