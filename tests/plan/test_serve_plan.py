"""`lmspec plan --serve` (issue 41, item 4): serving layouts ranked by goodput under serve.slo, every one of
them accepted by lmspec's own serving rules and its memory budget, priced by serve_perf.

The search runs the serving rules themselves on each candidate; the memory budget it judges with the model
the rule reads (compiler/search/serve_legality.py says why), so these tests run the rule on every candidate
and ask for the same verdict."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.cli import CliResult

from lmspec.compiler.cli.plan import _typed_spec
from lmspec.compiler.errors import Problem
from lmspec.compiler.models.serve_memory import estimate_serve_memory
from lmspec.compiler.models.serve_perf import serve_perf
from lmspec.compiler.rules import SERVING_RULES
from lmspec.compiler.rules.context import ServingContext
from lmspec.compiler.rules.serve_budget import serving_fits_memory
from lmspec.compiler.search.serve_evaluate import PREFILL_BUDGET
from lmspec.compiler.search.serve_legality import BUDGET_RULE
from lmspec.compiler.search.serve_search import ServeSearchResult, search_serve
from lmspec.compiler.search.serve_space import candidates, pool_candidates, serve_axes
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import ServingSpec, serving

Lmspec = Callable[..., CliResult]
DEEPSEEK_16_H100 = "deepseek_v3_serve_16gpu_h100_fp8"
DEEPSEEK_8_H200 = "deepseek_v3_serve_8gpu_h200_fp8"
LLAMA_8_H100 = "llama3_70b_serve_8gpu_h100_bf16"
SLO = "serve.slo={ttft_ms: 2000, tpot_ms: 100, percentile: 90}"
TWO_NODES = ("hardware.nodes=2", "serve.host=0.0.0.0")  # a second node: disaggregated pools are searched too


def _composed(spec: str, *overrides: str) -> tuple[ServingSpec, Origins]:
    typed, composed = _typed_spec(argparse.Namespace(spec=Path(spec), overrides=list(overrides)))
    served = serving(typed)
    assert served is not None
    return served, composed.origins


def _search(spec: str, *overrides: str, objective: str = "throughput") -> ServeSearchResult:
    return search_serve(*_composed(spec, *overrides), objective)


def _errors(problems: list[Problem]) -> list[str]:
    return [p.message for p in problems if p.severity == "error"]


@pytest.mark.parametrize(
    ("spec", "overrides", "objective"),
    [
        pytest.param(LLAMA_8_H100, (SLO,), "throughput", id="llama-slo"),
        pytest.param(DEEPSEEK_16_H100, (), "throughput", id="deepseek-capacity"),
        pytest.param(DEEPSEEK_8_H200, (), "cost", id="deepseek-h200-per-gpu"),
    ],
)
def test_the_ranking_follows_goodput_and_each_row_is_serve_perf_of_its_spec(
    spec: str, overrides: tuple[str, ...], objective: str
) -> None:
    result = _search(spec, *overrides, objective=objective)
    assert result.feasible >= 5
    primary = [p.goodput_per_gpu if objective == "cost" else p.perf.goodput_rps for p in result.ranked]
    assert primary == sorted(primary, reverse=True) and primary[0] > primary[-1]
    for p in result.ranked[:3]:
        applied = p.candidate.applied(result.spec)
        assert serve_perf(applied, estimate_serve_memory(applied)) == p.perf


@pytest.mark.parametrize(
    ("spec", "overrides"),
    [
        pytest.param(DEEPSEEK_16_H100, (), id="deepseek-16-h100"),
        pytest.param(LLAMA_8_H100, TWO_NODES, id="llama-2-nodes-with-pools"),
    ],
)
def test_every_candidate_is_judged_as_lmspec_check_judges_it(spec: str, overrides: tuple[str, ...]) -> None:
    """Every serving rule, the memory budget's among them, run on each candidate the space holds: one any of
    them refuses is never ranked, an aggregated one all accept always is, and the budget's refusals are
    counted under its name."""
    served, origins = _composed(spec, *overrides)
    result = search_serve(served, origins)
    ranked = {p.candidate for p in result.ranked}
    axes, rejected = serve_axes(served), dict[str, int]()
    over_budget = 0
    for candidate in [*candidates(served, axes, rejected), *pool_candidates(served, axes, rejected)]:
        ctx = ServingContext(candidate.applied(served), origins)
        budget = _errors(list(serving_fits_memory(ctx)))
        others = _errors([p for rule in SERVING_RULES if rule is not serving_fits_memory for p in rule(ctx)])
        over_budget += bool(budget and not others)
        if budget or others:
            assert candidate not in ranked, (candidate, budget, others)
        elif candidate.disaggregation is None:  # a pool's prefill engine is judged apart (its own test)
            assert candidate in ranked, candidate
    assert over_budget == result.rejected[BUDGET_RULE] > 0
    assert rejected == {k: v for k, v in result.rejected.items() if k in rejected}


def test_the_counts_add_up_to_the_raw_space(lmspec: Lmspec) -> None:
    result = lmspec("plan", "--spec", DEEPSEEK_16_H100, "--serve", "--format", "json", "--top", "3")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    budget = data["rejected"].pop(BUDGET_RULE)
    prefill = data["rejected"].pop(PREFILL_BUDGET, 0)
    assert sum(data["rejected"].values()) + data["legal_candidates"] == data["raw_candidates"]
    assert budget + prefill + data["feasible_candidates"] == data["legal_candidates"]
    assert [row["rank"] for row in data["top"]] == [1, 2, 3]


def test_deepseek_v3_on_16_h100_gets_a_sensible_winner(lmspec: Lmspec) -> None:
    """All 16 GPUs, experts spread over the ranks (the 671B FP8 weights fit no engine without it), attention
    TP inside a node, and at least the goodput of vLLM's own recipe (the shipped spec: TP1 DP16 EP)."""
    result = _search(DEEPSEEK_16_H100)
    best = result.ranked[0]
    assert best.candidate.gpus == 16 and best.candidate.expert_parallel and best.candidate.tp <= 8
    assert all(p.candidate.expert_parallel for p in result.ranked)
    own = next(p for p in result.ranked if (p.candidate.tp, p.candidate.pp, p.candidate.dp) == (1, 1, 16))
    assert best.perf.goodput_rps >= own.perf.goodput_rps
    assert best.memory.max_tokens_in_cache >= result.spec.serve.max_model_len
    shown = lmspec("plan", "--spec", DEEPSEEK_16_H100, "--top", "3")  # a serve-only spec plans its serving
    assert shown.code == 0, shown.err
    assert "deepseek_v3 serving on 16 x H100-SXM5-80GB" in shown.out
    assert "the spec's own layout (TP1 PP1 DP16 EP, 1 replica(s))" in shown.out


def test_a_second_node_brings_disaggregated_pools_priced_by_serve_perf() -> None:
    result = _search(LLAMA_8_H100, *TWO_NODES, SLO)
    pools = [p for p in result.ranked if p.candidate.disaggregation is not None]
    assert pools
    for p in pools[:2]:
        applied = p.candidate.applied(result.spec)
        assert applied.serve.disaggregation == p.candidate.disaggregation
        assert serve_perf(applied, estimate_serve_memory(applied)) == p.perf
        d = p.candidate.disaggregation
        assert d is not None and d.prefill.engines + d.decode.engines == 2 and p.candidate.gpus == 16
    assert not any(p.candidate.disaggregation for p in _search(LLAMA_8_H100).ranked)  # one node: no pools


def test_a_model_that_fits_no_layout_says_what_would(lmspec: Lmspec) -> None:
    result = lmspec("plan", "--serve", "--spec", DEEPSEEK_8_H200, "hardware=h100_80g")
    result.assert_reports(
        1,
        [
            "error: no serving layout of deepseek_v3 fits on 8 x H100-SXM5-80GB",
            "less KV cache than one serve.max_model_len=32768 sequence",
            "hardware.nodes=2",
        ],
    )


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        pytest.param(
            ("--spec", "llama3_8b_pretrain_8gpu_h100_bf16", "serve=null"),
            ["this spec does not serve (serve: null)", "drop serve=null"],
            id="no-serve",
        ),
        pytest.param(
            ("--spec", LLAMA_8_H100, "--gpus", "16"),
            ["--gpus searches training GPU counts", "set hardware.nodes=N"],
            id="gpus",
        ),
        pytest.param(
            ("--spec", LLAMA_8_H100, "--objective", "min-gpus"),
            ["--objective min-gpus is training's", "goodput per GPU (cost)"],
            id="min-gpus",
        ),
    ],
)
def test_usage_errors_name_the_fix(lmspec: Lmspec, args: tuple[str, ...], fragments: list[str]) -> None:
    lmspec("plan", "--serve", *args).assert_reports(2, fragments)
