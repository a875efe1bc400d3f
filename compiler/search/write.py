"""The winner as a spec file `lmspec compile --spec` accepts unchanged.

The file is a Hydra primary config: a defaults list of lmspec's built-in groups (the
choices the plan was composed with) and, under `_self_`, exactly the values where the
planned job differs from those groups. The difference is taken by composing the file
itself, and the file is composed once more to prove it resolves to the planned spec.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from lmspec.compiler.errors import UsageError
from lmspec.compiler.spec.load import compose_spec

# as specs/config.yaml
GROUP_ORDER = ("model", "parallel", "train", "serve", "cluster", "convert", "quantize", "hardware")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


_SAME: Any = object()  # marks "no difference"


def _differences(target: Any, base: Any) -> Any:
    """The parts of `target` that differ from `base` (whole lists; nested mappings key by key)."""
    if isinstance(target, dict) and isinstance(base, dict):
        out = {}
        for key, value in target.items():
            if key not in base:
                out[key] = value
                continue
            diff = _differences(value, base[key])
            if diff is not _SAME:
                out[key] = diff
        return out or _SAME
    return _SAME if target == base else target


def _text(header: str, choices: dict[str, str], body: dict[str, Any]) -> str:
    defaults = [{group: choices[group]} for group in GROUP_ORDER if group in choices] + ["_self_"]
    dumped = yaml.safe_dump({"defaults": defaults}, sort_keys=False, default_flow_style=False)
    rest = yaml.safe_dump(body, sort_keys=False, default_flow_style=False, width=1000) if body else ""
    return header + dumped + "\n" + rest


def spec_file_text(path: Path, overrides: list[str], spec_file: Path | None, header: str) -> str:
    """Text of a primary config at `path` resolving to the spec composed from `overrides`."""
    name = path.stem
    if not NAME.match(name) or path.suffix != ".yaml":
        raise UsageError(
            f"--write {path}: the file must be <name>.yaml with a name of letters, digits, _ . -; "
            "the name becomes the job's name"
        )
    composed = compose_spec([*overrides, f"name={name}"], spec_file)
    target = composed.spec
    choices = {k: v for k, v in composed.choices.items() if "/" not in k}
    path.parent.mkdir(parents=True, exist_ok=True)
    # composed next to its destination, so it resolves exactly as the written file will
    handle, probe_name = tempfile.mkstemp(suffix=".yaml", prefix=".lmspec-plan-", dir=path.parent)
    os.close(handle)
    probe = Path(probe_name)
    try:
        probe.write_text(_text("", choices, {"name": name}), encoding="utf-8")
        body = _differences(target, compose_spec([], probe).spec)
        body = {"name": name, **({} if body is _SAME else {k: v for k, v in body.items() if k != "name"})}
        text = _text(header, choices, body)
        probe.write_text(text, encoding="utf-8")
        if compose_spec([], probe).spec != target:
            raise RuntimeError(f"the spec written for {path} does not resolve to the planned spec")
    finally:
        probe.unlink(missing_ok=True)
    return text
