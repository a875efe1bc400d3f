"""The `convert` group: how training checkpoints become a HuggingFace model directory for serving."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import key


@dataclass(frozen=True, kw_only=True)
class ConvertSpec:
    """Checkpoint conversion for serving."""

    target: Literal["hf"] = key("Target format.", example="hf")
    dtype: Literal["bfloat16", "float16", "float32"] = key("Dtype of the converted weights.", example="bfloat16")
    output: str = key("Output directory of the converted model.", example="runs/llama3_8b/hf", kind=kinds.PATH)
