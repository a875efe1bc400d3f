"""The search agrees with `lmspec check`: same rules reject the same layouts, same memory per GPU.

The search evaluates the rules' conditions and the memory model on numpy arrays; these
tests take layouts at random from the raw space and compare, one by one, against the
validator's own rule functions and `estimate_train_memory` on the typed spec.
"""

from __future__ import annotations

import random

import pytest
from helpers.layouts import Layout, enumerate_one, price_one, scalar

from lmspec.compiler.models.train_memory import estimate_train_memory
from lmspec.compiler.rules import backend, batch, experts, layout
from lmspec.compiler.rules.budget import training_fits_memory
from lmspec.compiler.rules.context import RuleContext
from lmspec.compiler.search.legality import BACKENDS, RECOMPUTE
from lmspec.compiler.search.space import default_axes, enumerate_legal
from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.typed import from_dict

SEARCHED_RULES = (*layout.RULES, *experts.RULES, *batch.RULES, *backend.RULES)  # validator order
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
                cp=rng.choice(axes.cp),
                ep=rng.choice(axes.ep),
                micro_batch_size=rng.choice(axes.micro_batch_size),
                backend=BACKENDS[b],
                zero_stage=z,
                distributed_optimizer=d,
                sequence_parallel=rng.choice((False, True)),
                recompute=RECOMPUTE[rng.choice(axes.recompute)],
            )
        )
    legal = enumerate_legal(spec, axes).legal
    for i in rng.sample(range(legal.size), min(n - len(out), legal.size)):
        out.append(
            Layout(
                nodes=int(legal.nodes[i]),
                tp=int(legal.tp[i]),
                pp=int(legal.pp[i]),
                cp=int(legal.cp[i]),
                ep=int(legal.ep[i]),
                micro_batch_size=int(legal.micro_batch_size[i]),
                backend=BACKENDS[int(legal.backend[i])],
                zero_stage=int(legal.zero_stage[i]),
                distributed_optimizer=bool(legal.distributed_optimizer[i]),
                sequence_parallel=bool(legal.sequence_parallel[i]),
                recompute=RECOMPUTE[int(legal.recompute[i])],
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
        elif search_says == ["layout.sequence_parallel_needs_tp"]:  # a warning: dropped as a duplicate
            assert failing == [] and point.sequence_parallel and point.tp == 1
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
        Layout(nodes=7, tp=8, pp=7, micro_batch_size=2, recompute="none"),
    ),
    (
        "llama3_8b ZeRO-3",
        ["model=llama3_8b", "hardware=a100_40g"],
        Layout(nodes=2, backend="deepspeed", zero_stage=3, distributed_optimizer=False, micro_batch_size=4),
    ),
    (
        "llama3_8b ZeRO-1 PP4",
        ["model=llama3_8b", "hardware=a100_40g"],
        Layout(nodes=2, pp=4, backend="deepspeed", zero_stage=1, distributed_optimizer=False, recompute="full"),
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
    import dataclasses

    from lmspec.compiler.search import steptime
    from lmspec.compiler.search.evaluate import price_inputs

    spec = from_dict(Spec, compose_spec(["model=mixtral_8x7b", "hardware=h100_80g"]).spec)
    point = Layout(nodes=4, tp=2, pp=4, cp=2, ep=4, micro_batch_size=2, sequence_parallel=True)
    priced = price_one(spec, point)
    inputs, kwargs = price_inputs(spec, priced.feasible)
    plain = dataclasses.replace(
        inputs,
        **{
            f.name: getattr(inputs, f.name)[0].item()
            for f in dataclasses.fields(inputs)
            if hasattr(getattr(inputs, f.name), "shape")
        },
    )
    assert steptime.step_time(plain, **kwargs).total == pytest.approx(scalar(priced.step_time_s), rel=1e-12)
