"""Converting a >= 2 GB TP=2 checkpoint stays within 2x the largest tensor + a small constant.

The checkpoint is synthetic (bench/synthetic_checkpoint.py: megatron-core's own
dist_checkpointing, sharded as the mapping says, random data); the converter runs in a
subprocess whose peak RSS the kernel reports, twice: as compiled (fp32 -> fp32: every
tensor takes the direct path, bytes file to file) and compiled again with
convert.dtype=bfloat16 (every tensor assembled as a tensor: the path the bound is
about). ~1.5 min on 2 CPU cores; 6.7 GB of disk, removed afterwards.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
from helpers.convert import compile_run_build, lmspec, peak_rss_bytes, run
from helpers.paths import ROOT
from helpers.ports import free_port

from lmspec.runtime.dtypes import DTYPE_BYTES

pytestmark = pytest.mark.slow

# A Llama-shaped model of 557M fp32 parameters (2.2 GB): largest tensor the embedding, 262 MB.
SYNTHETIC_2GB = [
    "hardware=h100_80g",
    "hardware.gpus_per_node=2",
    "parallel.tp=2",
    "train.precision=fp32",
    "convert.dtype=float32",
    "model.hidden_size=2048",
    "model.ffn_hidden_size=8192",
    "model.num_attention_heads=16",
    "model.num_kv_heads=4",
    "model.head_dim=128",
    "model.num_layers=7",
    "model.vocab_size=32000",
    "model.max_position_embeddings=4096",
]
MIN_CHECKPOINT_BYTES = 2 * 10**9
BASE_RSS_ALLOWANCE_BYTES = 400 * 2**20  # interpreter, torch, safetensors, rich (~270 MiB measured) + metadata


def largest_tensor_bytes(mapping: dict) -> int:
    return max(
        math.prod(t["megatron_shape"]) * max(DTYPE_BYTES[t["megatron"]["dtype"]], DTYPE_BYTES[t["hf_dtype"]])
        for t in mapping["tensors"]
    )


def cast_copy(workdir: Path, build: Path, dtype: str) -> Path:
    """The same job compiled with convert.dtype=`dtype` (every tensor cast), into its own build root
    and conversion output; same name, so the same checkpoints. (A hand-edited mapping.json is refused.)"""
    output = json.loads((workdir / build / "convert" / "mapping.json").read_text())["output"]
    root = f"build_{dtype}"
    overrides = [o for o in SYNTHETIC_2GB if not o.startswith("convert.dtype=")]
    result = lmspec(
        "compile",
        *overrides,
        f"convert.dtype={dtype}",
        f"convert.output={output}_{dtype}",
        f"name={build.name}",
        "-o",
        root,
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    return Path(root) / build.name


def test_peak_rss_is_bounded_by_the_largest_tensor(tmp_path: Path) -> None:
    build = compile_run_build(tmp_path, "synthetic_2gb", SYNTHETIC_2GB)
    made = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            f"--master-port={free_port()}",
            str(ROOT / "bench" / "synthetic_checkpoint.py"),
            str(build),
        ],
        tmp_path,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    written = json.loads(made.stdout.strip().splitlines()[-1])
    assert written["bytes"] >= MIN_CHECKPOINT_BYTES
    try:
        for converted in (build, cast_copy(tmp_path, build, "bfloat16")):
            code, peak, out = peak_rss_bytes(
                [sys.executable, "-m", "lmspec.runtime.convert.to_hf", str(converted)], tmp_path
            )
            assert code == 0, out
            largest = largest_tensor_bytes(json.loads((tmp_path / converted / "convert" / "mapping.json").read_text()))
            bound = 2 * largest + BASE_RSS_ALLOWANCE_BYTES
            print(
                f"{converted.name}: peak RSS {peak / 2**20:.0f} MiB; largest tensor {largest / 2**20:.0f} MiB; "
                f"bound {bound / 2**20:.0f} MiB"
            )
            assert peak <= bound
            assert peak < written["bytes"] / 2  # and nowhere near the model
    finally:
        shutil.rmtree(tmp_path / "runs", ignore_errors=True)
