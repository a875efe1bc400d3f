"""The committed JSON Schema is the generated one, and it is a valid draft 2020-12 schema."""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator

from lmspec.compiler.paths import SCHEMA_FILE
from lmspec.compiler.spec.schema import spec_schema, spec_schema_text


def test_committed_schema_is_up_to_date() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == spec_schema_text(), (
        "schemas/spec.schema.json is stale: run `lmspec schema > schemas/spec.schema.json`"
    )


def test_schema_is_valid_draft_2020_12() -> None:
    Draft202012Validator.check_schema(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))


def _properties(node: dict, path: str = ""):
    for name, prop in node.get("properties", {}).items():
        yield f"{path}{name}", prop
        for option in [prop, *prop.get("anyOf", [])]:
            yield from _properties(option, f"{path}{name}.")


def test_every_key_has_a_description_and_objects_are_closed() -> None:
    props = list(_properties(spec_schema()))
    assert len(props) > 100
    for key, prop in props:
        assert prop.get("description"), f"{key} has no description"

    # the one open mapping: megatron-core's field names, checked by rules/megatron_extra.py against its dataclasses
    # and vLLM's option names, checked by rules/vllm_extra.py against vLLM's own parser
    open_mappings = {f"train.megatron.extra.{section}" for section in ("transformer_config", "ddp", "optimizer")}
    open_mappings.add("serve.extra_args")

    def closed(node: dict, path: str = "") -> None:
        if node.get("type") == "object":
            assert node["additionalProperties"] is False or path in open_mappings, path
        for name, child in node.get("properties", {}).items():
            closed(child, f"{path}.{name}" if path else name)
        for option in node.get("anyOf", []):
            closed(option, path)

    closed(spec_schema())


def test_lmspec_schema_prints_it(lmspec) -> None:
    result = lmspec("schema")
    assert result.code == 0
    assert json.loads(result.out) == spec_schema()
