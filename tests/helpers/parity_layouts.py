"""The parity sweep's layouts: every point of its axes that lmspec's own validator accepts.

A layout is one value per axis (the spec's own keys) on top of BASE, which fixes what every
layout shares: the batch (micro 2, global 16: every world of 1, 2 or 4 ranks divides it), seq 64,
3 steps, no validation, no checkpoint before the last step. `enumerate_layouts` composes the spec
once per (model, world) with Hydra, then asks `checked` (what `lmspec check` runs) about each
candidate, so no rule is copied here. It goes in two stages, to stay at seconds instead of the
hours the whole product (~83k candidates per model, world and backend) would take: the shape
axes (backend, tp, pp, pp_layout, virtual stages, ep, etp, sequence parallel) at the defaults of
the rest, then for each shape accepted the optimizer-state axes (distributed optimizer, ZeRO
stage, offload), then for each of those accepted recompute and MTP. A candidate refused at one
stage is counted refused once and not expanded further.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field, fields, replace
from typing import Any

from lmspec.compiler.errors import SpecError
from lmspec.compiler.pipeline import checked
from lmspec.compiler.spec.load import Composed, compose_spec

MODELS = ("tiny", "tiny_moe")
SEED_BACKEND = "megatron"  # the backend of the seed runs and of the references of the layouts started from them
WORLDS = (2, 4)
STEPS = 3
BASE = (
    "hardware=cpu",
    "train.transformer_impl=local",
    "train.precision=fp32",
    "train.micro_batch_size=2",
    "train.global_batch_size=16",
    "train.seq_length=64",
    "train.eval_iters=0",
    "train.log_interval=1",
    f"train.checkpoint.interval={STEPS + 1}",
    "train.checkpoint.resume=never",
)


@dataclass(frozen=True, order=True)
class ParityLayout:
    """One point of the sweep, by the spec's own keys (None = null)."""

    model: str
    world: int
    backend: str = "megatron"
    tp: int = 1
    pp: int = 1
    pp_layout: str | None = None
    virtual_stages: int | None = None
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    recompute: str = "none"
    mtp_layers: int = 0
    steps: int = STEPS
    init_from: str | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        """The build and run name: the values that differ from a plain data-parallel layout."""
        parts = [self.model, f"w{self.world}", self.backend]
        for f, default in _NAMED:
            value = getattr(self, f)
            if value != default:
                parts.append(f if value is True else f"{f}{value}")
        return "-".join(parts).replace("_", "")

    def reference(self) -> ParityLayout:
        """The single-rank layout of the same model, backend and MTP that this one must equal."""
        return ParityLayout(self.model, 1, self.backend, mtp_layers=self.mtp_layers, init_from=self.init_from)

    def seed(self) -> ParityLayout:
        """The one-rank, one-step megatron run whose checkpoint every megatron and torchtitan layout of this
        model and MTP starts from (helpers.parity_sweep): megatron's own initialisation depends on the layout."""
        return ParityLayout(self.model, 1, SEED_BACKEND, mtp_layers=self.mtp_layers, steps=1)

    def overrides(self) -> list[str]:
        """Hydra overrides, as a user would type them after `lmspec check`."""
        out = [
            *BASE,
            f"model={self.model}",
            f"name={self.name}",
            f"hardware.gpus_per_node={self.world}",
            f"train.backend={self.backend}",
            f"parallel.tp={self.tp}",
            f"parallel.pp={self.pp}",
            f"parallel.pp_layout={_yaml(self.pp_layout)}",
            f"parallel.virtual_stages={_yaml(self.virtual_stages)}",
            f"parallel.ep={self.ep}",
            f"parallel.etp={self.etp}",
            f"parallel.sequence_parallel={_yaml(self.sequence_parallel)}",
            f"parallel.distributed_optimizer={_yaml(self.distributed_optimizer)}",
            f"parallel.zero_stage={self.zero_stage}",
            f"parallel.offload_optimizer={_yaml(self.offload_optimizer)}",
            f"parallel.offload_params={_yaml(self.offload_params)}",
            f"train.recompute={self.recompute}",
            f"model.mtp_layers={self.mtp_layers}",
            f"train.steps={self.steps}",
        ]
        if self.init_from is not None:
            out.append(f"train.init_from={self.init_from}")
        return out


_DEFAULT = ParityLayout("", 0)
_NAMED = [(f.name, getattr(_DEFAULT, f.name)) for f in fields(ParityLayout)][3:-1]


def _yaml(value: object) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _powers(limit: int) -> tuple[int, ...]:
    return tuple(v for v in (1, 2, 4) if v <= limit)


def shape_axes(world: int) -> dict[str, tuple[Any, ...]]:
    return {
        "backend": ("megatron", "deepspeed", "torchtitan"),
        "tp": _powers(world),
        "pp": _powers(world),
        "pp_layout": (None, "auto"),
        "virtual_stages": (None, 2),
        "ep": _powers(world),
        "etp": _powers(min(world, 2)),
        "sequence_parallel": (False, True),
    }


# Expanded in this order, each stage only from the layouts the one before accepted.
STATE_STAGES: tuple[dict[str, tuple[Any, ...]], ...] = (
    {
        "distributed_optimizer": (False, True),
        "zero_stage": (0, 1, 2, 3),
        "offload_optimizer": (False, True),
        "offload_params": (False, True),
    },
    {"recompute": ("none", "selective", "full"), "mtp_layers": (0, 1)},
)

_SECTION = {
    "backend": "train",
    "recompute": "train",
    "steps": "train",
    "mtp_layers": "model",
}  # the rest are parallel.*


@dataclass
class Enumerated:
    """What the validator said about each candidate of one (model, world)."""

    accepted: list[ParityLayout]
    refused: list[tuple[ParityLayout, str]]  # with the first error line


def accepts(composed: Composed, layout: ParityLayout) -> str | None:
    """None when `checked` accepts the layout written into the composed spec, else its first error."""
    spec = copy.deepcopy(composed.spec)
    for f in ("backend", *(name for name, _ in _NAMED)):
        spec[_SECTION.get(f, "parallel")][f] = getattr(layout, f)
    try:
        checked(Composed(spec, composed.origins, composed.overrides, composed.choices))
    except SpecError as exc:
        return exc.problems[0].line()
    return None


def _product(axes: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]


def enumerate_layouts(model: str, world: int) -> Enumerated:
    """Every layout of the sweep's axes that `lmspec check` accepts for `model` on `world` CPU ranks."""
    composed = compose_spec([*BASE, f"model={model}", f"hardware.gpus_per_node={world}"])
    found = Enumerated([], [])
    layouts = [ParityLayout(model, world, **shape) for shape in _product(shape_axes(world))]
    for stage in (None, *STATE_STAGES):
        candidates = layouts if stage is None else [replace(lay, **v) for lay in layouts for v in _product(stage)]
        layouts = []
        for candidate in candidates:
            why = accepts(composed, candidate)
            if why is None:
                layouts.append(candidate)
            else:
                found.refused.append((candidate, why))
    found.accepted = layouts
    return found
