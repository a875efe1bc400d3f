"""Train at TP=2 / PP=2 / TP=2+EP=2 (Megatron) and ZeRO-3 (DeepSpeed), convert with the
emitted mapping, prove it by logits.

~6 minutes on 2 CPU cores, most of it the four 3-step training runs (session fixtures).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from helpers.convert import MOE_TP2_EP2, Trained, compile_run_build, hf_tensors, lmspec, verify_report

from lmspec.runtime.verify import MIN_LOGITS_COSINE

FP32_CPU_MIN_COSINE = 0.9999  # what fp32 on CPU must reach (the stage itself requires MIN_LOGITS_COSINE)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fixture", ["tiny_tp2", "tiny_pp2", "tiny_moe_tp2_ep2", "tiny_deepspeed_zero3"])
def test_convert_then_logits_match(fixture: str, request: pytest.FixtureRequest) -> None:
    trained: Trained = request.getfixturevalue(fixture)
    result = lmspec("run", str(trained.build), "--stage", "convert", cwd=trained.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    mapping = json.loads((trained.workdir / trained.build / "convert" / "mapping.json").read_text())
    tensors = hf_tensors(trained.hf_dir)
    assert len(tensors) == mapping["hf_tensor_count"]
    assert json.loads((trained.hf_dir / "config.json").read_text()) == mapping["hf_config"]

    result = lmspec("run", str(trained.build), "--stage", "verify", cwd=trained.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    report = json.loads(out[out.index("{\n") : out.rindex("}") + 1])
    assert report["ok"] and report["logits_cosine"] >= FP32_CPU_MIN_COSINE > MIN_LOGITS_COSINE
    assert report["max_abs_diff"] < 1e-3
    assert len(report["layers"]) == 4


def test_round_trip_hf_megatron_tp2_ep2_hf_is_bit_exact(tiny_moe_tp2_ep2: Trained) -> None:
    from lmspec.runtime.convert.from_hf import reverse_build

    source = tiny_moe_tp2_ep2
    if not (source.hf_dir / "config.json").is_file():
        assert lmspec("run", str(source.build), "--stage", "convert", cwd=source.workdir).returncode == 0
    build = compile_run_build(source.workdir, "tiny_moe_from_hf", MOE_TP2_EP2, spec="tiny_moe_pretrain_2rank_cpu_fp32")
    spec_text = (source.workdir / build / "spec.resolved.yaml").read_text()
    assert "ep: 2" in spec_text and "tp: 2" in spec_text
    cwd = Path.cwd()
    try:
        os.chdir(source.workdir)
        reverse_build(build, source.hf_dir)
    finally:
        os.chdir(cwd)
    result = lmspec("run", str(build), "--stage", "convert", cwd=source.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = hf_tensors(source.hf_dir), hf_tensors(source.workdir / "runs" / "tiny_moe_from_hf" / "hf")
    assert before.keys() == after.keys()
    differing = [name for name in before if not torch.equal(before[name], after[name])]
    assert differing == []
    code, report, err = verify_report(Trained(source.workdir, build, "tiny_moe_from_hf"))
    assert code == 0 and report["logits_cosine"] >= FP32_CPU_MIN_COSINE, err[-2000:]


def test_unknown_and_missing_keys_are_listed_and_nothing_is_written(tiny_tp2: Trained, tmp_path: Path) -> None:
    from lmspec.compiler.build.files import DIST_CKPT_DIR
    from lmspec.runtime.convert.to_hf import ConversionError, convert_megatron, latest_checkpoint

    doc = json.loads((tiny_tp2.workdir / tiny_tp2.build / "convert" / "mapping.json").read_text())
    step = latest_checkpoint(tiny_tp2.workdir / doc["checkpoint_dir"])
    dropped = doc["tensors"].pop(-1)  # the output head: now unknown to the mapping
    doc["tensors"][0] = {**doc["tensors"][0], "megatron": {**doc["tensors"][0]["megatron"], "key": "embedding.typo"}}
    output = tmp_path / "hf"
    output.mkdir()
    (output / "previous").write_text("kept")
    with pytest.raises(ConversionError) as caught:
        convert_megatron(doc, step / DIST_CKPT_DIR, output)
    message = str(caught.value)
    assert dropped["megatron"]["key"] in message and "embedding.word_embeddings.weight" in message
    assert "not in the mapping" in message and "missing from the checkpoint: embedding.typo" in message
    assert sorted(p.name for p in output.iterdir()) == ["previous"]
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temp directory left behind
