"""One point of `lmspec plan`'s search space, by the spec's own names, enumerated and priced alone."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from lmspec.compiler.search.evaluate import Priced, price
from lmspec.compiler.search.legality import BACKENDS, RECOMPUTE, candidate_impl
from lmspec.compiler.search.space import Axes, Enumeration, enumerate_legal
from lmspec.compiler.spec.sections import Spec


@dataclasses.dataclass(frozen=True)
class Layout:
    """One point of the search space, by the spec's own names."""

    nodes: int
    tp: int = 1
    pp: int = 1
    virtual_stages: int | None = None
    cp: int = 1
    ep: int = 1
    micro_batch_size: int = 1
    backend: str = "megatron"
    zero_stage: int = 0
    distributed_optimizer: bool = True
    sequence_parallel: bool = False
    recompute: str = "selective"
    moe_a2a: bool = False  # parallel.overlap.moe_a2a

    def axes(self) -> Axes:
        return Axes(
            nodes=(self.nodes,),
            tp=(self.tp,),
            pp=(self.pp,),
            cp=(self.cp,),
            ep=(self.ep,),
            micro_batch_size=(self.micro_batch_size,),
            virtual_stages=(self.virtual_stages or 1,),
            shardings=((BACKENDS.index(self.backend), self.zero_stage, self.distributed_optimizer),),
            sequence_parallel=(self.sequence_parallel,),
            recompute=(RECOMPUTE.index(self.recompute),),
            moe_a2a=(self.moe_a2a,),
        )

    def apply(self, spec: Spec) -> Spec:
        """The spec with this layout written into it, as `lmspec plan`'s overrides would."""
        parallel = dataclasses.replace(
            spec.parallel,
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            ep=self.ep,
            dp="auto",
            pp_layout="auto",
            virtual_stages=self.virtual_stages,
            sequence_parallel=self.sequence_parallel,
            zero_stage=self.zero_stage,
            distributed_optimizer=self.distributed_optimizer,
            offload_optimizer=False,
            offload_params=False,
            overlap=dataclasses.replace(spec.parallel.overlap, moe_a2a=self.moe_a2a),
        )
        train = dataclasses.replace(
            spec.train,
            backend=self.backend,
            transformer_impl=candidate_impl(self.backend, spec),  # the search's: torchtitan runs local too
            micro_batch_size=self.micro_batch_size,
            recompute=self.recompute,
        )
        hardware = dataclasses.replace(spec.hardware, nodes=self.nodes)
        return dataclasses.replace(spec, parallel=parallel, train=train, hardware=hardware)


def enumerate_one(spec: Spec, layout: Layout) -> Enumeration:
    return enumerate_legal(spec, layout.axes())


def price_one(spec: Spec, layout: Layout) -> Priced:
    found = enumerate_one(spec, layout)
    assert found.legal.size == 1, {k: v for k, v in found.rejected.items() if v}
    values = {
        "tp": np.array([layout.tp]),
        "cp": np.array([layout.cp]),
        "micro_batch_size": np.array([layout.micro_batch_size]),
    }
    return price(spec, found.legal, values)


def scalar(values: Any) -> float:
    return float(np.asarray(values)[0])
