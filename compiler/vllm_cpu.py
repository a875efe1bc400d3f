"""What vLLM's CPU backend can serve: the attention shapes its kernels take (vLLM 0.32).

vLLM checks neither at start-up: a wrong size serves until the first request fails. The compile runs this
as a rule (compiler/rules/serving.py), where an MLA latent other than DeepSeek's only warns on a job that
also trains (tiny_moe, the CPU training model of the DeepSeek shape, trains; its serving is what cannot
run); the serve stage (runtime/serve/stage.py) runs it again and refuses every finding before vLLM
starts. Pure, so the runtime calls it without the rules (compiler/contract.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.models.dims import device_kind
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import ServingSpec
from lmspec.compiler.spec.shown_key import show_key

# vLLM 0.32's CPU attention kernels (vllm/v1/attention/backends/cpu_attn.py get_supported_head_sizes):
# another head_dim starts, then fails the first request (RuntimeError: Unsupported CPU attention configuration).
CPU_ATTENTION_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# vLLM 0.32's CPU MLA (backends/mla/cpu_mla.py, amx_mla.py): the decode kernel is compiled for one
# latent width, kv_lora_rank + qk_rope_head_dim = 512 + 64 (DeepSeek-V2/V3), and an unquantized cache.
CPU_MLA_LATENT_WIDTH = 576


def cpu_attention_problems(spec: ServingSpec, origins: Origins) -> Iterator[Problem]:
    """Every attention shape of `spec`'s model that vLLM's CPU backend cannot serve; none on GPUs.
    MLA outside DeepSeek's latent is an error for a serve-only job and a warning on a train+serve one."""
    m = spec.model
    if device_kind(spec) == "gpu":
        return
    if m.attention == "mla":
        if m.mla is None:  # rules.model reports the missing block
            return
        problem = error if spec.train is None else warning
        fix = "" if spec.train is None else " or serve=null (train only)"
        width = m.mla.kv_lora_rank + m.mla.qk_rope_head_dim
        if width != CPU_MLA_LATENT_WIDTH:
            yield problem(
                "model.mla.kv_lora_rank",
                (
                    f"{show_key(spec, origins, 'model.mla.kv_lora_rank')} + "
                    f"{show_key(spec, origins, 'model.mla.qk_rope_head_dim')} = {width}: "
                    f"vLLM's CPU MLA kernel supports only a latent of {CPU_MLA_LATENT_WIDTH} (512 + 64, "
                    f"DeepSeek-V2/V3); serve this model on GPUs (hardware=h100_80g, ...){fix}"
                ),
            )
        if spec.serve.kv_cache_dtype != "auto":
            yield problem(
                "serve.kv_cache_dtype",
                (
                    f"{show_key(spec, origins, 'serve.kv_cache_dtype')}: vLLM's CPU MLA supports only an unquantized "
                    f"KV cache; use serve.kv_cache_dtype=auto{fix}"
                ),
            )
    elif m.head_dim not in CPU_ATTENTION_HEAD_DIMS:
        yield error(
            "model.head_dim",
            (
                f"{show_key(spec, origins, 'model.head_dim')}: vLLM's CPU attention supports head_dim "
                f"{', '.join(map(str, CPU_ATTENTION_HEAD_DIMS))} only (the server would start and fail the first "
                "request); use one of those (hidden_size / num_attention_heads) or serve on GPUs"
            ),
        )
