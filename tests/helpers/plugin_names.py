"""Where a plug-in's name is compared outside its own module: the AST scan behind "a name like "slurm"
appears in its module and in its registry, nowhere else" (STYLE.md, "A plug-in is a module plus a row").

A comparison counts when one side is one of the names (a string constant, or a tuple, list or set holding
one) and the other side refers to the plug-in kind: a name, attribute or string subscript containing one of `subjects`
("launcher" for cluster.launcher, "backend" for train.backend). So `cluster.launcher == "local"` and
`launcher in ("local", "slurm")` are found, and `transformer_impl == "local"` (another key's value) is not.
`==`, `!=`, `in`, `not in`, `is` and `is not` count, and so does a `match` on such a subject with a
`case "slurm":` pattern (alone, in an `|` or nested).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

_COMPARING = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def _is_name(node: ast.expr, names: frozenset[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_name(element, names) for element in node.elts)
    if isinstance(node, ast.Call):  # BACKENDS.index("deepspeed"): a position that stands for the name
        return any(_is_name(argument, names) for argument in node.args)
    return False


def _refers(node: ast.AST, subjects: tuple[str, ...]) -> bool:
    """Whether any name or attribute inside `node` contains one of `subjects` (case-insensitive)."""
    words = [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
    words += [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)]
    subscripts = [n.slice for n in ast.walk(node) if isinstance(n, ast.Subscript)]  # doc["backend"], v["train.backend"]
    words += [k.value for k in subscripts if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return any(subject in word.lower() for word in words for subject in subjects)


def _pattern_names(pattern: ast.pattern, names: frozenset[str]) -> bool:
    return any(
        isinstance(p, ast.MatchValue) and _is_name(p.value, names)
        for p in ast.walk(pattern)
        if isinstance(p, ast.pattern)
    )


def name_comparisons(source: str, names: Iterable[str], subjects: Iterable[str]) -> list[tuple[int, str]]:
    """(line, code) of every comparison in `source` of a `subjects` expression with one of `names`."""
    wanted, about = frozenset(names), tuple(s.lower() for s in subjects)
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides, sides[1:], strict=False):  # n ops join n + 1 sides
                if not isinstance(op, _COMPARING):
                    continue
                if (_is_name(left, wanted) and _refers(right, about)) or (
                    _is_name(right, wanted) and _refers(left, about)
                ):
                    found.append((node.lineno, ast.unparse(node)))
                    break
        elif isinstance(node, ast.Match) and _refers(node.subject, about):
            found += [
                (case.pattern.lineno, f"match {ast.unparse(node.subject)}: case {ast.unparse(case.pattern)}")
                for case in node.cases
                if _pattern_names(case.pattern, wanted)
            ]
    return sorted(found)


def names_compared_outside(
    root: Path, trees: Iterable[str], names: Iterable[str], subjects: Iterable[str], allowed: Iterable[str]
) -> list[str]:
    """`path:line: code` of each such comparison in the .py files under `trees` (relative to `root`), but
    those in `allowed` (paths relative to `root`: the plug-ins' own modules and their registry)."""
    names, subjects, allowed = tuple(names), tuple(subjects), frozenset(allowed)
    found: list[str] = []
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in allowed:
                continue
            for line, code in name_comparisons(path.read_text(encoding="utf-8"), names, subjects):
                found.append(f"{rel}:{line}: {code}")
    return found
