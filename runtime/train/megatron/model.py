"""Build megatron-core's GPTModel from a spec, with the pure-PyTorch local layer spec.

The public API (imported by conversion, issue 6) is small and stable:

- `ParallelDegrees(tp, pp, ep, etp, sequence_parallel, stage_layers)`; in training
  `ParallelDegrees.of(plan.layout)` (the Plan owns every degree, never the spec again).
- `transformer_config(spec, degrees)` -> the `TransformerConfig` (or
  `MLATransformerConfig`) the model is built with at those degrees (e.g. verify builds
  TP=1 to load a TP=2 checkpoint: dist_checkpointing reshards on load).
- `build_model(spec, pre_process, post_process, degrees, pp_rank=None)` -> one
  `GPTModel` for this pipeline rank. megatron's parallel_state must be initialised
  with the same degrees, and on CPU inside `lmspec.runtime.compat.megatron.megatron_on_cpu()`.

What is built: the family's architecture (lmspec.compiler.families: RMSNorm, SwiGLU,
RoPE, no biases; GQA, or MLA; MoE), no dropout. For MLA megatron-core 0.16.1's local
spec names `MLASelfAttention`, but its local core attention rejects MLA's distinct value
width, so `LatentCoreAttention` (torch SDPA) stands in; MoE tokens are dispatched
all-to-all over the expert-parallel group; the pipeline split follows the
Plan's `stage_layers` (the spec's `pp_layout`) through
`pipeline_model_parallel_layout`. Interleaved (virtual) stages are not built by
this runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from lmspec.compiler.families import FAMILIES
from lmspec.compiler.plan import Layout
from lmspec.compiler.spec.sections import Spec

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class ParallelDegrees:
    """The degrees a model is built for: the Plan's layout in training, all ones for one process."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = False
    stage_layers: tuple[int, ...] | None = None

    @classmethod
    def of(cls, layout: Layout) -> ParallelDegrees:
        return cls(
            tp=layout.tp,
            pp=layout.pp,
            ep=layout.ep,
            etp=layout.etp,
            sequence_parallel=layout.sequence_parallel,
            stage_layers=layout.stage_layers,
        )


def pipeline_layout(stage_layers: tuple[int, ...]) -> list[list[str]]:
    """Megatron's per-stage layer list: the embedding on the first stage, the loss on the last."""
    last = len(stage_layers) - 1
    return [
        (["embedding"] if i == 0 else []) + ["decoder"] * n + (["loss"] if i == last else [])
        for i, n in enumerate(stage_layers)
    ]


def transformer_config(spec: Spec, degrees: ParallelDegrees):
    """The TransformerConfig of `spec` for the given parallel degrees: the
    family's architecture (lmspec.compiler.families), this runtime's degrees, precision and settings."""
    from megatron.core.transformer import transformer_config as configs

    t = spec.train
    architecture = FAMILIES[spec.model.family].megatron(spec.model)
    d = degrees
    dtype = _DTYPES[t.precision]
    cpu = not torch.cuda.is_available()
    kwargs: dict[str, Any] = dict(
        **architecture.kwargs,
        activation_func=getattr(F, architecture.activation),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=d.tp,
        pipeline_model_parallel_size=d.pp,
        expert_model_parallel_size=d.ep,
        expert_tensor_parallel_size=d.etp,
        sequence_parallel=d.sequence_parallel and d.tp > 1,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=t.precision == "bf16",
        fp16=t.precision == "fp16",
        use_cpu_initialization=cpu,
        perform_initialization=True,
        init_method_std=0.02,
        recompute_granularity=None if t.recompute == "none" else t.recompute,
        recompute_method="uniform" if t.recompute == "full" else None,
        recompute_num_layers=1 if t.recompute == "full" else None,
    )
    if d.pp > 1 and d.stage_layers is not None:
        kwargs["pipeline_model_parallel_layout"] = pipeline_layout(d.stage_layers)
    return getattr(configs, architecture.config_class)(**kwargs)


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


def _without_transformer_engine_fixes() -> None:
    """Two megatron-core 0.16.1 bugs that show only where Transformer Engine is absent
    (any CPU, and GPUs without TE): MLA sets HAVE_TE from an import that succeeds with
    mock names, then calls `isinstance(x, <mock>)`; the MoE router reads
    `te_general_gemm`, which is defined only when TE imports."""
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    if not isinstance(multi_latent_attention.TELinear, type):
        multi_latent_attention.HAVE_TE = False
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def build_model(
    spec: Spec,
    pre_process: bool,
    post_process: bool,
    degrees: ParallelDegrees,
    pp_rank: int | None = None,
):
    """One GPTModel chunk for this pipeline rank, on this process's device."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    m = spec.model
    config = transformer_config(spec, degrees)
    block_spec = get_gpt_decoder_block_spec(
        config, use_transformer_engine=False, normalization=config.normalization, pp_rank=pp_rank
    )
    _swap_modules(block_spec, mla=config.multi_latent_attention)
    _without_transformer_engine_fixes()
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
        pg_collection=None,
    )
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model
