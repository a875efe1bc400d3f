"""What a site asks of every job it runs, in the words of the scripts that start it (training's and serving's).

- `sbatch_options`: the `#SBATCH` options of cluster.slurm (GPUs, time, partition, account, qos, reservation,
  constraint, exclusive, mem, gres, exclude, dependency, then the extra options as written);
- `srun_words`: what the step that starts the launchers adds to srun: cluster.slurm.srun_args, and pyxis'
  container flags (the build and submit directories mounted at their own paths, so the scripts and runs/ are
  where the batch script sees them);
- `environment_block`: cluster.env exported, then cluster.setup run, on every node before the launcher (inside
  the container, since the scripts carrying it run there).
"""

from __future__ import annotations

from lmspec.compiler.emit.nccl import cpu_ranks
from lmspec.compiler.emit.quoting import Quoted, directive, double_quoted, shell, word
from lmspec.compiler.plan import Plan

# Mounted in every container at their own paths: the build (the scripts srun starts) and the submit directory
# (runs/: checkpoints, metrics, logs), as bash expands them in the batch script.
CONTAINER_DIRS = "$BUILD_DIR:$BUILD_DIR,$SLURM_SUBMIT_DIR:$SLURM_SUBMIT_DIR"
SUBMIT_DIR = '"$SLURM_SUBMIT_DIR"'


def sbatch_options(plan: Plan, gpus_per_node: int) -> list[Quoted]:
    """The `#SBATCH` options every lmspec job asks of the site, for training's and serving's sbatch.sh."""
    slurm = plan.spec.cluster.slurm
    options: list[str] = []
    if slurm.gres:
        options.append(f"--gres={slurm.gres}")
    elif not cpu_ranks(plan):
        options.append(f"--gpus-per-node={gpus_per_node}")
    options += [f"--cpus-per-task={slurm.cpus_per_task}", f"--time={slurm.time}"]
    named = (
        ("--partition", slurm.partition),
        ("--account", slurm.account),
        ("--qos", slurm.qos),
        ("--reservation", slurm.reservation),
        ("--constraint", slurm.constraint),
        ("--mem", slurm.mem),
        ("--exclude", slurm.exclude),
        ("--dependency", slurm.dependency),
    )
    options += [f"{flag}={value}" for flag, value in named if value is not None]
    if slurm.exclusive:
        options.append("--exclusive")
    options += [_one_token_value(option) for option in slurm.extra_options]
    return [directive(option) for option in options]


def _one_token_value(option: str) -> str:
    """An extra option as sbatch reads it in an #SBATCH line: it splits the line at blanks, so a value holding
    one is double-quoted (`--comment=two words` -> `--comment="two words"`); a value the user quoted stays."""
    name, sep, value = option.partition("=")
    if not sep:
        name, sep, value = option.partition(" ")
    if not any(ch.isspace() for ch in value.strip()) or '"' in value:
        return option
    return f'{name}="{value.strip()}"'


def srun_words(plan: Plan) -> list[Quoted]:
    """Words srun gets before the launcher's command: the site's srun arguments, then the container's."""
    slurm = plan.spec.cluster.slurm
    words = [shell(arg) for arg in slurm.srun_args]
    container = slurm.container
    if container.image is not None:
        extra = "".join(f",{double_quoted(mount)}" for mount in container.mounts)
        workdir = shell(container.workdir) if container.workdir is not None else Quoted(SUBMIT_DIR)
        words += [
            shell(f"--container-image={container.image}"),
            Quoted(f'"--container-mounts={CONTAINER_DIRS}{extra}"'),
            Quoted(f"--container-workdir={workdir}"),
        ]
    return words


def environment_block(plan: Plan) -> Quoted:
    """Shell lines exporting cluster.env and running cluster.setup (as one block, so a line may continue the
    one before it), or nothing when the site asks for neither."""
    cluster = plan.spec.cluster
    lines = []
    if cluster.env:
        lines.append("# cluster.env, on every node before the launcher")
        for assignment in cluster.env:
            name, _, value = assignment.partition("=")
            lines.append(f"export {word(name)}={shell(value)}")
    if cluster.setup:
        lines.append("# cluster.setup, as written, on every node before the launcher")
        lines.append(f"CLUSTER_SETUP={shell(chr(10).join(cluster.setup))}")
        lines.append('eval "$CLUSTER_SETUP"')
    return Quoted("".join(f"{line}\n" for line in lines))
