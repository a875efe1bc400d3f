"""The training backends lmspec compiles for and trains with: `train.backend` -> its module's TrainingBackend.

A backend is one file here (its capability rows, rules, configuration emitter and file, trainer, checkpoint
format and cost-model differences; lmspec.compiler.backends.backend says what each is) plus its runtime
trainer under runtime/train/<name>/. This table is the only other line: `train.backend`'s allowed values
(and so the schema's enum, in this order) are its keys; `python -m lmspec.compiler.spec.schema` rewrites
schemas/. A backend's name is compared nowhere else (tests/compiler/test_plugin_names.py): code asks
`backend_of`. megatron_config.py and megatron_args.py own the Megatron backend's reviewed configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from lmspec.compiler.backends import deepspeed, megatron, torchtitan
from lmspec.compiler.backends.backend import TrainingBackend

if TYPE_CHECKING:
    from lmspec.compiler.spec.sections import TrainingSpec

BACKENDS: dict[str, TrainingBackend] = {
    "megatron": megatron.MEGATRON,
    "deepspeed": deepspeed.DEEPSPEED,
    "torchtitan": torchtitan.TORCHTITAN,
}

if TYPE_CHECKING:  # a Literal built at run time is no type to mypy: it checks the name as a str
    BackendName = str
else:
    BackendName = Literal[tuple(BACKENDS)]


def backend_of(spec: TrainingSpec) -> TrainingBackend:
    """The spec's training backend (the schema admits only the table's keys)."""
    return BACKENDS[spec.train.backend]
