"""The longest sequence vLLM serves a model at: its derived max_model_len, the one owner of that number.

vLLM 0.32 (vllm/config/model.py `_get_and_verify_max_len`) starts from max_position_embeddings and
multiplies it by rope_scaling's `factor` for the types that do not already count the extension in it:
of lmspec's types only `linear`; llama3 and yarn configs state max_position_embeddings extended
(Llama-3.1's 131072, DeepSeek-V3's 163840), so vLLM takes them as they are. A --max-model-len
above this is refused by vLLM (ValueError) when the engine is built.
"""

from __future__ import annotations

from lmspec.compiler.spec.sections import ModelSpec

SCALED_BY_FACTOR = ("linear",)  # rope_scaling types whose factor vLLM applies to max_position_embeddings


def vllm_max_model_len(model: ModelSpec) -> int:
    rope = model.rope_scaling
    if rope is not None and rope.type in SCALED_BY_FACTOR:
        return int(model.max_position_embeddings * rope.factor)
    return model.max_position_embeddings
