"""torchtitan backend's trainer: a transformers causal LM under TP, PP and FSDP2, from torchtitan.json.

The model is the one the DeepSpeed backend builds (lmspec.runtime.train.hf_model: transformers' class of
`model.family`, HF module names, so its checkpoint converts without renames), initialised from
`training.seed` on every rank before it is sharded (`.parallelize`). A step runs the plan's micro-batches,
each loss a token mean divided by their count (as DeepSpeed's engine scales), each backward reducing its
gradients into the sharded ones, as torchtitan's train step leaves FSDP2 to do (no unsharded gradients are
kept between micro-batches: the memory model prices it so, compiler/models/train_memory.py); then the global
gradient norm (DTensor norms made whole), clipping when `training.max_norm` > 0, the optimizer step and the
spec's learning-rate schedule (lmspec.runtime.train.lr_schedule), stepped after the optimizer as torchtitan
steps its own. Under tensor parallelism the ranks of a TP group train the same micro-batches
(`data_parallel_rank`) and compute the same whole-logit loss, so the loss mean over all ranks
(hf_model.dp_token_mean) counts each data-parallel rank's tokens tp times: the same mean.

Under pipeline parallelism (`.pipeline`) the model is cut into stages, each parallelized alone, one optimizer
and scheduler per stage this rank holds (torchtitan's model parts, OptimizersContainer and
LRSchedulersContainer); a step is one run of the schedule over the data-parallel rank's micro-batches, each
loss divided by their count as above; only the last stage computes losses, so the logged mean is summed over
all ranks from those of the last stage; the gradient norm sums each stage's squared norm over the pipeline
(torchtitan's clip_grad_norm_ with its pp mesh). FSDP2 under a schedule reduces a stage's gradients once,
after its last micro-batch's backward (torch's PipelineStage keeps them unsharded until then).

Checkpoints are torch.distributed.checkpoint saves under `<step dir>/torchtitan/`: every rank writes its
shards of the model and optimizer state (FQNs without FSDP's or checkpoint_wrapper's prefixes; the optimizer's
flattened per parameter, `state.<fqn>.exp_avg`, `param_groups.<fqn>.lr`, as torchtitan's OptimizersContainer
saves it, so a rank saves only its own stages' entries) and the scheduler's step count, synchronously; `load`
reads them back into the same structure, at any layout (DCP stores global tensors and reshards them: a TP
save resumes under FSDP2 alone, a pipeline's without one).
`init_from` (train.init_from, torchtitan.json's checkpoint.initial_load_path with initial_load_model_only)
reads only the model part of such a save, at any data-parallel layout: the optimizer and its step count
start afresh, as torchtitan's model-only initial load leaves them.
"""

from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from lmspec.compiler.build.files import TORCHTITAN_DIR
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.runtime.convert.dcp_reader import MODEL_KEY, DcpCheckpoint
from lmspec.runtime.train.checkpoint import CheckpointError
from lmspec.runtime.train.data import Batch
from lmspec.runtime.train.hf_model import (
    TransformersTrainer,
    causal_lm,
    causal_lm_loss,
    dp_token_mean,
    eval_token_mean,
)
from lmspec.runtime.train.init_from import require_stored_shapes
from lmspec.runtime.train.lr_schedule import SpecSchedule
from lmspec.runtime.train.saving import Staged
from lmspec.runtime.train.torchtitan.async_save import DcpAsyncQueue, DcpAsyncRequest
from lmspec.runtime.train.torchtitan.job_config import JobConfig, Optimizer
from lmspec.runtime.train.torchtitan.parallelize import (
    PP,
    data_parallel_rank,
    layout_problems,
    parallelize,
    world_mesh,
)
from lmspec.runtime.train.torchtitan.pipeline import Pipeline, build_pipeline, part_problems, split_model

logger = logging.getLogger(__name__)
# activation_checkpoint.mode as the start-up line says it
AC_SAID = {
    "none": "no activation checkpointing",
    "full": "every decoder layer checkpointed",
    "selective": "each decoder layer checkpointed per op (every second matmul recomputed)",
}
# torchtitan's OptimizersContainer: each parameter's entries under its FQN, so stages merge and reshard
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
_NESTED = StateDictOptions()  # how the first torchtitan saves (before pipeline stages) held the optimizer
_NESTED_GROUP = re.compile(r"optimizer\.param_groups\.\d+\.")  # a list of groups, flattened by DCP


def _optimizer_flattened(path: Path) -> bool:
    """Whether the DCP save in `path` holds the optimizer per parameter name (torchtitan's format, every save
    since pipeline stages), not as one nested state dict with a list of parameter groups."""
    return not any(
        _NESTED_GROUP.match(key) for key in DcpCheckpoint(path, container="optimizer").metadata.state_dict_metadata
    )


def build_optimizer(params: list[torch.nn.Parameter], o: Optimizer) -> torch.optim.Optimizer:
    """torch's optimizer `optimizer.name`, unfused (`fused` needs every parameter on CUDA; a DTensor's
    `foreach` path is torch's choice), weight decay on every parameter as torchtitan applies it."""
    if o.name == "SGD":
        return torch.optim.SGD(params, lr=o.lr, weight_decay=o.weight_decay)
    kind = torch.optim.AdamW if o.name == "AdamW" else torch.optim.Adam
    return kind(
        params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay, fused=False, foreach=None
    )


class TorchtitanTrainer(TransformersTrainer):
    def __init__(self, spec: TrainingSpec, plan: Plan, config: dict[str, Any]) -> None:
        """`config`: the build's torchtitan.json, as compiled (lmspec.runtime.train.loop reads it through Build)."""

        self.spec = spec
        self.config = JobConfig.parse(config)
        batch = plan.trained().batch
        self.micro_batch_size = batch.micro_batch_size
        self.num_micro_batches = batch.grad_accum_steps
        world = dist.get_world_size()
        if problems := layout_problems(self.config, world, self.micro_batch_size, self.num_micro_batches):
            raise ValueError(f"torchtitan.json does not match this run: {'; '.join(problems)}")
        p = self.config.parallelism
        parts = p.module_fqns_per_model_part
        if parts is not None and (problems := part_problems(parts, spec.model.num_layers)):
            raise ValueError(f"torchtitan.json: parallelism.module_fqns_per_model_part: {'; '.join(problems)}")
        cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
        self.mesh = world_mesh(self.config, self.device.type)
        # the loop's data: a TP group's ranks read their data-parallel rank's micro-batches, the same ones
        self.dp_rank, self.dp_size = data_parallel_rank(self.mesh)
        torch.manual_seed(self.config.training.seed)  # every rank the same weights before they are sharded
        model = causal_lm(spec)
        # built on the host: fully_shard moves each unit's weights to the mesh's device as it shards them, so a
        # GPU holds one layer unsharded at a time, never the whole model
        self.pipeline: Pipeline | None = None
        self.pp_rank = 0
        if parts is None:
            self.model_parts = [parallelize(model, self.config, self.mesh)]
        else:
            pp_mesh = self.mesh[PP]
            stages = split_model(model, parts, pp_mesh, p.tensor_parallel_degree)
            self.model_parts = [parallelize(stage, self.config, self.mesh) for _, stage in stages]
            self.pipeline = build_pipeline(
                [(index, part) for (index, _), part in zip(stages, self.model_parts, strict=True)],
                len(parts),
                p.pipeline_parallel_schedule,
                self.num_micro_batches,
                pp_mesh,
                self.device,
            )
            self.pp_rank = pp_mesh.get_local_rank()
        del model
        part_params = [[q for q in part.parameters() if q.requires_grad] for part in self.model_parts]
        self.params = [q for params in part_params for q in params]
        self.optimizers = [build_optimizer(params, self.config.optimizer) for params in part_params]
        self.schedulers = [SpecSchedule(optimizer, spec.train) for optimizer in self.optimizers]
        # a background save's collectives run on a gloo group of their own, beside the training's (torchtitan's)
        async_mode = self.config.checkpoint.async_mode == "async"
        self.checkpoint_group = dist.new_group(backend="gloo") if async_mode else None
        if dist.get_rank() == 0:
            ac = self.config.activation_checkpoint.mode
            schedule = f" ({p.pipeline_parallel_schedule}, {len(parts)} stages)" if parts else ""
            logger.info(
                f"lmspec: torchtitan PP x TP x FSDP2{schedule} on mesh "
                f"{dict(zip(self.mesh.mesh_dim_names or (), self.mesh.shape))}, "
                f"reshard_after_forward={p.fsdp_reshard_after_forward}, "
                f"param dtype {self.config.training.mixed_precision_param}; torch {self.config.optimizer.name}; "
                f"{AC_SAID[ac]}"
            )

    def train_step(self, batches: list[Batch], step: int) -> tuple[float, float, float]:
        """Optimizer step `step`: these micro-batches at the rate the scheduler set after the step before."""
        used_lr = float(self.optimizers[0].param_groups[0]["lr"])
        totals = torch.zeros(2, dtype=torch.float64)
        if self.pipeline is not None:
            totals += torch.tensor(self.pipeline.step(batches), dtype=torch.float64)
        else:
            for batch in batches:
                loss, tokens = causal_lm_loss(self.model_parts[0], batch, self.device, "mean")
                (loss / len(batches)).backward()
                totals += torch.tensor([float(loss.detach()) * tokens, tokens], dtype=torch.float64)
        grad_norm = self._clip_gradients()
        for optimizer in self.optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for scheduler in self.schedulers:
            scheduler.step()
        # under a pipeline only the last stage's ranks add their losses: the sum over all ranks is theirs
        return dp_token_mean(totals, self.device), grad_norm, used_lr

    def _clip_gradients(self) -> float:
        """The global gradient norm before clipping, and the gradients clipped to `training.max_norm` when
        it is set (torchtitan's clip_grad_norm_: each DTensor norm is this rank's share until full_tensor(),
        and under a pipeline each stage's norm squared is summed over the pipeline ranks)."""
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False, foreach=None)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        if self.pipeline is not None:
            norm = norm**2
            dist.all_reduce(norm, group=self.mesh[PP].get_group())
            norm = norm.sqrt()
        max_norm = self.config.training.max_norm
        if max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, max_norm, norm, foreach=None)
        return float(norm) if grads else math.nan

    def eval_loss(self, batches: list[Batch]) -> float:
        """The mean token loss over all data-parallel ranks; under a pipeline its forward-only schedule. A
        forward without a backward leaves the weights of reshard_after_forward=False (SHARD_GRAD_OP) gathered:
        they are resharded after it, so the optimizer's and the checkpoint's parameters are the shards again."""
        try:
            if self.pipeline is None:
                return eval_token_mean(self.model_parts[0], batches, self.device)
            for part in self.model_parts:
                part.eval()
            try:
                totals = torch.tensor(self.pipeline.evaluate(batches), dtype=torch.float64)
            finally:
                for part in self.model_parts:
                    part.train()
            return dp_token_mean(totals, self.device)
        finally:
            for part in self.model_parts:
                for module in part.modules():
                    if isinstance(module, FSDPModule):
                        module.reshard()

    def model_state(self) -> dict[str, Any]:
        """This rank's shards of the model, under the whole model's names (every stage it holds)."""
        return {name: t for part in self.model_parts for name, t in get_model_state_dict(part).items()}

    def _state(self, options: StateDictOptions = _FLAT) -> dict[str, Any]:
        """What a checkpoint holds: this rank's shards of the model and optimizer state, under the
        unwrapped model's names, and the scheduler's step count (its schedule comes from the build)."""
        optimizer: dict[str, Any] = {}
        for part, opt in zip(self.model_parts, self.optimizers, strict=True):
            optimizer |= get_optimizer_state_dict(part, opt, options=options)  # makes Adam's states if none yet
        return {MODEL_KEY: self.model_state(), "optimizer": optimizer, "lr_scheduler": self.schedulers[0].state_dict()}

    def _set_model_state(self, model: dict[str, Any]) -> None:
        """`model` (every stage this rank holds) into each stage, which takes its own names from it."""
        options = StateDictOptions(strict=len(self.model_parts) == 1)
        for part in self.model_parts:
            set_model_state_dict(part, model, options=options)

    def save(self, directory: Path) -> Staged:
        """checkpoint.async_mode="disabled": written here; "async": staged to host memory here and written by
        a thread (torchtitan's async mode; lmspec.runtime.train.torchtitan.async_save). The files are digested
        at the commit, read back once."""
        target = str(directory / TORCHTITAN_DIR)
        if self.checkpoint_group is None:
            dcp.save(self._state(), checkpoint_id=target)
            return Staged()
        response = dcp.async_save(self._state(), checkpoint_id=target, process_group=self.checkpoint_group)
        # a non-blocking stager answers with the staging and the upload apart; the commit waits for the upload
        written = response.upload_completion if isinstance(response, AsyncSaveResponse) else response
        return Staged(DcpAsyncRequest(written))

    def async_queue(self) -> DcpAsyncQueue:
        return DcpAsyncQueue()

    def load(self, directory: Path) -> None:
        """The state `save` wrote, read into this rank's shards (DCP reshards a save of another DP layout)."""
        path = directory / TORCHTITAN_DIR
        options = _FLAT if _optimizer_flattened(path) else _NESTED
        if options is _NESTED and len(self.model_parts) > 1:
            raise CheckpointError(
                f"{directory} holds its optimizer state as lmspec 0.1.0 saved it before pipeline stages (one nested "
                "state dict, not one entry per parameter name): resume it with parallel.pp=1, and the next save "
                "converts it"
            )
        state = self._state(options)
        dcp.load(state, checkpoint_id=str(path))
        self._set_model_state(state[MODEL_KEY])
        for part, optimizer in zip(self.model_parts, self.optimizers, strict=True):
            set_optimizer_state_dict(part, optimizer, state["optimizer"], options=options)
        for scheduler in self.schedulers:
            scheduler.load_state_dict(state["lr_scheduler"])

    def init_from(self, directory: Path) -> None:
        """The model weights of checkpoint step `directory` (torchtitan.json's checkpoint.initial_load_path),
        resharded to this layout. Only the model is asked for: get_state_dict would also make the optimizer's
        states (a zero-gradient step), which would count in Adam's bias correction. Under a pipeline each rank
        reads its own stages' tensors."""
        path = self.config.checkpoint.initial_load_path
        if path is None or Path(path) != directory / TORCHTITAN_DIR:
            raise ValueError(
                f"torchtitan.json: checkpoint.initial_load_path is {path!r}, train.init_from is {str(directory)!r}"
            )
        model = self.model_state()
        stored = {name: t.shape for name, t in DcpCheckpoint(Path(path)).tensors.items()}
        shapes = {name: tuple(t.shape) for name, t in model.items() if isinstance(t, torch.Tensor)}
        require_stored_shapes(Path(path), stored, shapes)
        dcp.load({MODEL_KEY: model}, checkpoint_id=path)
        self._set_model_state(model)
