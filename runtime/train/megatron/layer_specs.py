"""The layer specs a GPTModel is built from: megatron-core's own, with what its local path lacks.

With train.transformer_impl=transformer_engine, megatron-core's TE specs as they are (TE's fused
norm+linear, TEDotProductAttention, TEGroupedMLP experts).

For MLA megatron-core 0.16.1's local spec names `MLASelfAttention`, but its local core
attention rejects MLA's distinct value width, so `LatentCoreAttention` (torch SDPA) stands
in; its pure-PyTorch norm gets the sequence-parallel tag it lacks. These are modules of the
spec, not patches: the two megatron-core bugs of a machine without Transformer Engine are
patched for the model's life by `lmspec.runtime.compat.megatron.without_transformer_engine()`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm whose weight is tagged for sequence parallelism.

    megatron-core's pure-PyTorch norm (`WrappedTorchNorm`) refuses sequence
    parallelism only because it does not tag its weight: under SP every norm sees
    a sequence shard, so its weight gradient must be all-reduced over the TP group,
    which megatron's `finalize_model_grads` does for parameters tagged
    `sequence_parallel`.
    """

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        # megatron's own tag, an attribute it sets on parameters and reads in finalize_model_grads
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]


class LatentCoreAttention(torch.nn.Module):
    """Causal softmax attention whose value width differs from the query/key width (MLA).

    megatron-core 0.16.1's local layer spec names `DotProductAttention` as MLA's core
    attention, but that class rejects MLA's `k_channels`/`v_channels` (only Transformer
    Engine's attention takes them), so the local MLA spec does not build. This is the
    same computation with torch's scaled_dot_product_attention: [s, b, n, d] in,
    [s, b, n * v_head_dim] out.
    """

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        softmax_scale: float | None = None,
        **_: Any,
    ) -> None:
        super().__init__()
        self.config = config
        self.softmax_scale = softmax_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        assert packed_seq_params is None and attention_bias is None, "not supported by the local MLA attention"
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, n, s, d]
        mask = None if attention_mask is None else ~attention_mask  # megatron: True = masked
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.softmax_scale)
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def _swap_modules(node: Any, mla: bool, seen: set[int] | None = None) -> None:
    """In a (nested) module spec: WrappedTorchNorm -> SequenceParallelRMSNorm, and for MLA
    DotProductAttention -> LatentCoreAttention."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    seen = set() if seen is None else seen
    if id(node) in seen or not hasattr(node, "__dict__"):
        return
    seen.add(id(node))
    for name, value in vars(node).items():
        if value is WrappedTorchNorm:
            setattr(node, name, SequenceParallelRMSNorm)
        elif name == "core_attention" and value is DotProductAttention and mla:
            setattr(node, name, LatentCoreAttention)
        elif isinstance(value, (list, tuple)):
            for item in value:
                _swap_modules(item, mla, seen)
        elif type(value).__module__.startswith("megatron.core"):
            _swap_modules(value, mla, seen)


def decoder_block_spec(config: Any, pp_rank: int | None = None, vp_stage: int | None = None) -> Any:
    """megatron-core's decoder block spec for `config` (model chunk `vp_stage` of an interleaved pipeline),
    as Megatron-LM's gpt_builders picks it: Transformer Engine's layers
    (`get_gpt_decoder_block_spec(use_transformer_engine=True)`) where `config.transformer_impl` is
    transformer_engine, untouched; else the local path with the stand-ins above."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    use_te = config.transformer_impl == "transformer_engine"
    block_spec = get_gpt_decoder_block_spec(
        config, use_transformer_engine=use_te, normalization=config.normalization, vp_stage=vp_stage, pp_rank=pp_rank
    )
    if not use_te:
        _swap_modules(block_spec, mla=config.multi_latent_attention)
    return block_spec


def mtp_block_spec(config: Any, block_spec: Any, pp_rank: int | None = None, vp_stage: int | None = None) -> Any:
    """megatron-core's multi-token-prediction block spec, None where this pipeline chunk builds no MTP
    layer: each MTP layer is the decoder's last layer (DeepSeek-V3: an MoE layer) between its
    enorm/hnorm, eh_proj and final norm, on the decoder's implementation (with the same stand-ins on the
    local path)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    if not config.mtp_num_layers:
        return None
    use_te = config.transformer_impl == "transformer_engine"
    spec = get_gpt_mtp_block_spec(config, block_spec, use_transformer_engine=use_te, vp_stage=vp_stage, pp_rank=pp_rank)
    if spec is not None and not use_te:
        _swap_modules(spec, mla=config.multi_latent_attention)
    return spec
