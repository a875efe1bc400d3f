"""A vLLM engine under the spec's workload in steady state: batch, TTFT, TPOT, throughput, goodput.

vLLM V1's scheduler gives every running sequence one decode token per step, then fills the rest of
max_num_batched_tokens with prompt chunks (chunked prefill), first come first served, as long as a
sequence slot (max_num_seqs) and KV blocks are free. In steady state a request spends s_p steps in
prefill (its prompt over the step's spare budget, at least one) and output - 1 steps decoding, so
with n running requests r = n / (s_p + output - 1) finish per step, each step carries r x prompt
prefill tokens and n - r x s_p decoding sequences, and one step's time (serve_step) sets everything:

- TPOT = the step time (every decoding sequence gets a token per step; Sarathi-Serve's point: the
  prefill chunks riding in the step lengthen it for all of them);
- TTFT = waiting for a slot or for prefill budget, half a step to the next step boundary, then s_p
  steps, each carrying that prompt's chunk (longer than the average step, which shares the prompts);
- throughput = n x output tokens per (s_p + output - 1) steps.

A closed loop of `concurrency` clients runs n = min(clients, slots, KV fit) and queues the rest;
an open loop of `request_rate` finds the n that serves it (fixed point, bisection) and queues
arrivals for prefill budget as an M/D/1 queue; with neither, every request is in at once (vLLM
bench's request rate inf) and the engine runs full. Percentiles follow the prompt-length
distribution (TTFT grows with the prompt); TPOT is every request's mean step. Goodput is
DistServe's: the largest request rate at which serve.slo.percentile % of requests meet both targets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from lmspec.compiler.models.serve_step import Batch, EngineShape, ServeConstants, StepTime, step_time
from lmspec.compiler.spec.sections.serve_workload import SloSpec, WorkloadSpec

BISECTION_STEPS = 40
BISECTION_TOLERANCE = 1e-3  # relative: a rate or a length to 0.1% is finer than any input it comes from


def largest_where(holds: Callable[[float], bool], low: float, high: float) -> float:
    """The largest x in [low, high] where `holds` (true up to some point, false beyond) still holds,
    to BISECTION_TOLERANCE of `high`; `low` when it holds nowhere above it."""
    for _ in range(BISECTION_STEPS):
        if high - low <= BISECTION_TOLERANCE * high:
            break
        mid = (low + high) / 2
        low, high = (mid, high) if holds(mid) else (low, mid)
    return low


@dataclass(frozen=True, kw_only=True)
class Drafting:
    """MTP speculative decoding: `drafts` tokens proposed a step, each accepted with `acceptance`."""

    drafts: int
    acceptance: float

    @property
    def tokens_per_step(self) -> float:
        """Tokens a sequence gains per step: the accepted prefix of the drafts plus the verified token,
        1 + a + a^2 + ... + a^drafts (drafts accepted independently, the first rejection ending the run)."""
        return sum(self.acceptance**i for i in range(self.drafts + 1))


@dataclass(frozen=True, kw_only=True)
class EngineLimits:
    """What bounds one engine's running requests and its steps."""

    slots: int  # max_num_seqs
    kv_tokens: int  # tokens the KV cache holds
    batched_tokens: int  # max_num_batched_tokens


@dataclass(frozen=True, kw_only=True)
class Steady:
    """One engine at one load."""

    running: float  # requests in the engine (prefilling or decoding)
    waiting_s: float  # mean wait before a request's prefill starts
    prefill_steps: float  # s_p for a prompt of the mean length
    batch: Batch  # what a step runs on average
    step: StepTime
    tpot_s: float
    ttft_s: float  # mean
    requests_per_s: float
    output_tokens_per_s: float
    saturated: bool  # the load asks more than the engine serves: the queue grows without bound


def quantile(distribution: str, mean: float, q: float) -> float:
    """The q-quantile of a length with this mean: fixed, uniform over [1, 2 mean - 1], or exponential."""
    if distribution == "fixed":
        return mean
    if distribution == "uniform":
        return 1 + q * (2 * mean - 2)
    return -mean * math.log(max(1 - q, 1e-12))


def cdf(distribution: str, mean: float, x: float) -> float:
    """Share of lengths at most x (the inverse of `quantile`)."""
    if distribution == "fixed":
        return 1.0 if x >= mean else 0.0
    if distribution == "uniform":
        return min(max((x - 1) / max(2 * mean - 2, 1e-12), 0.0), 1.0)
    return 1 - math.exp(-max(x, 0.0) / mean)


def share_meeting(
    slo: SloSpec, w: WorkloadSpec, decoding: Steady, ttft_of: Callable[[float], float], shortest: float
) -> float:
    """Share of requests meeting both targets when the decoding engine runs at `decoding` and a prompt of x
    tokens waits ttft_of(x) for its first token: none when TPOT misses (every request decodes at the same
    step), else those whose prompt is short enough (TTFT grows with the prompt), from the length distribution.
    `shortest` is where the search for the longest prompt that still makes it starts."""
    if decoding.saturated or (slo.tpot_ms is not None and decoding.tpot_s * 1e3 > slo.tpot_ms):
        return 0.0
    if slo.ttft_ms is None:
        return 0.0 if math.isinf(ttft_of(1)) else 1.0
    target = slo.ttft_ms / 1e3
    if ttft_of(1) > target:
        return 0.0
    longest = largest_where(lambda x: ttft_of(x) <= target, shortest, float(max(w.input_tokens * 64, 2)))
    return cdf(w.distribution, w.input_tokens, longest)


class Engine:
    """One engine (a data-parallel rank) of one shape under one workload's lengths."""

    def __init__(
        self,
        shape: EngineShape,
        limits: EngineLimits,
        constants: ServeConstants,
        workload: WorkloadSpec,
        prefix_hit: float,
        drafting: Drafting | None = None,
        prefills: bool = True,
    ) -> None:
        self.shape, self.limits, self.c, self.w = shape, limits, constants, workload
        self.prompt = workload.input_tokens * (1 - prefix_hit)  # tokens actually prefilled
        self.cached = workload.input_tokens * prefix_hit
        self.output = workload.output_tokens
        self.drafting = drafting or Drafting(drafts=0, acceptance=0.0)
        self.prefills = prefills  # False: a decode pool's engine, the KV cache arriving from a prefill engine
        # steps a request decodes for: its tokens after the first, `tokens_per_step` at a time
        self.decode_steps = max(self.output - 1, 0) / self.drafting.tokens_per_step
        fit = limits.kv_tokens // max(workload.input_tokens + workload.output_tokens, 1)
        self.capacity = max(min(limits.slots, fit), 0)

    def _prefill_steps(self, prompt: float, decoding: float) -> float:
        spare = max(self.limits.batched_tokens - decoding, 1.0)
        return max(1.0, prompt / spare)

    def _step(self, batch: Batch) -> StepTime:
        """One step, the draft model's passes included: with MTP every decoding sequence verifies
        drafts + 1 tokens, and each draft ran one MTP module (a layer) over the decoding sequences."""
        verified = dataclasses.replace(batch, decode_seqs=batch.decode_seqs, verify_tokens=self.drafting.drafts + 1)
        step = step_time(self.shape, verified, self.c)
        if not self.drafting.drafts:
            return step
        draft = step_time(self.shape, dataclasses.replace(batch, prefill_tokens=0.0), self.c)
        share = self.drafting.drafts / self.shape.layers_per_stage  # one layer of the stage's, per draft
        return dataclasses.replace(
            step,
            linear_s=step.linear_s + share * draft.linear_s,
            attention_s=step.attention_s + share * draft.attention_s,
            communication_s=step.communication_s + share * draft.communication_s,
        )

    def _mean_step(self, batch: Batch, chunks_per_step: float) -> StepTime:
        """The mean step when prompt chunks arrive `chunks_per_step` a step on average: a step carries one
        or more with probability f = 1 - exp(-chunks_per_step) (arrivals at random), so the engine
        alternates decode-only steps with steps that also run prompt tokens (batch.prefill_tokens / f of
        them); the mean of the two, not the step of the mean batch, is what TPOT sees (Sarathi-Serve)."""
        f = 1 - math.exp(-chunks_per_step)
        if f <= 0 or batch.prefill_tokens <= 0:
            return self._step(batch)
        with_prompt = self._step(dataclasses.replace(batch, prefill_tokens=batch.prefill_tokens / f))
        decode_only = self._step(dataclasses.replace(batch, prefill_tokens=0.0))
        return StepTime(
            **{
                k: f * getattr(with_prompt, k) + (1 - f) * getattr(decode_only, k)
                for k in ("linear_s", "attention_s", "communication_s", "overhead_s")
            }
        )

    def at(self, running: float) -> Steady:
        """Steady state with `running` requests in the engine (no queue)."""
        n = max(running, 1e-9)
        s_p = 1.0 if self.prefills else 0.0
        for _ in range(8 if self.prefills else 0):  # s_p and the decoding count decide each other
            per_step = n / (s_p + self.decode_steps)
            decoding = n - per_step * s_p
            s_p = self._prefill_steps(self.prompt, decoding)
        per_step = n / max(s_p + self.decode_steps, 1e-9)
        decoding = max(n - per_step * s_p, 0.0)
        batch = Batch(
            decode_seqs=decoding,
            decode_context=self.w.input_tokens + self.output / 2,
            prefill_tokens=per_step * self.prompt if self.prefills else 0.0,
            prefill_context=self.cached + self.prompt / 2,
        )
        step = self._mean_step(batch, per_step * s_p if self.prefills else 0.0)
        t = step.total_s
        s = Steady(
            running=running,
            waiting_s=0.0,
            prefill_steps=s_p,
            batch=batch,
            step=step,
            tpot_s=t / self.drafting.tokens_per_step,
            ttft_s=0.0,
            requests_per_s=per_step / t,
            output_tokens_per_s=per_step * self.output / t,
            saturated=False,
        )
        first = self.ttft_for_prompt(s, self.w.input_tokens) if self.prefills else 0.0
        return dataclasses.replace(s, ttft_s=first)

    def prefill_step_s(self, tokens: float, context: float) -> float:
        """A step of `tokens` prompt tokens and no decoding, each attending over `context` tokens on average."""
        batch = Batch(decode_seqs=0, decode_context=0, prefill_tokens=tokens, prefill_context=context)
        return step_time(self.shape, batch, self.c).total_s

    def static_batch(self, batch: int) -> tuple[float, float]:
        """(TTFT, TPOT) of `batch` requests started together (vllm bench latency, a profiling run): their
        prompts prefilled in max_num_batched_tokens chunks before any decodes, so every first token waits
        for the whole prefill; then each step decodes the batch at its mean context."""
        tokens = batch * self.prompt
        budget = self.limits.batched_tokens
        full, rest = divmod(tokens, budget)
        ttft = 0.0
        for chunk, count in ((budget, full), (rest, 1 if rest else 0)):
            if count:
                ttft += count * self.prefill_step_s(chunk, self.cached + self.prompt / 2)
        decode = Batch(
            decode_seqs=batch, decode_context=self.w.input_tokens + self.output / 2, prefill_tokens=0, prefill_context=0
        )
        return ttft, self._step(decode).total_s / self.drafting.tokens_per_step

    def closed_loop(self, clients: float) -> Steady:
        """`clients` each waiting for its answer before the next request; those beyond capacity queue."""
        running = min(clients, self.capacity)
        s = self.at(running)
        if clients <= running:
            return s
        wait = (clients - running) / s.requests_per_s  # Little's law over the queue
        return Steady(**{**s.__dict__, "waiting_s": wait, "ttft_s": s.ttft_s + wait})

    def open_loop(self, rate: float) -> Steady:
        """Poisson arrivals at `rate` requests/s: the running count that serves them, plus budget queueing."""
        full = self.at(self.capacity)
        if rate >= full.requests_per_s:
            return Steady(**{**full.__dict__, "saturated": True, "waiting_s": math.inf, "ttft_s": math.inf})
        below = largest_where(lambda n: self.at(n).requests_per_s < rate, 0.0, float(self.capacity))
        s = self.at(min(below * (1 + BISECTION_TOLERANCE), float(self.capacity)))
        # prompts arriving at random wait for prefill budget: M/D/1 with the prefill share of each step
        busy = min(rate * s.prefill_steps * s.step.total_s, 0.999)
        wait = busy / (2 * (1 - busy)) * s.prefill_steps * s.step.total_s
        return Steady(**{**s.__dict__, "waiting_s": wait, "ttft_s": s.ttft_s + wait})

    def ttft_for_prompt(self, s: Steady, prompt_tokens: float) -> float:
        """TTFT of one request whose prompt has `prompt_tokens`, at the load `s`: its chunks ride in steps
        that carry at least that chunk (a long prompt fills its steps' budget, a short one shares them)."""
        prompt = prompt_tokens * (self.prompt / max(self.w.input_tokens, 1))
        steps = self._prefill_steps(prompt, s.batch.decode_seqs)
        chunk = prompt / steps
        own = self._step(dataclasses.replace(s.batch, prefill_tokens=max(s.batch.prefill_tokens, chunk)))
        return s.waiting_s + s.step.total_s / 2 + steps * own.total_s

    def slo_attainment(self, s: Steady, slo: SloSpec) -> float:
        """Share of requests meeting both targets: TPOT is every request's step; TTFT grows with the prompt."""
        return share_meeting(slo, self.w, s, lambda x: self.ttft_for_prompt(s, x), shortest=1.0)

    def goodput(self, slo: SloSpec | None) -> float:
        """Largest request rate (per engine) at which slo.percentile % of requests meet the targets."""
        full = self.at(self.capacity)
        if slo is None:
            return full.requests_per_s
        need = slo.percentile / 100
        if self.slo_attainment(self.open_loop(full.requests_per_s * 1e-6), slo) < need:
            return 0.0
        return largest_where(lambda r: self.slo_attainment(self.open_loop(r), slo) >= need, 0.0, full.requests_per_s)
