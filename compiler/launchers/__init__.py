"""The launchers `lmspec run` starts a build with: `cluster.launcher` -> its module's Launcher.

A launcher is one file here (its rules, the files only it emits, how `lmspec run` starts it, its stop
signal, its doctor signatures; lmspec.compiler.launchers.launcher says what each is), its runtime record
under runtime/launchers/, and a cluster preset under specs/cluster/. This table is the only other line:
`cluster.launcher`'s allowed values (and so the schema's enum, in this order) are its keys;
`python -m lmspec.compiler.spec.schema` rewrites schemas/.
A launcher's name is compared nowhere else (tests/compiler/test_plugin_names.py): code asks `launcher_of`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from lmspec.compiler.launchers import kubernetes, local, slurm
from lmspec.compiler.launchers.launcher import Launcher

if TYPE_CHECKING:
    from lmspec.compiler.spec.sections import ClusterSpec

LAUNCHERS: dict[str, Launcher] = {
    "local": local.LOCAL,
    "slurm": slurm.SLURM,
    "kubernetes": kubernetes.KUBERNETES,
}

if TYPE_CHECKING:  # a Literal built at run time is no type to mypy: it checks the name as a str
    LauncherName = str
else:
    LauncherName = Literal[tuple(LAUNCHERS)]


def launcher_of(cluster: ClusterSpec) -> Launcher:
    """The spec's launcher (the schema admits only the table's keys)."""
    return LAUNCHERS[cluster.launcher]
