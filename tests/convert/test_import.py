"""`lmspec run BUILD --stage import --from HF_DIR` with DeepSeek-V3's block-FP8 release format, then training.

A DeepSeek-V3-shaped model with dims >= 128 (so 128x128 blocks are real, kv_a_proj_with_mqa's 160 rows
a partial one) is saved by transformers with random weights, then quantised here as the release is:
every `*_proj.weight` of a decoder layer as float8_e4m3fn with a float32 `weight_scale_inv` per 128x128
block (amax / 448), `quantization_config` in config.json. Imported at TP=2 EP=2 through the build's own
launcher, it is judged by `verify --from` against transformers on that directory (weights dequantised
by the release's formula: transformers' FP8 loader needs accelerate, absent here), then trained from.
~4 minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers.convert import Trained, compile_run_build, hf_tensors, lmspec, verify_report
from safetensors.torch import load_file, save_file

from lmspec.runtime.convert.hf_source import FP8_BLOCK, QUANTIZATION, SCALE_SUFFIX
from lmspec.runtime.verify import MAX_LOGITS_ABS_DIFF

pytestmark = pytest.mark.slow

SPEC = "tiny_moe_pretrain_2rank_cpu_fp32"
WIDE_MOE_TP2_EP2 = [
    "parallel.tp=2",
    "parallel.sequence_parallel=true",
    "model.hidden_size=256",
    "model.ffn_hidden_size=384",
    "model.moe.ffn_hidden_size=128",
    "model.mla.q_lora_rank=128",
    "model.mla.kv_lora_rank=128",
]
FP8_MAX = 448.0  # largest finite float8_e4m3fn
RELEASE_QUANTIZATION = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": list(FP8_BLOCK),
}


def quantise_block_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn weight, float32 scale_inv per block): DeepSeek-V3's release quantisation."""
    rows, cols = weight.shape
    br, bc = FP8_BLOCK
    scale_inv = torch.empty(math.ceil(rows / br), math.ceil(cols / bc))
    quantised = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            block = weight[i * br : (i + 1) * br, j * bc : (j + 1) * bc].float()
            scale_inv[i, j] = block.abs().max() / FP8_MAX
            quantised[i * br : (i + 1) * br, j * bc : (j + 1) * bc] = (block / scale_inv[i, j]).to(torch.float8_e4m3fn)
    return quantised, scale_inv


@dataclass(frozen=True)
class Fp8Release:
    workdir: Path
    build: Path
    name: str
    original: Path  # transformers' save, fp32
    fp8: Path  # the same weights as the release stores them


@pytest.fixture(scope="module")
def fp8_release(tmp_path_factory: pytest.TempPathFactory) -> Fp8Release:
    from transformers import AutoConfig, AutoModelForCausalLM

    workdir = tmp_path_factory.mktemp("fp8_import")
    name = "fp8_import"
    build = compile_run_build(
        workdir, name, [*WIDE_MOE_TP2_EP2, f"train.checkpoint.dir=runs/{name}/imported"], spec=SPEC
    )
    emitted = json.loads((workdir / build / "convert" / "mapping.json").read_text())["hf_config"]
    original, fp8 = workdir / "original", workdir / "fp8"
    original.mkdir()
    (original / "config.json").write_text(json.dumps(emitted))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(original)), dtype=torch.float32)
    model.save_pretrained(str(original))
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(original.glob("*.safetensors")):
        for key, value in load_file(shard).items():
            if key.startswith("model.layers.") and key.endswith("_proj.weight"):
                tensors[key], tensors[key + SCALE_SUFFIX] = quantise_block_fp8(value)
            else:
                tensors[key] = value
    fp8.mkdir()
    save_file(tensors, str(fp8 / "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {key: "model-00001-of-00001.safetensors" for key in sorted(tensors)}}
    (fp8 / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {**json.loads((original / "config.json").read_text()), QUANTIZATION: RELEASE_QUANTIZATION}
    (fp8 / "config.json").write_text(json.dumps(config))
    return Fp8Release(workdir, build, name, original, fp8)


def test_fp8_release_imports_at_tp2_ep2_and_verifies_against_transformers(fp8_release: Fp8Release) -> None:
    r = fp8_release
    result = lmspec("run", str(r.build), "--stage", "import", "--from", str(r.fp8), cwd=r.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    step = f"runs/{r.name}/imported/step_0"
    assert f"train.init_from={step}" in result.stdout
    assert "block-FP8 (128x128)" in result.stdout
    code, report, err = verify_report(Trained(r.workdir, r.build, r.name), r.fp8)
    assert code == 0 and report["max_abs_diff"] <= MAX_LOGITS_ABS_DIFF, err[-2000:]

    # back out to HF: every weight at the original's scale (the FP8 bug read mean |w| 85 for 0.016)
    assert lmspec("run", str(r.build), "--stage", "convert", cwd=r.workdir).returncode == 0
    before, after = hf_tensors_any(r.original), hf_tensors(r.workdir / "runs" / r.name / "hf")
    for key in ("model.layers.1.mlp.experts.5.down_proj.weight", "model.layers.2.self_attn.kv_a_proj_with_mqa.weight"):
        ratio = float(after[key].abs().mean() / before[key].abs().mean())
        assert abs(ratio - 1) < 0.03, (key, ratio)
        assert float((after[key] - before[key]).abs().max()) <= float(before[key].abs().max()) / 8  # e4m3: 3 bits


def test_training_starts_from_the_imported_weights(fp8_release: Fp8Release) -> None:
    r = fp8_release
    if not (r.workdir / "runs" / r.name / "imported" / "step_0").is_dir():
        assert lmspec("run", str(r.build), "--stage", "import", "--from", str(r.fp8), cwd=r.workdir).returncode == 0
    name = "from_fp8_import"
    steps = ["train.steps=2", "train.log_interval=1", "train.checkpoint.interval=2"]
    overrides = [*WIDE_MOE_TP2_EP2, f"train.init_from=runs/{r.name}/imported/step_0", *steps]
    build = compile_run_build(r.workdir, name, overrides, spec=SPEC)
    result = lmspec("run", str(build), cwd=r.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"initialised from runs/{r.name}/imported/step_0" in result.stdout
    records = [json.loads(line) for line in (r.workdir / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    losses = [rec["loss"] for rec in records if rec.get("loss") is not None]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    print(f"init_from losses: {losses}")


def hf_tensors_any(directory: Path) -> dict[str, torch.Tensor]:
    """A transformers save: one model.safetensors, or shards with an index."""
    if (directory / "model.safetensors.index.json").is_file():
        return hf_tensors(directory)
    return load_file(directory / "model.safetensors")


def test_unknown_quantisation_is_refused_naming_the_field(fp8_release: Fp8Release, tmp_path: Path) -> None:
    r = fp8_release
    for field, value in [("quant_method", "awq"), ("fmt", "e5m2"), ("weight_block_size", [64, 64])]:
        other = tmp_path / field
        shutil.copytree(r.fp8, other)
        config = json.loads((other / "config.json").read_text())
        config[QUANTIZATION][field] = value
        (other / "config.json").write_text(json.dumps(config))
        result = lmspec("run", str(r.build), "--stage", "import", "--from", str(other), cwd=r.workdir)
        assert result.returncode == 2, result.stdout[-2000:]
        assert f"{QUANTIZATION}.{field} is {value!r}" in result.stderr


def test_a_config_of_another_model_is_refused_naming_the_field(fp8_release: Fp8Release, tmp_path: Path) -> None:
    r = fp8_release
    other = tmp_path / "other"
    shutil.copytree(r.original, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 512}))
    result = lmspec("run", str(r.build), "--stage", "import", "--from", str(other), cwd=r.workdir)
    assert result.returncode == 2 and "config.json field hidden_size" in result.stderr, result.stderr[-2000:]
    missing = lmspec("run", str(r.build), "--stage", "import", "--from", str(tmp_path / "nowhere"), cwd=r.workdir)
    assert missing.returncode == 2 and "no such directory" in missing.stderr
    assert not (r.workdir / "runs" / r.name / "imported" / ".tmp-step_0").exists()


def test_a_deepspeed_build_is_refused_with_the_way_out(fp8_release: Fp8Release) -> None:
    r = fp8_release
    build = compile_run_build(r.workdir, "ds_import", [], spec="tiny_deepspeed_zero3_2rank_cpu_fp32")
    result = lmspec("run", str(build), "--stage", "import", "--from", str(r.original), cwd=r.workdir)
    assert result.returncode == 2 and "train.backend='deepspeed'" in result.stderr, result.stderr[-2000:]
    assert "train.backend=megatron" in result.stderr
