"""`lmspec init <dir>`: scaffold a team's spec repository, compiled and ready to commit.

specs/<starter>.yaml            a job whose defaults list pulls lmspec's built-in groups
specs/hardware/our_cluster.yaml our own groups, found first on Hydra's search path
specs/cluster/our_slurm.yaml
schemas/*.schema.json           for editors (each spec names its schema in a modeline)
build/<starter>/                compiled now: committed, reviewed, drift-checked in CI
.github/workflows/lmspec.yml    CI: check, compile --check, diff, upload REPORT.md; it installs
                                this lmspec (the git URL and commit, archive or version pip recorded)
.pre-commit-config.yaml         the same checks before each commit
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from lmspec.compiler.cli.install_source import InstallSource, given, this_install
from lmspec.compiler.errors import EXIT_OK, UsageError

SCAFFOLD_DIR = Path(__file__).resolve().parent / "scaffold"
STARTER_SPEC = "llama3_8b_pretrain_16gpu_our_cluster_bf16"
# Target path in the new repository -> template in compiler/cli/scaffold/.
SCAFFOLD: tuple[tuple[str, str], ...] = (
    ("README.md", "README.md.j2"),
    (".gitignore", "gitignore.j2"),
    (".pre-commit-config.yaml", "pre-commit-config.yaml.j2"),
    (".github/workflows/lmspec.yml", "ci.yml.j2"),
    (f"specs/{STARTER_SPEC}.yaml", "starter_spec.yaml.j2"),
    ("specs/hardware/our_cluster.yaml", "our_cluster.yaml.j2"),
    ("specs/cluster/our_slurm.yaml", "our_slurm.yaml.j2"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "init",
        help="scaffold a spec repository: specs/, schemas/, build/, CI, pre-commit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        + "\n".join(("  lmspec init our-training-specs && cd our-training-specs && lmspec hook check",)),
    )
    p.add_argument("directory", type=Path, help="where to create it (may exist; no file is overwritten)")
    p.add_argument(
        "--install",
        metavar="REQUIREMENT",
        default=None,
        help="what the CI pip-installs (default: this lmspec, as pip recorded it: the git URL and commit, "
        "archive or version), e.g. lmspec==0.1.0 from your own index",
    )
    p.set_defaults(handler=run_init)


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(SCAFFOLD_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def scaffold_files(install: InstallSource) -> dict[str, str]:
    """Every file `init` writes before compiling, by path relative to the new repository; its CI
    installs lmspec from `install`."""
    from lmspec.compiler import __version__
    from lmspec.compiler.spec.schema import schema_files

    command = f"pip install {shlex.quote(install.requirement)}"
    values = {
        "spec_name": STARTER_SPEC,
        "lmspec_version": __version__,
        "install": install,
        "install_command": command,
        "install_run": json.dumps(command),  # a YAML double-quoted scalar
    }
    files = {target: _environment().get_template(template).render(**values) for target, template in SCAFFOLD}
    files.update({f"schemas/{name}": text for name, text in schema_files().items()})
    return files


def run_init(args: argparse.Namespace) -> int:
    from lmspec.compiler.cli.diff import working_directory
    from lmspec.compiler.pipeline import compile_one

    root: Path = args.directory
    install = given(args.install) if args.install is not None else this_install()
    files = scaffold_files(install)
    clashes = sorted(rel for rel in files if (root / rel).exists())
    if clashes or (root / "build").exists():
        raise UsageError(f"{root}: would overwrite {', '.join(clashes) or 'build/'}; choose an empty directory")
    try:
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {root}: {exc.strerror}") from None
    # Compile from the repository root, as CI and the hooks do, so origins read `specs/...`.
    with working_directory(root):
        compiled = compile_one(Path("specs") / f"{STARTER_SPEC}.yaml", [], Path("build"), check=False)
        compiled.write()
    print(
        f"created {root}: specs/{STARTER_SPEC}.yaml, our groups in specs/hardware and specs/cluster, "
        f"build/{compiled.plan.name}/, CI and pre-commit config\n"
        f"CI installs {install.requirement} ({install.origin})\n"
        f"next: cd {root} && git init && git add -A && git commit -m 'lmspec specs and builds'"
    )
    if not install.reachable:
        print(
            f"warning: {install.requirement} is a path on this machine, which CI cannot install: change the "
            f"pip install line in {root}/.github/workflows/lmspec.yml (its README.md says how)",
            file=sys.stderr,
        )
    return EXIT_OK
