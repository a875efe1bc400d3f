"""A spec states only what differs: lmspec's choice fills each group its defaults list leaves out,
in the built-in order (hardware after train and serve), under the spec's own values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# (spec file text, {key: (value, where it came from)} that `explain --format json` must show)
CASES = [
    pytest.param(
        "defaults:\n  - model: llama3_8b\n  - hardware: h100_80g\n  - _self_\nname: short\n",
        {
            "model.num_layers": (32, "lmspec:specs/model/llama3_8b.yaml:"),
            "train.seq_length": (4096, "lmspec:specs/train/default.yaml:"),  # not the cpu preset's 128
            "cluster.launcher": ("local", "lmspec:specs/cluster/local.yaml:"),
            "serve.tp": (8, "lmspec:specs/serve/default.yaml:"),
            "convert.output": ("runs/short/hf", "lmspec:specs/convert/default.yaml:"),
        },
        id="model-and-hardware-only",
    ),
    pytest.param(
        "defaults:\n  - model: llama3_8b\n  - hardware: h100_80g\nname: no_self\n"
        "train:\n  optimizer:\n    lr: 1.0e-4\n",
        {"train.optimizer.lr": (1.0e-4, "spec.yaml:7"), "train.steps": (1000, "lmspec:specs/train/default.yaml:")},
        id="no-self-the-spec-still-wins",
    ),
    pytest.param(
        "name: bare\nserve: null\nparallel:\n  tp: 2\n",
        {
            "model.name": ("tiny", "lmspec:specs/model/tiny.yaml:"),
            "train.seq_length": (128, "lmspec:specs/hardware/cpu.yaml:"),  # the cpu preset sizes train, as in config
            "parallel.tp": (2, "spec.yaml:4"),
            "serve": (None, "spec.yaml:2"),
        },
        id="no-defaults-list",
    ),
    pytest.param(
        "defaults:\n  - config\n  - override model: tiny_moe\n  - _self_\nname: based\n",
        {"model.name": ("tiny_moe", "lmspec:specs/model/tiny_moe.yaml:")},
        id="a-base-config-keeps-its-own-choices",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_groups_a_spec_leaves_out_are_lmspecs(lmspec, tmp_path: Path, text: str, expected: dict) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    result = lmspec("explain", "--format", "json", "--spec", str(spec))
    assert "missing" not in result.err and "_self_" not in result.err, result.err
    document = json.loads(result.out)
    for key, (value, origin) in expected.items():
        found = document["spec"]
        for part in key.split("."):
            found = found[part]
        assert found == pytest.approx(value) if isinstance(value, float) else found == value, (key, found)
        assert origin in document["origins"][key], (key, document["origins"][key])
