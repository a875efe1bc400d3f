"""Train at TP=2 / PP=2 / TP=2+EP=2 (Megatron) and ZeRO-3 / MoE at ZeRO-2 (DeepSpeed), convert with the
emitted mapping, prove it by logits.

~7 minutes on 2 CPU cores, most of it the 3-step training runs (session fixtures).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.convert import (
    MOE_TP2_EP2,
    TRAIN_STEPS,
    V2_TP2_EP2,
    Trained,
    compile_run_build,
    convert_then_verify,
    hf_tensors,
    lmspec,
    verify_report,
)
from helpers.tokenizers import builtin_documents, train_bpe_tokenizer

from lmspec.runtime.verify import MAX_LOGITS_ABS_DIFF

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "fixture",
    ["tiny_tp2", "tiny_pp2", "tiny_moe_tp2_ep2", "tiny_v2_tp2_ep2", "tiny_deepspeed_zero3", "tiny_moe_deepspeed_zero2"],
)
def test_convert_then_logits_match(fixture: str, request: pytest.FixtureRequest) -> None:
    trained: Trained = request.getfixturevalue(fixture)
    mapping, tensors, report = convert_then_verify(trained)
    assert len(report["layers"]) == 4


@pytest.mark.parametrize(
    "fixture,overrides,mtp",
    [("tiny_moe_tp2_ep2", MOE_TP2_EP2, True), ("tiny_v2_tp2_ep2", V2_TP2_EP2, False)],
)
def test_round_trip_hf_megatron_tp2_ep2_hf_is_bit_exact(
    fixture: str, overrides: list[str], mtp: bool, request: pytest.FixtureRequest
) -> None:
    """`--stage import` into a build whose checkpoint dir is the import's output, so `convert` reads it back."""
    source: Trained = request.getfixturevalue(fixture)
    if not (source.hf_dir / "config.json").is_file():
        assert lmspec("run", str(source.build), "--stage", "convert", cwd=source.workdir).returncode == 0
    name = f"{fixture}_from_hf"
    overrides = [*overrides, f"train.checkpoint.dir=runs/{name}/imported"]
    build = compile_run_build(source.workdir, name, overrides, spec="tiny_moe_pretrain_2rank_cpu_fp32")
    spec_text = (source.workdir / build / "spec.resolved.yaml").read_text()
    assert "ep: 2" in spec_text and "tp: 2" in spec_text
    result = lmspec("run", str(build), "--stage", "import", "--from", str(source.hf_dir), cwd=source.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"train.init_from=runs/{name}/imported/step_0" in result.stdout
    result = lmspec("run", str(build), "--stage", "convert", cwd=source.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = hf_tensors(source.hf_dir), hf_tensors(source.workdir / "runs" / name / "hf")
    assert before.keys() == after.keys() and ("model.layers.4.eh_proj.weight" in before) == mtp  # MTP module too
    differing = [name for name in before if not torch.equal(before[name], after[name])]
    assert differing == []
    code, report, err = verify_report(Trained(source.workdir, build, name), source.hf_dir)
    assert code == 0 and report["max_abs_diff"] <= MAX_LOGITS_ABS_DIFF, err[-2000:]


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


def test_converted_models_carry_the_training_tokenizer(tiny_tp2: Trained, tmp_path: Path) -> None:
    """The converter writes the spec's tokenizer beside the weights, so AutoTokenizer on the output gives
    the training ids: the byte tokenizer for tiny_tp2, and the user's BPE for a build that names one.
    The tokenizer comes from train.data, not from the checkpoint, so the second build converts
    tiny_tp2's checkpoint (same model and layout) rather than training again."""
    from transformers import AutoTokenizer, GenerationConfig

    from lmspec.runtime.data.byte_tokenizer import EOT_ID, encode
    from lmspec.runtime.data.tokenizer import load_tokenizer

    texts = builtin_documents()[:3] + ["Grüße, 東京"]
    if not (tiny_tp2.hf_dir / "config.json").is_file():
        assert lmspec("run", str(tiny_tp2.build), "--stage", "convert", cwd=tiny_tp2.workdir).returncode == 0
    byte = AutoTokenizer.from_pretrained(str(tiny_tp2.hf_dir))
    assert [byte(t, add_special_tokens=False).input_ids for t in texts] == [encode(t) for t in texts]
    assert byte.eos_token_id == EOT_ID == GenerationConfig.from_pretrained(str(tiny_tp2.hf_dir)).eos_token_id

    tok = train_bpe_tokenizer(tmp_path / "bpe")
    overrides = [
        "hardware=cpu",
        "parallel.tp=2",
        f"train.steps={TRAIN_STEPS}",
        f"train.checkpoint.interval={TRAIN_STEPS}",
    ]
    hf_data = [
        "train.data.tokenizer=hf",
        f"train.data.tokenizer_path={tok}",
        "train.checkpoint.dir=runs/tiny_tp2/checkpoints",
    ]
    build = compile_run_build(tiny_tp2.workdir, "tiny_tp2_bpe", [*overrides, *hf_data])
    result = lmspec("run", str(build), "--stage", "convert", cwd=tiny_tp2.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    output = tiny_tp2.workdir / "runs" / "tiny_tp2_bpe" / "hf"
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in output.iterdir()}
    assert (output / "tokenizer.json").read_bytes() == (tok / "tokenizer.json").read_bytes()
    served = AutoTokenizer.from_pretrained(str(output))
    training = load_tokenizer(tok)
    assert [served(t).input_ids for t in texts] == training.encode_batch(texts)
    assert served.eos_token_id == training.eod_id == GenerationConfig.from_pretrained(str(output)).eos_token_id
    assert hf_tensors(output).keys() == hf_tensors(tiny_tp2.hf_dir).keys()
