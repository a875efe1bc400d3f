"""The `cluster` group: how the job is launched (the launcher, Slurm and its container, the
environment and setup every node runs, NCCL, the checkpoint filesystem's bandwidth)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.launchers import LauncherName
from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import key
from lmspec.compiler.spec.sections.kubernetes import KubernetesSpec

MTBF_HOURS_MAX = 1e9  # a node that never fails in a job's lifetime: any figure above one is as good


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """A container image for the launch step (pyxis' srun flags): the build and submit directories are
    mounted at their own paths, so the scripts and runs/ are where the batch script sees them."""

    image: str | None = key(
        "--container-image: a registry reference or a squashfs file; every node's launcher and the trainer (or "
        "server) run in it, and so does cluster.setup, so it must hold lmspec with its training stack (torch, "
        "megatron-core or DeepSpeed) or serving stack (vLLM); null = no container.",
        example="nvcr.io#nvidia/pytorch:25.01-py3",
        kind=kinds.CONTAINER_IMAGE,
    )
    mounts: list[str] = key(
        "--container-mounts beyond the build and submit directories, each SRC[:DST[:FLAGS]].",
        example=["/lustre/data:/data:ro"],
        kind=kinds.CONTAINER_MOUNT,
        max_items=kinds.SITE_LINES_MAX,
    )
    workdir: str | None = key(
        "--container-workdir, where runs/ and every relative path of the run go: a mounted directory (null = "
        "the directory sbatch was called from, mounted at its own path), or the run is lost with the container.",
        example="/workspace",
        kind=kinds.PATH,
    )


@dataclass(frozen=True, kw_only=True)
class SlurmSpec:
    """Slurm submission settings."""

    partition: str | None = key("--partition; null = the cluster default.", example="gpu", kind=kinds.SLURM_NAME)
    account: str | None = key("--account; null = none.", example="my_team", kind=kinds.SLURM_NAME)
    time: str = key("--time limit, [D-]HH:MM:SS.", example="24:00:00", kind=kinds.SLURM_TIME)
    cpus_per_task: int = key(
        "--cpus-per-task (one task per node runs torchrun).", example=64, minimum=1, maximum=kinds.CPUS_MAX
    )
    signal_seconds: int = key(
        "--signal=USR1@N: seconds before the time limit to checkpoint and requeue.",
        example=300,
        minimum=1,
        maximum=kinds.SIGNAL_SECONDS_MAX,
    )
    requeue: bool = key("--requeue: requeue after preemption or the pre-timeout checkpoint.", example=True)
    qos: str | None = key("--qos; null = the account's default.", example="high", kind=kinds.SLURM_NAME)
    reservation: str | None = key("--reservation; null = none.", example="maint_week", kind=kinds.SLURM_NAME)
    constraint: str | None = key(
        "--constraint: node features the job needs (Slurm's & | [] syntax); null = none.",
        example="h100&ib",
        kind=kinds.SLURM_VALUE,
    )
    exclusive: bool = key("--exclusive: no other job shares the nodes.", example=True)
    mem: int | str | None = key(
        "--mem per node: megabytes, or a size with K, M, G or T (0 = all of the node's); null = the partition default.",
        example="500G",
        minimum=0,
        maximum=kinds.SLURM_MEM_MB_MAX,
        kind=kinds.SLURM_MEM,
    )
    gres: str | None = key(
        "--gres, for sites that count GPUs as generic resources; replaces --gpus-per-node when set.",
        example="gpu:8",
        kind=kinds.SLURM_VALUE,
    )
    exclude: str | None = key(
        "--exclude: nodes not to use (a Slurm host list).", example="gpu[07,12]", kind=kinds.SLURM_VALUE
    )
    dependency: str | None = key(
        "--dependency: start after other jobs (afterok:ID, singleton, ...); null = none.",
        example="afterok:1234",
        kind=kinds.SLURM_VALUE,
    )
    extra_options: list[str] = key(
        "More #SBATCH options, each as written after #SBATCH (both training's and serving's sbatch.sh).",
        example=["--mail-type=END", "--comment=lmspec"],
        kind=kinds.SBATCH_OPTION,
        max_items=kinds.SITE_LINES_MAX,
    )
    srun_args: list[str] = key(
        "More srun arguments for the step that starts the launcher on every node, one word each.",
        example=["--cpu-bind=none", "--mpi=pmix"],
        kind=kinds.SRUN_ARG,
        max_items=kinds.SITE_LINES_MAX,
    )
    container: ContainerSpec = key("A container every node's launcher runs in (pyxis/enroot); image null = none.")


@dataclass(frozen=True, kw_only=True)
class NcclSpec:
    """NCCL settings written to nccl.env."""

    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = key("NCCL_DEBUG.", example="WARN")
    timeout_minutes: int = key(
        "Collective watchdog timeout; must outlast the longest checkpoint save.",
        example=30,
        minimum=1,
        maximum=kinds.TIMEOUT_MINUTES_MAX,
    )
    ib_timeout: int = key("NCCL_IB_TIMEOUT exponent (4.096 us x 2^n).", example=22, minimum=1, maximum=31)
    ib_retry_cnt: int = key("NCCL_IB_RETRY_CNT.", example=7, minimum=0, maximum=7)
    ib_gid_index: int | None = key(
        "NCCL_IB_GID_INDEX for RoCE (3 = RoCEv2 on most NICs); null = NCCL default.",
        example=3,
        minimum=0,
        maximum=kinds.GID_INDEX_MAX,
    )


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """How the job is launched."""

    launcher: LauncherName = key(
        "local = torchrun on this machine; slurm = sbatch; kubernetes = Kubernetes objects (kubectl apply).",
        example="local",
    )
    master_port: int | None = key(
        "Rendezvous port on node 0, the same for every node; null = one per job: a free port on a one-node run, "
        "10000 + SLURM_JOB_ID % 20000 under Slurm, MASTER_PORT set on every node of a multi-node local run "
        "(lmspec run prints it).",
        example=29500,
        minimum=1,
        maximum=kinds.PORT_MAX,
    )
    env: list[str] = key(
        "Environment variables every node sets before the launcher (training and serving), NAME=value.",
        example=["HF_HOME=/lustre/hf", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"],
        kind=kinds.ENV_ASSIGNMENT,
        max_items=kinds.SITE_LINES_MAX,
    )
    setup: list[str] = key(
        "Shell lines every node runs before the launcher, as written (module load, a venv's activate), "
        "after cluster.env; under a container they run inside it.",
        example=["module load cuda/12.4", "source /opt/venv/bin/activate"],
        kind=kinds.SHELL_LINE,
        max_items=kinds.SITE_LINES_MAX,
    )
    slurm: SlurmSpec = key("Slurm settings (used when launcher is slurm).")
    kubernetes: KubernetesSpec = key("Kubernetes objects (used when launcher is kubernetes).")
    storage_write_gb_per_s: float = key(
        "Aggregate write bandwidth, GB/s, of the filesystem train.checkpoint.dir is on, all nodes writing "
        "at once: it prices a checkpoint save (REPORT.md) against cluster.nccl.timeout_minutes. The default "
        "10 is a modest shared filesystem (one NVMe drive writes 2-7 GB/s; Lustre, GPFS, Weka or 3FS "
        "installations for thousands of GPUs reach hundreds of GB/s and more): set what yours sustains.",
        example=10,
        minimum=kinds.RATE_MIN,
        maximum=kinds.RATE_MAX,
    )
    node_mtbf_hours: float = key(
        "Mean time between unexpected interruptions of one node, hours: with hardware.nodes it gives the job's "
        "(node MTBF / nodes) and REPORT.md's checkpoint interval advice (Young/Daly: sqrt(2 x save cost x job "
        "MTBF)). The default 6335 is Llama 3's pre-training (Dubey et al. 2024, section 3.3.4): 419 unexpected "
        "interruptions in 54 days on 16,384 H100 GPUs in 2,048 nodes, 54 x 24 x 2048 / 419 hours.",
        example=6335,
        exclusive_minimum=0,
        maximum=MTBF_HOURS_MAX,
    )
    nccl: NcclSpec = key("NCCL settings.")
