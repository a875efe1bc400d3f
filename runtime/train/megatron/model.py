"""Build megatron-core's GPTModel from a spec: the model chunks of this pipeline rank.

What is built: the family's architecture (lmspec.compiler.families: RMSNorm, SwiGLU, RoPE with
Llama-3.1's scaling, no biases but Qwen2's q/k/v; GQA with Qwen3's q/k norms, or MLA; MoE), no
dropout, with the TransformerConfig of
`lmspec.runtime.train.megatron.config` and the layer specs of `...megatron.layer_specs`.
MoE tokens are dispatched all-to-all over the expert-parallel group; the pipeline split
follows the Plan's `stage_layers` (the spec's `pp_layout`) through
`pipeline_model_parallel_layout`, one chunk per virtual stage under interleaved 1F1B (as
Megatron-LM's `get_model` builds them: chunk i with `vp_stage=i`, the embedding in the first
rank's chunk 0, the output head in the last rank's last chunk). megatron's parallel_state must be
initialised with the same degrees, and on CPU inside `lmspec.runtime.compat.megatron.megatron_on_cpu()`.
"""

from __future__ import annotations

from typing import Any

import torch

from lmspec.compiler.spec.sections import ModelSpec, TrainingSpec
from lmspec.runtime.train.megatron.config import ParallelDegrees, transformer_config
from lmspec.runtime.train.megatron.layer_specs import decoder_block_spec, mtp_block_spec


def build_model(
    spec: TrainingSpec,
    pre_process: bool,
    post_process: bool,
    degrees: ParallelDegrees,
    pp_rank: int | None = None,
    vp_stage: int | None = None,
    mtp: bool = True,
):
    """One GPTModel chunk (virtual stage `vp_stage` of this pipeline rank), on this process's device; with
    `mtp` (and model.mtp_layers > 0) the last chunk holds the multi-token-prediction block, whose loss
    megatron adds in the forward with labels. Without labels megatron 0.16.1 cannot run the MTP block, so
    a model built for logits alone (verify) is built with `mtp=False`."""
    from megatron.core.models.gpt import GPTModel

    m = spec.model
    config = transformer_config(spec, degrees, mtp=mtp)
    block_spec = decoder_block_spec(config, pp_rank=pp_rank, vp_stage=vp_stage)
    model = GPTModel(
        config=config,
        transformer_layer_spec=block_spec,
        vocab_size=m.vocab_size,
        max_sequence_length=spec.train.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=m.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=int(m.rope_theta),
        **rope_scaling_kwargs(m),
        mtp_block_spec=mtp_block_spec(config, block_spec, pp_rank=pp_rank, vp_stage=vp_stage),
        pg_collection=None,
        vp_stage=vp_stage,
    )
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


def rope_scaling_kwargs(m: ModelSpec) -> dict[str, Any]:
    """GPTModel's arguments for `model.rope_scaling` on GQA attention: llama3 as megatron-core's
    `rope_scaling` (band limits fixed; rule megatron_rope_scaling_runs), linear as position interpolation.
    MLA's YaRN goes through its MLATransformerConfig (lmspec.compiler.families.megatron)."""
    rs = m.rope_scaling
    if rs is None or m.attention != "gqa":
        return {}
    if rs.type == "llama3":
        return {"rope_scaling": True, "rope_scaling_factor": rs.factor}
    assert rs.type == "linear", "rule megatron_rope_scaling_runs refuses yarn with GQA attention"
    return {"seq_len_interpolation_factor": rs.factor}


def build_chunks(spec: TrainingSpec, degrees: ParallelDegrees) -> list:
    """This pipeline rank's model chunks in schedule order: one, or `degrees.virtual_stages`."""
    from megatron.core import parallel_state as ps

    if degrees.virtual_stages is None:
        return [build_model(spec, ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage(), degrees)]
    return [
        build_model(
            spec,
            ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=i),
            ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=i),
            degrees,
            vp_stage=i,
        )
        for i in range(degrees.virtual_stages)
    ]
