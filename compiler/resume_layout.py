"""Whether a spec can resume from a checkpoint written at another layout: the manifest's `saved_with`.

Every step's manifest.json records what wrote it (`saved_with`, below); before it loads a step the runtime
asks `resume_problems` and stops with its messages, and `lmspec check --resume-from DIR` prints the same.

What reshards (megatron-core 0.16.1 dist_checkpointing, torch_dist):
- The model: every tensor is saved under its global name with its global shape, each rank writing its
  shard (`sharded_state_dict`), so any TP / PP / virtual-stage / CP / DP / EP / ETP layout loads it.
- The optimizer, regular (parallel.distributed_optimizer=false): its Adam moments are sharded exactly as
  the parameters (`optim_state_to_sharding_state`), so they reshard with them; its non-tensor state (the
  param groups' hyperparameters, Adam's step) is one common copy, matched to the new groups by key.
- The optimizer, distributed (parallel.distributed_optimizer=true): lmspec saves megatron-core's default
  sharding type, `fully_sharded_model_space` (each parameter's moments a flattened slice of the global
  tensor), one of the types megatron-core lists as fully reshardable (`checkpoint_fully_reshardable_formats`):
  TP, PP and DP may change. (`dp_reshardable`, Megatron-LM's own default, and `dp_zero_gather_scatter`
  keep the TP x PP structure and reshard over DP only: a checkpoint recording one of them is judged so.)
  lmspec cannot run the distributed optimizer on CPU ranks, so this case is megatron-core's word, not a
  lmspec test; switching the distributed optimizer on or off across a resume is refused.

What does not (refused here, each message with the fix):
- Crossing parallel.ep=1 <-> parallel.ep>1, or a layout where some pipeline stage holds no MoE layer
  beside one that does (the saved or the new one): megatron-core gives expert parameters an optimizer of
  their own only on a rank that holds expert-parallel ones (`allreduce=False`, i.e. ep > 1 and a MoE
  layer on that stage), and a ChainedOptimizer of two saves its moments as `chained_0.` / `chained_1.` keys
  and its common state as two entries; one optimizer saves neither. Measured on CPU: tp2 ep2 -> pp2 ep1
  fails in dist_checkpointing (KeyError `optimizer.state.exp_avg...`). Other ep and etp changes keep the
  structure and load, as do TP/PP/DP/CP/virtual-stage changes that keep every stage's expert optimizer.
  Run on CPU (tests/runtime/test_resume_layout.py, test_megatron_parallel.py): TP2 EP2 DP2 -> TP1 PP2 EP2 DP2,
  TP2 -> TP1 (DP1 -> DP2), DP2 on 2 ranks -> 1 rank; by hand also TP2 EP2 DP1 -> TP1 EP2 DP2.
- Any change of the model's shapes (the `model` record), of train.backend, train.precision,
  train.transformer_impl (the local and Transformer Engine layers name their norms differently) or of
  train.optimizer.name (other state per parameter).
- DeepSpeed: a change of parallel.zero_stage or of the data-parallel size. DeepSpeed writes the optimizer
  state partitioned per data-parallel rank in the layout of its ZeRO stage
  (zero_pp_rank_<R>_mp_rank_00_optim_states.pt) and `load_checkpoint` reads back exactly that layout;
  another stage or DP size needs DeepSpeed's universal checkpoint (`ds_to_universal.py` offline, then
  `checkpoint.load_universal`), which lmspec's DeepSpeed trainer does not run. The fix is the saved
  layout, or a fresh run (DeepSpeed has no train.init_from).

A manifest without `saved_with` (written by an older lmspec) gives no verdict: `resume_problems` returns
none (the runtime tries, as before) and `lmspec check --resume-from` says it cannot tell.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lmspec.compiler import __version__
from lmspec.compiler.backends import backend_of
from lmspec.compiler.capabilities import capabilities_of
from lmspec.compiler.models.dims import chunk_layers
from lmspec.compiler.plan import Layout, Plan
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.compiler.spec.sections.declare import JsonValue
from lmspec.compiler.spec.shown_key import value_at

FORMAT = 1  # saved_with's own version: a record of another format gets no verdict
# What lmspec's Megatron trainer passes as metadata["distrib_optim_sharding_type"] (megatron-core's default
# when none is passed): a checkpoint of the distributed optimizer that reshards over TP, PP and DP.
DISTRIB_OPTIM_SHARDING = "fully_sharded_model_space"
# megatron-core's distributed-optimizer sharding types that keep the TP x PP structure (DP changes only).
DP_ONLY_SHARDINGS = frozenset({"dp_reshardable", "dp_zero_gather_scatter"})

# The model keys that set a tensor's shape or the set of tensors: the checkpoint's `model` record.
MODEL_KEYS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "attention",
    "qkv_bias",
    "qk_norm",
    "tie_embeddings",
    "mtp_layers",
    "mla.q_lora_rank",
    "mla.kv_lora_rank",
    "mla.qk_nope_head_dim",
    "mla.qk_rope_head_dim",
    "mla.v_head_dim",
    "moe.num_experts",
    "moe.num_shared_experts",
    "moe.ffn_hidden_size",
    "moe.first_dense_layers",
    "moe.router_score_bias",
)


@dataclass(frozen=True)
class Row:
    """One entry of `saved_with`: where it sits (`path`, dotted; a model key keeps its own dots under
    `model`), the spec key a message names, and how the compiled job gives its value."""

    path: str
    key: str
    read: Callable[[TrainingSpec, Layout], JsonValue]

    def parts(self) -> list[str]:
        return ["model", self.path[len("model.") :]] if self.path.startswith("model.") else self.path.split(".")


def _layout_row(name: str) -> Row:
    return Row(f"layout.{name}", f"parallel.{name}", lambda spec, layout: getattr(layout, name))


def _model_row(name: str) -> Row:
    return Row(f"model.{name}", f"model.{name}", lambda spec, layout: value_at(spec, f"model.{name}"))


BACKEND = Row("backend", "train.backend", lambda spec, layout: spec.train.backend)
WORLD = Row("layout.world_size", "hardware.gpus_per_node x hardware.nodes", lambda spec, layout: layout.world_size)
LAYOUT_ROWS = (
    WORLD,
    *(_layout_row(name) for name in ("tp", "pp", "dp", "cp", "ep", "etp", "virtual_stages")),
    Row("layout.stage_layers", "parallel.pp_layout", lambda spec, layout: list(layout.stage_layers)),
)
ZERO_STAGE = Row("sharding.zero_stage", "parallel.zero_stage", lambda spec, layout: layout.zero_stage)
DISTRIBUTED = Row(
    "sharding.distributed_optimizer",
    "parallel.distributed_optimizer",
    lambda spec, layout: layout.distributed_optimizer,
)
SHARDING_TYPE = Row(
    "sharding.distrib_optim_sharding_type",
    "parallel.distributed_optimizer",
    lambda spec, layout: DISTRIB_OPTIM_SHARDING if layout.distributed_optimizer else None,
)
# Equal on both sides whatever the backend; why, for the message.
SAME_ROWS: tuple[tuple[Row, str], ...] = (
    (
        Row("precision", "train.precision", lambda spec, layout: spec.train.precision),
        "the saved weights and optimizer state (fp32 main weights, a loss scaler) follow the precision",
    ),
    (
        Row("transformer_impl", "train.transformer_impl", lambda spec, layout: spec.train.transformer_impl),
        "the local and Transformer Engine layers name and fuse their tensors differently",
    ),
    (
        Row("optimizer", "train.optimizer.name", lambda spec, layout: spec.train.optimizer.name),
        "each optimizer keeps other state per parameter",
    ),
    *(
        (
            _model_row(k),
            "the checkpoint holds another model (its tensors have other shapes or names)",
        )
        for k in MODEL_KEYS
    ),
)


def _rows(zero_sharding: bool) -> tuple[Row, ...]:
    sharding = (ZERO_STAGE,) if zero_sharding else (DISTRIBUTED, SHARDING_TYPE)
    return (BACKEND, *LAYOUT_ROWS, *sharding, *(row for row, _ in SAME_ROWS))


_MISSING: Any = object()


def _get(record: Mapping[str, Any], row: Row) -> Any:
    """The row's value in a record, or _MISSING (a record edited by hand, or written by another lmspec)."""
    node: Any = record
    for part in row.parts():
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def saved_with(spec: TrainingSpec, plan: Plan) -> dict[str, JsonValue]:
    """What a checkpoint step of this build is written with, for its manifest's "saved_with":

        {"format": 1, "lmspec_version": "0.1.0", "backend": "megatron",
         "layout": {"world_size": 2, "tp": 2, "pp": 1, "dp": 1, "cp": 1, "ep": 2, "etp": 1,
                    "virtual_stages": null, "stage_layers": [4]},
         "sharding": {"distributed_optimizer": false, "distrib_optim_sharding_type": null},
         "precision": "fp32", "transformer_impl": "local", "optimizer": "adamw",
         "model": {"num_layers": 4, "hidden_size": 128, ..., "mla.kv_lora_rank": 64, "moe.num_experts": 8, ...}}

    `sharding` is {"zero_stage": N} for a backend that shards with ZeRO stages (DeepSpeed); `model` holds
    MODEL_KEYS (a section the model lacks, e.g. mla of a GQA model, gives nulls)."""
    layout = plan.trained().layout
    record: dict[str, Any] = {"format": FORMAT, "lmspec_version": __version__}
    for row in _rows(backend_of(spec).zero_sharding):
        *parents, leaf = row.parts()
        node = record
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = row.read(spec, layout)
    return record


def _shown(value: Any) -> str:
    return (
        "null" if value is _MISSING or value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


def _fresh(spec: TrainingSpec, weights: bool = True) -> str:
    """The fix that keeps nothing of the checkpoint, or only its weights where the backend can load them."""
    caps = capabilities_of(spec)
    keep = (
        "to keep only its weights (the optimizer afresh), compile with train.init_from=<that step directory> and "
        "another train.checkpoint.dir; "
        if weights and caps is not None and caps.runs("init_from")
        else ""
    )
    return f"{keep}to start afresh, set train.checkpoint.resume=never or another train.checkpoint.dir"


def _changed(now: Mapping[str, Any], saved: Mapping[str, Any], row: Row) -> bool:
    was = _get(saved, row)
    return was is not _MISSING and was != _get(now, row)


def _differs(now: Mapping[str, Any], saved: Mapping[str, Any], row: Row) -> str:
    return f"{row.key} is {_shown(_get(now, row))} here but the checkpoint was written with {_shown(_get(saved, row))}"


def _expert_optimizers(layout: Mapping[str, Any], model: Mapping[str, Any]) -> set[bool] | None:
    """Over the pipeline ranks, whether megatron-core builds one an optimizer of its own for expert parameters
    (ep > 1 and a MoE layer among the layers it holds); None where the record cannot tell."""
    try:
        ep, pp, virtual = int(layout["ep"]), int(layout["pp"]), layout["virtual_stages"]
        chunks = chunk_layers(tuple(int(n) for n in layout["stage_layers"]), virtual)
        experts, dense = model["moe.num_experts"], int(model["moe.first_dense_layers"] or 0)
    except (KeyError, TypeError, ValueError):
        return None
    if experts is None or ep <= 1:
        return {False}
    ends = [sum(chunks[: i + 1]) for i in range(len(chunks))]  # chunk i holds layers [ends[i] - chunks[i], ends[i])
    return {any(chunks[c] > 0 and ends[c] > dense for c in range(r, len(chunks), pp)) for r in range(pp)}


def _megatron_problems(now: Mapping[str, Any], saved: Mapping[str, Any], fresh: str) -> list[str]:
    """megatron-core's dist_checkpointing: what it cannot reshard (the module's docstring)."""
    problems = []
    if _changed(now, saved, DISTRIBUTED):
        was = _shown(_get(saved, DISTRIBUTED))
        problems.append(
            f"{_differs(now, saved, DISTRIBUTED)}: megatron-core saves the distributed optimizer's state and the "
            f"regular optimizer's differently, and neither is proven to load the other; set "
            f"parallel.distributed_optimizer={was}, or {fresh}"
        )
    sharding = _get(saved, SHARDING_TYPE)
    if sharding in DP_ONLY_SHARDINGS:
        moved = [
            row for row in LAYOUT_ROWS if row not in (WORLD,) and row.key != "parallel.dp" and _changed(now, saved, row)
        ]
        if moved:
            problems.append(
                f"{'; '.join(_differs(now, saved, row) for row in moved)}: the distributed optimizer's state was saved "
                f"as {sharding}, which megatron-core reshards over data parallelism only; keep "
                f"{', '.join(f'{row.key}={_shown(_get(saved, row))}' for row in moved)}, or {fresh}"
            )
    layout, model = saved.get("layout"), saved.get("model")
    if isinstance(layout, Mapping) and isinstance(model, Mapping):
        before, after = _expert_optimizers(layout, model), _expert_optimizers(now["layout"], now["model"])
        if before is not None and after is not None and len(before | after) > 1:
            problems.append(
                f"parallel.ep is {now['layout']['ep']} here with stages of {now['layout']['stage_layers']} layers, "
                f"but the checkpoint was written at parallel.ep={_shown(layout.get('ep'))} with stages of "
                f"{_shown(layout.get('stage_layers'))}: megatron-core gives expert parameters an optimizer of "
                "their own only on a pipeline rank holding a MoE layer with parallel.ep > 1, so the two layouts "
                "save their optimizer state in different structures that dist_checkpointing cannot map onto each "
                "other; resume with parallel.ep on the same side of 1 as the saved layout (and, with parallel.ep "
                f"> 1, a MoE layer on every pipeline stage, as it had), or {fresh}"
            )
    return problems


def _zero_problems(now: Mapping[str, Any], saved: Mapping[str, Any], fresh: str) -> list[str]:
    """DeepSpeed's checkpoint: the optimizer state partitioned for one ZeRO stage and data-parallel size."""
    moved = [row for row in (ZERO_STAGE, *LAYOUT_ROWS) if row is not WORLD and _changed(now, saved, row)]
    if not moved:
        return []
    keep = ", ".join(f"{row.key}={_shown(_get(saved, row))}" for row in moved)
    return [
        f"{'; '.join(_differs(now, saved, row) for row in moved)}: DeepSpeed writes the optimizer state partitioned "
        "over the data-parallel ranks as its ZeRO stage and precision arrange it (zero_pp_rank_<R>_mp_rank_00_"
        "optim_states.pt), and its load_checkpoint reads back only the partitioning it wrote; another stage or "
        "data-parallel size needs DeepSpeed's universal checkpoint (ds_to_universal.py, then "
        f"checkpoint.load_universal), which lmspec does not run; keep {keep} (parallel.dp = world size / "
        f"(tp x pp x cp), the world being hardware.gpus_per_node x hardware.nodes), or {fresh}"
    ]


def readable(saved: Mapping[str, Any] | None) -> str | None:
    """Why a manifest's record gives no verdict (written before lmspec recorded it, or of another format), or None."""
    if saved is None:
        return "its manifest has no saved_with (written by an older lmspec): lmspec cannot tell what wrote it"
    if saved.get("format") != FORMAT:
        return (
            f"its manifest's saved_with is of format {_shown(saved.get('format'))}, not {FORMAT} (written by lmspec "
            f"{_shown(saved.get('lmspec_version'))}): this lmspec cannot judge it"
        )
    return None


def resume_problems(spec: TrainingSpec, plan: Plan, saved: Mapping[str, Any] | None) -> list[str]:
    """Why this job cannot resume from a checkpoint written with `saved` (its manifest's saved_with); empty
    when it can, or when `saved` gives no verdict (`readable`)."""
    if readable(saved) is not None:
        return []
    assert saved is not None
    now = saved_with(spec, plan)
    fresh = _fresh(spec)
    if _changed(now, saved, BACKEND):
        return [
            f"{_differs(now, saved, BACKEND)}: each backend saves its own checkpoint format "
            f"({backend_of(spec).checkpoint_format} here), and neither loads the other's; set "
            f"train.backend={_shown(_get(saved, BACKEND))}, or {_fresh(spec, weights=False)}"
        ]
    problems = [
        # another model's weights do not load either (train.init_from needs the same tensors)
        f"{_differs(now, saved, row)}: {why}; {_fresh(spec, weights=False) if row.key.startswith('model.') else fresh}"
        for row, why in SAME_ROWS
        if _changed(now, saved, row)
    ]
    backend = backend_of(spec)
    if backend.fsdp:  # DCP reshards TP's and FSDP2's DTensors as it loads them: any tp, data-parallel size or stage
        return problems
    if backend.zero_sharding:
        return problems + _zero_problems(now, saved, fresh)
    return problems + _megatron_problems(now, saved, fresh)


def summary(saved: Mapping[str, Any]) -> str:
    """`megatron, 2 ranks: tp 2 x pp 1 x dp 1 x cp 1, ep 2`: one line of what wrote a checkpoint."""
    found = saved.get("layout")
    layout: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    degrees = " x ".join(f"{k} {_shown(layout.get(k, _MISSING))}" for k in ("tp", "pp", "dp", "cp"))
    ranks, backend = _shown(layout.get("world_size", _MISSING)), _shown(saved.get("backend", _MISSING))
    return f"{backend}, {ranks} ranks: {degrees}, ep {_shown(layout.get('ep', _MISSING))}"
