"""The whole path on this CPU, through the CLI a user types: spec -> compile -> train (2 ranks)
-> convert -> verify -> serve (vLLM) -> completion, for the built-in tiny spec.

The served completion is compared with transformers' greedy generation from the same converted
directory: a bad conversion, a wrong tokenizer or a mis-sized KV cache shows up as different
text (the seed's pitfall 5.5), not only as an error. ~3-5 min on 2 cores (vLLM start-up is
most of it).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lmspec.runtime.serve.stage import SMOKE_MAX_TOKENS

STAGE_TIMEOUT_S = {"compile": 60, "train": 600, "convert": 300, "verify": 300, "serve": 900}
LMSPEC = str(Path(sys.executable).parent / "lmspec")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lmspec(cwd: Path, stage: str, *args: str) -> str:
    env = {**os.environ, "VLLM_API_KEY": "e2e-key"}
    proc = subprocess.Popen(
        [LMSPEC, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=STAGE_TIMEOUT_S[stage])
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"{stage} timed out after {STAGE_TIMEOUT_S[stage]} s:\n{out[-3000:]}")
    assert proc.returncode == 0, f"{stage} failed ({proc.returncode}):\n{out[-3000:]}"
    return out


def _reference_completion(model_dir: Path, prompt: str, max_tokens: int) -> str:
    """Greedy generation by transformers from the converted directory, decoded as training did."""
    import torch
    from transformers import AutoModelForCausalLM

    from lmspec.runtime.train.data import EOT_ID, decode, encode

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    ids = torch.tensor([encode(prompt)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, eos_token_id=EOT_ID, pad_token_id=EOT_ID)
    return decode(out[0, ids.shape[1] :].tolist())


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install '.[serve]')")
def test_tiny_spec_trains_converts_verifies_and_serves(tmp_path: Path) -> None:
    overrides = [f"cluster.master_port={_free_port()}", f"serve.port={_free_port()}"]
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
