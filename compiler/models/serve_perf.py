"""What the spec's deployment serves under its workload: TTFT, TPOT, throughput and goodput.

The one owner of serving performance: engine_shape (the GPU's costs, serve_step) and the
workload's steady state (serve_traffic) for one engine, scaled to the deployment. vLLM runs each
data-parallel rank as its own engine, and serve.replicas copies the whole engine, so a deployment of
replicas x dp engines splits the clients or the request rate evenly over them (vLLM's data-parallel
load balancer and the user's load balancer in front of the replicas both balance by queue length).
A disaggregated deployment (serve.disaggregation) is priced pool by pool (serve_disagg).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models import serve_defaults
from lmspec.compiler.models.dims import device_kind
from lmspec.compiler.models.serve_disagg import Pools, pool_spec, transfer_rate
from lmspec.compiler.models.serve_memory import ServeMemory, estimate_serve_memory
from lmspec.compiler.models.serve_step import ServeConstants, StepTime, constants_for, engine_shape
from lmspec.compiler.models.serve_traffic import Drafting, Engine, EngineLimits, Steady, quantile
from lmspec.compiler.spec.sections import ServingSpec

DEFAULT_PERCENTILE = 90.0  # the percentile TTFT is shown at without an SLO (DistServe's attainment goal)


@dataclass(frozen=True, kw_only=True)
class ServePerf:
    engines: int  # engines that decode: replicas x dp, or the decode pool's
    running_per_engine: float  # requests in each (decoding) engine at the workload's load
    capacity_per_engine: int  # most requests an engine runs at once (slots, KV cache)
    step: StepTime  # one (decode) engine step at that load
    ttft_s: float  # mean, queueing included (inf when the load exceeds the deployment)
    ttft_p_s: float  # at `percentile`
    tpot_s: float
    output_tokens_per_s: float  # the deployment
    requests_per_s: float  # the deployment
    prefill_tokens_per_s: float  # one engine prefilling only, a full max_num_batched_tokens chunk a step
    slo_attainment: float | None  # share of requests meeting serve.slo at the workload's load
    goodput_rps: float  # the deployment: largest request rate with slo.percentile % within the targets
    saturated: bool
    percentile: float


def drafting(spec: ServingSpec) -> Drafting:
    s = spec.serve.speculative
    return Drafting(drafts=s.num_tokens, acceptance=s.acceptance_rate) if s else Drafting(drafts=0, acceptance=0.0)


def engine_of(
    spec: ServingSpec, memory: ServeMemory, constants: ServeConstants | None = None, prefills: bool = True
) -> Engine:
    v = spec.serve
    limits = EngineLimits(
        slots=serve_defaults.max_num_seqs(spec),
        kv_tokens=memory.max_tokens_in_cache,
        batched_tokens=serve_defaults.max_num_batched_tokens(spec),
    )
    hit = v.workload.prefix_cache_hit_rate if v.prefix_caching else 0.0
    shape = engine_shape(spec, memory)
    chosen = constants or constants_for(device_kind(spec))
    return Engine(shape, limits, chosen, v.workload, hit, drafting(spec), prefills)


def _steady(spec: ServingSpec, engine: Engine, engines: int) -> Steady:
    w = spec.serve.workload
    if w.concurrency is not None:
        return engine.closed_loop(w.concurrency / engines)
    if w.request_rate is not None:
        return engine.open_loop(w.request_rate / engines)
    return engine.at(engine.capacity)


def _prefill_tokens_per_s(engine: Engine) -> float:
    chunk = engine.limits.batched_tokens
    return chunk / engine.prefill_step_s(chunk, chunk / 2)


def serve_perf(spec: ServingSpec, memory: ServeMemory, constants: ServeConstants | None = None) -> ServePerf:
    v = spec.serve
    if v.disaggregation is not None:
        return _disaggregated(spec, constants)
    engines = v.replicas * v.dp
    engine = engine_of(spec, memory, constants)
    s = _steady(spec, engine, engines)
    percentile = v.slo.percentile if v.slo else DEFAULT_PERCENTILE
    longest = quantile(v.workload.distribution, v.workload.input_tokens, percentile / 100)
    return ServePerf(
        engines=engines,
        running_per_engine=round(s.running, 2),
        capacity_per_engine=engine.capacity,
        step=s.step,
        ttft_s=s.ttft_s,
        ttft_p_s=math.inf if s.saturated else engine.ttft_for_prompt(s, longest),
        tpot_s=s.tpot_s,
        output_tokens_per_s=s.output_tokens_per_s * engines,
        requests_per_s=s.requests_per_s * engines,
        prefill_tokens_per_s=_prefill_tokens_per_s(engine),
        slo_attainment=engine.slo_attainment(s, v.slo) if v.slo else None,
        goodput_rps=engine.goodput(v.slo) * engines,
        saturated=s.saturated,
        percentile=percentile,
    )


def pools_of(spec: ServingSpec, constants: ServeConstants | None = None) -> Pools:
    d = spec.serve.disaggregation
    assert d is not None
    prefill_spec, decode_spec = pool_spec(spec, d.prefill.tp, d.prefill.dp), pool_spec(spec, d.decode.tp, d.decode.dp)
    prefill_memory = estimate_serve_memory(prefill_spec)
    return Pools(
        prefill=engine_of(prefill_spec, prefill_memory, constants),
        prefill_engines=d.prefill.engines * d.prefill.dp,
        decode=engine_of(decode_spec, estimate_serve_memory(decode_spec), constants, prefills=False),
        decode_engines=d.decode.engines * d.decode.dp,
        transfer_bytes_per_token=prefill_memory.kv_cache_bytes_per_token,
        transfer_bytes_per_s=transfer_rate(spec),
    )


def _disaggregated(spec: ServingSpec, constants: ServeConstants | None) -> ServePerf:
    v, w = spec.serve, spec.serve.workload
    pools = pools_of(spec, constants)
    rate = pools.rate_of(spec)
    capacity = pools.capacity()
    saturated = rate >= capacity
    s = pools.decode_at(min(rate, capacity * (1 - 1e-9)))
    percentile = v.slo.percentile if v.slo else DEFAULT_PERCENTILE
    longest = quantile(w.distribution, w.input_tokens, percentile / 100)
    served = min(rate, capacity)
    return ServePerf(
        engines=pools.decode_engines,
        running_per_engine=round(s.running, 2),
        capacity_per_engine=pools.decode.capacity,
        step=s.step,
        ttft_s=math.inf if saturated else pools.ttft(rate, w.input_tokens),
        ttft_p_s=math.inf if saturated else pools.ttft(rate, longest),
        tpot_s=s.tpot_s,
        output_tokens_per_s=served * w.output_tokens,
        requests_per_s=served,
        prefill_tokens_per_s=_prefill_tokens_per_s(pools.prefill),
        slo_attainment=pools.attainment(rate, v.slo) if v.slo else None,
        goodput_rps=pools.goodput(v.slo),
        saturated=saturated,
        percentile=percentile,
    )


def perf_dict(perf: ServePerf) -> dict[str, Any]:
    """plan.json's serving performance: times in ms, rates per second, null where the load is never served."""

    def ms(seconds: float) -> float | None:
        return None if math.isinf(seconds) else round(seconds * 1e3, 3)

    return {
        "engines": perf.engines,
        "running_per_engine": perf.running_per_engine,
        "capacity_per_engine": perf.capacity_per_engine,
        "ttft_ms": ms(perf.ttft_s),
        f"ttft_p{perf.percentile:g}_ms": ms(perf.ttft_p_s),
        "tpot_ms": ms(perf.tpot_s),
        "step_ms": {k.removesuffix("_s"): round(v * 1e3, 3) for k, v in dataclasses.asdict(perf.step).items()},
        "output_tokens_per_s": round(perf.output_tokens_per_s, 1),
        "requests_per_s": round(perf.requests_per_s, 3),
        "prefill_tokens_per_s_per_engine": round(perf.prefill_tokens_per_s, 1),
        "slo_attainment": None if perf.slo_attainment is None else round(perf.slo_attainment, 4),
        "goodput_requests_per_s": round(perf.goodput_rps, 3),
        "saturated": perf.saturated,
    }
