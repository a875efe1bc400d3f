"""torchtitan.json as typed sections: torchtitan's JobConfig names, read once, never a raw dict after.

The emitter (compiler/emit/torchtitan_config.py) writes the file and the manifest pins it, so a key this
module does not know is a build from another lmspec, not a user's typo to forgive: each section is a frozen
dataclass built with its keys as keyword arguments, and an unknown or missing key raises TypeError naming it
(`JobConfig.parse`). Only what this trainer applies is typed; the sections it has no use for (`job`,
`compile`) are checked to be absent or harmless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

# torchtitan's training.mixed_precision_* names -> torch dtypes (MixedPrecisionPolicy's)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, kw_only=True)
class Model:
    name: str  # model.family (torchtitan's model registry name; here the transformers class's family)
    flavor: str  # model.name


@dataclass(frozen=True, kw_only=True)
class Training:
    local_batch_size: int  # the micro-batch, per data-parallel rank
    global_batch_size: int  # samples per optimizer step over all ranks
    seq_len: int
    steps: int
    max_norm: float  # the gradient clipping norm; 0: no clipping
    mixed_precision_param: Literal["float32", "bfloat16"]  # FSDP2's param_dtype for compute
    mixed_precision_reduce: Literal["float32", "bfloat16"]  # FSDP2's reduce_dtype for the gradient reduction
    seed: int


@dataclass(frozen=True, kw_only=True)
class Optimizer:
    name: Literal["AdamW", "Adam", "SGD"]  # the torch.optim class
    lr: float  # the peak rate; each step's comes from the spec's schedule (lmspec.runtime.train.lr_schedule)
    eps: float
    beta1: float
    beta2: float
    weight_decay: float


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    data_parallel_replicate_degree: int
    data_parallel_shard_degree: int
    # "always": free a layer's gathered weights after its forward (ZeRO-3); "never": keep them to its backward
    # (ZeRO-2); "default": torchtitan's choice without pipeline parallelism, which is "always"
    fsdp_reshard_after_forward: Literal["always", "never", "default"]
    # tensor parallelism, always with sequence parallelism (torchtitan has no key to turn it off)
    tensor_parallel_degree: int
    # true: the head's logits are gathered whole and the loss is transformers' cross-entropy; torchtitan's
    # loss parallelism (false) is not run
    disable_loss_parallel: bool
    enable_async_tensor_parallel: bool  # false: async TP needs torch.compile and CUDA symmetric memory
    pipeline_parallel_degree: int
    # torch.distributed.pipelining's schedule by torchtitan's name (get_schedule_class): "1F1B", one stage per
    # rank; "Interleaved1F1B", parallel.virtual_stages stages per rank, looped (rank r holds r, r + pp, ...)
    pipeline_parallel_schedule: Literal["1F1B", "Interleaved1F1B"]
    # a pipeline micro-batch's samples: local_batch_size / this is the schedule's micro-batch count
    pipeline_parallel_microbatch_size: int
    # each pipeline stage's modules, in stage order (transformers' names: model.embed_tokens, model.layers.<i>,
    # model.norm, lm_head), as parallel.pp_layout and parallel.virtual_stages split the layers; None without PP
    module_fqns_per_model_part: list[list[str]] | None
    context_parallel_degree: int

    @property
    def dp(self) -> int:
        return self.data_parallel_replicate_degree * self.data_parallel_shard_degree


@dataclass(frozen=True, kw_only=True)
class ActivationCheckpoint:
    # full: every decoder layer recomputed in the backward; selective: per op inside each layer
    mode: Literal["none", "full", "selective"]
    # "op": torchtitan's per-op policy (save the compute-bound ops' outputs but every second matmul);
    # torchtitan's other choice, a layer frequency, is not written
    selective_ac_option: Literal["op"]


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    enable: bool
    folder: str
    interval: int
    async_mode: Literal["disabled", "async"]  # async: dcp.async_save, staged to host memory, written by a thread
    # train.init_from's DCP directory, whose model part the run starts from (its optimizer afresh); None: seed
    initial_load_path: str | None
    initial_load_model_only: Literal[True]  # torchtitan's default is True too: an initial load reads the weights
    keep_latest_k: int = 0  # the commit (lmspec.runtime.train.checkpoint) prunes, with train.checkpoint.keep_last_k


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    model: Model
    training: Training
    optimizer: Optimizer
    parallelism: Parallelism
    activation_checkpoint: ActivationCheckpoint
    checkpoint: Checkpoint

    @classmethod
    def parse(cls, doc: dict[str, Any]) -> JobConfig:
        """The typed document; TypeError names an unknown or missing key, ValueError a value this trainer
        cannot run (a section it does not read that asks for something)."""
        sections = {"job", "compile", *cls.__dataclass_fields__}
        if unknown := sorted(set(doc) - sections):
            raise TypeError(f"torchtitan.json: unknown section(s) {unknown}; this trainer reads {sorted(sections)}")
        if doc.get("compile", {}).get("enable", False):
            raise ValueError("torchtitan.json: compile.enable=true, but this trainer runs eagerly")
        return cls(
            model=Model(**doc["model"]),
            training=Training(**doc["training"]),
            optimizer=Optimizer(**doc["optimizer"]),
            parallelism=Parallelism(**doc["parallelism"]),
            activation_checkpoint=ActivationCheckpoint(**doc["activation_checkpoint"]),
            checkpoint=Checkpoint(**doc["checkpoint"]),
        )
