"""KV capacity against published vLLM start-up lines: one row per point of
tests/data/serving/kv_capacity.json with the published and predicted tokens and their ratio.

No constant is fitted to these points (too few come from allowed sources), so there is no
leave-one-source-out median to print; the script says so.

    .venv/bin/python bench/serve_kv_capacity.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.specs import spec_of  # noqa: E402

from lmspec.compiler.models.serve_memory import estimate_serve_memory, kv_bytes_per_token, tokens_in_cache  # noqa: E402
from lmspec.compiler.models.units import GIB  # noqa: E402

DATA = ROOT / "tests" / "data" / "serving" / "kv_capacity.json"


def main() -> None:
    points = json.loads(DATA.read_text())["points"]
    print(f"{'point':32} {'scope':20} {'published':>10} {'predicted':>10} {'ratio':>7}")
    for point in points:
        spec = spec_of(*point["overrides"])
        if point["scope"] == "tokens_from_budget":
            predicted = tokens_in_cache(round(point["budget_gib"] * GIB), kv_bytes_per_token(spec))
        else:
            predicted = estimate_serve_memory(spec).max_tokens_in_cache
        ratio = predicted / point["published_tokens"]
        print(f"{point['id']:32} {point['scope']:20} {point['published_tokens']:>10,} {predicted:>10,} {ratio:>7.4f}")
    print("fitted constants: none (leave-one-source-out median not applicable)")


if __name__ == "__main__":
    main()
