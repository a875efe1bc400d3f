"""One module per verb: the CLI imports only the module of the command being run (help and
typos still see them all), and no CLI module takes part in an import cycle."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lmspec.compiler.cli.main import COMMAND_MODULES, _command_modules, run

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"compiler": "lmspec.compiler", "runtime": "lmspec.runtime"}
CLI = "lmspec.compiler.cli"


def test_a_command_imports_just_its_module() -> None:
    assert _command_modules(["compile", "-o", "build", "parallel.tp=2"]) == (f"{CLI}.compile",)
    assert _command_modules(["check", "--spec", "x.yaml"]) == (f"{CLI}.check",)
    assert _command_modules(["plan", "--gpus", "64"]) == (f"{CLI}.plan",)
    assert _command_modules(["hook", "compile-check"]) == (f"{CLI}.hook",)
    assert _command_modules(["import-model", "config.json"]) == (f"{CLI}.import_model",)  # a verb's "-" is "_"
    assert _command_modules([]) == COMMAND_MODULES
    assert _command_modules(["main"]) == COMMAND_MODULES  # a module that is no verb is a typo


PROBE = f"""
import json, sys
from lmspec.compiler.cli.main import run
code = run(sys.argv[1:])
print(json.dumps({{"code": code, "cli": sorted(m for m in sys.modules if m.startswith("{CLI}."))}}))
"""


@pytest.mark.parametrize(
    ("argv", "loaded"),
    [
        # help_text: every verb's --help text; spec_repo: without --spec, a spec repository's every job
        (["check"], ["check", "help_text", "main", "spec_args", "spec_repo"]),
        (["compile", "--check", "-o", "{out}"], ["compile", "help_text", "main", "spec_args", "spec_repo"]),  # no sweep
        (["schema"], ["help_text", "main", "schema"]),
    ],
    ids=["check", "compile", "schema"],
)
def test_a_fresh_interpreter_loads_only_the_verbs_module(argv: list[str], loaded: list[str], tmp_path: Path) -> None:
    argv = [a.replace("{out}", str(tmp_path)) for a in argv]
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["cli"] == [f"{CLI}.{name}" for name in loaded]


@pytest.mark.parametrize("argv", [["--help"], ["bogus"]])
def test_help_and_unknown_commands_list_every_command(argv: list[str], capsys) -> None:
    assert _command_modules(argv) == COMMAND_MODULES
    with pytest.raises(SystemExit):
        run(argv)
    out = capsys.readouterr()
    listed = out.out + out.err
    assert all(m.removeprefix(f"{CLI}.").replace("_", "-") in listed for m in COMMAND_MODULES)


def _module_files() -> dict[str, Path]:
    modules = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """lmspec modules `path` imports anywhere (function bodies too), but for type checking only."""
    found: set[str] = set()

    class Imports(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names if alias.name in modules)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.update([name] if name in modules else [node.module] if node.module in modules else [])

    Imports().visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """An import path from `start` back to itself, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        module, path = stack.pop()
        for imported in sorted(graph[module]):
            if imported == start:
                return [*path, start]
            if imported not in seen:
                seen.add(imported)
                stack.append((imported, [*path, imported]))
    return None


def test_no_cli_module_is_on_an_import_cycle() -> None:
    modules = _module_files()
    graph = {name: _imports(path, modules) for name, path in modules.items()}
    graph[f"{CLI}.main"] |= set(COMMAND_MODULES)  # dispatch imports them by name (importlib)
    cli = sorted(m for m in modules if m.startswith(f"{CLI}."))
    assert f"{CLI}.sweep" in cli and f"{CLI}.compile" in graph[f"{CLI}.main"]
    assert f"{CLI}.sweep" in graph[f"{CLI}.compile"]  # the walk sees imports inside functions
    cycles = {m: cycle for m in cli if (cycle := _cycle_from(m, graph))}
    assert cycles == {}
