"""Every file name of a build directory, of a run directory and of a checkpoint directory.

A build is an interface between the compiler that writes it and the runtime, `lmspec logs`,
`doctor`, `diff` and `run` that read it: each name is spelled here once, so a reader and its
writer cannot drift apart. Paths inside a build are relative to it, with `/` separators, as
manifest.json lists them. Run paths are relative to the working directory of the job.
"""

from __future__ import annotations

import re

# -- a build directory (compiler/build/writer.py writes it, compiler/build/reader.py reads it) ---------------
MANIFEST = "manifest.json"  # how the build was made and the sha256 of every other file
SPEC = "spec.resolved.yaml"  # the resolved spec: what was compiled
PLAN = "plan.json"  # what lmspec derived from it (compiler/plan.py)
REPORT = "REPORT.md"
MEMORY_CHART = "report/memory.svg"
TORCHRUN_SH = "launch/torchrun.sh"
SBATCH_SH = "launch/sbatch.sh"
NCCL_ENV = "launch/nccl.env"
DS_CONFIG = "ds_config.json"  # train.backend=deepspeed only
TORCHTITAN_CONFIG = "torchtitan.json"  # train.backend=torchtitan only: torchtitan's job configuration
MEGATRON_CONFIG = "megatron/config.json"  # train.backend=megatron only: what the trainer builds megatron-core from
MEGATRON_ARGS = "megatron/pretrain_gpt_args.sh"  # the same as Megatron-LM's pretrain_gpt.py arguments
MAPPING = "convert/mapping.json"  # the reviewed checkpoint -> HuggingFace table
VLLM_YAML = "serve/vllm.yaml"
SERVE_SH = "serve/serve.sh"  # a one-node engine
SERVE_HEAD_SH = "serve/head.sh"  # node 0 of a multi-node engine: `bash serve/head.sh HEAD_ADDRESS`
SERVE_WORKER_SH = "serve/worker.sh"  # the other nodes: `bash serve/worker.sh HEAD_ADDRESS NODE_RANK`
SERVE_SBATCH_SH = "serve/sbatch.sh"  # cluster=slurm: the whole engine as one Slurm job
SERVE_POOLS = ("prefill", "decode")  # serve.disaggregation: serve/<pool>/vllm.yaml and serve/<pool>/serve.sh
LAUNCH_FILES = (TORCHRUN_SH, SBATCH_SH, NCCL_ENV)  # what bash reads when a training starts
# cluster.launcher=kubernetes (lmspec.compiler.launchers.kubernetes): every container runs `bash pod.sh ROLE`
# from the build ConfigMap's mount; train.yaml and serve.yaml hold the objects of the parts the spec has
K8S_POD_SH = "k8s/pod.sh"
K8S_TRAIN = "k8s/train.yaml"  # when the spec trains: a TrainJob and its ClusterTrainingRuntime, or a JobSet
K8S_SERVE = "k8s/serve.yaml"  # when it serves: a LeaderWorkerSet and its leader Service, or a RayService
# The ConfigMap(s) carrying the build into the pods: made from the finished files, manifest.json included, so
# the manifest cannot list it (a file cannot hold its own hash); `lmspec run` makes it again and compares.
K8S_BUILD = "k8s/build.yaml"
CARRIED = (K8S_BUILD,)  # a build's files its manifest does not list (lmspec.compiler.emit.manifest.build_files)

# -- a converted model (convert.output): the converter's record of what it wrote ----------------------------
CONVERTED_MANIFEST = "lmspec-convert.json"

# -- a quantized model (quantize.output): the quantize stage's record, and the quality it was accepted with --
QUANTIZED_MANIFEST = "lmspec-quantize.json"
QUALITY_JSON = "lmspec-quality.json"  # also in runs/<name>/quantize/: what the stage measured, and its verdict

# -- the run directory runs/<name>/ and its own entries ------------------------------------------------------
RUNS = "runs"
METRICS = "metrics.jsonl"  # lmspec.runtime.train.metrics
VLLM_LOG = "vllm.log"  # lmspec.runtime.serve.stage
TOKENIZER_DIR = "tokenizer"  # the training tokenizer a served model without one gets
VLLM_CACHE_DIR = "vllm_cache"  # vLLM's compile and download caches (serve/serve.sh)
DATA_DIR = "datasets"  # the built-in corpus prepared for the run's tokenizer, megatron-core's index cache
RANK_LOGS = "rank_logs"  # launch/torchrun.sh: each rank's stdout and stderr, a folder per launch (torchrun --log-dir)
TENSORBOARD_DIR = "tensorboard"  # lmspec.runtime.train.metric_sinks: train.logging.tensorboard's event files
WANDB_DIR = "wandb"  # W&B's own folder in the directory it is given (train.logging.wandb): the run directory
QUANTIZE_DIR = "quantize_stage"  # lmspec.runtime.quantize.stage: its sequences, request, log and quality report
QUALITY_MD = "quality.md"  # in QUANTIZE_DIR: the quality table a reviewer reads
QUANTIZE_LOG = "quantize.log"  # in QUANTIZE_DIR: llm-compressor's output
RUN_DIR_ENTRIES = (
    METRICS,
    VLLM_LOG,
    TOKENIZER_DIR,
    VLLM_CACHE_DIR,
    DATA_DIR,
    RANK_LOGS,
    TENSORBOARD_DIR,
    WANDB_DIR,
    QUANTIZE_DIR,
)

# -- train.checkpoint.dir (lmspec.runtime.train.checkpoint) -------------------------------------------------
LATEST = "latest"  # one line naming the newest complete step directory
LATEST_TEMP = "latest.tmp"  # the next `latest`, before its rename
STEP_PREFIX = "step_"  # step_<N>/: one complete checkpoint
STEP_MANIFEST = "manifest.json"  # in each step directory: its run id, what wrote it and the digest of its files
TRAINER_STATE = "trainer_state"  # in each step directory: rank_<R>.pt
PREVIOUS_RUNS = "previous_runs"  # checkpoints of earlier runs, moved aside
DIST_CKPT_DIR = "torch_dist"  # megatron-core dist_checkpointing, in each step directory
DEEPSPEED_DIR = "deepspeed"  # DeepSpeed's save_checkpoint layout, in each step directory
TORCHTITAN_DIR = "torchtitan"  # the torchtitan trainer's DCP save (model and optimizer), in each step directory
# convert/mapping.json's checkpoint_format: what the converter reads (TrainingBackend.checkpoint_format)
TORCH_DIST_FORMAT = DIST_CKPT_DIR  # megatron-core's dist_checkpointing, sharded as the mapping's rows say
DEEPSPEED_ZERO_FORMAT = "deepspeed_zero"  # ZeRO partitions, consolidated to full tensors by zero_to_fp32
TORCHTITAN_DCP_FORMAT = "torchtitan_dcp"  # torch.distributed.checkpoint of FSDP2 DTensors, transformers' names


def run_dir(name: str) -> str:
    """The run directory of job `name`, relative to the working directory."""
    return f"{RUNS}/{name}"


def serve_scripts(nodes: int) -> tuple[str, ...]:
    """The scripts that start vLLM on an engine of `nodes` nodes (what compiler/emit/serve.py writes besides
    vllm.yaml and a launcher's own files, and what the serve stage checks before bash runs them):
    serve.sh for one node, head.sh and worker.sh for more."""
    return (SERVE_SH,) if nodes == 1 else (SERVE_HEAD_SH, SERVE_WORKER_SH)


def pool_files(pool: str) -> tuple[str, str]:
    """serve/<pool>/vllm.yaml and serve/<pool>/serve.sh of a disaggregated pool (serve.disaggregation):
    the script runs one engine of the pool, on each of its nodes."""
    return f"serve/{pool}/vllm.yaml", f"serve/{pool}/serve.sh"


def step_dir(step: int) -> str:
    """The name of the checkpoint directory of optimizer step `step`."""
    return f"{STEP_PREFIX}{step}"


_STEP_DIR = re.compile(rf"{STEP_PREFIX}(0|[1-9][0-9]*)")  # fullmatch; ASCII digits only, no leading zeros


def step_number(name: str) -> int | None:
    """N for a step directory name `step_<N>` (as `step_dir` spells it), else None."""
    match = _STEP_DIR.fullmatch(name)
    return int(match.group(1)) if match else None
