"""Issue 41: vLLM's CPU engine timed on the tiny model and a larger random Llama at several batch sizes and
lengths, and lmspec's serving model, given this machine's CPU parameters measured in the same run, predicts
TTFT and TPOT within 15% (the median point; every point within WORST, and the table shows each).

The parameters are never fitted to the times they predict (tests/helpers/vllm_timing.py,
vllm_timing_predict.py): the GEMM rate at each prefill's rows and the weight-read rate at each decode batch
are torch microbenchmarks of vLLM's own fp32 kernel, sampled between the engine's rounds; the per-step,
per-layer and per-sequence overheads come from two probe models (hidden 64, 1 and 8 layers) that are not
among the points, stepped warm and, for the 100 MB model that overflows the cache, cold. The measured points, the
parameters and the table land in the test's tmp directory (timing.json, predicted.json) and on stdout (-s).

One child process, ~90 s on 2 cores (vLLM's import ~12 s, seven engines of ~2 s each, the rounds).
Timing on a shared machine is noisy: the child raises its priority where allowed, each figure is a median
over rounds (TPOT the median step of each), and the rates come from the same minutes as the times.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
from helpers.marks import needs_vllm
from helpers.vllm_timing import measure
from helpers.vllm_timing_predict import issue_models, predict, table

pytestmark = [needs_vllm, pytest.mark.slow]

ROUNDS = 5
MEDIAN_ERROR = 0.15  # issue 41
# A point's own error can reach this: a round's noise on a shared 2-core machine (spreads of 20-40% over
# five rounds), and the cold probes' whole-stream eviction against a step that streams as it computes.
WORST = 0.30


def test_cpu_engine_ttft_and_tpot_are_predicted_within_15_percent(tmp_path: Path) -> None:
    run = measure(issue_models(), tmp_path, rounds=ROUNDS)
    compared = predict(run, tmp_path)
    text = table(run, compared)
    print(text)
    rows = [
        {**dataclasses.asdict(c.timed), "predicted_ttft_s": c.ttft_s, "predicted_tpot_s": c.tpot_s} for c in compared
    ]
    (tmp_path / "predicted.json").write_text(json.dumps(rows, indent=1))
    for name, ratios in (("TTFT", [c.ttft_ratio for c in compared]), ("TPOT", [c.tpot_ratio for c in compared])):
        assert statistics.median(abs(r - 1) for r in ratios) <= MEDIAN_ERROR, f"{name} median error\n{text}"
    worst = [miss for c in compared for miss in c.misses(WORST)]
    assert not worst, "\n".join([*worst, text])
