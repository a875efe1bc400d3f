"""KV capacity against published vLLM start-up lines: one row per point of
tests/data/serving/kv_capacity.json with the published and predicted tokens and their ratio, and the
published 'Available KV cache memory' against lmspec's cache budget where the point is priced in full.
The lines lmspec cannot price follow, each with its reason (kept out of the error figure).

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


def predicted(point: dict) -> tuple[int, float | None]:
    """(tokens, budget GiB): the budget only where lmspec prices the whole memory budget."""
    spec = spec_of(*point["overrides"])
    if point["scope"] == "tokens_from_budget":
        return tokens_in_cache(round(point["budget_gib"] * GIB), kv_bytes_per_token(spec)), None
    memory = estimate_serve_memory(spec)
    return memory.max_tokens_in_cache, memory.cache_budget_bytes / GIB


def main() -> None:
    data = json.loads(DATA.read_text())
    print(f"{'point':32} {'scope':18} {'tokens pub':>10} {'pred':>10} {'ratio':>7}", end=" ")
    print(f"{'GiB pub':>8} {'pred':>8} {'ratio':>7}")
    errors = []
    for point in data["points"]:
        tokens, budget = predicted(point)
        ratio = tokens / point["published_tokens"]
        errors.append(abs(ratio - 1))
        pub_gib = point.get("budget_gib")
        gib = f"{pub_gib:>8.2f} " if pub_gib is not None else f"{'-':>8} "
        gib += f"{budget:>8.2f} {budget / pub_gib:>7.4f}" if budget is not None and pub_gib else f"{'-':>8} {'-':>7}"
        published = point["published_tokens"]
        print(f"{point['id']:32} {point['scope']:18} {published:>10,} {tokens:>10,} {ratio:>7.4f} {gib}")
    print(f"error figure ({len(errors)} priced points): max |ratio - 1| = {max(errors):.4f}")
    print("left out (not in the error figure):")
    for point in data["left_out"]:
        line = f"  {point['id']:32}"
        if "overrides" in point:  # priced from its published budget, to show the size of the gap
            tokens = tokens_in_cache(round(point["budget_gib"] * GIB), kv_bytes_per_token(spec_of(*point["overrides"])))
            published = point["published_tokens"]
            line += f" published {published:,}, from budget {tokens:,} ({tokens / published:.4f})"
        print(f"{line}\n      {point['reason']}")
    print("fitted constants: none (leave-one-source-out median not applicable)")


if __name__ == "__main__":
    main()
