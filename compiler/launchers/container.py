"""What every launcher that runs a job's processes in a container image warns of (pyxis/enroot under Slurm,
a pod under Kubernetes); each calls these from its own rules, as only it knows whether it is the spec's
launcher and which key names its image (compiler/launchers/slurm.py, kubernetes.py).

Two traps a first container job meets, both invisible until the allocation starts:

- cluster.setup runs where the launcher runs, inside the image: `module load ...` (Lmod, Environment
  Modules, Spack) is a command of the host's shell, absent from NGC's and most images, so the step dies
  with `module: command not found` before torchrun starts;
- pyxis' --container-workdir is where every relative path of the run resolves (runs/<name>/, and the
  presets' train.checkpoint.dir and convert.output inside it): a directory under no mount is the
  container's own file system, thrown away when the step ends, checkpoints and all. The default (null)
  is the submit directory, which lmspec mounts at its own path.

Both are warnings: a site image may carry Lmod, and a workdir may lie inside the submit directory, which
the compile cannot see.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from lmspec.compiler.errors import Problem, warning

if TYPE_CHECKING:
    from lmspec.compiler.rules.context import RuleContext

# First words of a setup line that only a host's login environment defines (Lmod's `ml` included).
HOST_COMMANDS = ("module", "ml", "spack")


def setup_runs_in_the_image(ctx: RuleContext, key: str, image: str) -> Iterator[Problem]:
    """A warning for each cluster.setup line whose command the host's shell alone defines, under the image
    `key`=`image` the launcher runs every node's processes in."""
    for index, line in enumerate(ctx.spec.cluster.setup):
        words = line.split()
        if not words or words[0] not in HOST_COMMANDS:
            continue
        yield warning(
            "cluster.setup",
            f"cluster.setup[{index}]={line!r} ({ctx.origins.of('cluster.setup')}) runs inside the container "
            f"{key}={image!r}, where NGC's and most images have no `{words[0]}` (the step would end in "
            f"`{words[0]}: command not found` before the launcher starts); the image brings its own CUDA, NCCL "
            "and Python: drop the line, or set what it sets in cluster.env",
        )


def _mounted_at(mount: str) -> PurePosixPath:
    """Where a pyxis mount SRC[:DST[:FLAGS]] appears inside the container (DST, else SRC)."""
    parts = mount.split(":")
    return PurePosixPath(parts[1] if len(parts) > 1 and parts[1] else parts[0])


def workdir_is_mounted(ctx: RuleContext) -> Iterator[Problem]:
    """cluster.slurm.container.workdir under one of its mounts (pyxis' image with a workdir of its own)."""
    container = ctx.spec.cluster.slurm.container
    if container.image is None or container.workdir is None:
        return
    workdir = PurePosixPath(container.workdir)
    if any(workdir.is_relative_to(_mounted_at(mount)) for mount in container.mounts):
        return
    yield warning(
        "cluster.slurm.container.workdir",
        f"{ctx.show('cluster.slurm.container.workdir')} is under none of cluster.slurm.container.mounts "
        f"({', '.join(container.mounts) or 'none'}): runs/{ctx.spec.name}/ and every relative path of the run "
        "(the presets' checkpoints among them) would be written to the container's own file system and lost "
        "when the job ends, unless it lies inside the directory sbatch is called from (mounted at its own "
        "path); set cluster.slurm.container.workdir=null (that directory), or mount one there: "
        f"cluster.slurm.container.mounts=['/lustre/you/work:{workdir}']",
    )
