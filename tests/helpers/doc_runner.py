"""Run the console blocks of a Markdown tutorial, top to bottom, in one scratch directory.

In a ```console block, `$ CMD` is a command (bash; a trailing `# exits N` expects that exit
code, else 0; `# needs: MODULE` skips it when MODULE is not importable) and every other
line is expected output: some line of the command's output must match it, where `...`
stands for any text and runs of spaces count as one. `$ cd DIR` and `$ export K=V` change
the directory and environment of the commands after them.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from helpers.processes import run_in_group

BLOCK = re.compile(r"^```console\n(.*?)^```", re.S | re.M)
EXITS = re.compile(r"#\s*exits\s+(\d+)\s*$")
NEEDS = re.compile(r"#\s*needs:\s*([\w.]+)")
COMMAND_TIMEOUT_S = 600


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)
    line: int = 0

    @property
    def exit_code(self) -> int:
        match = EXITS.search(self.command)
        return int(match.group(1)) if match else 0

    @property
    def needs(self) -> str | None:
        match = NEEDS.search(self.command)
        return match.group(1) if match else None


def steps(markdown: str) -> list[Step]:
    out: list[Step] = []
    for block in BLOCK.finditer(markdown):
        first_line = markdown.count("\n", 0, block.start()) + 2
        for offset, line in enumerate(block.group(1).splitlines()):
            if line.startswith("$ "):
                out.append(Step(line[2:], line=first_line + offset))
            elif line.strip() and out:
                out[-1].expected.append(line)
    return out


def _squash(text: str) -> str:
    return " ".join(text.split())


def matches(expected: str, output: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in _squash(expected).split("..."))
    return any(re.fullmatch(pattern, _squash(line)) for line in output.splitlines())


def _run(command: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """bash -c in its own process group; on timeout the whole group (vLLM, torchrun) is killed."""
    done = run_in_group(
        ["bash", "-o", "pipefail", "-c", command], cwd=cwd, timeout_s=COMMAND_TIMEOUT_S, env=env, merge_stderr=True
    )
    return done.returncode, done.stdout


def run_tutorial(markdown: str, workdir: Path, env: dict[str, str]) -> list[str]:
    """The commands skipped (`skipped: ...`) and the first failure (`line N: $ CMD: why`), if any."""
    problems: list[str] = []
    cwd = workdir
    for step in steps(markdown):
        where = f"line {step.line}: $ {step.command}"
        if step.needs and importlib.util.find_spec(step.needs) is None:
            problems.append(f"skipped: {where}: {step.needs} is not installed")
            continue
        words = shlex.split(step.command, comments=True)
        if words[:1] == ["cd"]:
            cwd = (cwd / words[1]).resolve()
            continue
        if words[:1] == ["export"]:
            env.update(word.split("=", 1) for word in words[1:])
            continue
        code, output = _run(step.command, cwd, env)
        if code != step.exit_code:
            return problems + [f"{where}: exit {code}, expected {step.exit_code}\n{output[-3000:]}"]
        missing = [e for e in step.expected if not matches(e, output)]
        if missing:  # later steps build on this one: stop at the first failure
            return problems + [f"{where}: output lacks {missing}\n{output[-3000:]}"]
    return problems
