"""The quantize stage end to end on this CPU, through the CLI: a tiny dense model and a tiny Qwen3-MoE are trained,
converted, calibrated by llm-compressor (in its own environment) on their validation split, measured, and the
accepted checkpoints served by vLLM's CPU engine where it has kernels for them.

What each scheme costs here (perplexity on the held-back sequences, greedy agreement) is printed for the note.
vLLM's CPU engine serves dense w4a16, fp8_dynamic and int8 checkpoints; quantized MoE experts need AMX tiles
(vLLM's CPUExpertsInt4/Int8), which this machine's CPU may lack: then the serve stage's refusal is what is
tested, and a MoE checkpoint with its experts kept in bf16 is served instead. ~8 min on 2 cores.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from helpers.build import compile_build
from helpers.cli import LMSPEC
from helpers.convert import Trained, lmspec, train
from helpers.marks import needs_llmcompressor, needs_vllm, quantize_python
from helpers.ports import free_port
from helpers.processes import run_in_group

from lmspec.compiler.build.files import QUALITY_JSON, QUALITY_MD, QUANTIZE_DIR, QUANTIZED_MANIFEST, SPEC
from lmspec.runtime.quantize.stage import QUANTIZE_PYTHON_ENV

pytestmark = [pytest.mark.slow, needs_llmcompressor]

QUANTIZE_TIMEOUT_S = 600
SERVE_TIMEOUT_S = 600
# The built-in corpus is ~6.4k byte tokens: a fifth of its documents held out gives the calibration set room
SMALL_DATA = [
    "train.steps=30",
    "train.checkpoint.interval=30",
    "train.data.split='80,20,0'",
    "quantize.calibration.samples=8",
    "quantize.calibration.seq_length=64",
    "quantize.calibration.eval_samples=4",
    "quantize.max_perplexity_increase=1.0",
]
# vLLM loads the checkpoint as compressed-tensors; its CPU kernel for 4-bit weights multiplies in bfloat16
SERVED = ["serve.quantization=compressed-tensors", "serve.dtype=bfloat16"]
MOE = [
    "model=qwen3_30b_a3b",
    "model.hidden_size=64",
    "model.ffn_hidden_size=96",
    "model.num_attention_heads=4",
    "model.num_kv_heads=2",
    "model.head_dim=32",
    "model.vocab_size=384",
    "model.max_position_embeddings=256",
    "model.moe.num_experts=4",
    "model.moe.top_k=2",
    "model.moe.ffn_hidden_size=64",
    "model.num_layers=3",
    "model.moe.first_dense_layers=1",
    "parallel.tp=2",
    "parallel.sequence_parallel=true",
]
MOE_SPEC = "tiny_moe_pretrain_2rank_cpu_fp32"
KEEP_EXPERTS = "quantize.keep=[lm_head,'re:.*mlp[.]gate$','re:.*mlp[.]experts[.].*']"


def _env() -> dict[str, str]:
    python = quantize_python()
    assert python is not None
    return {**os.environ, QUANTIZE_PYTHON_ENV: python, "OMP_NUM_THREADS": "2", "VLLM_API_KEY": "quantize-test"}


def _run(trained: Trained, build: Path, *args: str, timeout_s: float = QUANTIZE_TIMEOUT_S):
    return run_in_group(
        [LMSPEC, "run", str(build), *args], cwd=trained.workdir, timeout_s=timeout_s, env=_env(), merge_stderr=True
    )


def _variant(trained: Trained, label: str, overrides: list[str], spec: str | None = None) -> Path:
    """Another build of the same run (same name: the same runs/<name>, its checkpoint and converted model),
    under build_<label>/ so the trained build stays as compiled."""
    compiled = compile_build(
        trained.workdir / f"build_{label}",
        [*overrides, f"name={trained.name}", f"cluster.master_port={free_port()}"],
        spec,
    )
    return compiled.dir.relative_to(trained.workdir)


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    trained = train(
        tmp_path_factory.mktemp("dense"),
        "qdense",
        ["quantize=w4a16_gptq", *SMALL_DATA, *SERVED, f"serve.port={free_port()}"],
    )
    assert lmspec("run", str(trained.build), "--stage", "convert", cwd=trained.workdir).returncode == 0
    return trained


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    overrides = [
        *MOE,
        "quantize=w4a16_gptq",
        "quantize.group_size=32",
        *SMALL_DATA,
        *SERVED,
        f"serve.port={free_port()}",
    ]
    trained = train(tmp_path_factory.mktemp("moe"), "qmoe", overrides, spec=MOE_SPEC)
    assert lmspec("run", str(trained.build), "--stage", "convert", cwd=trained.workdir).returncode == 0
    return trained


def _quality(trained: Trained) -> dict:
    return json.loads((trained.workdir / "runs" / trained.name / QUANTIZE_DIR / QUALITY_JSON).read_text())


def _output(trained: Trained, build: Path) -> Path:
    spec = yaml.safe_load((trained.workdir / build / SPEC).read_text())
    return trained.workdir / spec["quantize"]["output"]


def _served(trained: Trained, build: Path) -> str:
    done = _run(trained, build, "--stage", "serve", "--smoke", timeout_s=SERVE_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "smoke checks passed" in done.stdout
    return done.stdout


def _quantized(trained: Trained, build: Path) -> dict:
    done = _run(trained, build, "--stage", "quantize")
    assert done.returncode == 0, done.stdout[-4000:]
    quality = _quality(trained)
    output = _output(trained, build)
    assert (output / QUANTIZED_MANIFEST).is_file() and (output / QUALITY_JSON).is_file()
    assert (
        json.loads((output / "config.json").read_text())["quantization_config"]["quant_method"] == "compressed-tensors"
    )
    assert (
        (trained.workdir / "runs" / trained.name / QUANTIZE_DIR / QUALITY_MD).read_text().startswith("## Quantization")
    )
    assert quality["accepted"] and quality["perplexity_after"] > 0 and 0 <= quality["top1_agreement"] <= 1
    print(
        f"{trained.name} {quality['scheme']}/{quality['method']}: perplexity {quality['perplexity_before']:.3f} -> "
        f"{quality['perplexity_after']:.3f} ({quality['increase']:+.2%}), greedy agreement "
        f"{quality['top1_agreement']:.1%}, KL {quality['kl_mean']:.3g}, {quality['seconds']:.0f} s"
    )
    return quality


def _loads_in_transformers(output: Path) -> None:
    """lmspec's own environment (transformers with vLLM's compressed-tensors) reads the checkpoint too."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(output))
    logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()


@needs_vllm
def test_dense_w4a16_gptq_is_calibrated_measured_and_served(dense: Trained) -> None:
    _quantized(dense, dense.build)
    _loads_in_transformers(_output(dense, dense.build))
    served = _served(dense, dense.build)
    assert "qdense" in served


@needs_vllm
def test_dense_fp8_dynamic_is_served(dense: Trained) -> None:
    build = _variant(dense, "fp8_dynamic", ["quantize=fp8_dynamic", *SMALL_DATA, *SERVED, f"serve.port={free_port()}"])
    assert _quantized(dense, build)["scheme"] == "fp8_dynamic"
    _served(dense, build)


def test_static_fp8_and_int8_quantize_on_cpu(dense: Trained) -> None:
    """Static FP8 runs here but vLLM's CPU engine has no kernel for it: a train-only build publishes it."""
    fp8 = _quantized(dense, _variant(dense, "fp8", ["quantize=fp8", *SMALL_DATA, "serve=null"]))
    int8 = _quantized(dense, _variant(dense, "int8", ["quantize=int8_smoothquant", *SMALL_DATA, "serve=null"]))
    assert fp8["scheme"] == "fp8" and int8["scheme"] == "int8"


def test_a_quantization_beyond_the_bound_fails_and_publishes_nothing(dense: Trained) -> None:
    # fp8_dynamic costs this model a little perplexity (+0.08% here), where 4-bit rounding of a barely trained
    # model may even lower it by chance: a bound of 0 then refuses it
    refused = "runs/qdense/hf-refused"
    overrides = ["quantize=fp8_dynamic", *SMALL_DATA, *SERVED, f"quantize.output={refused}"]
    build = _variant(dense, "refused", [*overrides, "quantize.max_perplexity_increase=0"])
    done = _run(dense, build, "--stage", "quantize")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "quantize.max_perplexity_increase=0" in done.stdout and "nothing was published" in done.stdout
    assert not (dense.workdir / refused).exists()
    assert _quality(dense)["accepted"] is False


def test_moe_experts_all_calibrated_and_served_or_refused_for_amx(moe: Trained) -> None:
    quality = _quantized(moe, moe.build)
    _loads_in_transformers(_output(moe, moe.build))
    assert quality["scheme"] == "w4a16"
    if torch.cpu._is_amx_tile_supported():
        _served(moe, moe.build)
        return
    done = _run(moe, moe.build, "--stage", "serve", "--smoke")
    assert done.returncode == 2 and "AMX" in done.stdout and "quantize.keep" in done.stdout, done.stdout[-3000:]


@needs_vllm
def test_moe_with_experts_kept_is_served(moe: Trained) -> None:
    overrides = [*MOE, "quantize=w4a16_gptq", "quantize.group_size=32", *SMALL_DATA, *SERVED, KEEP_EXPERTS]
    build = _variant(
        moe, "kept", [*overrides, f"serve.port={free_port()}", "quantize.output=runs/qmoe/hf-kept"], MOE_SPEC
    )
    assert _quantized(moe, build)["accepted"]
    _served(moe, build)


def test_a_calibration_set_larger_than_the_split_is_refused(dense: Trained) -> None:
    overrides = ["quantize=w4a16_gptq", *SMALL_DATA, *SERVED, "quantize.calibration.samples=1000"]
    done = _run(dense, _variant(dense, "large", overrides), "--stage", "quantize")
    assert done.returncode == 2, done.stdout[-3000:]
    assert "quantize.calibration.samples=1000" in done.stdout and "holds" in done.stdout
