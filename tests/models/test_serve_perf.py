"""The serving performance model (compiler/models/serve_perf.py and beneath): each mechanism moves the
figures the way the hardware and vLLM's scheduler do, and the committed constants are the fit of the
published calibration set (bench/serve_published.py prints the per-point table)."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from types import ModuleType

import pytest
from helpers.bench import bench_module
from helpers.specs import spec_of

from lmspec.compiler.models.serve_memory import estimate_serve_memory
from lmspec.compiler.models.serve_perf import ServePerf, engine_of, perf_dict, serve_perf
from lmspec.compiler.models.serve_step import Batch, engine_shape, gpu_constants, step_time
from lmspec.compiler.models.serve_traffic import Drafting
from lmspec.compiler.spec.sections import ServingSpec, serving

LLAMA_8B = ("model=llama3_8b", "hardware=h100_80g", "serve.tp=1", "serve.max_model_len=4096")
LLAMA_70B = ("model=llama3_70b", "hardware=h100_80g", "serve.tp=8", "serve.max_model_len=4096")
SLO = "serve.slo={ttft_ms: 500, tpot_ms: 50, percentile: 90}"


def _spec(*overrides: str) -> ServingSpec:
    spec = serving(spec_of(*overrides))
    assert spec is not None
    return spec


def _perf(*overrides: str) -> ServePerf:
    spec = _spec(*overrides)
    return serve_perf(spec, estimate_serve_memory(spec))


def test_more_clients_lengthen_each_step_and_raise_throughput_until_the_engine_is_full() -> None:
    few, many, all_at_once = (
        _perf(*LLAMA_8B, "serve.workload.concurrency=1"),
        _perf(*LLAMA_8B, "serve.workload.concurrency=64"),
        _perf(*LLAMA_8B),
    )
    assert few.tpot_s < many.tpot_s < all_at_once.tpot_s
    assert few.output_tokens_per_s < many.output_tokens_per_s < all_at_once.output_tokens_per_s
    assert all_at_once.running_per_engine == all_at_once.capacity_per_engine
    # clients beyond the engine's slots queue: their TTFT carries the wait, throughput stays the engine's
    crowd = _perf(*LLAMA_8B, "serve.max_num_seqs=16", "serve.workload.concurrency=64")
    full = _perf(*LLAMA_8B, "serve.max_num_seqs=16", "serve.workload.concurrency=16")
    assert crowd.running_per_engine == 16
    assert crowd.output_tokens_per_s == pytest.approx(full.output_tokens_per_s)
    assert crowd.ttft_s > 3 * full.ttft_s  # 48 waiting for 16 slots: about three answers' time more


def test_a_rate_above_capacity_saturates_and_has_no_ttft() -> None:
    capacity = _perf(*LLAMA_8B).requests_per_s
    below = _perf(*LLAMA_8B, f"serve.workload.request_rate={capacity / 2:.3f}")
    above = _perf(*LLAMA_8B, f"serve.workload.request_rate={capacity * 2:.3f}")
    assert not below.saturated and below.requests_per_s == pytest.approx(capacity / 2, rel=1e-3)
    assert above.saturated and math.isinf(above.ttft_s)
    assert perf_dict(above)["ttft_ms"] is None  # plan.json holds null, never Infinity


def test_goodput_is_the_rate_that_keeps_the_targets_and_tighter_targets_lower_it() -> None:
    loose = _perf(*LLAMA_70B, "serve.slo={ttft_ms: 2000, tpot_ms: 200, percentile: 90}")
    tight = _perf(*LLAMA_70B, "serve.slo={ttft_ms: 2000, tpot_ms: 30, percentile: 90}")
    capacity = _perf(*LLAMA_70B).requests_per_s
    assert 0 < tight.goodput_rps < loose.goodput_rps <= capacity * 1.001
    at_goodput = _perf(
        *LLAMA_70B,
        "serve.slo={ttft_ms: 2000, tpot_ms: 30, percentile: 90}",
        f"serve.workload.request_rate={tight.goodput_rps * 0.98:.4f}",
    )
    assert at_goodput.tpot_s * 1e3 <= 30 and at_goodput.slo_attainment == 1.0
    impossible = _perf(*LLAMA_70B, "serve.slo={ttft_ms: 1, tpot_ms: 1, percentile: 90}")
    assert impossible.goodput_rps == 0.0


def test_ttft_percentile_follows_the_prompt_length_distribution() -> None:
    fixed = _perf(*LLAMA_8B, "serve.workload.concurrency=8", "serve.workload.input_tokens=2048", SLO)
    spread = _perf(
        *LLAMA_8B,
        "serve.workload.concurrency=8",
        "serve.workload.input_tokens=2048",
        "serve.workload.distribution=exponential",
        SLO,
    )
    assert fixed.ttft_p_s == pytest.approx(fixed.ttft_s, rel=1e-6)
    assert spread.ttft_p_s > 1.5 * spread.ttft_s  # p90 of an exponential is 2.3 x its mean


def test_eager_mode_pays_a_launch_per_operator_and_layer() -> None:
    graphs = _perf(*LLAMA_8B, "serve.workload.concurrency=1")
    eager = _perf(*LLAMA_8B, "serve.workload.concurrency=1", "serve.enforce_eager=true")
    c = gpu_constants()
    launches = c.launch_s * c.kernels_per_layer * 32
    assert eager.step.overhead_s - graphs.step.overhead_s == pytest.approx(launches, rel=1e-6)


def test_tensor_parallel_pays_two_all_reduces_a_layer_and_splits_the_weights() -> None:
    one = _spec(*LLAMA_70B, "serve.tp=4")
    two = _spec(*LLAMA_70B, "serve.tp=8")
    batch = Batch(decode_seqs=32, decode_context=1024, prefill_tokens=0, prefill_context=0)
    t4 = step_time(engine_shape(one, estimate_serve_memory(one)), batch, gpu_constants())
    t8 = step_time(engine_shape(two, estimate_serve_memory(two)), batch, gpu_constants())
    assert t8.linear_s == pytest.approx(t4.linear_s / 2, rel=0.02)  # bandwidth-bound: half the weights a GPU
    assert t4.communication_s >= 160 * gpu_constants().collective_latency_s  # 2 x 80 layers


def test_fp8_weights_halve_the_decode_weight_reads() -> None:
    bf16 = _spec(*LLAMA_70B)
    fp8 = _spec(*LLAMA_70B, "serve.quantization=fp8")
    assert engine_shape(fp8, estimate_serve_memory(fp8)).dense_bytes == pytest.approx(
        engine_shape(bf16, estimate_serve_memory(bf16)).dense_bytes / 2, rel=0.05
    )


def test_a_moe_step_reads_only_the_experts_its_tokens_pick() -> None:
    spec = _spec("model=mixtral_8x7b", "hardware=h100_80g", "serve.tp=2", "serve.max_model_len=4096")
    shape = engine_shape(spec, estimate_serve_memory(spec))
    one = step_time(
        shape, Batch(decode_seqs=1, decode_context=512, prefill_tokens=0, prefill_context=0), gpu_constants()
    )
    many = step_time(
        shape, Batch(decode_seqs=64, decode_context=512, prefill_tokens=0, prefill_context=0), gpu_constants()
    )
    # one token reads 2 of 8 experts, 64 tokens all of them: the expert reads grow about 4x
    assert 2.5 < many.linear_s / one.linear_s < 4.5


def test_mtp_drafts_divide_the_step_by_the_tokens_each_step_keeps() -> None:
    assert Drafting(drafts=1, acceptance=0.8).tokens_per_step == pytest.approx(1.8)
    assert Drafting(drafts=3, acceptance=0.5).tokens_per_step == pytest.approx(1.875)
    base = (
        "model=deepseek_v3",
        "hardware=h200_141g",
        "serve.tp=8",
        "serve.expert_parallel=true",
        "serve.quantization=fp8",
        "serve.max_model_len=4096",
        "train=null",
        "parallel=null",
        "serve.model_path=/models/ds",
        "serve.workload.concurrency=1",
    )
    plain = _perf(*base)
    mtp = _perf(*base, "serve.speculative={method: mtp, num_tokens: 1, acceptance_rate: 0.8}")
    assert mtp.tpot_s < plain.tpot_s
    assert mtp.step.total_s > plain.step.total_s  # verifying the draft and drafting cost a little


def test_disaggregated_decode_steps_carry_no_prompt_chunks() -> None:
    common = (*LLAMA_70B, "hardware.nodes=2", "serve.workload.request_rate=3", "serve.workload.input_tokens=4096")
    aggregated = _perf(*common, "serve.replicas=2")
    split = _perf(
        *common,
        "serve.disaggregation={kv_connector: NixlConnector, prefill: {tp: 8, dp: 1, engines: 1}, "
        "decode: {tp: 8, dp: 1, engines: 1}}",
    )
    assert split.tpot_s < aggregated.tpot_s  # Splitwise's and DistServe's point
    assert split.step.linear_s < aggregated.step.linear_s
    assert split.requests_per_s == pytest.approx(3.0)


def test_a_cpu_engine_uses_the_cpu_constants_it_is_given() -> None:
    spec = _spec("hardware=cpu")
    memory = estimate_serve_memory(spec)
    slow = dataclasses.replace(gpu_constants(), step_overhead_s=0.1)
    engine = engine_of(spec, memory, slow)
    _, tpot = engine.static_batch(1)
    assert tpot >= 0.1


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return bench_module("serve_published")


@pytest.mark.slow
def test_the_committed_constants_are_the_fit_of_the_published_set(bench: ModuleType) -> None:
    data = json.loads(bench.DATA.read_text(encoding="utf-8"))["points"]
    priced = [p for p in (bench.compose(p) for p in data) if p.served is not None]
    assert len(priced) >= 20 and len({p.source for p in priced}) >= 3
    fitted = bench.fit(priced)
    assert fitted[bench.VLLM] == gpu_constants()  # bench/serve_published.py --fit wrote what it fits
    tpot = [abs(r - 1) for p in priced for k, r in p.ratios(fitted).items() if k == "tpot_ms"]
    assert statistics.median(tpot) <= 0.15  # issue 41's target on the calibration set
