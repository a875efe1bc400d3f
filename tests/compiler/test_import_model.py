"""`lmspec import-model`: a released config.json becomes a model group file a spec beside it composes,
exactly or not at all (every field lmspec would drop is named in the error)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers.cli import CliResult
from helpers.paths import ROOT
from jsonschema import Draft202012Validator

from lmspec.compiler.cli.import_model import IMPORT_HEADER
from lmspec.compiler.families import FAMILIES
from lmspec.compiler.paths import display_path

Lmspec = Callable[..., CliResult]
CONFIGS = ROOT / "tests" / "data" / "hf_configs"
QWEN3 = CONFIGS / "Qwen3-8B.json"
MISTRAL_V0_1 = {"sliding_window": 4096, "vocab_size": 32000, "rope_theta": 10000.0}  # v0.3 has null, 32768, 1e6
JOB = """defaults:
  - model: qwen3
  - parallel: default
  - train: default
  - serve: default
  - cluster: local
  - convert: default
  - hardware: h100_80g
  - _self_
name: imported_qwen3
parallel:
  tp: 4
  sequence_parallel: true
  distributed_optimizer: true
train:
  recompute: full
serve:
  tp: 1
"""


def _config(tmp_path: Path, base: Path, **changes: object) -> Path:
    config = {**json.loads(base.read_text(encoding="utf-8")), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_the_group_names_its_source_is_schema_valid_and_a_spec_beside_it_composes(
    tmp_path: Path, lmspec: Lmspec
) -> None:
    output = tmp_path / "specs" / "model" / "qwen3.yaml"
    assert lmspec("import-model", str(QWEN3), "-o", str(output)).code == 0
    text = output.read_text(encoding="utf-8")
    assert text.startswith(f"{IMPORT_HEADER}{display_path(QWEN3)} ")
    assert f"(sha256 {hashlib.sha256(QWEN3.read_bytes()).hexdigest()})" in text.splitlines()[0]
    group = yaml.safe_load(text)
    schema = json.loads((ROOT / "schemas" / "model.schema.json").read_text(encoding="utf-8"))
    Draft202012Validator(schema).validate(group)
    preset = yaml.safe_load((ROOT / "specs" / "model" / "llama3_8b.yaml").read_text(encoding="utf-8"))
    assert list(group) == list(preset) and list(group["rope_scaling"] or {}) == []  # the presets' key order
    assert (group["name"], group["family"], group["head_dim"], group["qk_norm"]) == ("qwen3", "qwen3", 128, True)
    (tmp_path / "specs" / "job.yaml").write_text(JOB, encoding="utf-8")
    checked = lmspec("check", "--spec", str(tmp_path / "specs" / "job.yaml"))
    assert checked.code == 0, checked.err
    assert "imported_qwen3: valid" in checked.out
    explained = json.loads(lmspec("explain", "--spec", str(tmp_path / "specs" / "job.yaml"), "--format", "json").out)
    assert explained["origins"]["model.qk_norm"].startswith(f"{display_path(output)}:")  # the user's group


def test_a_directory_stands_for_its_config_json_and_rope_scaling_is_carried(tmp_path: Path, lmspec: Lmspec) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_bytes((CONFIGS / "Llama-3.1-8B.json").read_bytes())
    output = tmp_path / "llama.yaml"
    assert lmspec("import-model", str(tmp_path / "hf"), "-o", str(output), "--name", "llama31").code == 0
    group = yaml.safe_load(output.read_text(encoding="utf-8"))
    assert group["name"] == "llama31" and group["max_position_embeddings"] == 131072
    assert group["rope_scaling"] == {
        "type": "llama3",
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "beta_fast": None,
        "beta_slow": None,
        "mscale": None,
        "mscale_all_dim": None,
    }


def test_an_unknown_architecture_is_refused_listing_the_supported_classes(tmp_path: Path, lmspec: Lmspec) -> None:
    source = _config(tmp_path, QWEN3, architectures=["GemmaForCausalLM"])
    result = lmspec("import-model", str(source), "-o", str(tmp_path / "x.yaml"))
    result.assert_reports(2, ["architectures", "GemmaForCausalLM", *(f.hf_class for f in FAMILIES.values())])
    assert not (tmp_path / "x.yaml").exists()


def test_every_field_lmspec_would_drop_is_named_in_one_error(tmp_path: Path, lmspec: Lmspec) -> None:
    source = _config(tmp_path, QWEN3, partial_rotary_factor=0.5, logit_softcapping=30.0)
    result = lmspec("import-model", str(source), "-o", str(tmp_path / "x.yaml"))
    result.assert_reports(2, ["partial_rotary_factor, logit_softcapping"])
    assert list(tmp_path.iterdir()) == [source]  # nothing written, no part file


@pytest.mark.parametrize(
    ("base", "changes", "field"),
    [
        ("Mistral-7B-v0.3.json", MISTRAL_V0_1, "sliding_window"),
        ("Qwen2.5-7B.json", {"use_sliding_window": True}, "use_sliding_window"),
        ("Qwen3-8B.json", {"attention_bias": True}, "attention_bias"),
        ("Qwen2.5-7B.json", {"hidden_act": "gelu"}, "hidden_act"),
        ("Llama-3.1-8B.json", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling"),
    ],
    ids=["mistral_v0.1_window", "qwen2_window", "qwen3_attention_bias", "activation", "dynamic_rope"],
)
def test_a_value_lmspec_cannot_model_is_refused_naming_the_field(
    base: str, changes: dict[str, object], field: str, tmp_path: Path, lmspec: Lmspec
) -> None:
    source = _config(tmp_path, CONFIGS / base, **changes)
    lmspec("import-model", str(source), "-o", str(tmp_path / "x.yaml")).assert_reports(2, [f"field {field}"])


def test_only_a_file_lmspec_imported_is_replaced(tmp_path: Path, lmspec: Lmspec) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: hand_written\n", encoding="utf-8")
    lmspec("import-model", str(QWEN3), "-o", str(mine)).assert_reports(2, ["lmspec did not write it"])
    assert mine.read_text(encoding="utf-8") == "name: hand_written\n"
    ours = tmp_path / "ours.yaml"
    assert lmspec("import-model", str(QWEN3), "-o", str(ours)).code == 0
    assert lmspec("import-model", str(CONFIGS / "Qwen3-32B.json"), "-o", str(ours)).code == 0
    assert yaml.safe_load(ours.read_text(encoding="utf-8"))["num_layers"] == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml", "ours.yaml"]


@pytest.mark.parametrize(("output", "name"), [("a b.yaml", None), ("x.yaml", "bad/name"), ("x.json", None)])
def test_a_name_that_is_no_plain_name_or_a_non_yaml_output_is_refused(
    output: str, name: str | None, tmp_path: Path, lmspec: Lmspec
) -> None:
    argv = ["import-model", str(QWEN3), "-o", str(tmp_path / output), *(["--name", name] if name else [])]
    lmspec(*argv).assert_reports(2, [])
    assert not list(tmp_path.iterdir())
