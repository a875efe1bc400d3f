"""The build contract holds: no runtime module reaches a compiler module the contract forbids
(compiler/contract.py), directly or through other compiler modules, function-level imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lmspec.compiler.contract import RUNTIME_FORBIDDEN

ROOT = Path(__file__).resolve().parents[2]
TREES = {"compiler": ROOT / "compiler", "runtime": ROOT / "runtime"}  # lmspec.<tree> -> its folder


def module_file(name: str) -> Path | None:
    """The source file of `lmspec.compiler...` or `lmspec.runtime...`; None for anything else."""
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "lmspec" or parts[1] not in TREES:
        return None
    base = TREES[parts[1]].joinpath(*parts[2:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_by(path: Path) -> set[str]:
    """Every lmspec module `path` imports when it runs: module-level or inside a function, with the
    packages above each (importing a.b.c runs a/__init__ and a/b/__init__); not `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for statement in node.body
        for inner in ast.walk(statement)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import x` imports pkg, and pkg.x when x is a module
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    found = set()
    for name in names:
        if module_file(name) is not None:
            parts = name.split(".")
            found |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
    return found


def forbidden_paths(start: list[str], forbidden: tuple[str, ...]) -> list[str]:
    """`a <- b <- runtime.x` for every forbidden module reachable from `start`, by the first path found."""
    came_from: dict[str, str] = {}
    seen: set[str] = set()
    todo = sorted(start, reverse=True)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_file(name)
        for imported in sorted(imported_by(path), reverse=True) if path is not None else ():
            if imported not in seen:
                came_from.setdefault(imported, name)
                todo.append(imported)
    hits = []
    for name in sorted(seen):
        if any(name == f or name.startswith(f"{f}.") for f in forbidden):
            chain = [name]
            while chain[-1] in came_from:
                chain.append(came_from[chain[-1]])
            hits.append(" <- ".join(chain))
    return hits


def runtime_modules() -> list[str]:
    modules = []
    for path in sorted(TREES["runtime"].rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules.append(".".join(("lmspec", *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return modules


def test_the_runtime_imports_no_compile_step() -> None:
    modules = runtime_modules()
    assert len(modules) > 40
    assert forbidden_paths(modules, RUNTIME_FORBIDDEN) == []


def test_the_walk_finds_a_forbidden_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not blind: a runtime module that imports a rule inside a function, through an allowed compiler
    module, is caught, and so is the allowed module's own import; a TYPE_CHECKING import is not."""
    runtime = tmp_path / "runtime"
    compiler = tmp_path / "compiler"
    (compiler / "rules").mkdir(parents=True)
    runtime.mkdir()
    (compiler / "__init__.py").write_text("")
    (compiler / "rules" / "__init__.py").write_text("")
    (compiler / "rules" / "layout.py").write_text("")
    (compiler / "helper.py").write_text("def f():\n    from lmspec.compiler.rules import layout\n")
    (compiler / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lmspec.compiler.rules import layout\n"
    )
    (runtime / "__init__.py").write_text("")
    (runtime / "stage.py").write_text("import lmspec.compiler.helper\nfrom lmspec.compiler import typed\n")
    monkeypatch.setitem(TREES, "compiler", compiler)
    monkeypatch.setitem(TREES, "runtime", runtime)
    assert forbidden_paths(["lmspec.runtime.stage"], ("lmspec.compiler.rules",)) == [
        "lmspec.compiler.rules <- lmspec.compiler.helper <- lmspec.runtime.stage",
        "lmspec.compiler.rules.layout <- lmspec.compiler.helper <- lmspec.runtime.stage",
    ]
    assert forbidden_paths(["lmspec.runtime.stage"], ("lmspec.compiler.cli",)) == []
