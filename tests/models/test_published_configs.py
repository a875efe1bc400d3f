"""Every published config.json in tests/data/hf_configs, imported with `lmspec import-model`, is the
released model exactly: its total and active parameter counts are transformers' meta-device count of
the model built from that config.json, and convert/mapping.json's HF names and shapes are the names
and shapes of the release's checkpoint (transformers' state dict with its load-time fusions reverted).

A new family only adds its released config.json here (the files are hand-written from the model
cards: nothing is downloaded); the meta device builds even a 405B model in about a second.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.paths import ROOT

from lmspec.compiler.build.files import MAPPING
from lmspec.compiler.cli.main import run
from lmspec.compiler.conversion.document import tensors
from lmspec.compiler.emit.conversion import emit_conversion
from lmspec.compiler.models.params import count_params
from lmspec.compiler.plan import build_plan
from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.typed import from_dict

pytest.importorskip("transformers")

CONFIGS = sorted((ROOT / "tests" / "data" / "hf_configs").glob("*.json"))
EXPERT_COUNT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")  # Mixtral, Qwen3-MoE, DeepSeek
# The compose of the user's spec around the imported group: the built-in groups, this machine's CPU
# (the layout does not change a name or a count; rules are run by tests/compiler/test_import_model.py).
JOB = """defaults:
  - model: {name}
  - parallel: default
  - train: default
  - serve: default
  - cluster: local
  - convert: default
  - hardware: cpu
  - _self_
name: ${{model.name}}
"""


class Imported:
    """One released config.json: the model group `lmspec import-model` wrote, and transformers' model."""

    def __init__(self, config_json: Path, root: Path) -> None:
        self.config: dict[str, Any] = json.loads(config_json.read_text(encoding="utf-8"))
        specs = root / "specs"
        name = "imported"
        assert run(["import-model", str(config_json), "-o", str(specs / "model" / f"{name}.yaml")]) == 0
        (specs / "job.yaml").write_text(JOB.format(name=name), encoding="utf-8")
        composed = compose_spec([], specs / "job.yaml")
        self.spec = from_dict(Spec, composed.spec)
        self.plan = build_plan(self.spec, composed, [])
        self.hf_dir = root / "hf"
        self.hf_dir.mkdir()
        shutil.copy(config_json, self.hf_dir / "config.json")

    def meta_model(self) -> Any:
        import torch
        import transformers

        config = transformers.AutoConfig.from_pretrained(self.hf_dir)
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(config)


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda p: p.stem)
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Imported, Any]:
    release = Imported(request.param, tmp_path_factory.mktemp(request.param.stem))
    return release, release.meta_model()


def test_the_architecture_is_the_release_s(imported: tuple[Imported, Any]) -> None:
    release, model = imported
    assert type(model).__name__ == release.config["architectures"][0]


def test_total_and_active_parameters_equal_transformers_count(imported: tuple[Imported, Any]) -> None:
    release, model = imported
    counts = count_params(release.spec.model)
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    experts = next((release.config[f] for f in EXPERT_COUNT_FIELDS if f in release.config), None)
    fraction = release.config["num_experts_per_tok"] / experts if experts else 0.0
    assert counts.total == total
    assert counts.active == total - routed + round(routed * fraction)


def test_mapping_names_and_shapes_are_the_release_checkpoint_s(imported: tuple[Imported, Any]) -> None:
    """transformers 5 fuses some checkpoints' tensors at load time (experts); reverting its conversion
    on the meta state dict gives the names and shapes the released safetensors hold."""
    from transformers.core_model_loading import revert_weight_conversion

    release, model = imported
    # tied weights once, as the release stores them; persistent buffers kept (DeepSeek-V3's e_score_correction_bias)
    tied = set(dict(model.named_parameters(remove_duplicate=False))) - set(dict(model.named_parameters()))
    state = {k: v for k, v in model.state_dict().items() if k not in tied}
    released = {name: tuple(t.shape) for name, t in revert_weight_conversion(model, state).items()}
    doc = json.loads(emit_conversion(release.plan)[MAPPING])
    mapped = {name: tuple(shape) for t in tensors(doc) for name, shape in t.transform.hf_shapes().items()}
    # the release's MTP modules (model.layers.{num_hidden_layers + i}, which transformers does not build):
    # tests/convert/test_mtp.py checks their names and shapes against the release's layer 61
    layers, mtp = release.config["num_hidden_layers"], release.config.get("num_nextn_predict_layers", 0)
    mtp_names = {n for n in mapped if n.startswith("model.layers.") and int(n.split(".")[2]) >= layers}
    assert {".".join(n.split(".")[:3]) for n in mtp_names} == {f"model.layers.{layers + i}" for i in range(mtp)}
    assert {n: s for n, s in mapped.items() if n not in mtp_names} == released
