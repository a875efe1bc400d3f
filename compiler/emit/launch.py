"""launch/torchrun.sh and launch/sbatch.sh: one torchrun per node, under Slurm or by hand.

Python decides every value and quotes every spec string (lmspec.compiler.emit.quoting); the templates
only place them. `#SBATCH` lines are read by sbatch, not by bash, so the values placed there are
restricted by their kinds (lmspec.compiler.spec.kinds: Slurm names and times) and placed verbatim by `word`,
which refuses anything a shell or sbatch would read differently.
"""

from __future__ import annotations

from lmspec.compiler.build.files import RANK_LOGS, SBATCH_SH, TORCHRUN_SH, run_dir
from lmspec.compiler.emit import rack, site
from lmspec.compiler.emit.quoting import Quoted, directive, shell
from lmspec.compiler.emit.render import render
from lmspec.compiler.launch_names import IMPORT_MODULE, TRAIN_MODULE
from lmspec.compiler.plan import Plan

LOOPBACK_ADDR = "127.0.0.1"  # one node: rendezvous on loopback, no hostname resolution needed
# cluster.master_port=null under Slurm: MASTER_PORT = base + SLURM_JOB_ID % span, below Linux's
# ephemeral range (32768-60999), so jobs sharing a node differ unless their ids differ by a multiple of span
DERIVED_PORT_BASE = 10000
DERIVED_PORT_SPAN = 20000


def emit_launch(plan: Plan) -> dict[str, str]:
    return {TORCHRUN_SH: torchrun_sh(plan), SBATCH_SH: sbatch_sh(plan)}


def torchrun_sh(plan: Plan) -> str:
    s, layout = plan.trained().spec, plan.trained().layout
    ifname = s.hardware.inter_node.socket_ifname
    return render(
        "torchrun.sh.j2",
        name=plan.name,
        nnodes=layout.nodes,
        nproc=layout.gpus_per_node,
        multi_node=layout.nodes > 1,
        loopback=LOOPBACK_ADDR,
        master_port=s.cluster.master_port,
        socket_ifname=ifname,
        interfaces=ifname.split(",") if ifname else [],
        rdzv_id=shell(f"lmspec-{plan.name}"),
        train_module=TRAIN_MODULE,
        import_module=IMPORT_MODULE,
        checkpoint_dir=shell(s.train.checkpoint.dir),
        log_dir=shell(f"{run_dir(plan.name)}/{RANK_LOGS}"),
        environment=site.environment_block(plan),
        resume=s.train.checkpoint.resume == "auto",
    )


def sbatch_options(plan: Plan) -> list[Quoted]:
    """`#SBATCH` options after job name, nodes and tasks: the site's, the rack's `--segment`, then the stop."""
    slurm, layout = plan.spec.cluster.slurm, plan.trained().layout
    options = site.sbatch_options(plan, layout.gpus_per_node) + rack.segment_options(plan, layout.nodes)
    if slurm.requeue:
        options.append(directive("--requeue"))
    # B: signals the batch shell, which forwards USR1 to the trainer (torchrun itself ignores it).
    options.append(directive(f"--signal=B:USR1@{slurm.signal_seconds}"))
    options += [directive("--output=slurm-%x-%j.out"), directive("--open-mode=append")]
    return options


def sbatch_sh(plan: Plan) -> str:
    layout, slurm = plan.trained().layout, plan.spec.cluster.slurm
    return render(
        "sbatch.sh.j2",
        name=plan.name,
        nnodes=layout.nodes,
        nproc=layout.gpus_per_node,
        options=sbatch_options(plan),
        multi_node=layout.nodes > 1,
        loopback=LOOPBACK_ADDR,
        master_port=plan.spec.cluster.master_port,
        port_base=DERIVED_PORT_BASE,
        port_span=DERIVED_PORT_SPAN,
        requeue=slurm.requeue,
        signal_seconds=slurm.signal_seconds,
        srun_words=site.srun_words(plan),
        container=slurm.container.image is not None,
    )
