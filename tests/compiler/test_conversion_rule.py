"""A model convert/mapping.json cannot shard is a problem `lmspec check` reports (rules/conversion.py),
not an exception out of the emitter; the rule builds the emitter's entries, so it runs only on a spec
every other rule accepts."""

from __future__ import annotations

import pytest

from lmspec.compiler.cli.main import run
from lmspec.compiler.conversion.transforms import MappingError
from lmspec.compiler.rules import conversion

MESSAGE = (
    "parallel.tp=1 (ep 1, etp 1): convert/mapping.json cannot shard the model: decoder.layers.x: 2 ranks; use a "
    "parallel.tp that divides model.ffn_hidden_size, model.vocab_size and model.num_kv_heads (and parallel.ep/etp "
    "that divide the experts' sizes)"
)


def _unshardable(*_: object) -> None:
    raise MappingError("decoder.layers.x: 2 ranks")


def test_a_model_the_mapping_cannot_shard_is_a_rule_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(conversion, "build_entries", _unshardable)
    assert run(["check"]) == 1
    assert MESSAGE in capsys.readouterr().err
    assert run(["check", "convert=null", "serve.model_path=models/tiny"]) == 0  # nothing to convert


def test_the_mapping_is_built_only_for_a_spec_every_other_rule_accepts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(conversion, "build_entries", _unshardable)
    assert run(["check", "parallel.tp=3"]) == 1
    err = capsys.readouterr().err
    assert "parallel.tp=3" in err and "cannot shard the model" not in err
