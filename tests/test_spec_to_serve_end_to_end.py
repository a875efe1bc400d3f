"""The whole path on this CPU, through the CLI a user types: spec -> compile -> train (2 ranks)
-> convert -> verify -> serve (vLLM) -> completion, for the built-in tiny spec.

The served completion is compared with transformers' greedy generation from the same converted
directory: a bad conversion, a wrong tokenizer or a mis-sized KV cache shows up as different
text (the seed's pitfall 5.5), not only as an error. ~3-5 min on 2 cores (vLLM start-up is
most of it).
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
from helpers.cli import LMSPEC
from helpers.marks import needs_vllm
from helpers.ports import free_port
from helpers.processes import run_in_group

from lmspec.runtime.serve.stage import SMOKE_MAX_TOKENS

STAGE_TIMEOUT_S = {"compile": 60, "train": 600, "convert": 300, "verify": 300, "serve": 900}


def _lmspec(cwd: Path, stage: str, *args: str) -> str:
    env = {**os.environ, "VLLM_API_KEY": "e2e-key"}
    done = run_in_group([LMSPEC, *args], cwd=cwd, timeout_s=STAGE_TIMEOUT_S[stage], env=env, merge_stderr=True)
    assert done.returncode == 0, f"{stage} failed ({done.returncode}):\n{done.stdout[-3000:]}"
    return done.stdout


def _reference_completion(model_dir: Path, prompt: str, max_tokens: int) -> str:
    """Greedy generation by transformers from the converted directory, decoded as training did."""
    import torch
    from transformers import AutoModelForCausalLM

    from lmspec.runtime.data.byte_tokenizer import EOT_ID, decode, encode

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    ids = torch.tensor([encode(prompt)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, eos_token_id=EOT_ID, pad_token_id=EOT_ID)
    return decode(out[0, ids.shape[1] :].tolist())


@pytest.mark.slow
@needs_vllm
def test_tiny_spec_trains_converts_verifies_and_serves(tmp_path: Path) -> None:
    overrides = [f"cluster.master_port={free_port()}", f"serve.port={free_port()}"]
    _lmspec(tmp_path, "compile", "compile", "-o", "build", *overrides)
    train = _lmspec(tmp_path, "train", "run", "build/tiny")
    assert (tmp_path / "runs/tiny/checkpoints/latest").is_file(), train[-2000:]
    _lmspec(tmp_path, "convert", "run", "build/tiny", "--stage", "convert")
    verify = _lmspec(tmp_path, "verify", "run", "build/tiny", "--stage", "verify")
    assert "verify: ok" in verify, verify[-2000:]
    served = _lmspec(tmp_path, "serve", "run", "build/tiny", "--stage", "serve", "--smoke")
    assert "serving tiny at http://127.0.0.1:" in served and "smoke checks passed" in served
    match = re.search(r"^completion \((\d+) tokens\): (.+) -> (.+)$", served, re.MULTILINE)
    assert match, served[-2000:]
    prompt, text = ast.literal_eval(match[2]), ast.literal_eval(match[3])
    assert text, "the trained model served an empty completion"
    assert text == _reference_completion(tmp_path / "runs/tiny/hf", prompt, SMOKE_MAX_TOKENS)
