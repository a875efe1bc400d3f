"""A checkpoint that does not fit the model it is loaded into: missing or unexpected keys, a tensor
of another shape, a dist-checkpoint without a key the model asks for. The model, its layout or the
checkpoint is not the one meant: resume found another run's checkpoint, init_from names another model,
or a model key changed since the save.

Formats: torch/nn/modules/module.py::load_state_dict (``RuntimeError: Error(s) in loading state_dict
for GPTModel:``, ``Missing key(s) in state_dict: "decoder.layers.0..."``, ``Unexpected key(s) in
state_dict``, ``size mismatch for weight: copying a param with shape torch.Size([1024, 384]) from
checkpoint, the shape in current model is torch.Size([1536, 384]).``) and megatron/core/
dist_checkpointing (``CheckpointingException``, ``Missing key in checkpoint state_dict``).
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.doctor.findings import Finding, Fix, LogText, Watch
from lmspec.compiler.observe.logs.context import RunContext

_MISMATCH = re.compile(
    r"Error\(s\) in loading state_dict for (\w+)|(?:Missing|Unexpected) key\(s\) in state_dict"
    r"|CheckpointingException|Missing key in checkpoint state_dict"
)
_SHAPE = re.compile(
    r"size mismatch for (\S+): copying a param with shape (torch\.Size\(\[[\d, ]*\]\)) from checkpoint, "
    r"the shape in current model is (torch\.Size\(\[[\d, ]*\]\))"
)


class CheckpointLoadFailure:
    name = "checkpoint_load"
    watches = (
        Watch(
            _MISMATCH,
            (b"in loading state_dict for ", b"key(s) in state_dict", b"CheckpointingException", b"Missing key in"),
        ),
        Watch(_SHAPE, (b"size mismatch for ",)),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_MISMATCH)
        shapes = log.find(_SHAPE, limit=2)
        if not hits and not shapes:
            return None
        cause = "The checkpoint's tensors do not match the model being loaded"
        if shapes:
            m = shapes[0][1]
            cause += f" ({m.group(1)} is {m.group(2)} in the checkpoint, {m.group(3)} in this model)"
        cause += (
            ": it was saved by another model or model config (hidden size, vocabulary, layers, MoE), or in "
            "another format than the loader expects."
        )
        train = context.spec.train if context else None
        fixes = (
            Fix(
                "train.checkpoint.dir",
                train.checkpoint.dir if train else "<this run's own directory>",
                "resume loads the newest checkpoint there: it must be this model's",
            ),
            Fix(
                "train.init_from",
                (train.init_from or "null") if train else "<a checkpoint of this very model config>",
                "weights to start from must come from the same model config",
            ),
            Fix("model", "<as the checkpoint was saved>", "or make the model keys match the checkpoint's config"),
        )
        return Finding(
            self.name, "checkpoint does not match the model", cause, tuple(e for e, _ in hits + shapes), fixes
        )
