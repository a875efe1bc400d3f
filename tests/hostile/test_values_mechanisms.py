"""The mechanisms behind tests/hostile/test_values.py, each checked on its own.

- lmspec.compiler.spec.schema refuses a key without its bound (a maximum, a kind, max_items), and the
  schema it writes gives every string a kind and every number a maximum;
- lmspec's validator reads `integer`, `number`, `format` and `pattern` its own way where the
  stock draft 2020-12 validator lets NaN, 2.0, true and a trailing newline through;
- the editors' ECMA patterns (check-jsonschema, upstream) refuse what lmspec refuses;
- strict templates refuse an unquoted value; `comment` keeps a comment one line; `shell`
  round-trips through bash; JSON artifacts are standard JSON;
- the hints' helpers do bounded work and agree with the plain definitions they replaced.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT
from jsonschema import Draft202012Validator

from lmspec.compiler.emit.quoting import UnsafeValue, comment, shell, word
from lmspec.compiler.emit.render import UnquotedValue, render
from lmspec.compiler.emit.spec_files import NonFiniteNumber, dump_json, dump_json_line
from lmspec.compiler.models.dims import balanced_stages, divisors
from lmspec.compiler.models.params import count_params, is_moe_layer, layer_params
from lmspec.compiler.rules.context import HINT_VALUES, listed
from lmspec.compiler.spec.kinds import KINDS, PLAIN_NAME, SLURM_TIME
from lmspec.compiler.spec.schema import UndeclaredBound, _object_schema, spec_schema
from lmspec.compiler.spec.schema_check import LmspecValidator
from lmspec.compiler.spec.sections import Spec, key
from lmspec.compiler.spec.typed import from_dict

CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")


def _leaves(node: dict, path: str = ""):
    for name, prop in node.get("properties", {}).items():
        for option in [prop, *prop.get("anyOf", [])]:
            if option.get("type") == "object":
                yield from _leaves(option, f"{path}{name}.")
            elif "type" in option or "enum" in option:
                yield f"{path}{name}", option
                if option.get("type") == "array":
                    yield f"{path}{name}[]", option["items"]


def test_every_string_has_a_kind_and_every_number_a_maximum() -> None:
    leaves = list(_leaves(spec_schema()))
    assert len(leaves) > 100
    for name, node in leaves:
        if node.get("type") == "string":
            assert node.get("format") in KINDS, name
            assert node["pattern"].startswith("^") and node["pattern"].endswith("$"), name
        if node.get("type") in ("integer", "number"):
            assert "maximum" in node or "enum" in node, name
        if node.get("type") == "array":
            assert "maxItems" in node, name


def test_the_generator_refuses_a_key_without_its_bound() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Unbounded:
        """A section with an unbounded number."""

        count: int = key("A count.", example=1, minimum=1)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Unkinded:
        """A section with a string of no kind."""

        label: str = key("A label.", example="x")

    for cls, word_ in ((Unbounded, "maximum="), (Unkinded, "kind=")):
        with pytest.raises(UndeclaredBound, match=word_):
            _object_schema(cls)


TIME_BEFORE = r"^(\d+-)?\d{1,2}:\d{2}:\d{2}$"  # cluster.slurm.time's pattern before kinds


@pytest.mark.parametrize(
    ("stock", "lmspec_schema", "value"),
    [
        pytest.param({"type": "integer"}, {"type": "integer"}, 2.0, id="float-as-integer"),
        pytest.param({"type": "number", "minimum": 0, "maximum": 1}, None, math.nan, id="nan-within-bounds"),
        pytest.param({"type": "number", "minimum": 0}, None, math.inf, id="inf-above-minimum"),
        pytest.param({"enum": [0, 1]}, {"type": "integer", "enum": [0, 1]}, 1.0, id="float-in-int-enum"),
        pytest.param({"pattern": PLAIN_NAME.anchored}, None, "tiny\n", id="trailing-newline-pattern"),
        pytest.param({"pattern": TIME_BEFORE}, {"format": SLURM_TIME.name}, "\u0660\u0664:00:00", id="arabic-digits"),
    ],
)
def test_lmspec_validator_refuses_what_the_stock_one_lets_through(
    stock: dict, lmspec_schema: dict | None, value: object
) -> None:
    assert Draft202012Validator(stock).is_valid(value)
    assert not LmspecValidator(lmspec_schema or stock).is_valid(value)


def test_booleans_are_never_numbers() -> None:
    for schema in ({"type": "integer"}, {"type": "number"}):
        assert not LmspecValidator(schema).is_valid(True)


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
def test_every_kind_accepts_its_example_and_refuses_control_characters(kind) -> None:
    assert kind.problem(kind.example) is None
    for bad in (f"{kind.example}\n", f"\n{kind.example}", kind.example[:1] + "\x00" + kind.example[1:], ""):
        assert kind.problem(bad) is not None, repr(bad)


@pytest.mark.skipif(not CHECK_JSONSCHEMA.exists(), reason="check-jsonschema is not installed in this environment")
def test_editors_ecma_patterns_refuse_a_trailing_newline(tmp_path: Path) -> None:
    """check-jsonschema reads `pattern` as ECMA regex (regress): $ does not match before a final newline."""
    schema = ROOT / "schemas" / "spec-file.schema.json"
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text('name: tiny\nserve:\n  host: "127.0.0.1"\ncluster:\n  slurm:\n    time: "04:00:00"\n')
    bad.write_text('name: "tiny\\n"\nserve:\n  host: "127.0.0.1\\n"\ncluster:\n  slurm:\n    time: "\u0660:00:00"\n')
    run = [str(CHECK_JSONSCHEMA), "--schemafile", str(schema)]
    assert subprocess.run([*run, str(good)], capture_output=True, text=True, timeout=120).returncode == 0
    result = subprocess.run([*run, str(bad)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    for where in ("$.name", "$.serve.host", "$.cluster.slurm.time"):
        assert where in result.stdout, result.stdout


def test_a_strict_template_refuses_an_unquoted_value() -> None:
    with pytest.raises(UnquotedValue):
        render(
            "nccl.env.j2",
            name="tiny",
            library=comment("NCCL"),
            settings=[("why", "NCCL_SOCKET_IFNAME", "eth0; touch pwned")],
        )
    text = render(
        "nccl.env.j2",
        name="tiny",
        library=comment("NCCL"),
        settings=[("why", "NCCL_SOCKET_IFNAME", shell("eth0; touch pwned"))],
    )
    assert "export NCCL_SOCKET_IFNAME='eth0; touch pwned'" in text


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b", "a\u2028b", "a\x1b[2Jb", "\n#!/bin/sh\n", "ok"])
def test_a_comment_stays_one_line(value: str) -> None:
    text = comment(value)
    assert "\n" not in text and "\r" not in text and text.isprintable()


@pytest.mark.parametrize(
    "value", ["a\nb", "$(touch x)", "`x`", "'\"", "$'\\n'", "${PATH}", "-n", "\\", "~", "ünï ✓", "", "ok"]
)
def test_shell_round_trips_through_bash(value: str) -> None:
    shown = subprocess.run(["bash", "-c", f"printf %s {shell(value)}"], capture_output=True, text=True, check=True)
    assert shown.stdout == value


@pytest.mark.parametrize("value", ["a b", "$x", "a\nb", "`x`", "x;y", "", True])
def test_word_refuses_anything_a_shell_would_read_differently(value: object) -> None:
    with pytest.raises(UnsafeValue):
        word(value)  # type: ignore[arg-type]


def test_json_artifacts_refuse_nan_and_infinity_by_path() -> None:
    with pytest.raises(NonFiniteNumber, match=r"memory\.stages\.1\.gib=nan"):
        dump_json({"memory": {"stages": [{"gib": 1.0}, {"gib": math.nan}]}})
    with pytest.raises(NonFiniteNumber, match=r"x=inf"):
        dump_json_line({"x": math.inf})
    assert dump_json({"a": 1.5}) == '{\n  "a": 1.5\n}\n'


def test_compiled_json_artifacts_are_standard_json(lmspec, tmp_path: Path) -> None:
    assert lmspec("compile", "-o", str(tmp_path), "hardware=cpu").code == 0

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant}")

    files = sorted((tmp_path / "tiny").rglob("*.json"))
    assert {p.name for p in files} >= {"plan.json", "mapping.json", "manifest.json"}
    for path in files:
        json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def test_divisors_and_hints_are_bounded_and_exact() -> None:
    for n in range(1, 3000):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    shown = listed(divisors(2**26))
    assert shown.count(",") <= HINT_VALUES and "(27 values)" in shown
    assert listed([1, 2, 4]) == "1, 2, 4"


def _balanced_stages_reference(num_layers: int, pp: int) -> tuple[int, ...]:
    """The O(pp^2) split that balanced_stages replaced, kept as the definition."""
    per_stage = -(-num_layers // pp)
    stages = [per_stage] * pp
    order = [i for pair in zip(range(pp), reversed(range(pp))) for i in pair]
    seen: list[int] = []
    for i in order:
        if i not in seen:
            seen.append(i)
    for i in seen[: per_stage * pp - num_layers]:
        stages[i] -= 1
    return tuple(stages)


def test_linear_stage_split_equals_the_quadratic_one() -> None:
    for layers in range(1, 65):
        for pp in range(1, layers + 1):
            assert balanced_stages(layers, pp) == _balanced_stages_reference(layers, pp), (layers, pp)
    assert sum(balanced_stages(1024, 1000)) == 1024


@pytest.mark.parametrize("first_dense", [None, 0, 1, 3, 60, 61, 200])
def test_param_counts_equal_the_per_layer_sums(first_dense: int | None) -> None:
    import yaml

    from lmspec.compiler.paths import SPECS_DIR

    data = yaml.safe_load((SPECS_DIR / "model" / "deepseek_v3.yaml").read_text(encoding="utf-8"))
    data = {k: v for k, v in data.items() if k != "defaults"}
    if first_dense is None:
        data["moe"] = None
        data["mla"], data["attention"] = None, "gqa"
    else:
        data["moe"]["first_dense_layers"] = first_dense
    m = from_dict(_model_type(), data)
    counts = count_params(m)
    layers = [layer_params(m, i) for i in range(m.num_layers)]
    moe = [lp for i, lp in enumerate(layers) if is_moe_layer(m, i)]
    dense = [lp for i, lp in enumerate(layers) if not is_moe_layer(m, i)]
    assert counts.attention == sum(lp.attention + lp.attention_norms for lp in layers)
    assert counts.total == counts.embedding + counts.output_head + sum(lp.total for lp in layers) + m.hidden_size
    assert counts.dense_mlp == sum(lp.dense_mlp for lp in dense)
    assert counts.shared_experts == sum(lp.dense_mlp for lp in moe)
    assert counts.routed_experts == sum(lp.routed_experts for lp in moe)
    assert counts.router == sum(lp.router for lp in moe)


def _model_type() -> type:
    import typing

    return typing.get_type_hints(Spec)["model"]
