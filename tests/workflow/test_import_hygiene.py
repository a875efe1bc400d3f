"""`lmspec check` (the pre-commit hook's work) imports no training, serving or plotting stack;
`lmspec compile` no training or serving stack (its memory chart may load matplotlib)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

STACKS = ("torch", "deepspeed", "megatron", "vllm", "transformers")
HEAVY = (*STACKS, "matplotlib")
PROBE = f"""
import json, sys
from lmspec.compiler.cli.main import run
code = run(sys.argv[1:])
print(json.dumps({{"code": code, "heavy": sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))}}))
"""


def _probe(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_check_of_the_largest_preset_imports_nothing_heavy() -> None:
    result = _probe("check", "--spec", "deepseek_v3_pretrain_2048gpu_h800_bf16")
    assert result["heavy"] == []


def test_check_of_the_default_spec_imports_nothing_heavy() -> None:
    result = _probe("check")
    assert result == {"code": 0, "heavy": []}


def test_compile_imports_no_training_or_serving_stack(tmp_path: Path) -> None:
    result = _probe("compile", "-o", str(tmp_path), "--spec", "deepseek_v3_pretrain_2048gpu_h800_bf16")
    assert result["code"] == 0 and not set(result["heavy"]) & set(STACKS)
