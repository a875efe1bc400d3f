"""Per-GPU training memory of many candidates at once, with `lmspec.compiler.models.train_memory`'s formulas.

The memory model prices one spec stage by stage. Here every candidate's worst stage is
found without looping over stages: a stage's memory is its parameters times the bytes
per parameter of its sharding, plus its activations per micro-batch times the
micro-batches in flight (`in_flight_micro_batches`: pp - stage under 1F1B, more when
interleaved, falling with the stage either way). Within stages of the same layer count
and layer kinds, the earliest holds the most micro-batches, so the worst stage is among
a few per pipeline depth: the first and the last (embedding, output head), every stage
holding a dense layer of a MoE model, and the first of each (layer count, kinds) class.
Those are tabulated once per pp; the model's own functions (`state_bytes`,
`layer_activation_bytes`, `stage_terms`, ...) are then called on numpy arrays, once
per group of candidates sharing the settings they branch on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from lmspec.compiler.models.activations import (
    backward_working_bytes,
    dispatched_tokens,
    embedding_activation_bytes,
    head_working_bytes,
    layer_activation_bytes,
    layer_shape,
    persistent_buffer_bytes,
    residual_bytes,
    step_input_bytes,
    working_layer_bytes,
)
from lmspec.compiler.models.dims import balanced_stages
from lmspec.compiler.models.params import count_params, is_moe_layer, layer_params
from lmspec.compiler.models.stages import StageParams, last_stage_extra, stage_params
from lmspec.compiler.models.train_memory import (
    StateBytes,
    StepPhase,
    Workspace,
    activation_setting,
    backend_workspace,
    budget_bytes,
    in_flight_micro_batches,
    last_stage_activation_bytes,
    layer_working_bytes,
    moe_loads,
    stage_held_bytes,
    stage_terms,
    stage_working_bytes,
    state_bytes,
    step_phase,
)
from lmspec.compiler.search.legality import BACKENDS, RECOMPUTE, ZERO_STAGES, Columns, dims_of
from lmspec.compiler.spec.sections import TrainingSpec


@dataclass(frozen=True)
class StageTable:
    """Candidate worst stages for every pp (row pp - 1), padded to the same width (`valid`)."""

    valid: np.ndarray
    index: np.ndarray  # stage number: pp - index micro-batches in flight at most
    dense_layers: np.ndarray
    moe_layers: np.ndarray
    dense_split: np.ndarray  # parameters TP divides (projections, MLPs, embedding/head)
    dense_replicated: np.ndarray  # parameters every TP rank keeps (norms, routers)
    expert: np.ndarray  # routed-expert parameters before EP
    first: np.ndarray
    last: np.ndarray


def _worth_pricing(kinds: list[tuple[int, int]], moe_model: bool) -> list[int]:
    """Stages that can be the worst (see the module docstring); kinds[i] = (dense, MoE) layers of stage i."""
    pp = len(kinds)
    picked = {0, pp - 1}
    seen: set[tuple[int, int]] = set()
    for i in range(1, pp - 1):
        if (moe_model and kinds[i][0]) or kinds[i] not in seen:
            picked.add(i)
        seen.add(kinds[i])
    return sorted(picked)


def stage_table(spec: TrainingSpec) -> StageTable:
    m = spec.model
    counts = count_params(m)
    layers = [layer_params(m, i) for i in range(m.num_layers)]
    moe = [is_moe_layer(m, i) for i in range(m.num_layers)]
    extra = last_stage_extra(m, spec.train.seq_length)
    rows = []
    for pp in range(1, m.num_layers + 1):
        stages = balanced_stages(m.num_layers, pp, extra)
        starts = np.cumsum((0,) + stages)
        kinds = [
            (sum(not moe[j] for j in range(a, b)), sum(moe[j] for j in range(a, b)))
            for a, b in zip(starts[:-1], starts[1:])
        ]
        row = []
        for i in _worth_pricing(kinds, m.moe is not None):
            held = stage_params(layers, counts, int(starts[i]), int(starts[i + 1]), pp)
            row.append((i, *kinds[i], held.split, held.replicated, held.expert, i == 0, i == pp - 1))
        rows.append(row)
    width = max(len(r) for r in rows)
    table = np.zeros((len(rows), width, 8), dtype=np.float64)
    valid = np.zeros((len(rows), width), dtype=bool)
    for p, row in enumerate(rows):
        table[p, : len(row)] = row
        valid[p, : len(row)] = True
    cols = [table[..., k] for k in range(8)]
    return StageTable(
        valid=valid,
        index=cols[0],
        dense_layers=cols[1],
        moe_layers=cols[2],
        dense_split=cols[3],
        dense_replicated=cols[4],
        expert=cols[5],
        first=cols[6] > 0,
        last=cols[7] > 0,
    )


@dataclass(frozen=True)
class Memory:
    """Per candidate: the worst GPU's bytes and the parameters it holds."""

    total_bytes: np.ndarray
    worst_stage: np.ndarray
    dense_params: np.ndarray
    expert_params: np.ndarray
    budget_bytes: int


def _group_spec(
    spec: TrainingSpec, backend: int, zero: int = 0, dopt: bool = False, sp: bool = False, recompute: int = 0
) -> TrainingSpec:
    parallel = dataclasses.replace(
        spec.parallel,
        zero_stage=ZERO_STAGES[zero],
        distributed_optimizer=dopt,
        sequence_parallel=sp,
        offload_optimizer=False,
        offload_params=False,
        virtual_stages=None,
    )
    train = dataclasses.replace(spec.train, backend=BACKENDS[backend], recompute=RECOMPUTE[recompute])
    return dataclasses.replace(spec, parallel=parallel, train=train)


ACTIVATION_TERMS = (
    "dense_layer",
    "moe_layer",
    "embedding",
    "head",
    "dense_working",
    "moe_working",
    "head_working",
    "dense_backward",
    "moe_backward",
    "persistent",
    "inputs",
    "residual",
)


def _activation_lookup(
    spec: TrainingSpec,
    c: Columns,
    tp_values: np.ndarray,
    cp_values: np.ndarray,
    mbs_values: np.ndarray,
    ep_values: np.ndarray,
) -> dict[str, np.ndarray]:
    """Activation bytes per micro-batch of each candidate, from the model's functions evaluated once
    on the small grid of (backend, sp, recompute, tp, cp, micro batch, ep) and looked up; a MoE layer's
    routed load (`moe_loads`) is re-priced at every grid point, as activation_setting prices one layout."""
    m = spec.model
    dense_shape = layer_shape(m, False)
    moe_shape = layer_shape(m, True) if m.moe is not None else None  # a dense model has no MoE layer to price
    axes = (tp_values, cp_values, mbs_values, ep_values)
    grid = [v.reshape([-1 if i == k else 1 for i in range(len(axes))]) for k, v in enumerate(axes)]
    tables = {k: np.zeros((len(BACKENDS), 2, len(RECOMPUTE), *(len(v) for v in axes))) for k in ACTIVATION_TERMS}
    for b, sp, r in product(range(len(BACKENDS)), (0, 1), range(len(RECOMPUTE))):
        group = _group_spec(spec, b, sp=bool(sp), recompute=r)
        act = dataclasses.replace(
            activation_setting(group), tp=grid[0], cp=grid[1], micro_batch_size=grid[2], ep=grid[3]
        )
        tokens = act.micro_batch_size * act.seq_length / act.cp
        routed, sent = moe_loads(group, act.ep, tokens, tokens / dispatched_tokens(act))
        act = dataclasses.replace(act, routed_load=routed, sent_load=sent)
        values = (
            layer_activation_bytes(dense_shape, act),
            0.0 if moe_shape is None else layer_activation_bytes(moe_shape, act),
            embedding_activation_bytes(act),
            last_stage_activation_bytes(m, act),
            working_layer_bytes(dense_shape, act),
            0.0 if moe_shape is None else working_layer_bytes(moe_shape, act),
            head_working_bytes(m, act),
            backward_working_bytes(dense_shape, act),
            0.0 if moe_shape is None else backward_working_bytes(moe_shape, act),
            persistent_buffer_bytes(m, act),
            step_input_bytes(act),
            residual_bytes(m.hidden_size, act),
        )
        for k, v in zip(ACTIVATION_TERMS, values):
            tables[k][b, sp, r] = v
    at = (
        c.backend,
        c.sequence_parallel.astype(np.int64),
        c.recompute,
        np.searchsorted(tp_values, c.tp),
        np.searchsorted(cp_values, c.cp),
        np.searchsorted(mbs_values, c.micro_batch_size),
        np.searchsorted(ep_values, c.ep),
    )
    flat = np.ravel_multi_index(at, tables["dense_layer"].shape)
    # a term that is nought everywhere (no MoE layer, the step's inputs off the CPU target) is looked up by no one
    nought = np.broadcast_to(0.0, flat.shape)  # a view: no memory, no gather
    return {k: t.ravel()[flat] if t.any() else nought for k, t in tables.items()}


STATE_FIELDS = ("weights", "gradients", "optimizer")  # what a stage's GPU holds in device memory


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _fill(columns: dict[str, np.ndarray], rows: np.ndarray, values: object) -> None:
    """Write the fields of one group's `values` into `columns` at `rows`."""
    for name, column in columns.items():
        column[rows] = getattr(values, name)


def _column_view(values: Any, col: Any, names: tuple[str, ...]) -> Any:
    """`values` (a dataclass of per-candidate columns) with each of `names` as one stage's column vectors."""
    return dataclasses.replace(values, **{name: col(getattr(values, name)) for name in names})


def _state_columns(spec: TrainingSpec, c: Columns) -> tuple[StateBytes, StateBytes, Workspace, StepPhase]:
    """Bytes per dense and per expert parameter, the backend's workspace and step-phase setting, of each
    candidate."""
    n = c.size
    dense = {f: np.zeros(n) for f in STATE_FIELDS}
    expert = {f: np.zeros(n) for f in STATE_FIELDS}
    workspace = {f: np.zeros(n) for f in _fields(Workspace)}
    phase = {f: np.zeros(n) for f in _fields(StepPhase)}
    dims = dims_of(c, spec)
    code = c.backend * 8 + c.zero_stage * 2 + c.distributed_optimizer
    for value in np.flatnonzero(np.bincount(code, minlength=16)).tolist():
        b, z, d = value // 8, value % 8 // 2, bool(value % 2)
        rows = np.flatnonzero(code == value)
        if rows.size == 0:
            continue
        g = _group_spec(spec, b, zero=z, dopt=d)
        for out, shards in ((dense, dims.dense_dp[rows]), (expert, dims.expert_dp[rows])):
            _fill(out, rows, state_bytes(g, shards, dims.micro_batches[rows], c.pp[rows]))
        _fill(workspace, rows, backend_workspace(g))
        _fill(phase, rows, step_phase(g))
    return StateBytes(**dense), StateBytes(**expert), Workspace(**workspace), StepPhase(**phase)


def worst_stage_memory(spec: TrainingSpec, c: Columns, table: StageTable, axes_values: dict[str, np.ndarray]) -> Memory:
    """Memory of each candidate's worst stage. `c` is sorted by pp and carries dp, world and
    micro_batches; `axes_values` holds the sorted tp, cp and micro-batch values searched."""
    n = c.size
    ep_values = np.unique(c.ep)
    act = _activation_lookup(spec, c, axes_values["tp"], axes_values["cp"], axes_values["micro_batch_size"], ep_values)
    dense_state, expert_state, workspace, phase = _state_columns(spec, c)
    shards = dims_of(c, spec).dense_dp
    total, worst = np.zeros(n), np.zeros(n, dtype=np.int64)
    dense_out, expert_out = np.zeros(n), np.zeros(n)
    etp = spec.parallel.etp
    bounds = np.searchsorted(c.pp, np.arange(1, spec.model.num_layers + 2))
    for s in range(spec.model.num_layers):
        lo, hi = bounds[s], bounds[s + 1]
        if lo == hi:
            continue
        k = int(table.valid[s].sum())
        cut = slice(lo, hi)

        def row(a: np.ndarray, s: int = s, k: int = k) -> np.ndarray:
            return a[s, :k][None, :]

        def col(a: np.ndarray, cut: slice = cut) -> np.ndarray:
            return a[cut][:, None]

        held = StageParams(row(table.dense_split), row(table.dense_replicated), row(table.expert))
        dense, expert = held.per_gpu(col(c.tp), col(c.ep), etp)
        per_mb = (
            row(table.dense_layers) * col(act["dense_layer"])
            + row(table.moe_layers) * col(act["moe_layer"])
            + row(table.first) * col(act["embedding"])
            + row(table.last) * col(act["head"])
        )
        has_dense, has_moe, last = row(table.dense_layers) > 0, row(table.moe_layers) > 0, row(table.last)
        layer_working = layer_working_bytes(
            np.maximum(has_dense * col(act["dense_working"]), has_moe * col(act["moe_working"])),
            np.maximum(has_dense * col(act["dense_backward"]), has_moe * col(act["moe_backward"])),
            last * col(act["head"]),
        )
        working = stage_working_bytes(layer_working, last * col(act["head_working"]))
        in_flight = in_flight_micro_batches(
            s + 1,
            row(table.index),
            col(c.micro_batches),
            col(c.virtual_stages),
            row(table.dense_layers + table.moe_layers),
            col(c.moe_a2a),
        )
        dense_st, expert_st = (_column_view(st, col, STATE_FIELDS) for st in (dense_state, expert_state))
        stage_workspace = _column_view(workspace, col, _fields(Workspace))
        held = stage_held_bytes(
            col(act["persistent"]),
            col(act["inputs"]),
            col(c.micro_batches),
            s + 1,
            row(table.index),
            col(c.virtual_stages),
            col(act["residual"]),
        )
        stage_total = sum(
            stage_terms(
                dense,
                expert,
                per_mb,
                working,
                layer_working,
                in_flight,
                dense_st,
                expert_st,
                stage_workspace,
                held,
                _column_view(phase, col, _fields(StepPhase)),
                col(shards),
                col(c.tp),
                s + 1,
            )
        )
        pick = np.argmax(stage_total, axis=1)
        at = np.arange(hi - lo)
        total[cut] = stage_total[at, pick]
        worst[cut] = table.index[s, pick]
        dense_out[cut] = np.broadcast_to(dense, stage_total.shape)[at, pick]
        expert_out[cut] = np.broadcast_to(expert, stage_total.shape)[at, pick]
    return Memory(
        total_bytes=total,
        worst_stage=worst,
        dense_params=dense_out,
        expert_params=expert_out,
        budget_bytes=budget_bytes(spec.hardware.gpu.memory_gib),
    )
