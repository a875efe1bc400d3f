"""megatron-core backend: GPTModel chunks under Megatron DDP, 1F1B via get_forward_backward_func.

Every megatron-core object (parallel groups, model config, DDP, optimizer, LR scheduler) is built from the
build's megatron/config.json (lmspec.runtime.train.megatron.config). One `train_step` = `grad_accum_steps`
micro-batches through the pipeline schedule megatron picks for the layout (no pipelining, 1F1B for pp > 1,
interleaved 1F1B over this rank's model chunks with `parallel.virtual_stages`), then megatron's optimizer
step over all chunks (grad clip to `train.grad_clip`) at the rate megatron-core's OptimizerParamScheduler
gives that step. The loss reported is the mean token loss over the
whole global batch. `eval_loss` runs the same schedule forward only, the model in eval mode,
as Megatron-LM's `evaluate`. Checkpoints go through `dist_checkpointing` (torch_dist), the chunks
under Megatron-LM's names (`model`, or `model0`, `model1`, ...) with global tensor keys, so any
TP/PP/virtual-stage checkpoint loads into any other layout; `init_from` loads only the model
weights of one (train.init_from), the optimizer starting fresh from them.
"""

from __future__ import annotations

import logging
import math
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lmspec.compiler.build.files import DIST_CKPT_DIR
from lmspec.compiler.plan import Plan
from lmspec.compiler.resume_layout import DISTRIB_OPTIM_SHARDING
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.runtime.compat.megatron import megatron_on_cpu, without_transformer_engine
from lmspec.runtime.train.data import Batch
from lmspec.runtime.train.init_from import require_model_tensors
from lmspec.runtime.train.megatron.config import ddp_config, optimizer_config, param_scheduler
from lmspec.runtime.train.megatron.context_parallel import this_rank_share
from lmspec.runtime.train.megatron.digested_save import Digests
from lmspec.runtime.train.megatron.model import build_chunks
from lmspec.runtime.train.saving import Staged


class MegatronTrainer:
    def __init__(self, spec: TrainingSpec, plan: Plan, document: dict[str, Any]) -> None:
        """`document`: the build's megatron/config.json, as compiled (lmspec.runtime.train.loop reads it
        through Build); every megatron-core object is built from it."""
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel
        from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
        from megatron.core.optimizer import get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module

        self.spec = spec
        layout, batch = plan.trained().layout, plan.trained().batch
        self._compat = ExitStack()  # megatron-core's CPU patches for the trainer's life; close() undoes them
        self.cpu = self._compat.enter_context(megatron_on_cpu())
        self._compat.enter_context(without_transformer_engine())  # the local path on a GPU without TE
        ps.initialize_model_parallel(**document["parallel_state"])
        tensor_parallel.model_parallel_cuda_manual_seed(spec.train.seed)
        self.ps = ps
        self.num_micro_batches = batch.grad_accum_steps
        self.micro_batch_size = batch.micro_batch_size
        self.seq_length = batch.seq_length
        self.dp_rank = ps.get_data_parallel_rank()
        self.dp_size = ps.get_data_parallel_world_size()
        self.chunks = build_chunks(document)
        self.config = self.chunks[0].config  # the schedule reads chunk 0's (Megatron-LM's get_model_config)
        if layout.pp > 1 and ps.get_tensor_model_parallel_rank() == 0 and self.dp_rank == 0:
            stage = ps.get_pipeline_model_parallel_rank()
            built = [len(chunk.decoder.layers) for chunk in self.chunks]
            chunks = f" in {len(built)} chunks of {built}" if layout.virtual_stages else ""
            logging.getLogger(__name__).info(f"lmspec: pipeline stage {stage}/{layout.pp}: {sum(built)} layers{chunks}")
        ddp = ddp_config(document)
        self.models = [
            DistributedDataParallel(
                config=chunk.config,
                ddp_config=ddp,
                module=Float16Module(chunk.config, chunk) if spec.train.precision != "fp32" else chunk,
                disable_bucketing=i > 0,  # as Megatron-LM: only the first chunk's grads overlap in buckets
            )
            for i, chunk in enumerate(self.chunks)
        ]
        self.config.finalize_model_grads_func = finalize_model_grads
        no_sync = [model.no_sync for model in self.models]
        self.config.no_sync_func = no_sync if len(no_sync) > 1 else no_sync[0]
        if ddp.overlap_grad_reduce:  # Megatron-LM's align_grad_reduce: the schedule starts each chunk's reduce
            grad_sync = [model.start_grad_sync for model in self.models]
            self.config.grad_sync_func = grad_sync if len(grad_sync) > 1 else grad_sync[0]
        self.optimizer = get_megatron_optimizer(optimizer_config(document), self.models)
        self.scheduler = param_scheduler(document, self.optimizer)
        device = "cpu" if self.cpu else torch.cuda.current_device()
        s = self.seq_length
        self.position_ids = torch.arange(s, device=device).unsqueeze(0).expand(self.micro_batch_size, s)
        # TE's attention is causal by its mask type (and a CP rank holds a share of the sequence); the
        # local path takes the mask explicitly (megatron-core's default mask helper allocates on CUDA)
        self.attention_mask = (
            None
            if self.config.transformer_impl == "transformer_engine"
            else torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool, device=device), diagonal=1)
        )
        self.device = device
        self._saving: Any = None  # the save strategy, built at the first save
        self._reports_loss = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0

    # -- one optimizer step ----------------------------------------------------------------------

    def _forward_step(self, data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
        batch: Batch = next(data_iterator)
        share = this_rank_share(batch.tokens.to(self.device), batch.labels.to(self.device), self.position_ids)
        labels = share["labels"]
        output = model(share["tokens"], share["position_ids"], self.attention_mask, labels=labels)
        return output, partial(self._loss, torch.tensor(labels.numel(), dtype=torch.int, device=self.device))

    @staticmethod
    def _loss(
        num_tokens: torch.Tensor, output: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Megatron-LM's loss_func: this rank's loss sum and token count (the schedule divides one by
        the other), so under CP each rank's tokens weigh the same in the DP x CP gradient mean."""
        loss_sum = output.float().sum()
        return loss_sum, num_tokens, {"loss_sum": loss_sum.detach().clone(), "tokens": num_tokens.double()}

    def train_step(self, batches: list[Batch], step: int) -> tuple[float, float, float]:
        """Forward/backward over this rank's micro-batches, optimizer step `step` (1-based) at the
        learning rate megatron-core's scheduler gives it; (loss, grad_norm, lr)."""
        self.scheduler.step(step - self.scheduler.num_steps)  # after a resume, straight to `step`
        lr = self.scheduler.get_lr({})  # the schedule's own rate (a param group may scale it; none here does)
        for model in self.models:
            model.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = self._schedule(batches, forward_only=False)
        _, grad_norm, _ = self.optimizer.step()
        return self._mean_loss(outputs), float(grad_norm) if grad_norm is not None else math.nan, float(lr)

    def eval_loss(self, batches: list[Batch]) -> float:
        """The mean token loss of these micro-batches over all DP ranks, no gradients, dropout off."""
        for model in self.models:
            model.eval()
        try:
            with torch.no_grad():
                return self._mean_loss(self._schedule(batches, forward_only=True))
        finally:
            for model in self.models:
                model.train()

    def _schedule(self, batches: list[Batch], forward_only: bool) -> list[dict[str, torch.Tensor]]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        # interleaved: one iterator per chunk, each chunk's k-th forward takes micro-batch k
        iterators = [iter(batches) for _ in self.models]
        return get_forward_backward_func()(
            forward_step_func=self._forward_step,
            data_iterator=iterators if len(iterators) > 1 else iterators[0],
            model=self.models,
            num_microbatches=len(batches),
            seq_length=self.seq_length,
            micro_batch_size=self.micro_batch_size,
            forward_only=forward_only,
        )

    def _mean_loss(self, outputs: list[dict[str, torch.Tensor]]) -> float:
        """Token-weighted mean of the last stage's losses, summed over the DP ranks."""
        totals = torch.zeros(2, dtype=torch.float64)
        if self._reports_loss:
            for out in outputs:
                totals[0] += float(out["loss_sum"])
                totals[1] += float(out["tokens"])
        if dist.get_backend() == "nccl":
            totals = totals.cuda()
        dist.all_reduce(totals)
        return float(totals[0] / totals[1]) if totals[1] > 0 else math.nan

    # -- checkpoint ------------------------------------------------------------------------------

    def _model_state(self) -> dict[str, Any]:
        """Every chunk's sharded state dict under Megatron-LM's checkpoint names: `model`, or `model<i>`."""
        # megatron reads the DP x CP group from metadata where a chunk keeps a copy of the embedding (MTP)
        metadata = {"dp_cp_group": self.ps.get_data_parallel_group(with_context_parallel=True)}
        states = [chunk.sharded_state_dict(metadata=metadata) for chunk in self.chunks]
        if len(states) == 1:
            return {"model": states[0]}
        return {f"model{i}": state for i, state in enumerate(states)}

    def _load_model_state(self, state: dict[str, Any]) -> None:
        names = ["model"] if len(self.chunks) == 1 else [f"model{i}" for i in range(len(self.chunks))]
        for name, chunk in zip(names, self.chunks, strict=True):
            # a chunk without a layer (dims.chunk_layers) holds no tensor: dist_checkpointing.load leaves out
            # its empty dict where nothing else is loaded beside the model (train.init_from)
            chunk.load_state_dict(state.get(name, {}))

    def _sharded_state(self, is_loading: bool) -> dict[str, Any]:
        models = self._model_state()
        # the distributed optimizer's sharding named, not left to megatron-core's default: the one every
        # manifest records (compiler/resume_layout.py), which reshards over TP, PP and DP
        metadata = {"distrib_optim_sharding_type": DISTRIB_OPTIM_SHARDING}
        optimizer = self.optimizer.sharded_state_dict(models, is_loading=is_loading, metadata=metadata)
        return {**models, "optimizer": optimizer}

    def save(self, directory: Path) -> Staged:
        """This rank's share of the state staged for writing (lmspec.runtime.train.saving runs the write):
        megatron-core's fully parallel strategy spreads the replicated shards over the data-parallel ranks,
        as Megatron-LM's --ckpt-fully-parallel-save, and each writer digests the file it writes."""
        from megatron.core import dist_checkpointing

        target = directory / DIST_CKPT_DIR
        for model in self.models:
            if model.ddp_config.overlap_param_gather:  # the last step's weights are still being all-gathered
                model.start_param_sync(force_sync=True)
        if dist.get_rank() == 0:
            target.mkdir()
        dist.barrier()
        request = dist_checkpointing.save(
            self._sharded_state(is_loading=False),
            str(target),
            sharded_strategy=self._save_strategy(),
            async_sharded_save=True,
        )
        digests = Digests(directory)
        return Staged(digests.wrap(request), digests)

    def async_queue(self) -> Any:
        """Where a background save persists: a fork per save, whose snapshot is the staged copy."""
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        return AsyncCallsQueue(persistent=False)

    def _save_strategy(self) -> Any:
        """torch_dist, its shards spread over the DP x CP ranks; the spread is computed at the first save
        and kept (the layout does not change during a run)."""
        if self._saving is None:
            from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
            from megatron.core.dist_checkpointing.strategies.fully_parallel import (
                FullyParallelSaveStrategyWrapper,
            )

            self._saving = FullyParallelSaveStrategyWrapper(
                get_default_save_sharded_strategy(),
                self.ps.get_data_parallel_group(with_context_parallel=True),
                do_cache_distribution=True,
            )
        return self._saving

    def load(self, directory: Path) -> None:
        from megatron.core import dist_checkpointing

        state = dist_checkpointing.load(self._sharded_state(is_loading=True), str(directory / DIST_CKPT_DIR))
        self._load_model_state(state)
        self.optimizer.load_state_dict(state["optimizer"])

    def init_from(self, directory: Path) -> None:
        """The model weights of checkpoint step `directory` (train.init_from), resharded to this layout;
        the optimizer's main parameters are refreshed from them (its states start fresh)."""
        from megatron.core import dist_checkpointing

        wanted = self._model_state()
        require_model_tensors(directory / DIST_CKPT_DIR, wanted)
        self._load_model_state(dist_checkpointing.load(wanted, str(directory / DIST_CKPT_DIR)))
        self.optimizer.reload_model_params()

    def rng_state(self) -> dict[str, Any]:
        from megatron.core import tensor_parallel

        return {"tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        from megatron.core import tensor_parallel

        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])

    def close(self) -> None:
        self.ps.destroy_model_parallel()
        self._compat.close()
