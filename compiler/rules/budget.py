"""The training budget: the worst GPU of a training layout must fit its device, and its
communication should not dominate the step (serving's budget: rules/serve_budget.py).

A layout that does not fit is an error naming the biggest term and the fixes in the order
the seed teaches (cheapest first): lower the micro batch, turn on recompute, shard more
state (ZeRO stage / distributed optimizer / offload), add PP or EP, add GPUs. Each fix is
computed on a copy of the spec and shown with its resulting number.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any, TypeVar

from lmspec.compiler.backends import backend_of
from lmspec.compiler.capabilities import capabilities_of
from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.models.comm import COMM_SHARE_WARNING
from lmspec.compiler.models.dims import data_parallel_size, divisors, next_multiple_above, ranks_per_stage, world_size
from lmspec.compiler.models.params import computable
from lmspec.compiler.models.steptime import estimate_comm_and_step
from lmspec.compiler.models.summary import comm_over_warning
from lmspec.compiler.models.train_memory import DEVICE_RESERVE_GIB, TERMS, TrainMemory, estimate_train_memory
from lmspec.compiler.models.units import GB, gib
from lmspec.compiler.rules.context import TrainingContext
from lmspec.compiler.spec.override_text import override_value
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import TrainingSpec

MAX_NODE_MULTIPLE = 1024  # how far "add GPUs" searches: up to this many times the nodes given
SCAN_MAX = 256  # node counts tried between the last two doublings (evenly spread when there are more)
RECOMPUTE_ORDER = ("none", "selective", "full")
S = TypeVar("S")


def with_value(spec: Any, key: str, value: Any) -> Any:
    """A copy of the frozen spec with one dotted key replaced."""
    head, _, rest = key.partition(".")
    if not rest:
        return dataclasses.replace(spec, **{head: value})
    return dataclasses.replace(spec, **{head: with_value(getattr(spec, head), rest, value)})


def with_values(spec: S, changes: dict[str, Any]) -> S:
    for key, value in changes.items():
        spec = with_value(spec, key, value)
    return spec


def both(n_bytes: float) -> str:
    """`52.1 GiB (55.9 GB)`: a memory size beside the decimal figure vendors label."""
    return f"{gib(n_bytes)} ({n_bytes / GB:,.1f} GB)"


def shown_changes(changes: dict[str, Any]) -> str:
    """`parallel.tp=2 train.recompute=full`: the changes as command-line overrides."""
    return " ".join(f"{k}={override_value(v)}" for k, v in changes.items())


def candidate_fixes(spec: TrainingSpec) -> Iterator[dict[str, Any]]:
    """TrainingSpec changes in the seed's order; each is checked before it is offered."""
    t, p, m = spec.train, spec.parallel, spec.model
    backend, capabilities = backend_of(spec), capabilities_of(spec)
    if t.micro_batch_size > 1:
        yield {"train.micro_batch_size": 1}
    if backend.hf_model_code:  # the HF model code has no selective recompute
        if t.recompute != "full":
            yield {"train.recompute": "full"}
    else:
        for level in RECOMPUTE_ORDER[RECOMPUTE_ORDER.index(t.recompute) + 1 :]:
            yield {"train.recompute": level}
    if backend.zero_sharding:
        for stage in range(p.zero_stage + 1, 4):
            if p.pp == 1 or stage <= 1:
                yield {"parallel.zero_stage": stage}
        if p.zero_stage >= 1 and not p.offload_optimizer:
            yield {"parallel.offload_optimizer": True}
        if p.zero_stage == 3 and not p.offload_params:
            yield {"parallel.offload_params": True}
    elif not p.distributed_optimizer:
        yield {"parallel.distributed_optimizer": True}
    if capabilities is not None and capabilities.runs("pipeline_parallel"):
        world = world_size(spec.hardware.gpus_per_node, spec.hardware.nodes)
        pps = [n for n in divisors(world) if p.pp < n <= m.num_layers and world % (n * p.tp * p.cp) == 0]
        pp_fix = _first_fitting_or_last(
            spec,
            [
                {"parallel.pp": n, "parallel.pp_layout": "auto", "parallel.dp": "auto", "parallel.virtual_stages": None}
                for n in pps
            ],
        )
        if pp_fix:
            yield pp_fix
        if m.moe is not None and capabilities.runs("expert_parallel"):
            ep_fix = _first_fitting_or_last(spec, [{"parallel.ep": n} for n in _legal_eps(spec) if n > p.ep])
            if ep_fix:
                yield ep_fix


def _legal_eps(spec: TrainingSpec) -> list[int]:
    """Expert-parallel sizes that divide the experts and fold into one stage's dp x tp x cp ranks."""
    p, moe = spec.parallel, spec.model.moe
    dp = data_parallel_size(spec)
    if moe is None or dp is None:
        return []
    ranks = ranks_per_stage(dp, p.tp, p.cp)
    return [n for n in divisors(moe.num_experts) if ranks % (n * p.etp) == 0]


def _first_fitting_or_last(spec: TrainingSpec, options: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The smallest change that fits alone, else the one that goes furthest."""
    for changes in options:
        memory = estimate(with_values(spec, changes))
        if memory is not None and memory.fits:
            return changes
    return options[-1] if options else None


def estimate(spec: TrainingSpec) -> TrainMemory | None:
    return estimate_train_memory(spec) if computable(spec) else None


def _fewest_nodes(spec: TrainingSpec) -> tuple[int, TrainingSpec, TrainMemory] | None:
    """Smallest node count (dp=auto; experts spread over the most EP ranks that divide them)
    whose worst GPU fits. Fit is not monotonic in the node count (EP must divide the experts and
    the ranks), so double the nodes until one fits, then scan the legal counts since the last double."""
    base = with_value(spec, "parallel.dp", "auto")

    def grown(nodes: int) -> TrainingSpec:
        bigger = with_value(base, "hardware.nodes", nodes)
        capabilities = capabilities_of(spec)
        eps = _legal_eps(bigger) if capabilities is not None and capabilities.runs("expert_parallel") else []
        return with_value(bigger, "parallel.ep", eps[-1]) if eps and eps[-1] > spec.parallel.ep else bigger

    def fits(nodes: int) -> TrainMemory | None:
        memory = estimate(grown(nodes))
        return memory if memory is not None and memory.fits else None

    step = spec.parallel.tp * spec.parallel.pp * spec.parallel.cp
    nodes, per_node = spec.hardware.nodes, spec.hardware.gpus_per_node
    doubled = (nodes * 2**k for k in range(1, MAX_NODE_MULTIPLE.bit_length()))
    hi = next((n for n in doubled if (n * per_node) % step == 0 and fits(n)), None)
    if hi is None:
        return None
    # legal counts are the multiples of `legal` in (hi / 2, hi]; at most SCAN_MAX of them are tried
    legal = step // math.gcd(per_node, step)
    first = next_multiple_above(hi // 2, legal)
    stride = legal * max(1, -(-((hi - first) // legal + 1) // SCAN_MAX))
    for n in [*range(first, hi, stride), hi]:
        if (found := fits(n)) is not None:
            return n, grown(n), found
    raise AssertionError("unreachable: hi itself fits")


def _failing_layout_rules(spec: TrainingSpec) -> set[str]:
    from lmspec.compiler.rules import experts, layout  # siblings of this rule in the same table

    ctx = TrainingContext(spec, Origins())
    return {rule.__name__ for rule in (*layout.RULES, *experts.RULES) if any(p.severity == "error" for p in rule(ctx))}


def _host(spec: TrainingSpec, memory: TrainMemory) -> str:
    host = max(s.host_bytes for s in memory.stages)
    return f" + {gib(host * spec.hardware.gpus_per_node)} host memory per node" if host else ""


def _fix_lines(spec: TrainingSpec) -> list[str]:
    """Each fix alone with its result; when none fits alone, the fixes stacked in order until one does."""
    lines: list[str] = []
    stacked: dict[str, Any] = {}
    stacked_spec = spec
    offered: list[dict[str, Any]] = []
    now = estimate(spec)
    already_failing = _failing_layout_rules(spec)
    for changes in candidate_fixes(spec):
        alone = estimate(with_values(spec, changes))
        if alone is None or now is None or alone.worst.total_bytes >= now.worst.total_bytes:
            continue  # a change that does not lower the worst GPU is no fix
        offered.append(changes)
        # stack it only if the stack breaks no further layout rule (more PP can leave no room for more EP)
        if _failing_layout_rules(with_values(spec, {**stacked, **changes})) <= already_failing:
            stacked.update(changes)
            stacked_spec = with_values(spec, stacked)
        lines.append(
            f"{shown_changes(changes)} -> {gib(alone.worst.total_bytes)}{_host(spec, alone)} "
            f"({'fits' if alone.fits else 'still over'})"
        )
    if not any(line.endswith("(fits)") for line in lines) and len(lines) > 1 and stacked:
        together = estimate(stacked_spec)
        if together is not None:
            which = "all of these" if len(stacked) == sum(len(c) for c in offered) else shown_changes(stacked)
            lines.append(
                f"{which} together -> {gib(together.worst.total_bytes)}{_host(spec, together)} "
                f"({'fits' if together.fits else 'still over'})"
            )
            if together.fits:
                return lines
    nodes = _fewest_nodes(stacked_spec if stacked and not any(line.endswith("(fits)") for line in lines) else spec)
    if nodes is not None:
        n, grown, memory = nodes
        world = world_size(spec.hardware.gpus_per_node, n)
        on_top = (
            " on top of all the above"
            if stacked_spec is not spec and not any(line.endswith("(fits)") for line in lines)
            else ""
        )
        ep = f" parallel.ep={grown.parallel.ep}" if grown.parallel.ep != stacked_spec.parallel.ep else ""
        lines.append(
            f"hardware.nodes={n} parallel.dp=auto{ep} ({world} GPUs){on_top} -> {gib(memory.worst.total_bytes)} (fits)"
        )
    return lines


def training_fits_memory(ctx: TrainingContext) -> Iterator[Problem]:
    spec = ctx.spec
    memory = estimate(spec)
    if memory is None or memory.fits:
        return
    worst = memory.worst
    terms = worst.terms()
    biggest = max(TERMS, key=lambda t: terms[t])
    detail = ", ".join(f"{t} {gib(terms[t])}" for t in TERMS)
    why = {
        "activations": (
            f"{worst.in_flight:g} micro-batch(es) in flight of {ctx.show('train.micro_batch_size')}, "
            f"{ctx.show('train.recompute')}"
        ),
        "optimizer": "fp32 master weights and Adam moments of every parameter this GPU holds",
        "gradients": "gradients of every parameter this GPU holds",
        "weights": "parameters this GPU holds",
        "workspace": "buffers the backend allocates beside the model state and activations",
        "allocator": "what the caching allocator reserves beyond what is allocated",
    }[biggest]
    fixes = _fix_lines(spec)
    stage = (
        f"pipeline stage {worst.stage} of {len(memory.stages)}, {worst.layers} layers"
        if len(memory.stages) > 1
        else "every GPU"
    )
    yield error(
        "hardware.gpu.memory_gib",
        (
            f"training does not fit: the worst GPU ({stage}) needs {both(worst.total_bytes)} but "
            f"{ctx.show('hardware.gpu.memory_gib')} leaves {gib(memory.budget_bytes)} usable "
            f"(minus a {DEVICE_RESERVE_GIB:g} GiB CUDA/NCCL reserve); biggest term: {biggest} {gib(terms[biggest])} "
            f"({why}); per GPU: {detail}. Fixes, cheapest first: "
            + (
                "; ".join(fixes)
                if fixes
                else "none of lower micro batch, recompute, more sharding, PP/EP or more GPUs fits; "
                "use a GPU with more memory"
            )
        ),
    )


COMM_KEYS = {"tp": "parallel.tp", "dp": "parallel.dp", "ep": "parallel.ep", "cp": "parallel.cp", "pp": "parallel.pp"}


def communication_within_budget(ctx: TrainingContext) -> Iterator[Problem]:
    """A warning: communication the step cannot hide above 30% of its compute time (the seed's TP8 slowdown).
    What `parallel.overlap` hides behind compute is not counted: DeepSeek-V3's expert all-to-alls, hidden by
    its DualPipe schedule, do not ask for a lower parallel.ep. The condition is `summary.comm_over_warning` on
    the step `lmspec plan` ranks by, so plan never picks a winner this warning flags while another fits."""
    memory = estimate(ctx.spec)
    priced = estimate_comm_and_step(ctx.spec, memory) if memory is not None else None
    if priced is None:
        return
    step = priced[1]
    compute = float(step.compute)
    parts = {
        "tp": float(step.tp_comm),
        "dp": float(step.dp_comm),
        "ep": float(step.ep_comm),
        "cp": float(step.cp_comm),
        "pp": float(step.pp_comm),
    }
    if not compute or not comm_over_warning(step):
        return
    exposed = float(step.comm)
    worst = max(parts, key=lambda k: parts[k])
    key = COMM_KEYS[worst]
    link = ctx.spec.hardware.intra_node
    fix = {
        "tp": f"lower parallel.tp (every layer all-reduces over {link.link} "
        f"at {link.gb_per_s:g} GB/s) and add parallel.pp",
        "dp": "shard less often: raise train.global_batch_size "
        "(fewer steps) or keep the data-parallel group inside a node",
        "ep": "keep parallel.ep inside a node or lower it, or hide the all-to-alls with parallel.overlap.moe_a2a=true",
        "cp": "lower parallel.cp (ring attention outruns the attention it hides behind)",
        "pp": "lower parallel.pp",
    }[worst]
    yield warning(
        key,
        (
            f"communication is {exposed / compute:.0%} of compute time (> {COMM_SHARE_WARNING:.0%}): per step "
            + ", ".join(f"{k} {v:.3g} s" for k, v in parts.items() if v)
            + f" against the estimated step's {compute:.3g} s of compute on "
            f"{ctx.show('hardware.gpu.bf16_tflops')}, after what parallel.overlap hides; biggest: {ctx.show(key)}; "
            f"{fix}"
        ),
    )


RULES = (training_fits_memory, communication_within_budget)
