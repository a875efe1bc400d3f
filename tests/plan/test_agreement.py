"""The search agrees with `lmspec check` and `lmspec explain`: same rules reject the same layouts,
same memory per GPU, same communication and step time.

The search evaluates the rules' conditions and the models on numpy arrays; these tests take
layouts at random from the raw space, or chosen ones, and compare, one by one, against the
validator's own rule functions, `estimate_train_memory` and `estimate_step_time` on the typed spec.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers.layouts import Layout, enumerate_one, price_one, scalar

from lmspec.compiler.backends import BACKENDS as TRAINING_BACKENDS
from lmspec.compiler.backends import backend_of
from lmspec.compiler.backends.megatron import MEGATRON
from lmspec.compiler.backends.torchtitan import pipeline_rules
from lmspec.compiler.errors import Problem
from lmspec.compiler.models import steptime, steptime_inputs
from lmspec.compiler.models.comm import (
    dp_grad_bytes,
    dp_seconds_per_byte,
    dp_traffic,
    worst_gpu_params,
)
from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.models.steptime import estimate_comm_and_step, estimate_step_time
from lmspec.compiler.models.summary import STEP_TERMS
from lmspec.compiler.models.train_memory import estimate_train_memory
from lmspec.compiler.rules import batch, capability, experts, layout, moe_settings, overlap
from lmspec.compiler.rules.budget import training_fits_memory
from lmspec.compiler.rules.context import RuleContext
from lmspec.compiler.search.evaluate import price_inputs
from lmspec.compiler.search.legality import BACKENDS, RECOMPUTE
from lmspec.compiler.search.search import search
from lmspec.compiler.search.space import default_axes, enumerate_legal
from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.typed import from_dict


def _run_by_its_backend(rule: Callable[[RuleContext], Iterator[Problem]]) -> Callable[..., Iterator[Problem]]:
    """A backend's own rule as rules/backend.py runs it: on the specs of that backend only, under its name."""
    owner = next(b for b in TRAINING_BACKENDS.values() if rule in b.rules)

    def run(ctx: Any) -> Iterator[Problem]:
        if backend_of(ctx.spec) is owner:
            yield from rule(ctx)

    run.__module__, run.__name__ = rule.__module__, rule.__name__
    return run


# validator order; of moe_settings only the rules that read parallel.overlap.moe_a2a, which the search searches
SEARCHED_RULES = (
    *layout.RULES,
    *experts.RULES,
    *batch.RULES,
    *capability.RULES,
    *overlap.RULES,
    moe_settings.shared_expert_overlap_has_its_layout,
    moe_settings.a2a_overlap_has_an_all_to_all,
    _run_by_its_backend(pipeline_rules),  # the torchtitan backend's own, after the overlap's
)
# warnings: the search drops the layout as a duplicate of the one without the setting
WARNED = (
    "layout.sequence_parallel_needs_tp",
    "layout.sharding_needs_data_parallel",
    "layout.virtual_stages_have_layers",
)
SAMPLES = 250

JOBS = {
    "mixtral": ["model=mixtral_8x7b", "hardware=h100_80g", "train.global_batch_size=96"],
    "deepseek_v2_lite": [
        "model=deepseek_v2_lite",
        "hardware=a100_40g",
        "train.global_batch_size=64",
        "train.seq_length=2048",
    ],
    "llama3_8b": ["model=llama3_8b", "hardware=rtx4090_24g", "train.global_batch_size=48"],
}


def _name(rule: object) -> str:
    return f"{rule.__module__.rsplit('.', 1)[-1]}.{rule.__name__}"  # type: ignore[attr-defined]


def _random_layouts(spec: Spec, nodes: range, n: int, seed: int) -> list[Layout]:
    """Half drawn from the whole raw space (mostly illegal), half from the legal set the search found."""
    axes = default_axes(spec, nodes, BACKENDS)
    rng = random.Random(seed)
    out = []
    for _ in range(n // 2):
        b, z, d = rng.choice(axes.shardings)
        out.append(
            Layout(
                nodes=rng.choice(axes.nodes),
                tp=rng.choice(axes.tp),
                pp=rng.choice(axes.pp),
                virtual_stages=rng.choice((None, *axes.virtual_stages[1:])),
                cp=rng.choice(axes.cp),
                ep=rng.choice(axes.ep),
                micro_batch_size=rng.choice(axes.micro_batch_size),
                backend=BACKENDS[b],
                zero_stage=z,
                distributed_optimizer=d,
                sequence_parallel=rng.choice((False, True)),
                recompute=RECOMPUTE[rng.choice(axes.recompute)],
                moe_a2a=rng.choice(axes.moe_a2a),
            )
        )
    legal = enumerate_legal(spec, axes).legal
    for i in rng.sample(range(legal.size), min(n - len(out), legal.size)):
        out.append(
            Layout(
                nodes=int(legal.nodes[i]),
                tp=int(legal.tp[i]),
                pp=int(legal.pp[i]),
                virtual_stages=int(legal.virtual_stages[i]) if legal.virtual_stages[i] > 1 else None,
                cp=int(legal.cp[i]),
                ep=int(legal.ep[i]),
                micro_batch_size=int(legal.micro_batch_size[i]),
                backend=BACKENDS[int(legal.backend[i])],
                zero_stage=int(legal.zero_stage[i]),
                distributed_optimizer=bool(legal.distributed_optimizer[i]),
                sequence_parallel=bool(legal.sequence_parallel[i]),
                recompute=RECOMPUTE[int(legal.recompute[i])],
                moe_a2a=bool(legal.moe_a2a[i]),
            )
        )
    return out


@pytest.mark.parametrize("job", sorted(JOBS))
def test_search_rejects_exactly_what_the_rules_reject(job: str) -> None:
    composed = compose_spec(JOBS[job])
    base = from_dict(Spec, composed.spec)
    legal_seen = rejected_seen = 0
    for point in _random_layouts(base, range(1, 7), SAMPLES, seed=len(job)):
        ctx = RuleContext(point.apply(base), composed.origins)
        failing = [_name(rule) for rule in SEARCHED_RULES if any(p.severity == "error" for p in rule(ctx))]
        found = enumerate_one(base, point)
        search_says = [rule for rule, n in found.rejected.items() if n]
        if found.legal.size:
            legal_seen += 1
            assert failing == [], (point, failing)
        elif len(search_says) == 1 and search_says[0] in WARNED:
            warned = [_name(rule) for rule in SEARCHED_RULES if any(p.severity == "warning" for p in rule(ctx))]
            assert failing == [] and search_says[0] in warned, (point, warned)
        else:
            rejected_seen += 1
            assert search_says == failing[:1], (point, search_says, failing)
    assert legal_seen >= SAMPLES // 2 and rejected_seen >= SAMPLES // 4, (legal_seen, rejected_seen)


MEMORY_CASES = [
    (
        "deepseek_v3 PP16 EP64",
        ["model=deepseek_v3", "hardware=h800_80g", "train.global_batch_size=15360"],
        Layout(nodes=256, pp=16, ep=64, recompute="full"),
    ),
    (
        "deepseek_v3 TP2 PP16 CP2 EP8 SP",
        ["model=deepseek_v3", "hardware=h800_80g", "train.global_batch_size=15360"],
        Layout(nodes=256, tp=2, pp=16, cp=2, ep=8, sequence_parallel=True, recompute="none"),
    ),
    (
        "deepseek_v3 PP13 uneven",
        ["model=deepseek_v3", "hardware=h800_80g", "train.global_batch_size=1040"],
        Layout(nodes=130, tp=4, pp=13, ep=16, micro_batch_size=2, distributed_optimizer=False, sequence_parallel=True),
    ),
    (
        "llama3_70b TP8 PP2 SP",
        ["model=llama3_70b", "hardware=h100_80g"],
        Layout(nodes=8, tp=8, pp=2, sequence_parallel=True),
    ),
    (
        "llama3_70b PP7 few micro-batches",
        ["model=llama3_70b", "hardware=h100_80g", "train.global_batch_size=16"],
        Layout(nodes=7, tp=8, pp=7, micro_batch_size=2, recompute="none", distributed_optimizer=False),  # dp 1
    ),
    (
        "llama3_70b TP8 PP4 VP5 interleaved",
        ["model=llama3_70b", "hardware=h100_80g", "train.global_batch_size=64"],
        Layout(nodes=8, tp=8, pp=4, virtual_stages=5, sequence_parallel=True, recompute="none"),
    ),
    (
        "llama3_8b ZeRO-3",
        ["model=llama3_8b", "hardware=a100_40g"],
        Layout(
            nodes=2,
            backend="deepspeed",
            zero_stage=3,
            distributed_optimizer=False,
            micro_batch_size=4,
            recompute="full",
        ),
    ),
    (
        "llama3_8b ZeRO-1",
        ["model=llama3_8b", "hardware=a100_40g"],
        Layout(nodes=2, backend="deepspeed", zero_stage=1, distributed_optimizer=False, recompute="full"),
    ),
    (
        "mixtral ZeRO-2",
        ["model=mixtral_8x7b", "hardware=h200_141g"],
        Layout(nodes=4, backend="deepspeed", zero_stage=2, distributed_optimizer=False, recompute="none"),
    ),
    (
        "mixtral TP4 PP4 EP4",
        ["model=mixtral_8x7b", "hardware=h100_80g"],
        Layout(nodes=4, tp=4, pp=4, ep=4, sequence_parallel=True),
    ),
]


@pytest.mark.parametrize(("overrides", "point"), [c[1:] for c in MEMORY_CASES], ids=[c[0] for c in MEMORY_CASES])
def test_worst_stage_memory_is_the_memory_models(overrides: list[str], point: Layout) -> None:
    composed = compose_spec(overrides)
    base = from_dict(Spec, composed.spec)
    spec = point.apply(base)
    expected = estimate_train_memory(spec)
    assert expected is not None
    priced = price_one(base, point)
    assert scalar(priced.memory_bytes) == pytest.approx(expected.worst.total_bytes, abs=16)
    assert scalar(priced.worst_stage) == expected.worst.stage
    assert bool(priced.fits[0]) == expected.fits
    budget_errors = list(training_fits_memory(RuleContext(spec, composed.origins)))
    assert bool(budget_errors) == (not bool(priced.fits[0]))


def test_step_time_is_the_same_for_one_layout_in_plain_numbers() -> None:
    """The step-time model is plain arithmetic: Python numbers give what the arrays give."""
    spec = from_dict(Spec, compose_spec(["model=mixtral_8x7b", "hardware=h100_80g"]).spec)
    point = Layout(nodes=4, tp=2, pp=4, cp=2, ep=4, micro_batch_size=2, sequence_parallel=True)
    priced = price_one(spec, point)
    inputs, constants = price_inputs(spec, priced.feasible)
    plain = _plain_numbers(inputs)
    assert not any(hasattr(v, "shape") for v in vars(plain.dims).values())
    assert steptime.step_time(plain, constants).total == pytest.approx(scalar(priced.step_time_s), rel=1e-12)


def _plain_numbers(value: Any) -> Any:
    """A dataclass of one-element arrays (nested ones too) with Python numbers in their place."""
    changes = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if dataclasses.is_dataclass(v):
            changes[f.name] = _plain_numbers(v)
        elif hasattr(v, "shape"):
            changes[f.name] = v[0].item()
    return dataclasses.replace(value, **changes)


# Layouts that fit, so `lmspec plan` times them; MoE, CP, PP, uneven stages and every sharding among them.
STEP_CASES = [
    (
        "deepseek_v3 PP16 EP64",
        ["model=deepseek_v3", "hardware=h800_80g", "train.global_batch_size=15360"],
        Layout(nodes=256, pp=16, ep=64, recompute="full"),
    ),
    (
        "mixtral TP2 PP4 CP2 EP4 SP",
        ["model=mixtral_8x7b", "hardware=h100_80g"],
        Layout(nodes=4, tp=2, pp=4, cp=2, ep=4, micro_batch_size=2, sequence_parallel=True),
    ),
    (
        "llama3_70b TP8 PP2 SP over 8 nodes",
        ["model=llama3_70b", "hardware=h100_80g"],
        Layout(nodes=8, tp=8, pp=2, sequence_parallel=True),
    ),
    (
        "mixtral TP2 PP4 VP2 EP4, all-to-alls overlapped",
        ["model=mixtral_8x7b", "hardware=h100_80g", "parallel.overlap.moe_a2a=true"],
        Layout(nodes=4, tp=2, pp=4, virtual_stages=2, ep=4, sequence_parallel=True, recompute="none"),
    ),
    (
        "llama3_70b PP5 uneven, megatron unsharded",
        ["model=llama3_70b", "hardware=h200_141g", "train.global_batch_size=64"],
        Layout(nodes=10, tp=8, pp=5, distributed_optimizer=False, sequence_parallel=True, recompute="full"),
    ),
    (
        "tiny ZeRO-0 over 2 nodes",
        ["model=tiny", "hardware=rtx4090_24g", "train.global_batch_size=16"],
        Layout(nodes=2, backend="deepspeed", distributed_optimizer=False, recompute="full"),
    ),
    (
        "llama3_8b ZeRO-1",
        ["model=llama3_8b", "hardware=h100_80g"],
        Layout(nodes=2, backend="deepspeed", zero_stage=1, distributed_optimizer=False, recompute="full"),
    ),
    (
        "mixtral ZeRO-2",
        ["model=mixtral_8x7b", "hardware=h200_141g"],
        Layout(nodes=4, backend="deepspeed", zero_stage=2, distributed_optimizer=False, recompute="full"),
    ),
    (
        "llama3_8b ZeRO-3 micro batch 2",
        ["model=llama3_8b", "hardware=a100_40g"],
        Layout(
            nodes=2,
            backend="deepspeed",
            zero_stage=3,
            distributed_optimizer=False,
            micro_batch_size=2,
            recompute="full",
        ),
    ),
]


@pytest.mark.parametrize(("overrides", "point"), [c[1:] for c in STEP_CASES], ids=[c[0] for c in STEP_CASES])
def test_explain_gives_the_communication_and_step_time_plan_gives(overrides: list[str], point: Layout) -> None:
    """`lmspec explain` (the Plan's degrees, the scalar path) and `lmspec plan` (the arrays) agree on the
    layout's degrees, every communication term and the step time of the same layout."""
    base = from_dict(Spec, compose_spec(overrides).spec)
    spec = point.apply(base)
    memory = estimate_train_memory(spec)
    dims = ParallelDims.from_spec(spec)
    assert memory is not None and dims is not None
    explained = estimate_step_time(spec, memory)
    assert explained is not None
    priced = price_one(base, point)
    assert priced.feasible.size == 1, "a case that does not fit is not timed by lmspec plan"
    f = priced.feasible
    assert (dims.world, dims.dp, dims.micro_batches) == (int(f.world[0]), int(f.dp[0]), int(f.micro_batches[0]))
    for term in (*STEP_TERMS, "tp_raw", "ep_raw", "cp_raw", "pp_raw", "dp_raw"):
        assert getattr(explained, term) == pytest.approx(scalar(getattr(priced.time, term)), rel=1e-9, abs=1e-12), term
    assert explained.comm == pytest.approx(scalar(priced.time.comm), rel=1e-9)
    assert explained.total == pytest.approx(scalar(priced.step_time_s), rel=1e-9)
    assert explained.dp_raw + explained.tp_raw + explained.pp_raw > 0  # priced, even where overlap hides it


def test_plan_json_dp_traffic_is_the_searchs_bytes_per_parameter() -> None:
    """plan.json's DP estimate (nothing overlapped) moves the bytes the search's DP term moves, at the same
    bus bandwidth: (reduce + gather + micro-batches x every) x the ring time of a byte."""
    spec = Layout(nodes=8, tp=8, pp=2, distributed_optimizer=False, sequence_parallel=True).apply(
        from_dict(Spec, compose_spec(["model=llama3_70b", "hardware=h100_80g"]).spec)
    )
    memory = estimate_train_memory(spec)
    dims = ParallelDims.from_spec(spec)
    assert memory is not None and dims is not None
    priced = estimate_comm_and_step(spec, memory)
    assert priced is not None
    comm = priced[0]
    dense, expert = worst_gpu_params(spec, dims, memory)
    traffic = dp_traffic(0, False, dp_grad_bytes(MEGATRON.grad_reduce_in_fp32("bf16"), "bf16"), 2)
    assert (traffic.reduce, traffic.gather, traffic.every) == (8, 0, 0)  # one all-reduce of fp32 main gradients
    per_byte = dp_seconds_per_byte(dims, dense, expert, steptime_inputs.bus_links(spec.hardware))
    assert comm.dp_s == pytest.approx(8 * per_byte, rel=1e-12)
    assert dims.spans_nodes(dims.dense_dp_span)  # dp 4 x tp 8 = 32 ranks: over the NICs


def test_the_specs_own_interleaving_is_not_lent_to_the_candidates() -> None:
    """Each candidate is priced with its own virtual stages: the spec's parallel.virtual_stages once halved
    every candidate's bubble, plain 1F1B ones included."""
    base = from_dict(Spec, compose_spec(["model=llama3_70b", "hardware=h100_80g", "hardware.nodes=8"]).spec)
    interleaved = dataclasses.replace(base, parallel=dataclasses.replace(base.parallel, pp=2, virtual_stages=4))
    plain, spec_v4 = (search(s, [8], BACKENDS, "throughput").priced for s in (base, interleaved))
    assert (plain.feasible.virtual_stages > 1).any() and (plain.feasible.virtual_stages == 1).any()
    assert (plain.step_time_s == spec_v4.step_time_s).all()
