"""What a user meets first on the command line: every command's --help describes it and shows
examples, and overrides may come after flags (issue 23, items 3 and 4)."""

from __future__ import annotations

import argparse
import json

import pytest

from lmspec.compiler.cli.main import build_parser


def _helps() -> dict[str, str]:
    """Each command's (and each data verb's) --help text, as argparse prints it."""
    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {}
    for name, command in commands.choices.items():
        helps[name] = command.format_help()
        for verbs in (a for a in command._actions if isinstance(a, argparse._SubParsersAction)):
            helps.update({f"{name} {verb}": p.format_help() for verb, p in verbs.choices.items()})
    return helps


HELPS = _helps()


@pytest.mark.parametrize("command", sorted(HELPS))
def test_every_command_help_has_a_description_and_examples(command: str) -> None:
    text = HELPS[command]
    usage, _, rest = text.partition("\n\n")
    description = rest.split("\n\n")[0]
    assert usage.startswith(f"usage: lmspec {command}") and len(description.split()) >= 8, text
    examples = text.split("examples:\n", 1)[1].splitlines()
    assert examples and all(line.strip().startswith("lmspec ") for line in examples), text


def test_run_help_names_every_stage_and_what_it_needs() -> None:
    out = " ".join(HELPS["run"].split())
    for stage, needs in [
        ("train", "a job that trains"),
        ("import", "a job that trains, and --from HF_DIR"),
        ("convert", "a job that trains and converts, and a checkpoint"),
        ("verify", "a checkpoint and its converted model"),
        ("serve", "a serve section"),
    ]:
        assert f"{stage} ({needs}" in out


def _plan(lmspec, *argv: str) -> dict:
    result = lmspec("plan", *argv)
    assert result.code == 0, result.err
    report = json.loads(result.out)
    for timing in ("seconds", "candidates_per_s"):  # how fast this search ran, not what it found
        report.pop(timing)
    return report


@pytest.mark.parametrize(
    "argv",
    [
        ("model=tiny", "--top", "2", "train.seq_length=256", "--format", "json"),
        ("model=tiny", "train.seq_length=256", "--top", "2", "--format", "json"),
    ],
    ids=["intermixed", "flags-last"],
)
def test_overrides_and_flags_in_any_order(lmspec, argv: tuple[str, ...]) -> None:
    assert _plan(lmspec, *argv) == _plan(lmspec, "--top", "2", "--format", "json", "model=tiny", "train.seq_length=256")


def test_explain_takes_a_flag_after_its_overrides(lmspec) -> None:
    result = lmspec("explain", "model=tiny", "--format", "json")
    assert result.code == 0 and json.loads(result.out)
