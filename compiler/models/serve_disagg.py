"""Disaggregated prefill and decode (serve.disaggregation): two pools of engines, a request's KV cache
moved from the prefill engine that made it to a decode engine by vLLM's KV connector.

DistServe's and Splitwise's argument, priced with the same step model as an aggregated engine:
- a prefill engine runs prompts only, as many as fit in max_num_batched_tokens a step; prompts arriving
  at random queue for it (M/D/1), and a request's first token comes when its prompt's step ends, plus
  the transfer of its KV cache (each GPU's share over its share of the node's NICs, the pools on other
  nodes);
- a decode engine runs decode steps only (serve_traffic.Engine with prefills=False), so no prompt
  chunk lengthens its steps: TPOT is the decode step at the load it carries.
The deployment serves the rate both pools keep up with; goodput is the largest rate at which
slo.percentile % of requests meet both targets (TTFT from the prefill pool, TPOT from the decode pool).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from lmspec.compiler.models.serve_traffic import BISECTION_STEPS, Engine, Steady, largest_where, share_meeting
from lmspec.compiler.models.steptime_inputs import bus_links
from lmspec.compiler.spec.sections import ServingSpec
from lmspec.compiler.spec.sections.serve_workload import SloSpec


@dataclass(frozen=True, kw_only=True)
class Pools:
    """Both pools as engines, with how many engines (data-parallel ranks x copies) each has."""

    prefill: Engine
    prefill_engines: int
    decode: Engine
    decode_engines: int
    transfer_bytes_per_token: float  # KV cache per prompt token, per GPU of the prefill engine
    transfer_bytes_per_s: float  # per GPU, over the NICs

    def prefill_s(self, prompt_tokens: float) -> float:
        """One prompt's prefill step on an otherwise idle prefill engine."""
        return self.prefill.prefill_step_s(prompt_tokens, prompt_tokens / 2)

    def prefill_rate(self) -> float:
        """Requests per second one prefill engine finishes, a full token budget a step."""
        e = self.prefill
        budget = e.limits.batched_tokens
        chunk = self.prefill_s(budget)
        return budget / max(e.prompt, 1.0) / chunk

    def transfer_s(self, prompt_tokens: float) -> float:
        return prompt_tokens * self.transfer_bytes_per_token / self.transfer_bytes_per_s

    def capacity(self) -> float:
        """The deployment's most requests per second: the slower pool's."""
        decode_full = self.decode.at(self.decode.capacity).requests_per_s
        return min(self.prefill_rate() * self.prefill_engines, decode_full * self.decode_engines)

    def ttft(self, rate: float, prompt_tokens: float) -> float:
        """TTFT of a prompt of `prompt_tokens` at a deployment rate: queueing, its prefill, its transfer."""
        service = 1 / self.prefill_rate()
        busy = rate / self.prefill_engines * service
        if busy >= 1:
            return math.inf
        wait = busy / (2 * (1 - busy)) * service
        prompt = prompt_tokens * self.prefill.prompt / max(self.prefill.w.input_tokens, 1)
        return wait + self.prefill_s(prompt) + self.transfer_s(prompt_tokens)

    def decode_at(self, rate: float) -> Steady:
        return self.decode.open_loop(rate / self.decode_engines)

    def attainment(self, rate: float, slo: SloSpec) -> float:
        return share_meeting(slo, self.prefill.w, self.decode_at(rate), lambda x: self.ttft(rate, x), shortest=0.0)

    def goodput(self, slo: SloSpec | None) -> float:
        full = self.capacity()
        if slo is None:
            return full
        need = slo.percentile / 100
        if self.attainment(full * 1e-6, slo) < need:
            return 0.0
        return largest_where(lambda r: self.attainment(r, slo) >= need, 0.0, full)

    def rate_of(self, spec: ServingSpec) -> float:
        """The deployment's request rate under the workload: stated, all at once (capacity), or set by
        `concurrency` clients each waiting TTFT + the decode of its answer (a fixed point)."""
        w = spec.serve.workload
        if w.request_rate is not None:
            return w.request_rate
        full = self.capacity()
        if w.concurrency is None:
            return full * (1 - 1e-9)
        rate = min(full, w.concurrency / max(self.prefill_s(w.input_tokens), 1e-9)) * 0.5
        for _ in range(BISECTION_STEPS):
            cycle = self.ttft(rate, w.input_tokens) + self.decode.decode_steps * self.decode_at(rate).step.total_s
            rate = min(full * (1 - 1e-9), (rate + w.concurrency / cycle) / 2)
        return rate


def pool_spec(spec: ServingSpec, tp: int, dp: int) -> ServingSpec:
    """The spec of one pool's engine: the same model and settings at the pool's tp x dp, one copy."""
    serve = dataclasses.replace(spec.serve, tp=tp, dp=dp, pp=1, replicas=1, disaggregation=None)
    return dataclasses.replace(spec, serve=serve)


def transfer_rate(spec: ServingSpec) -> float:
    return bus_links(spec.hardware).inter_bytes_per_s
