"""`serve.workload` and `serve.slo`: the traffic an engine is sized for and the latency it must keep.

vLLM's own benchmark (`vllm bench serve`) describes a run the same way: prompt and output lengths
(fixed, or drawn around a mean), either a fixed number of clients each waiting for its answer
(`--max-concurrency`) or an open arrival process (`--request-rate`, Poisson), and the share of each
prompt already in the prefix cache. Latency targets are what DistServe calls an SLO: time to first
token and time per output token, each held at a percentile; goodput counts only requests that meet both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import key

REQUESTS_MAX = 1e6  # requests per second of one deployment
LATENCY_MS_MAX = 3.6e6  # an hour


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """Requests as the deployment sees them; lengths are means, drawn as `distribution` says."""

    input_tokens: int = key("Mean prompt length in tokens.", example=1024, minimum=1, maximum=kinds.TOKENS_MAX)
    output_tokens: int = key("Mean generated length in tokens.", example=128, minimum=1, maximum=kinds.TOKENS_MAX)
    distribution: Literal["fixed", "uniform", "exponential"] = key(
        "How lengths spread around their means: fixed = every request the same (vLLM bench's random "
        "dataset with range ratio 0); uniform = evenly over [1, 2 x mean - 1]; exponential = a long tail "
        "as chat traffic has (ShareGPT-like).",
        example="fixed",
    )
    concurrency: int | None = key(
        "Closed loop: this many clients, each sending its next request when the last one finished "
        "(vllm bench serve --max-concurrency); null = set by serve.workload.request_rate.",
        example=64,
        minimum=1,
        maximum=kinds.SEQS_MAX,
    )
    request_rate: float | None = key(
        "Open loop: requests per second arriving as a Poisson process over the whole deployment "
        "(vllm bench serve --request-rate); null with concurrency null = every request at once "
        "(request rate inf: the engine's capacity).",
        example=8.0,
        exclusive_minimum=0,
        maximum=REQUESTS_MAX,
    )
    prefix_cache_hit_rate: float = key(
        "Share of prompt tokens found in vLLM's prefix cache (a shared system prompt, multi-turn chat); "
        "they are not prefilled again. Counts only with serve.prefix_caching.",
        example=0.0,
        minimum=0,
        maximum=1,
    )


@dataclass(frozen=True, kw_only=True)
class SloSpec:
    """Latency targets; a request meets the SLO when both hold for it."""

    ttft_ms: float | None = key(
        "Time to first token target in ms (queueing plus prefill); null = no target.",
        example=2000,
        exclusive_minimum=0,
        maximum=LATENCY_MS_MAX,
    )
    tpot_ms: float | None = key(
        "Time per output token target in ms (mean gap between tokens after the first); null = no target.",
        example=100,
        exclusive_minimum=0,
        maximum=LATENCY_MS_MAX,
    )
    percentile: float = key(
        "Share of requests, in percent, that must meet each target (DistServe's SLO attainment).",
        example=90,
        minimum=1,
        maximum=99.9,
    )
