"""Build megatron-core's GPTModel from megatron/config.json: the model chunks of this pipeline rank.

What is built: the family's architecture (lmspec.compiler.families: RMSNorm, SwiGLU, RoPE with
Llama-3.1's scaling, no biases but Qwen2's q/k/v; GQA with Qwen3's q/k norms, or MLA; MoE), no
dropout, with the TransformerConfig of the document (`lmspec.runtime.train.megatron.config`) and the
layer specs of `...megatron.layer_specs`. MoE tokens are dispatched all-to-all over the expert-parallel
group; the pipeline split follows the Plan's `stage_layers` (the spec's `pp_layout`) through
`pipeline_model_parallel_layout`, one chunk per virtual stage under interleaved 1F1B (as
Megatron-LM's `get_model` builds them: chunk i with `vp_stage=i`, the embedding in the first
rank's chunk 0, the output head in the last rank's last chunk). megatron's parallel_state must be
initialised with the same degrees, and on CPU inside `lmspec.runtime.compat.megatron.megatron_on_cpu()`.
"""

from __future__ import annotations

from typing import Any

import torch

from lmspec.runtime.train.megatron.config import transformer_config
from lmspec.runtime.train.megatron.layer_specs import decoder_block_spec, mtp_block_spec


def build_model(
    document: dict[str, Any],
    pre_process: bool,
    post_process: bool,
    pp_rank: int | None = None,
    vp_stage: int | None = None,
    *,
    parallel: bool = True,
    mtp: bool = True,
):
    """One GPTModel chunk (virtual stage `vp_stage` of this pipeline rank), on this process's device; with
    `mtp` (and model.mtp_layers > 0) the last chunk holds the multi-token-prediction block, whose loss
    megatron adds in the forward with labels. Without labels megatron 0.16.1 cannot run the MTP block, so
    a model built for logits alone (verify) is built with `mtp=False`; `parallel=False` builds it for one
    process (config.transformer_config)."""
    from megatron.core.models.gpt import GPTModel

    config = transformer_config(document, parallel=parallel, mtp=mtp)
    block_spec = decoder_block_spec(config, pp_rank=pp_rank, vp_stage=vp_stage)
    model = GPTModel(
        config=config,
        transformer_layer_spec=block_spec,
        **document["gpt_model"],
        pre_process=pre_process,
        post_process=post_process,
        mtp_block_spec=mtp_block_spec(config, block_spec, pp_rank=pp_rank, vp_stage=vp_stage),
        pg_collection=None,
        vp_stage=vp_stage,
    )
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


def build_chunks(document: dict[str, Any]) -> list:
    """This pipeline rank's model chunks in schedule order: one, or the document's virtual stages."""
    from megatron.core import parallel_state as ps

    virtual_stages = document["parallel"].get("virtual_pipeline_model_parallel_size")
    if virtual_stages is None:
        return [build_model(document, ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage())]
    return [
        build_model(
            document,
            ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=i),
            ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=i),
            vp_stage=i,
        )
        for i in range(virtual_stages)
    ]
