"""The model families lmspec trains, converts and serves: `model.family` -> its module's Family.

A family is one file here (its conversion rows, HF config.json, Megatron TransformerConfig and
transformers class; lmspec.compiler.families.family says what each is) plus a model preset under
specs/model/. This table is the only other line: `model.family`'s allowed values (and so the
schema's enum, in this order) are its keys; `python -m lmspec.compiler.spec.schema` rewrites schemas/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from lmspec.compiler.families import deepseek, llama, mistral, mixtral, qwen2, qwen3
from lmspec.compiler.families.family import Family

FAMILIES: dict[str, Family] = {
    "llama": llama.LLAMA,
    "mistral": mistral.MISTRAL,
    "qwen2": qwen2.QWEN2,
    "qwen3": qwen3.QWEN3,
    "mixtral": mixtral.MIXTRAL,
    "deepseek_v2": deepseek.DEEPSEEK_V2,
    "deepseek_v3": deepseek.DEEPSEEK_V3,
}

if TYPE_CHECKING:  # a Literal built at run time is no type to mypy: it checks the name as a str
    FamilyName = str
else:
    FamilyName = Literal[tuple(FAMILIES)]
