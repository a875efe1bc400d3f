"""`lmspec diff`: what a spec change does to every artifact and to the key numbers.

    lmspec diff build/a build/b                          two build directories
    lmspec diff --against main [--spec F] [OVERRIDES]    the spec as it was at a git revision
                                                         vs the working tree, both compiled now
    lmspec diff --against main                           in a spec repository (lmspec init):
                                                         every spec in specs/, added and removed ones too

The `--against` side extracts the spec's directory at that revision (`git archive`) into a
temp dir and compiles it with this lmspec, so only the spec differs, never the compiler.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lmspec.compiler.cli.spec_repo import repo_specs
from lmspec.compiler.errors import EXIT_OK, SpecError, UsageError

if TYPE_CHECKING:
    from lmspec.compiler.plan import Plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="what a spec change does to every artifact and to the key numbers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        + "\n".join(
            (
                "  lmspec diff --against HEAD --spec specs/llama3_8b_pretrain_8gpu_h100_bf16.yaml",
                "  lmspec diff build/tiny build/tiny_tp2",
                "  lmspec diff --stat --against origin/main --spec specs/llama3_70b_pretrain_64gpu_h100_bf16.yaml",
            )
        ),
    )
    p.add_argument(
        "--against",
        metavar="REV",
        default=None,
        help="compare the spec at this git revision with the working tree (both compiled now)",
    )
    p.add_argument(
        "--spec", type=Path, default=None, help="the spec file (or built-in preset) to compile with --against"
    )
    p.add_argument("--stat", action="store_true", help="the summary only, no unified diffs")
    p.add_argument(
        "args",
        nargs="*",
        metavar="BUILD_OR_OVERRIDE",
        help="two build directories; with --against, Hydra overrides instead",
    )
    p.set_defaults(handler=run_diff)


def read_build(path: Path) -> tuple[dict[str, str], Plan]:
    """Every file of a build directory as text, by relative path, and its Plan: read through
    Build.open, so a damaged or hand-edited build is refused rather than compared. The files its manifest
    lists: a carried one (k8s/build.yaml) is made from those, so a change shows in them."""
    from lmspec.compiler.build.files import MANIFEST
    from lmspec.compiler.build.reader import Build

    build = Build.open(path, cost_model=True)
    files = {rel: build.text(rel) for rel in build.manifest.files}
    files[MANIFEST] = build.manifest.text
    return files, build.plan


def _git(repo: Path, *argv: str) -> bytes:
    import subprocess

    try:
        result = subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, timeout=60, check=False)
    except FileNotFoundError:
        raise UsageError("--against needs git on PATH") from None
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip().splitlines()
        raise UsageError(f"git {' '.join(argv[:2])}: {message[-1] if message else 'failed'}")
    return result.stdout


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """Compile with paths shown relative to `path`, so both sides print origins alike."""
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _compile(spec_file: Path, overrides: list[str], cwd: Path) -> tuple[dict[str, str], Plan]:
    from lmspec.compiler.emit.manifest import build_files
    from lmspec.compiler.pipeline import make_plan

    with working_directory(cwd):
        plan = make_plan(overrides, spec_file)
        return build_files(plan), plan


@dataclass(frozen=True)
class Snapshot:
    """A directory of the working tree's git repository as it was at a revision, extracted to a temp dir."""

    rev: str
    root: Path  # the working tree's top level
    old_root: Path  # the temp dir standing for `root` at `rev`
    rel_dir: Path  # the directory, relative to both

    @property
    def old_dir(self) -> Path:
        return self.old_root / self.rel_dir

    def compile_old(self, name: str, overrides: list[str]) -> tuple[dict[str, str], Plan]:
        old_file = self.old_dir / name
        if not old_file.is_file():
            raise UsageError(f"{self.rel_dir / name} does not exist at {self.rev}")
        try:
            return _compile(old_file, overrides, self.old_root)
        except SpecError:
            print(f"the spec {self.rel_dir / name} at {self.rev} is invalid:", file=sys.stderr)
            raise

    def compile_new(self, spec_file: Path, overrides: list[str]) -> tuple[dict[str, str], Plan]:
        return _compile(spec_file, overrides, self.root)


@contextlib.contextmanager
def snapshot(rev: str, directory: Path) -> Iterator[Snapshot]:
    """`directory` (in a git working tree) as it was at `rev`; `git archive`, so nothing in the
    working tree or the index is touched."""
    import io
    import tarfile
    import tempfile

    directory = directory.resolve()
    root = Path(_git(directory, "rev-parse", "--show-toplevel").decode().strip()).resolve()
    rel_dir = directory.relative_to(root)
    commit = _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").decode().strip()
    archive = _git(root, "archive", "--format=tar", commit, "--", rel_dir.as_posix() if rel_dir.parts else ".")
    with tempfile.TemporaryDirectory(prefix="lmspec-diff-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        yield Snapshot(rev, root, Path(tmp), rel_dir)


def compile_against(
    rev: str, spec: Path | None, overrides: list[str]
) -> tuple[tuple[dict[str, str], Plan], tuple[dict[str, str], Plan], str]:
    """((files, Plan) at `rev`, (files, Plan) now, build name): the spec's directory at `rev` compiled in a temp dir."""
    from lmspec.compiler.paths import SPECS_DIR
    from lmspec.compiler.spec.spec_file import resolve_spec_file

    spec_file = resolve_spec_file(spec) if spec is not None else SPECS_DIR / "config.yaml"
    with snapshot(rev, spec_file.parent) as snap:
        old = snap.compile_old(spec_file.name, overrides)
    return old, snap.compile_new(spec_file, overrides), spec_file.stem


def diff_repo(rev: str, specs: list[Path], *, unified: bool) -> str:
    """Every job of a spec repository at `rev` against the working tree, with the jobs added and
    removed since."""
    from lmspec.compiler.build.compare import compare, render
    from lmspec.compiler.cli.spec_repo import primary_specs

    out = []
    with snapshot(rev, specs[0].parent) as snap:
        before = {p.name for p in primary_specs(snap.old_dir, [])} if snap.old_dir.is_dir() else set()
        for spec in specs:
            if spec.name not in before:
                files, plan = snap.compile_new(spec.resolve(), [])
                out.append(f"{spec}: new since {rev} (compiles to {plan.name}/, {len(files)} files)\n")
                continue
            old, new = snap.compile_old(spec.name, []), snap.compile_new(spec.resolve(), [])
            labels = {"old_label": f"{spec.stem}@{rev}", "new_label": f"{spec.stem}@worktree"}
            out.append(render(compare(old[0], new[0], old[1], new[1], **labels), **labels, unified=unified))
    out += [f"{snap.rel_dir / name}: removed since {rev}\n" for name in sorted(before - {s.name for s in specs})]
    return "".join(out)


def run_diff(args: argparse.Namespace) -> int:
    from lmspec.compiler.build.compare import compare, render

    if args.against is not None and (specs := repo_specs(args.spec, list(args.args), "diff")):
        sys.stdout.write(diff_repo(args.against, specs, unified=not args.stat))
        return EXIT_OK
    if args.against is not None:
        old, new, name = compile_against(args.against, args.spec, list(args.args))
        old_label, new_label = f"{name}@{args.against}", f"{name}@worktree"
    else:
        if args.spec is not None or len(args.args) != 2:
            raise UsageError(
                "diff takes two build directories (lmspec diff build/a build/b), "
                "or --against REV [--spec FILE] [OVERRIDES]"
            )
        old_label, new_label = args.args
        old, new = read_build(Path(old_label)), read_build(Path(new_label))
    comparison = compare(old[0], new[0], old[1], new[1], old_label, new_label)
    sys.stdout.write(render(comparison, old_label=old_label, new_label=new_label, unified=not args.stat))
    return EXIT_OK
