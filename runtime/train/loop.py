"""`python -m lmspec.runtime.train <build dir>`: train what was compiled.

Reads `<build dir>/spec.resolved.yaml` (through the schema into the compiler's typed TrainingSpec)
and `plan.json` (layout, batch), each verified against manifest.json, as are the launch
files; no other arguments. Runs under torchrun (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); nccl on GPU, gloo on CPU.
Writes into the run directory `runs/<name>/` (relative to the working
directory): `metrics.jsonl`, and checkpoints at `train.checkpoint.dir`, which
must not overlap (lmspec.compiler.run_paths, checked again here from the job's
own working directory). Before the first step the run's identity is decided
(lmspec.runtime.train.checkpoint.Checkpoints.open_run): resume=auto continues the newest
usable checkpoint's run (refused when that run's identity is not this build's), resume=never
moves an earlier run's checkpoints aside. A run that resumes nothing starts from the model weights of
`train.init_from` when set (checked before the ranks meet,
lmspec.runtime.train.init_from), its optimizer, step and data fresh.

Data: the train and valid splits of train.data through megatron-core (lmspec.runtime.data.datasets);
after each step `evaluates_after` names, the validation loss over that evaluation's valid samples.

Exit codes: 0 trained to train.steps; 1 stopped by a NaN/Inf loss, an
unusable checkpoint directory, training data the model cannot take, or
train.transformer_impl=transformer_engine where TE or a GPU is missing (runtime/train/te_preflight.py);
2 usage (bad build dir, world-size mismatch, run directories that overlap from this working directory,
a checkpoint directory holding a run of another identity: runtime/train/ownership.py);
3 (signals.REQUEUE_EXIT_CODE) stopped by SIGTERM/SIGUSR1 after a final checkpoint.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
import time
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from lmspec.compiler.backends import backend_of
from lmspec.compiler.backends.backend import load
from lmspec.compiler.build.files import LAUNCH_FILES, TRAINER_STATE
from lmspec.compiler.build.reader import Build
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from lmspec.compiler.models.samples import evaluates_after, evaluation_index
from lmspec.compiler.plan import Plan
from lmspec.compiler.resume_layout import resume_problems, saved_with
from lmspec.compiler.run_paths import require_run_paths_apart
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.runtime.data.datasets import DataError, build_datasets
from lmspec.runtime.data.preflight import data_ready
from lmspec.runtime.data.tokenizer import TokenizerError
from lmspec.runtime.train.checkpoint import AnotherRun, CheckpointError, Checkpoints
from lmspec.runtime.train.data import Batch, micro_batches
from lmspec.runtime.train.init_from import init_from_ready
from lmspec.runtime.train.metrics import MetricsLog, NonFiniteLoss
from lmspec.runtime.train.ownership import run_identity
from lmspec.runtime.train.saving import Saver, Staged
from lmspec.runtime.train.signals import REQUEUE_EXIT_CODE, StopRequest
from lmspec.runtime.train.te_preflight import transformer_engine_ready

logger = logging.getLogger(__name__)


class Trainer(Protocol):
    dp_rank: int
    dp_size: int
    num_micro_batches: int
    micro_batch_size: int

    def train_step(self, batches: list[Batch], step: int) -> tuple[float, float, float]: ...
    def eval_loss(self, batches: list[Batch]) -> float: ...
    def save(self, directory: Path) -> Staged: ...
    def async_queue(self) -> Any: ...
    def load(self, directory: Path) -> None: ...
    def init_from(self, directory: Path) -> None: ...
    def rng_state(self) -> dict[str, Any]: ...
    def set_rng_state(self, state: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def load_build(build_dir: Path) -> Build:
    """A build lmspec wrote, verified against its manifest (compiler/build/reader.py): its typed
    TrainingSpec and Plan, the launch files that started this process (a build edited by hand is refused
    here too when its scripts are run directly: torchrun.sh, sbatch) and the configuration its backend's
    trainer builds from (megatron/config.json, ds_config.json), all checked before the ranks meet."""
    build = Build.open(build_dir)
    for rel in LAUNCH_FILES:
        build.script(rel)
    build.json(backend_of(build.training()).config_file)
    return build


def init_distributed(spec: TrainingSpec, plan: Plan) -> None:
    expected = plan.trained().layout.world_size
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if world != expected:
        raise UsageError(
            f"the launcher started {world or 'no torchrun'} rank(s) but the plan's layout.world_size={expected} "
            f"(hardware.gpus_per_node={spec.hardware.gpus_per_node} x hardware.nodes={spec.hardware.nodes}); "
            "start it with the build's launch/torchrun.sh or `lmspec run <build dir>`"
        )
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=spec.cluster.nccl.timeout_minutes)
    )


def make_trainer(build: Build) -> Trainer:
    """The backend's trainer (its module names the class), built from the build's configuration file."""
    spec = build.training()
    backend = backend_of(spec)
    trainer: Trainer = load(backend.trainer)(spec, build.plan, build.json(backend.config_file))
    return trainer


def _rng_state(trainer: Trainer) -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state(), "backend": trainer.rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(trainer: Trainer, state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    trainer.set_rng_state(state["backend"])


def trainer_state(trainer: Trainer, step: int, consumed_samples: int) -> dict[str, Any]:
    """What a checkpoint holds beside the backend's own state: this rank's step, data position and RNG."""
    return {"step": step, "consumed_samples": consumed_samples, "rng": _rng_state(trainer)}


def save_checkpoint(ckpts: Checkpoints, trainer: Trainer, step: int, consumed_samples: int) -> Path:
    """One synchronous save, committed on return (the HF import's step 0)."""
    saver = Saver(ckpts, trainer, asynchronous=False)
    saver.save(step, trainer_state(trainer, step, consumed_samples))
    assert saver.committed is not None  # a synchronous save commits before returning
    return saver.committed


def load_checkpoint(path: Path, trainer: Trainer) -> tuple[int, int]:
    """Restore the trainer from `path`; (step, consumed_samples)."""
    trainer.load(path)
    own = path / TRAINER_STATE / f"rank_{dist.get_rank()}.pt"
    state = torch.load(own if own.is_file() else path / TRAINER_STATE / "rank_0.pt", weights_only=False)
    _set_rng_state(trainer, state["rng"])
    return int(state["step"]), int(state["consumed_samples"])


def validate(spec: TrainingSpec, plan: Plan, trainer: Trainer, valid: Any, step: int) -> float:
    """The loss over the valid samples of the evaluation after `step` (eval_iters global batches)."""
    first = evaluation_index(spec.train, step) * plan.trained().batch.samples.samples_per_evaluation
    count = spec.train.eval_iters * trainer.num_micro_batches
    return trainer.eval_loss(
        micro_batches(valid, first, trainer.micro_batch_size, trainer.dp_rank, trainer.dp_size, count)
    )


def train(build: Build) -> int:
    spec, plan = build.training(), build.plan
    rank0 = dist.get_rank() == 0
    torch.manual_seed(spec.train.seed)
    random.seed(spec.train.seed)
    data = build_datasets(spec, plan)
    trainer = make_trainer(build)
    ckpt_spec = spec.train.checkpoint
    ckpts = Checkpoints(
        Path(ckpt_spec.dir),
        ckpt_spec.keep_last_k,
        required=(f"{TRAINER_STATE}/rank_0.pt",),
        saved_with=saved_with(spec, plan),
        identity=run_identity(spec),
    )
    step, consumed = 0, 0
    path = ckpts.open_run(ckpt_spec.resume)
    if path is not None:
        if problems := resume_problems(spec, plan, ckpts.resumed_with):
            raise CheckpointError(f"cannot resume from {path}: {'; '.join(problems)}")
        step, consumed = load_checkpoint(path, trainer)
        if rank0:
            logger.info(f"lmspec: resumed from {path} (step {step}); run {ckpts.run_id}")
    elif spec.train.init_from is not None:
        trainer.init_from(Path(spec.train.init_from))
        if rank0:
            logger.info(f"lmspec: initialised from {spec.train.init_from}; run {ckpts.run_id}")
    elif rank0:
        logger.info(f"lmspec: run {ckpts.run_id}: from scratch (train.checkpoint.resume={ckpt_spec.resume})")
    stop = StopRequest()
    stop.install()
    log = MetricsLog(
        spec,
        Path(plan.paths.run_dir),
        dist.get_world_size(),
        rank0,
        spec.train.steps,
        step,
        fresh_run=path is None,
        tokens_per_step=plan.trained().batch.tokens_per_step,
        flops_per_token=plan.trained().flops.per_token,
    )
    global_batch = spec.train.global_batch_size
    saver = Saver(ckpts, trainer, asynchronous=ckpt_spec.async_save)
    finished = False
    try:
        while step < spec.train.steps:
            started = time.perf_counter()
            batches = micro_batches(
                data.train,
                consumed,
                trainer.micro_batch_size,
                trainer.dp_rank,
                trainer.dp_size,
                trainer.num_micro_batches,
            )
            loss, grad_norm, lr = trainer.train_step(batches, step + 1)
            elapsed = time.perf_counter() - started
            step, consumed = step + 1, consumed + global_batch
            saver.poll()
            log.record(step, loss, lr, grad_norm, elapsed)
            if evaluates_after(spec.train, step):
                log.record_validation(step, validate(spec, plan, trainer, data.valid, step))
            stopping = stop.agreed()
            if step % ckpt_spec.interval == 0 or step == spec.train.steps or stopping:
                saver.save(step, trainer_state(trainer, step, consumed))
            if stopping:
                saver.wait()
                finished = True
                if rank0:
                    logger.info(
                        f"lmspec: {stop.signal_name or 'signal'} received: checkpointed at step {step}; "
                        f"exit {REQUEUE_EXIT_CODE} (requeue)"
                    )
                return REQUEUE_EXIT_CODE
        saver.wait()
        finished = True
    except NonFiniteLoss:
        saver.wait()  # every rank saw the same mean loss: the save in flight, of a step before it, is kept
        finished = True
        raise
    finally:
        if not finished:  # failing: a background write is stopped, never committed
            saver.abandon()
        log.close()
    trainer.close()
    return EXIT_OK


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        logger.error("usage: python -m lmspec.runtime.train <build dir>")
        return EXIT_USAGE
    build_dir = Path(argv[0])
    try:
        build = load_build(build_dir)
        spec = build.training()
        require_run_paths_apart(spec)
        report = os.environ.get("LOCAL_RANK", "0") == "0"  # one report per node
        if not transformer_engine_ready(spec, report=report):
            return EXIT_FAILED
        ready = data_ready(build.plan, report=report)
        if not (init_from_ready(spec, report=report) and ready):
            return EXIT_FAILED
        init_distributed(spec, build.plan)
    except UsageError as exc:
        logger.error(f"lmspec: error: {exc}")
        return EXIT_USAGE
    try:
        return train(build)
    except AnotherRun as exc:
        if dist.get_rank() == 0:
            logger.error(f"lmspec: error: {exc}")
        return EXIT_USAGE
    except (NonFiniteLoss, CheckpointError, NotImplementedError, DataError, TokenizerError) as exc:
        if dist.get_rank() == 0:  # every rank reaches the same verdict
            logger.error(f"lmspec: error: {exc}")
        return EXIT_FAILED
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
