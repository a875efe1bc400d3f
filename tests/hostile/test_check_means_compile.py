"""What `check` accepts, `compile` builds: sizes no rank split can hold are refused by a rule, never first by
the conversion emitter (which used to be the only place that noticed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

TP2 = ["parallel.tp=2", "hardware.gpus_per_node=2"]

REFUSED = [
    pytest.param(["model.ffn_hidden_size=129"], ["parallel.tp=2", "model.ffn_hidden_size=129", "valid: 1"], id="ffn"),
    pytest.param(["model.vocab_size=257"], ["model.vocab_size=257", "vocabulary-parallel"], id="vocab"),
    pytest.param(
        ["model.vocab_size=257", "model.ffn_hidden_size=129"],
        ["model.ffn_hidden_size=129 (command-line override) or model.vocab_size=257"],
        id="ffn-and-vocab",
    ),
    pytest.param(["model.num_kv_heads=1"], ["model.num_kv_heads=1", "cannot replicate them"], id="kv-heads-1"),
    pytest.param(
        ["model.num_kv_heads=1", "parallel.tp=4", "hardware.gpus_per_node=4"],
        ["parallel.tp=4", "model.num_kv_heads=1", "valid: 1"],
        id="kv-heads-1-tp4",
    ),
]


@pytest.mark.parametrize(("overrides", "fragments"), REFUSED)
def test_check_refuses_what_compile_cannot_shard(
    lmspec: Any, tmp_path: Path, overrides: list[str], fragments: list[str]
) -> None:
    argv = [*TP2, *overrides]
    lmspec("check", *argv).assert_reports(1, fragments)
    lmspec("compile", "-o", str(tmp_path), *argv).assert_reports(1, fragments)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param([*TP2, "model.ffn_hidden_size=130", "model.vocab_size=258"], id="even-widths"),
        pytest.param([*TP2, "model.num_kv_heads=2"], id="kv-heads-2"),
        pytest.param(["model=tiny_moe", *TP2, "parallel.sequence_parallel=true"], id="moe-tp2"),
    ],
)
def test_what_check_accepts_compiles(lmspec: Any, tmp_path: Path, overrides: list[str]) -> None:
    assert lmspec("check", *overrides).code == 0
    result = lmspec("compile", "-o", str(tmp_path), *overrides)
    assert result.code == 0, result.err
    (build,) = tmp_path.iterdir()
    assert (build / "convert" / "mapping.json").is_file()
