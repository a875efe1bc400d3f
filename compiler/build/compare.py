"""Compare two builds: what changed in the spec, in the key numbers of the Plan, in the
warnings, and in every artifact. Pure functions over {path: text} and the two typed Plans
(Build.open's, or a fresh compile's), so `lmspec diff` compares build directories or fresh
compiles alike, and a sweep's index can tabulate the same key numbers (of plan.json's document).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmspec.compiler.models.units import GIB, MIB
from lmspec.compiler.build.files import CARRIED, MANIFEST, REPORT

if TYPE_CHECKING:
    from lmspec.compiler.plan import Plan

REFERENCE_MFU = 0.4  # plan.json lists tokens/s at several MFUs; the key numbers quote this one

# The numbers a reviewer reads first, by label; each a pattern over plan.json's dotted
# leaves (its sections grow as the models do: the first leaf that matches is used).
KEY_NUMBERS: tuple[tuple[str, str], ...] = (
    ("world size", r"^layout\.world_size$"),
    ("tp x pp x dp x ep", r"^layout\.(tp|pp|dp|ep)$"),
    ("params", r"^params\.total$"),
    ("active params", r"^params\.active$"),
    ("memory/GPU", r"^memory\.(total|peak|worst)\w*_bytes$"),
    ("weights/GPU", r"^memory\.(per_gpu\.)?weights_bytes$"),
    ("activations/GPU", r"^memory\.(per_gpu\.)?activations_bytes$"),
    ("memory budget", r"^memory\.budget_bytes$"),
    ("fits", r"^memory\.fits$"),
    ("tokens/step", r"^batch\.tokens_per_step$"),
    (f"tokens/s @{REFERENCE_MFU:.0%} MFU", r"^flops\.mfu_at\.reference\.tokens_per_s$"),
    (f"step time @{REFERENCE_MFU:.0%} MFU", r"^flops\.mfu_at\.reference\.step_time_s$"),
    ("exposed comm/compute", r"^comm\.exposed_ratio_to_compute$"),
    ("comm share of step", r"^comm\.share_of_step$"),
    ("serve weights/GPU", r"^serve\.weights_bytes_per_gpu$"),
    ("KV capacity (tokens)", r"^serve\.max_tokens_in_cache$"),
    ("concurrent seqs", r"^serve\.max_concurrent_seqs$"),
)
_LAYOUT_KEYS = ("tp", "pp", "dp", "ep")


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value for every leaf of nested dicts (lists are values)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def format_value(path: str, value: Any) -> str:
    """A value as a reviewer reads it: bytes in GiB, shares in %, counts with separators."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        if path.endswith("_bytes") or "_bytes_" in path:
            return f"{value / GIB:.1f} GiB" if abs(value) >= GIB else f"{value / MIB:.1f} MiB"
        if re.search(r"(share|fraction|mfu|utilization|ratio|ratio_to_\w+|share_of_\w+)$", path):
            return f"{value * 100:.0f}%"
        if path.startswith("params."):
            return f"{value / 1e9:.3g}B" if value >= 1e9 else f"{value / 1e6:.3g}M"
        if path.endswith("_s") and not path.endswith("_per_s"):
            return f"{value:.3g} s"
        if isinstance(value, int) or abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(path, v) for v in value) + "]"
    return str(value)


def key_numbers(plan: dict[str, Any]) -> dict[str, str]:
    """Label -> formatted value of each key number plan.json carries (absent ones left out)."""
    flops = plan.get("flops")
    if isinstance(flops, dict) and isinstance(flops.get("mfu_at"), list):
        at = [row for row in flops["mfu_at"] if isinstance(row, dict) and row.get("mfu") == REFERENCE_MFU]
        plan = {**plan, "flops": {**flops, "mfu_at": {"reference": at[0]} if at else {}}}
    flat = leaves(plan)
    out: dict[str, str] = {}
    for label, pattern in KEY_NUMBERS:
        matches = [p for p in flat if re.search(pattern, p)]
        if not matches:
            continue
        if label == "tp x pp x dp x ep":
            by_key = {p.rsplit(".", 1)[1]: flat[p] for p in matches}
            out[label] = " x ".join(str(by_key.get(k, "-")) for k in _LAYOUT_KEYS)
        else:
            out[label] = format_value(matches[0], flat[matches[0]])
    line = flat.get("comm.warning_ratio")
    ratio = flat.get("comm.exposed_ratio_to_compute")
    if isinstance(line, (int, float)) and isinstance(ratio, (int, float)) and ratio > line:
        out["exposed comm/compute"] += f" (over the {line:.0%} line)"
    return out


def _warnings(report: str | None) -> list[str]:
    """The bullet lines under REPORT.md's `## Warnings` heading."""
    if not report:
        return []
    section = re.search(r"^## Warnings\n(.*?)(?=^## |\Z)", report, re.S | re.M)
    return [line[2:] for line in section.group(1).splitlines() if line.startswith("- ")] if section else []


def arrow(old: str, new: str) -> str:
    """`41.2→20.6 GiB`: a shared unit is written once."""
    old_parts, new_parts = old.rsplit(" ", 1), new.rsplit(" ", 1)
    if len(old_parts) == len(new_parts) == 2 and old_parts[1] == new_parts[1] and old_parts[1].isalpha():
        return f"{old_parts[0]}→{new}"
    return f"{old}→{new}"


@dataclass(frozen=True)
class Comparison:
    """What changed between build A and build B."""

    spec_changes: tuple[tuple[str, str, str], ...]  # key, old, new
    number_changes: tuple[tuple[str, str, str], ...]  # label, old, new (key numbers only)
    warnings_added: tuple[str, ...]
    warnings_removed: tuple[str, ...]
    files: tuple[tuple[str, str], ...]  # (status M/A/D, path) for differing files
    # one unified diff per differing file, but manifest.json and the carried files (made from the others: the
    # build ConfigMap repeats every change again)
    unified: tuple[str, ...]

    @property
    def identical(self) -> bool:
        return not self.files

    def headline(self) -> str:
        """One line: `parallel.tp 4→8: weights/GPU 41.2→20.6 GiB, world size ...`."""
        spec = ", ".join(f"{k} {arrow(a, b)}" for k, a, b in self.spec_changes) or "no spec change"
        numbers = ", ".join(f"{label} {arrow(a, b)}" for label, a, b in self.number_changes) or "key numbers unchanged"
        return f"{spec}: {numbers}"


def _changes(old: dict[str, Any], new: dict[str, Any], fmt: Any) -> list[tuple[str, str, str]]:
    return [
        (k, fmt(k, old.get(k, "-")), fmt(k, new.get(k, "-")))
        for k in dict.fromkeys([*old, *new])
        if old.get(k, "-") != new.get(k, "-")
    ]


def compare(
    old: dict[str, str], new: dict[str, str], old_plan: Plan, new_plan: Plan, old_label: str = "a", new_label: str = "b"
) -> Comparison:
    """Compare two builds given as {relative path: text} and the Plans they were compiled from."""
    old_spec, new_spec = leaves(old_plan.spec_dict()), leaves(new_plan.spec_dict())
    numbers = _changes(key_numbers(old_plan.to_document()), key_numbers(new_plan.to_document()), lambda _k, v: v)
    old_warn, new_warn = _warnings(old.get(REPORT)), _warnings(new.get(REPORT))
    files, unified = [], []
    for path in sorted(old.keys() | new.keys()):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        files.append(("A" if a is None else "D" if b is None else "M", path))
        if path not in (MANIFEST, *CARRIED):
            unified.append(
                "".join(
                    difflib.unified_diff(
                        (a or "").splitlines(keepends=True),
                        (b or "").splitlines(keepends=True),
                        fromfile=f"{old_label}/{path}" if a is not None else "/dev/null",
                        tofile=f"{new_label}/{path}" if b is not None else "/dev/null",
                    )
                )
            )
    return Comparison(
        spec_changes=tuple(_changes(old_spec, new_spec, format_value)),
        number_changes=tuple(numbers),
        warnings_added=tuple(w for w in new_warn if w not in old_warn),
        warnings_removed=tuple(w for w in old_warn if w not in new_warn),
        files=tuple(files),
        unified=tuple(unified),
    )


def render(comparison: Comparison, *, old_label: str, new_label: str, unified: bool = True) -> str:
    """The review text: headline, key numbers, warnings, changed files, then the diffs."""
    if comparison.identical:
        return f"{old_label} and {new_label}: identical\n"
    lines = [f"{old_label} → {new_label}", comparison.headline(), ""]
    if comparison.spec_changes:
        lines.append("spec:")
        lines += [f"  {k}: {a} → {b}" for k, a, b in comparison.spec_changes]
    if comparison.number_changes:
        lines.append("key numbers:")
        lines += [f"  {label}: {a} → {b}" for label, a, b in comparison.number_changes]
    lines += [f"new warning: {w}" for w in comparison.warnings_added]
    lines += [f"warning gone: {w}" for w in comparison.warnings_removed]
    lines.append(f"files ({len(comparison.files)} differ):")
    lines += [f"  {status} {path}" for status, path in comparison.files]
    text = "\n".join(lines) + "\n"
    if unified:
        text += "\n" + "".join(d if d.endswith("\n") else d + "\n" for d in comparison.unified if d)
    return text
