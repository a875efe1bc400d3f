"""train.backend=torchtitan: its DCP checkpoint (FSDP2 shards) converts to HF as the mapping says.

Fast: a checkpoint written in this process by `dcp.save` of transformers' model of the mapping (the layout
the trainer saves: `{"model": state}` with transformers' names), converted, read back bit for bit; a
mapping that does not match it is refused listing both sides; a damaged shard is one line naming the file.
Slow (~25 s each on 2 CPU cores, most of it training): the tiny and tiny_moe models trained by FSDP2 over
2 ranks, and tiny by tensor parallelism over them (its DCP save holds TP shards; the reader reads global
tensors) and by a 2-stage pipeline (each rank saves its stage's tensors), through `lmspec run`, then the
convert and verify stages; the converted model's logits match
transformers' logits on the DCP checkpoint's tensors (read by DCP's own dcp_to_torch_save) within the bar.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.convert import Trained, compile_run_build, convert_then_verify, hf_tensors, lmspec, train

from lmspec.compiler.build.files import MAPPING, TORCHTITAN_DCP_FORMAT, TORCHTITAN_DIR
from lmspec.compiler.emit.conversion import emit_conversion
from lmspec.compiler.pipeline import make_plan
from lmspec.runtime.convert.to_hf import ConversionError, convert_torchtitan, latest_checkpoint
from lmspec.runtime.verify import MAX_LOGITS_ABS_DIFF

SPEC = "tiny_torchtitan_fsdp2_2rank_cpu_fp32"
TWO_RANKS = ["parallel.zero_stage=3", "hardware.gpus_per_node=2"]
SMALL_MOE = ["model=tiny_moe", "model.num_layers=2", "model.hidden_size=64", "model.moe.ffn_hidden_size=32"]
# what each trained run adds to TWO_RANKS: a model, or tiny under TP (sequence parallel, as torchtitan runs TP)
TRAINED = {
    "tiny": ["model=tiny"],
    "tiny_moe": ["model=tiny_moe"],
    "tiny_tp2": ["model=tiny", "parallel.tp=2", "parallel.sequence_parallel=true"],
    "tiny_pp2": ["model=tiny", "parallel.pp=2"],
}


def _mapping(overrides: list[str]) -> dict[str, Any]:
    doc = json.loads(emit_conversion(make_plan([*TWO_RANKS, *overrides], Path(SPEC)))[MAPPING])
    assert doc["checkpoint_format"] == TORCHTITAN_DCP_FORMAT
    return doc


def _model(doc: dict[str, Any]) -> Any:
    import transformers

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**doc["hf_config"])
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _saved(tmp: Path, model: Any) -> Path:
    """A step directory holding `model`'s DCP checkpoint as the trainer lays it out (one process: one shard)."""
    import torch.distributed.checkpoint as dcp

    step = tmp / "step_1"
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(step / TORCHTITAN_DIR), no_dist=True)
    return step


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any, Path]:
    doc = _mapping(["model.num_layers=2"])
    model = _model(doc)
    return doc, model, _saved(tmp_path_factory.mktemp("dcp"), model)


@pytest.mark.parametrize("overrides", [["model.num_layers=2"], ["model.tie_embeddings=true"], SMALL_MOE])
def test_every_mapped_tensor_is_written_bit_for_bit(overrides: list[str], tmp_path: Path) -> None:
    """A tied head (the state dict holds it, the mapping does not) and MoE experts (transformers holds them
    fused, the mapping names them per expert) included; read in loads of one tensor each."""
    from transformers import AutoModelForCausalLM

    doc = _mapping(overrides)
    model = _model(doc)
    config = json.loads(json.dumps(doc["hf_config"]))  # as compiled (transformers' config edits what it is given)
    summary = convert_torchtitan(doc, _saved(tmp_path, model), tmp_path / "hf", read_bytes=1)
    assert json.loads((tmp_path / "hf" / "config.json").read_text()) == config == doc["hf_config"]
    written = hf_tensors(tmp_path / "hf")
    assert sorted(written) == sorted(item["name"] for t in doc["tensors"] for item in t["hf"])
    assert len(written) == doc["hf_tensor_count"] == summary["tensors"]
    assert summary["dcp_loads"] == len(model.state_dict()) - model.config.tie_word_embeddings  # the head not read
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).state_dict()
    assert loaded.keys() == model.state_dict().keys()
    assert [k for k, v in model.state_dict().items() if not torch.equal(v, loaded[k])] == []


def test_a_mapping_that_does_not_match_is_refused_listing_both_sides(
    dense: tuple[dict[str, Any], Any, Path], tmp_path: Path
) -> None:
    doc, _, step = dense
    doc = json.loads(json.dumps(doc))
    dropped = doc["tensors"].pop(-1)["hf"][0]["name"]
    renamed = doc["tensors"][0]
    renamed["hf"][0]["name"] = renamed["source"]["key"] = "model.embed_tokens.typo"
    norm, shape = doc["tensors"][1]["hf"][0]["name"], doc["tensors"][1]["hf"][0]["shape"]
    doc["tensors"][1]["hf"][0]["shape"] = [7]
    output = tmp_path / "hf"
    with pytest.raises(ConversionError) as caught:
        convert_torchtitan(doc, step, output)
    message = str(caught.value)
    assert "1 mapped tensor(s) missing from the checkpoint: model.embed_tokens.typo" in message
    assert f"2 checkpoint tensor(s) not in the mapping: {dropped}, model.embed_tokens.weight" in message
    assert f"{norm}: checkpoint shape {shape}, mapping says [7]" in message
    assert not output.exists()


def _truncate(step: Path) -> Path:
    shard = step / TORCHTITAN_DIR / "__0_0.distcp"
    with shard.open("r+b") as fh:
        fh.truncate(shard.stat().st_size // 8)  # into the model's tensors (the optimizer state follows them)
    return shard


def _garble(step: Path) -> Path:
    shard = step / TORCHTITAN_DIR / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[:64] = bytes(64)  # the first tensor's torch.save archive header
    shard.write_bytes(bytes(data))
    return shard


def _remove(name: str) -> Any:
    def damage(step: Path) -> Path:
        path = step / TORCHTITAN_DIR / name
        path.unlink()
        return path

    return damage


def _scramble_metadata(step: Path) -> Path:
    path = step / TORCHTITAN_DIR / ".metadata"
    path.write_bytes(b"not a pickle")
    return path


@pytest.mark.parametrize(
    "damage, says",
    [
        pytest.param(_truncate, "bytes, but .metadata stores", id="truncated-shard"),
        pytest.param(_garble, "cannot be read as part of this checkpoint", id="garbled-shard"),
        pytest.param(_remove("__0_0.distcp"), "missing (.metadata stores shards of", id="missing-shard"),
        pytest.param(_remove(".metadata"), "missing (not a torch.distributed.checkpoint directory)", id="no-metadata"),
        pytest.param(_scramble_metadata, "not a DCP checkpoint index", id="damaged-metadata"),
    ],
)
def test_a_damaged_checkpoint_is_one_line_naming_the_file(
    dense: tuple[dict[str, Any], Any, Path], damage: Any, says: str, tmp_path: Path
) -> None:
    doc, _, step = dense
    copy = shutil.copytree(step, tmp_path / step.name)
    path = damage(copy)
    output = tmp_path / "hf"
    with pytest.raises(ConversionError) as caught:
        convert_torchtitan(doc, copy, output)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and says in message and "\n" not in message, message
    assert not output.exists()


# ---- trained by FSDP2 over 2 ranks through `lmspec run` ------------------------------------------------------


@pytest.fixture(scope="module")
def trained(workdir: Path) -> dict[str, Trained]:
    return {}


def _trained(cache: dict[str, Trained], workdir: Path, run: str) -> Trained:
    if run not in cache:
        cache[run] = train(workdir, f"torchtitan_{run}", [*TWO_RANKS, *TRAINED[run]], spec=SPEC)
    return cache[run]


def _dcp_state(step: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's model tensors, full, by DCP's own offline consolidation (an oracle apart from the
    converter's reader)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(step / TORCHTITAN_DIR, tmp / "full.pt")
    state = torch.load(tmp / "full.pt", weights_only=False)
    return state["model"]  # {"model": {transformers' name: tensor}, "optimizer": ...} as the trainer saved it


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(TRAINED))
def test_fsdp2_checkpoint_converts_and_its_logits_match(
    model: str, trained: dict[str, Trained], workdir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from lmspec.compiler.build.reader import Build
    from lmspec.runtime.train.hf_model import hf_config

    run = _trained(trained, workdir, model)
    mapping, _, report = convert_then_verify(run)

    # independently of the verify stage: transformers' model on the DCP tensors against the converted one
    build = Build.open(run.workdir / run.build)
    step = latest_checkpoint(run.workdir / mapping["checkpoint_dir"])
    state = _dcp_state(step, tmp_path)
    import transformers

    reference = transformers.AutoModelForCausalLM.from_config(hf_config(build.training()), dtype=torch.float32)
    reference.load_state_dict(state, strict=True)
    converted = AutoModelForCausalLM.from_pretrained(str(run.hf_dir), dtype=torch.float32)
    differing = [k for k, v in reference.state_dict().items() if not torch.equal(v, converted.state_dict()[k])]
    assert differing == []
    tokens = torch.randint(0, mapping["hf_config"]["vocab_size"], (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (reference.eval()(input_ids=tokens).logits - converted.eval()(input_ids=tokens).logits).abs().max()
    print(f"{model}: verify max |diff| {report['max_abs_diff']:.3e}, direct max |diff| {float(diff):.3e}")
    assert float(diff) <= MAX_LOGITS_ABS_DIFF


@pytest.mark.slow
def test_a_damaged_shard_stops_the_stage_in_one_line(trained: dict[str, Trained], workdir: Path) -> None:
    run = _trained(trained, workdir, "tiny")
    copy = workdir / "torchtitan_damaged_checkpoints"
    shutil.copytree(run.workdir / "runs" / run.name / "checkpoints", copy)
    build = compile_run_build(
        workdir, "torchtitan_damaged", [*TWO_RANKS, "train.steps=3", f"train.checkpoint.dir={copy}"], spec=SPEC
    )
    shard = _truncate(latest_checkpoint(copy))
    result = lmspec("run", str(build), "--stage", "convert", cwd=workdir)
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"lmspec: convert: {shard}: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def _imported_bit_for_bit(
    trained: dict[str, Trained], workdir: Path, model: str, name: str, overrides: list[str]
) -> Path:
    """`model`'s FSDP2 run converted to HF, imported into the build `name` (`--stage import`); its step_0 holds
    the very bits the run saved. Returns that step directory."""
    from lmspec.runtime.convert.dcp_reader import DcpCheckpoint

    run = _trained(trained, workdir, model)
    converted = lmspec("run", str(run.build), "--stage", "convert", cwd=workdir)
    assert converted.returncode == 0, converted.stderr[-3000:]
    build = compile_run_build(workdir, name, overrides, spec=SPEC)
    result = lmspec("run", str(build), "--stage", "import", "--from", str(run.hf_dir), cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = workdir / "runs" / name / "imported" / "step_0"
    source = DcpCheckpoint(latest_checkpoint(workdir / "runs" / run.name / "checkpoints") / TORCHTITAN_DIR)
    back = DcpCheckpoint(imported / TORCHTITAN_DIR)
    assert back.tensors == source.tensors
    want, got = source.read(source.tensors), back.read(back.tensors)
    assert [key for key in want if not torch.equal(want[key], got[key])] == []
    return imported


@pytest.mark.slow
def test_an_hf_release_imports_into_fsdp2_shards_bit_for_bit_and_trains(
    trained: dict[str, Trained], workdir: Path
) -> None:
    """HF -> torchtitan (`--stage import`, at another sharding than the run it came from): the experts, which
    transformers holds fused and the release per expert, come back to the very bits the run saved; a run
    started from the import (train.init_from) trains."""
    other = [*TWO_RANKS, "parallel.zero_stage=2", "model=tiny_moe"]
    imported = _imported_bit_for_bit(trained, workdir, "tiny_moe", "torchtitan_imported", other)
    start = [*other, "train.steps=1", "train.log_interval=1", f"train.init_from={imported.relative_to(workdir)}"]
    started = train(workdir, "torchtitan_from_import", start, spec=SPEC)
    log = (workdir / "runs" / started.name / "metrics.jsonl").read_text()
    assert '"loss"' in log


@pytest.mark.slow
def test_an_hf_release_imports_into_pipeline_stages_bit_for_bit(trained: dict[str, Trained], workdir: Path) -> None:
    """HF -> a 2-stage torchtitan pipeline: each rank reads only its stage's tensors into its stage module
    (under the whole model's names), and together they save the very bits the FSDP2 run saved."""
    _imported_bit_for_bit(trained, workdir, "tiny", "torchtitan_imported_pp2", [*TWO_RANKS, "parallel.pp=2"])
