"""Rule: a site's extra Slurm options never set what lmspec writes from a key of its own.

launch/sbatch.sh and serve/sbatch.sh write #SBATCH options from the spec (hardware.nodes, cluster.slurm.time,
...) and options their scripts depend on (one task per node; the log file that a requeued run names anew);
the srun line that starts every node's launcher likewise. cluster.slurm.extra_options and srun_args come
after them, and sbatch and srun take the last of two values, so a repeated option would quietly replace the
key's value, or break the script (a second --output, --ntasks-per-node=8): each is refused, naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from lmspec.compiler.errors import Problem, error
from lmspec.compiler.rules.context import RuleContext

_SCRIPT = "launch/sbatch.sh itself"
# sbatch option (long and short names) -> the key that sets it, or why lmspec sets it
SBATCH_OWNED: dict[tuple[str, ...], str] = {
    ("--job-name", "-J"): "name",
    ("--nodes", "-N"): "hardware.nodes",
    ("--ntasks-per-node", "--ntasks", "-n"): f"{_SCRIPT} (one launcher per node)",
    ("--gpus-per-node",): "hardware.gpus_per_node (or cluster.slurm.gres)",
    ("--cpus-per-task", "-c"): "cluster.slurm.cpus_per_task",
    ("--time", "-t"): "cluster.slurm.time",
    ("--partition", "-p"): "cluster.slurm.partition",
    ("--account", "-A"): "cluster.slurm.account",
    ("--qos", "-q"): "cluster.slurm.qos",
    ("--reservation",): "cluster.slurm.reservation",
    ("--constraint", "-C"): "cluster.slurm.constraint",
    ("--exclusive",): "cluster.slurm.exclusive",
    ("--mem",): "cluster.slurm.mem",
    ("--gres",): "cluster.slurm.gres",
    ("--exclude", "-x"): "cluster.slurm.exclude",
    ("--dependency", "-d"): "cluster.slurm.dependency",
    ("--requeue", "--no-requeue"): "cluster.slurm.requeue",
    ("--signal",): "cluster.slurm.signal_seconds",
    ("--output", "-o", "--error", "-e", "--open-mode"): f"{_SCRIPT} (one log per job: slurm-<name>-<job id>.out)",
}
SRUN_OWNED: dict[tuple[str, ...], str] = {
    ("--nodes", "-N"): "hardware.nodes",
    ("--ntasks-per-node", "--ntasks", "-n"): f"{_SCRIPT} (one launcher per node)",
    ("--export",): "cluster.env (every variable of the batch shell reaches the launcher)",
    ("--label", "-l", "--output", "-o", "--error", "-e"): f"{_SCRIPT} (labelled lines, or a log per node)",
    ("--kill-on-bad-exit", "-K"): f"{_SCRIPT} (one failed node ends the step)",
    ("--container-image",): "cluster.slurm.container.image",
    ("--container-mounts",): "cluster.slurm.container.mounts",
    ("--container-workdir",): "cluster.slurm.container.workdir",
}
_NAME = re.compile(r"--[A-Za-z0-9_-]+|-[A-Za-z]")


def _owner(option: str, owned: dict[tuple[str, ...], str]) -> str | None:
    match = _NAME.match(option)
    if match is None:
        return None
    return next((owner for names, owner in owned.items() if match.group(0) in names), None)


def site_options_lmspec_owns(ctx: RuleContext) -> Iterator[Problem]:
    slurm = ctx.spec.cluster.slurm
    lists = (("extra_options", slurm.extra_options, SBATCH_OWNED), ("srun_args", slurm.srun_args, SRUN_OWNED))
    for field, options, owned in lists:
        for index, option in enumerate(options):
            owner = _owner(option, owned)
            if owner is None:
                continue
            key = f"cluster.slurm.{field}"
            fix = f"{owner} sets it" if owner.startswith(_SCRIPT) else f"set {owner} instead"
            yield error(
                key,
                f"{key}[{index}]={option!r} ({ctx.origins.of(key)}) repeats an option lmspec writes itself, and the "
                f"later one would win; drop it: {fix}",
            )


RULES = (site_options_lmspec_owns,)
