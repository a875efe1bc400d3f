"""Price a legal serving candidate: its memory per GPU, whether vLLM fits it, its goodput and latencies.

Memory is estimate_serve_memory, the function rules/serve_budget.py reads; a candidate fits where the KV
cache left after the weights and vLLM's reserve holds one serve.max_model_len sequence (max_tokens_in_cache,
the rule's own measure). Performance is serve_perf, the one owner of TTFT, TPOT, throughput and goodput,
on the candidate's spec: the numbers are those `lmspec explain` shows for the compiled winner. A
disaggregated candidate's memory is its decode engine's (serve.tp/pp/dp, the engine that holds the KV cache
while it decodes); its prefill engine must fit too, judged the same way (no rule judges it yet).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmspec.compiler.models.serve_disagg import pool_spec
from lmspec.compiler.models.serve_memory import ServeMemory, estimate_serve_memory
from lmspec.compiler.models.serve_perf import ServePerf, serve_perf
from lmspec.compiler.search.serve_space import ServeCandidate
from lmspec.compiler.spec.sections import ServingSpec

PREFILL_BUDGET = "prefill pool fits memory (serve_budget.serving_fits_memory's measure on the prefill engine)"


@dataclass(frozen=True)
class PricedServe:
    """A candidate that fits, with its memory and its performance under serve.workload and serve.slo."""

    candidate: ServeCandidate
    memory: ServeMemory
    perf: ServePerf

    @property
    def goodput_per_gpu(self) -> float:
        return self.perf.goodput_rps / self.candidate.gpus


def fitting_memory(spec: ServingSpec) -> tuple[ServeMemory, bool]:
    """The candidate's memory, and whether vLLM holds one serve.max_model_len sequence in its KV cache."""
    memory = estimate_serve_memory(spec)
    return memory, memory.max_tokens_in_cache >= spec.serve.max_model_len


def prefill_fits(spec: ServingSpec) -> bool:
    """A disaggregated deployment's prefill engine fits as the budget rule measures an engine (its serve.tp/pp/dp
    are the decode engine's, which the rule judges); an aggregated one has no prefill pool."""
    d = spec.serve.disaggregation
    return d is None or fitting_memory(pool_spec(spec, d.prefill.tp, d.prefill.dp))[1]


def price(candidate: ServeCandidate, spec: ServingSpec, memory: ServeMemory) -> PricedServe:
    """`spec` is the candidate applied (ServeCandidate.applied) and `memory` its fitting_memory."""
    return PricedServe(candidate, memory, serve_perf(spec, memory))
