"""A released HuggingFace directory as the HF -> Megatron import reads it: config, quantisation, tensors.

`check_source` runs in `lmspec run BUILD --stage import` before any rank starts: the directory must
hold a readable config.json whose architecture and every computation field the build's own emitted
config.json also sets (convert/mapping.json's `hf_config`) are equal, and a quantisation lmspec can
undo. `HfTensors` runs on every rank: it opens the safetensors shards lazily and hands out one tensor
at a time, dequantised, so a rank holds at most its current tensor beside its model shard.

DeepSeek's FP8 release (`quantization_config: {quant_method: fp8, fmt: e4m3, weight_block_size:
[128, 128]}`) stores each quantised `<name>` as float8_e4m3fn with a float32 `<name>_scale_inv`
holding one factor per 128x128 block (partial blocks at the right and bottom edges); the weight is
`fp8.float() * scale_inv` broadcast over its block (DeepSeek-V3's inference/kernel.py weight_dequant).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmspec.compiler.errors import UsageError
from lmspec.compiler.families.hf_import import METADATA

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
QUANTIZATION = "quantization_config"
SCALE_SUFFIX = "_scale_inv"
FP8_BLOCK = (128, 128)  # the only block size of the releases lmspec reads
# what each supported quantisation field must be (DeepSeek-V3/R1's release)
FP8_FIELDS: dict[str, tuple[Any, ...]] = {
    "quant_method": ("fp8",),
    "fmt": ("e4m3",),
    "weight_block_size": (list(FP8_BLOCK),),
    "activation_scheme": ("dynamic",),
}


@dataclass(frozen=True)
class Imported:
    """What a backend's HF importer loaded into one rank's model (logged before the save)."""

    tensors: int  # model tensors written
    largest_read: int  # bytes of the largest set of HF tensors held at once (dequantised)
    shard_bytes: int  # this rank's model bytes


@dataclass(frozen=True)
class BlockFp8:
    """Block-wise FP8 weights with inverse scales (DeepSeek-V3): dequantised while streaming."""

    block: tuple[int, int] = FP8_BLOCK

    def dequantize(self, weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
        """float32 `weight * scale_inv`, each scale over its block; edge blocks may be partial."""
        rows, cols = weight.shape
        br, bc = self.block
        grid = (math.ceil(rows / br), math.ceil(cols / bc))
        if tuple(scale_inv.shape) != grid:
            raise UsageError(
                f"a {rows}x{cols} FP8 weight with {br}x{bc} blocks needs a {grid[0]}x{grid[1]} scale_inv, "
                f"the checkpoint has {tuple(scale_inv.shape)}"
            )
        scale = scale_inv.float().repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
        return weight.float() * scale


def read_config(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / CONFIG
    if not hf_dir.is_dir():
        raise UsageError(f"--from {hf_dir}: no such directory (a HuggingFace model directory with {CONFIG})")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--from {hf_dir}: cannot read {CONFIG}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--from {hf_dir}: {CONFIG} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError(f"--from {hf_dir}: {CONFIG} is not a JSON object")
    return config


def quantization(config: dict[str, Any]) -> BlockFp8 | None:
    """The quantisation of a release's config.json; anything but DeepSeek's block FP8 is refused by field."""
    quant = config.get(QUANTIZATION)
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise UsageError(f"config.json field {QUANTIZATION} is {quant!r}; lmspec reads only an object")
    for field, value in quant.items():
        allowed = FP8_FIELDS.get(field)
        if allowed is None:
            raise UsageError(f"config.json field {QUANTIZATION}.{field} is unknown to lmspec's FP8 import")
        if value not in allowed:
            raise UsageError(
                f"config.json field {QUANTIZATION}.{field} is {value!r}; lmspec dequantises only "
                f"{' or '.join(map(repr, allowed))} (DeepSeek-V3's block FP8); dequantise the release first"
            )
    if "quant_method" not in quant:
        raise UsageError(f"config.json field {QUANTIZATION}.quant_method is missing")
    return BlockFp8()


def check_source(hf_dir: Path, emitted: dict[str, Any]) -> BlockFp8 | None:
    """UsageError naming the field unless `hf_dir` holds the build's model (`emitted`: its own config.json)."""
    config = read_config(hf_dir)
    if config.get("architectures") != emitted["architectures"]:
        raise UsageError(
            f"config.json field architectures: {hf_dir} holds {config.get('architectures')!r}, the build's "
            f"model is {emitted['architectures']!r}; import into a build of that model (lmspec import-model)"
        )
    for field in sorted(emitted.keys() & config.keys() - METADATA):
        if config[field] != emitted[field]:
            raise UsageError(
                f"config.json field {field}: {hf_dir} has {config[field]!r}, the build's model has "
                f"{emitted[field]!r}; compile the build from that config (lmspec import-model) or set the "
                "model.* key to match"
            )
    if not ((hf_dir / INDEX).is_file() or (hf_dir / SINGLE).is_file()):
        raise UsageError(f"--from {hf_dir}: no {INDEX} or {SINGLE}; lmspec imports safetensors weights only")
    return quantization(config)


class HfTensors:
    """Lazily opened safetensors shards of an HF directory, by tensor name, dequantised when quantised."""

    def __init__(self, hf_dir: Path) -> None:
        from safetensors import safe_open

        index = hf_dir / INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        else:
            single = hf_dir / SINGLE
            with safe_open(str(single), "pt") as fh:
                weight_map = {name: single.name for name in fh.keys()}
        self.weight_map: dict[str, str] = weight_map
        self.fp8 = quantization(read_config(hf_dir))
        self._open = {file: safe_open(str(hf_dir / file), "pt") for file in sorted(set(weight_map.values()))}

    def _raw(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise UsageError(f"HF checkpoint has no tensor {name}")
        return self._open[self.weight_map[name]].get_tensor(name)

    def get(self, name: str) -> torch.Tensor:
        tensor = self._raw(name)
        if tensor.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
            return tensor
        if self.fp8 is None or tensor.dtype != torch.float8_e4m3fn:
            raise UsageError(
                f"{name} is {tensor.dtype} but config.json's {QUANTIZATION} does not say how to dequantise it "
                "(lmspec reads quant_method fp8, fmt e4m3, weight_block_size [128, 128])"
            )
        if name + SCALE_SUFFIX not in self.weight_map:
            raise UsageError(f"{name} is FP8 but the checkpoint has no {name}{SCALE_SUFFIX}")
        return self.fp8.dequantize(tensor, self._raw(name + SCALE_SUFFIX))
