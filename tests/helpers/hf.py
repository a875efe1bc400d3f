"""HuggingFace models built from lmspec's specs (configs only, random weights, nothing downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmspec.compiler.families import FAMILIES
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.sections import ModelSpec

MODEL_PRESETS = (
    "tiny",
    "tiny_moe",
    "llama3_8b",
    "llama3_70b",
    "mixtral_8x7b",
    "qwen3_30b_a3b",
    "deepseek_v2_lite",
    "deepseek_v3",
)


def hf_model(m: ModelSpec, device: str = "meta", attn_implementation: str = "eager") -> Any:
    """The family's transformers class built from the config lmspec emits for `m` (convert/mapping.json's
    hf_config, also what the DeepSpeed trainer builds): counting its parameters checks both."""
    import torch
    import transformers

    from lmspec.runtime.train.hf_model import transformers_config

    cls = getattr(transformers, FAMILIES[m.family].hf_class)
    with torch.device(device):
        return cls(transformers_config(m, attn_implementation))


def save_random_hf_llama(plan: Plan, directory: Path) -> None:
    """A HuggingFace Llama directory shaped by the spec, random weights, no tokenizer, no download."""
    import torch
    import transformers

    from lmspec.runtime.data.byte_tokenizer import EOT_ID, PAD_ID

    m = plan.spec.model
    config = transformers.LlamaConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=m.ffn_hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        max_position_embeddings=m.max_position_embeddings,
        rms_norm_eps=m.norm_eps,
        rope_theta=m.rope_theta,
        tie_word_embeddings=m.tie_embeddings,
        bos_token_id=None,
        eos_token_id=EOT_ID,
        pad_token_id=PAD_ID,
        torch_dtype=plan.spec.convert.dtype,
    )
    torch.manual_seed(plan.spec.train.seed)
    transformers.LlamaForCausalLM(config).save_pretrained(str(directory))
