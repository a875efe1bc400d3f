"""`lmspec run <build> --stage convert`: execute convert/mapping.json on the newest checkpoint.

Megatron (torch_dist), two paths per full tensor of the mapping, same bytes out:

- direct (every tensor that needs no dtype cast): the transform describes its HF tensors
  as row ranges of the full Megatron tensor (`Transform.hf_rows`: QKV per group q, k, v
  row blocks; gate and up halves; whole tensors), the reader says where those rows lie
  in the .distcp files (`DistCheckpoint.row_bands`: one byte run per TP/EP chunk, or per
  row and TP chunk for row-parallel tensors), and the writer copies those bytes file to
  file through a buffer that stays in cache (runtime/convert/safetensors_stream.py). Why: going
  through tensors cost a read into a large buffer, the de-interleave copy of QKV and a
  write from memory that is out of cache; on the 2.2 GB bench checkpoint that ran at
  0.2x the speed of `cp -r` (bench/convert_throughput.py), the direct copy at about cp's
  speed. It holds no tensor, so memory stays at the interpreter's, and imports no torch
  (runtime/convert/dist_metadata.py reads the checkpoint's index): importing torch and
  torch.distributed.checkpoint took 1.9 s, four times the copy of that 2.2 GB.
- buffered (casts, transforms that only `to_hf` knows, chunks stored compressed or as
  pickles): the full Megatron tensor is assembled from the rank boxes its transform
  names (the TP/EP concatenation), cast to the output dtype as it is copied (into one
  reused buffer), turned into its HF tensor(s) (`to_hf`), checked against the shapes
  and dtypes the mapping declared, and appended. Only one full tensor and its HF outputs
  are alive at a time: peak memory stays near 2x the largest tensor, never the model.

Before anything is written: every model key of the checkpoint must be in the mapping
and every mapped key in the checkpoint (both lists printed otherwise), with the shapes
and dtypes the mapping says; the direct path checks each HF tensor's byte count.
Output goes to a staging directory that takes the place of `convert.output` at the end
(compiler/build/atomic.py replace_directory: renameat2 exchange, so a failed or killed conversion
leaves the previous one in place). The output carries lmspec-convert.json, the list of the
files the converter wrote; an existing `convert.output` without it (a run directory, the
checkpoints, a user's directory) or with files it does not name is refused (exit 2), never
deleted.
DeepSpeed: ZeRO partitions are consolidated by DeepSpeed's own zero_to_fp32; its fused tensors (a MoE layer's
experts, as transformers 5 holds them) are released per expert by transformers' own reversal (ReleaseForm).
torchtitan: the FSDP2 shards of its torch.distributed.checkpoint are read as full tensors by DCP's own
loader in this one process (runtime/convert/dcp_reader.py), a batch of tensors of about DCP_READ_BYTES at a
time; the checkpoint's model tensors and the mapping's rows are checked against each other (names, shapes,
dtypes, every problem listed) from the checkpoint's .metadata before any tensor is read.
Beside config.json the output carries the training tokenizer (runtime/data/training_tokenizer.py)
and a generation_config.json with its bos/eos/pad ids, so transformers and vLLM load the model with
the ids it was trained on and stop at its end of text.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmspec.compiler.build.atomic import replace_directory
from lmspec.compiler.build.files import (
    DEEPSPEED_DIR,
    DEEPSPEED_ZERO_FORMAT,
    DIST_CKPT_DIR,
    LATEST,
    MAPPING,
    TORCH_DIST_FORMAT,
    TORCHTITAN_DCP_FORMAT,
    TORCHTITAN_DIR,
)
from lmspec.compiler.build.ownership import CONVERTED, require_replaceable
from lmspec.compiler.build.reader import Build
from lmspec.compiler.conversion.document import TRANSFORMS, Tensor, tensors
from lmspec.compiler.conversion.kinds import SplitKind
from lmspec.compiler.conversion.transforms import Transform
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from lmspec.compiler.run_paths import require_run_paths_apart
from lmspec.runtime.convert.dist_reader import Band, DistCheckpoint
from lmspec.runtime.convert.safetensors_stream import DEFAULT_MAX_SHARD_BYTES, Planned, ShardedWriter
from lmspec.runtime.data.training_tokenizer import (
    GENERATION_CONFIG,
    TrainingTokenizer,
    generation_config,
    training_tokenizer,
)
from lmspec.runtime.dtypes import DTYPE_BYTES, torch_dtype

if TYPE_CHECKING:
    import torch  # imported where tensors are made: the direct path needs no torch (0.8 s to import here)
    from rich.progress import Progress

    from lmspec.runtime.convert.dcp_reader import DcpCheckpoint

logger = logging.getLogger(__name__)

_LISTED = 20  # names printed per problem list
DCP_READ_BYTES = 1 << 30  # tensors read per DCP load: memory stays near this (or the largest tensor), never the model
# transformers' output head when config.json ties it to the embedding: the trainer's state dict holds it (the
# module has it), the mapping does not (transformers ties it again when it loads the output)
_TIED_HEAD = "lm_head.weight"
OUTPUT_LABEL = "convert.output="  # how messages about the output directory name it


class ConversionError(RuntimeError):
    """The checkpoint does not match the mapping; nothing was written."""


def mapped_tensors(
    build: Build, doc: Mapping[str, Any], classes: Mapping[SplitKind, type[Transform]] = TRANSFORMS
) -> list[Tensor]:
    """The mapping's tensors; an entry this lmspec cannot execute is refused naming the file."""
    try:
        return tensors(doc, classes)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise build.refuse(MAPPING, f"an entry is not one lmspec writes ({type(exc).__name__}: {exc})") from None


def latest_checkpoint(root: Path) -> Path:
    """The checkpoint resume would load (runtime/train/checkpoint.py decides, skipping damaged ones with a warning)."""
    from lmspec.runtime.train.checkpoint import CheckpointError, newest_checkpoint

    try:
        return newest_checkpoint(root)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None


def _listing(names: list[str]) -> str:
    more = f" (+{len(names) - _LISTED} more)" if len(names) > _LISTED else ""
    return ", ".join(names[:_LISTED]) + more


def check_against_checkpoint(todo: list[Tensor], ckpt: DistCheckpoint) -> None:
    """Every problem between mapping and checkpoint, raised at once before anything is written."""
    stored = ckpt.model_tensors()
    problems: list[str] = []
    mapped = {t.key for t in todo}
    unknown = sorted(stored.keys() - mapped)
    missing = sorted(mapped - stored.keys())
    if unknown:
        problems.append(f"{len(unknown)} checkpoint tensor(s) not in the mapping: {_listing(unknown)}")
    if missing:
        problems.append(f"{len(missing)} mapped tensor(s) missing from the checkpoint: {_listing(missing)}")
    seen: dict[str, set[tuple[int, ...]]] = {}
    for t in todo:
        if t.key not in stored:
            continue
        s = stored[t.key]
        lead = s.shape[: len(t.index)]
        if s.shape[len(t.index) :] != t.transform.shape or any(i >= n for i, n in zip(t.index, lead)):
            problems.append(
                f"{t.label}: checkpoint shape {list(s.shape)}, mapping expects "
                f"{list(lead)} x {list(t.transform.shape)} with index {list(t.index)}"
            )
        if s.dtype_name != t.dtype:
            problems.append(f"{t.label}: checkpoint dtype {s.dtype_name}, mapping says {t.dtype}")
        seen.setdefault(t.key, set()).add(t.index)
    for key, indices in seen.items():
        lead = stored[key].shape[: len(next(iter(indices)))]
        expected = 1
        for n in lead:
            expected *= n
        if len(indices) != expected:
            problems.append(f"{key}: the mapping covers {len(indices)} of its {expected} slices {list(lead)}")
    if problems:
        raise ConversionError("checkpoint does not match convert/mapping.json:\n  " + "\n  ".join(problems))


class Arena:
    """One reusable buffer as large as the largest full tensor, touched once.

    A fresh allocation of hundreds of MB per tensor costs a page fault per 4 KiB page on
    first touch (measured here: reading the checkpoint ran at ~0.6 GB/s into fresh tensors);
    reusing one buffer keeps the peak at one full tensor plus the HF copies QKV makes.
    """

    def __init__(self, nbytes: int) -> None:
        import torch

        self.buffer = torch.zeros(nbytes, dtype=torch.uint8)

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        return self.buffer[:nbytes].view(dtype).view(shape)


def assemble(t: Tensor, ckpt: DistCheckpoint, dtype: torch.dtype, arena: Arena | None = None) -> torch.Tensor:
    """The full Megatron tensor from its rank boxes (each distinct box read once), in `dtype`."""
    import torch

    full = arena.tensor(t.transform.shape, dtype) if arena else torch.empty(t.transform.shape, dtype=dtype)
    done: set[tuple[tuple[int, int], ...]] = set()
    for rank in range(t.transform.parts):
        for box in t.transform.boxes(rank):
            if box in done:
                continue
            done.add(box)
            lead = tuple((i, i + 1) for i in t.index)
            view = full[tuple(slice(a, b) for a, b in box)]
            ckpt.read_into(t.key, lead + box, view[(None,) * len(lead)])  # a view, never a copy
    return full


def file_bands(t: Tensor, ckpt: DistCheckpoint) -> dict[str, list[Band]] | None:
    """Where each HF tensor of `t` lies in the checkpoint files, or None if `t` needs the buffered path."""
    rows = t.transform.hf_rows()
    if rows is None or t.dtype != t.hf_dtype:
        return None
    out: dict[str, list[Band]] = {}
    for name, ranges in rows.items():
        bands: list[Band] = []
        for span in ranges:
            found = ckpt.row_bands(t.key, t.index, span, t.dtype)
            if found is None:
                return None
            bands += found
        out[name] = bands
    return out


def hf_plan(todo: list[Tensor]) -> list[Planned]:
    return [Planned(name, shape, t.hf_dtype) for t in todo for name, shape in t.transform.hf_shapes().items()]


def _progress(enabled: bool) -> Progress:
    """A rich progress bar over bytes written (shown on a terminal only)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    return Progress(
        TextColumn("converting {task.fields[tensor]}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
    )


def _write_buffered(t: Tensor, ckpt: DistCheckpoint, writer: ShardedWriter, arena: Arena | None) -> None:
    full = assemble(t, ckpt, torch_dtype(t.hf_dtype), arena)
    outputs = t.transform.to_hf(full)
    del full
    for name, shape in t.transform.hf_shapes().items():
        tensor = outputs.pop(name)
        if tuple(tensor.shape) != shape:
            raise ConversionError(
                f"{name}: {t.transform.kind.value} produced {tuple(tensor.shape)}, the mapping declares {shape}"
            )
        writer.write(name, tensor)
        del tensor


def convert_megatron(
    doc: Mapping[str, Any],
    ckpt_dir: Path,
    output: Path,
    *,
    classes: Mapping[SplitKind, type[Transform]] = TRANSFORMS,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: bool = False,
    direct: bool = True,
    tokenizer: TrainingTokenizer | None = None,
) -> dict[str, Any]:
    """Convert one torch_dist directory into an HF directory (with `tokenizer`'s files); returns a summary.

    `direct=False` sends every tensor through the buffered path (the tests compare both).
    """
    todo = tensors(doc, classes)
    ckpt = DistCheckpoint(ckpt_dir)
    try:
        check_against_checkpoint(todo, ckpt)
        plan = hf_plan(todo)
        # by position: two entries may read one checkpoint tensor (DeepSeek-V3's MTP copies of embedding and head)
        bands = [file_bands(t, ckpt) if direct else None for t in todo]
        buffered = [t for t, found in zip(todo, bands, strict=True) if found is None]
        with replace_directory(output, CONVERTED, OUTPUT_LABEL) as staging:
            writer = ShardedWriter(staging, plan, max_shard_bytes)
            largest = max((math.prod(t.transform.shape) * DTYPE_BYTES[t.hf_dtype] for t in buffered), default=0)
            arena = Arena(largest) if buffered else None
            bar = _progress(progress)
            with bar:
                task = bar.add_task("convert", total=writer.total_bytes, tensor="")
                for t, found in zip(todo, bands, strict=True):
                    if found is None:
                        _write_buffered(t, ckpt, writer, arena)
                    else:
                        for name in t.transform.hf_shapes():
                            writer.write_bands(name, found[name], ckpt.fileno)
                    bar.update(task, completed=writer.bytes_written, tensor=t.label)
            writer.finish()
            _write_configs(doc, staging, tokenizer)
    finally:
        ckpt.close()
    return {
        "tensors": len(plan),
        "bytes": writer.total_bytes,
        "shards": len(writer.shards),
        "megatron_tensors_direct": len(todo) - len(buffered),
        "megatron_tensors_buffered": len(buffered),
    }


def _write_configs(doc: Mapping[str, Any], staging: Path, tokenizer: TrainingTokenizer | None) -> None:
    """config.json as the mapping declares it; the training tokenizer beside it, with its special ids."""
    (staging / "config.json").write_text(json.dumps(doc["hf_config"], indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.write(staging)
        (staging / GENERATION_CONFIG).write_text(generation_config(staging))


def convert_deepspeed(
    doc: Mapping[str, Any], step_dir: Path, output: Path, tokenizer: TrainingTokenizer | None = None
) -> dict[str, Any]:
    """ZeRO shards -> full fp32 tensors (DeepSpeed's zero_to_fp32) -> HF tensors as released (ReleaseForm: the
    engine's module is transformers', experts fused) -> the mapping's names."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    ds_dir = step_dir / DEEPSPEED_DIR
    saved = get_fp32_state_dict_from_zero_checkpoint(str(ds_dir))
    form = ReleaseForm(doc["hf_config"])
    state = {name: t for key, tensor in saved.items() for name, t in form(key.removeprefix("module."), tensor).items()}
    wanted = {item["name"]: (tuple(item["shape"]), t["hf_dtype"]) for t in doc["tensors"] for item in t["hf"]}
    unknown, missing = sorted(state.keys() - wanted.keys()), sorted(wanted.keys() - state.keys())
    if doc["hf_config"].get("tie_word_embeddings") and _TIED_HEAD in unknown:
        unknown.remove(_TIED_HEAD)
    if unknown or missing:
        raise ConversionError(
            f"DeepSpeed checkpoint vs mapping: not mapped: {_listing(unknown) or 'none'}; "
            f"missing: {_listing(missing) or 'none'}"
        )
    plan = [Planned(name, shape, dtype) for name, (shape, dtype) in wanted.items()]
    with replace_directory(output, CONVERTED, OUTPUT_LABEL) as staging:
        writer = ShardedWriter(staging, plan)
        for p in plan:
            writer.write(p.name, state.pop(p.name).to(torch_dtype(p.dtype)))
        writer.finish()
        _write_configs(doc, staging, tokenizer)
    return {"tensors": len(plan), "bytes": writer.total_bytes, "shards": len(writer.shards)}


@dataclass(frozen=True)
class Released:
    """One HF tensor as the release (and the mapping) names it: the checkpoint tensor it comes from."""

    key: str
    shape: tuple[int, ...]
    dtype_name: str


class ReleaseForm:
    """transformers' modules hold some tensors fused (transformers 5: each MoE layer's experts as
    `experts.gate_up_proj` [E, 2f, h] and `experts.down_proj` [E, h, f]), which the trainer's checkpoint
    stores as they are; the mapping names them as released (`experts.{e}.gate_proj.weight`, ...), which
    transformers fuses when it loads them. transformers' own reversal (revert_weight_conversion, what
    save_pretrained writes) turns one into the other, a checkpoint tensor at a time: on meta tensors to
    list the names and shapes, on the read tensors to write them."""

    def __init__(self, hf_config: Mapping[str, Any]) -> None:
        import torch
        import transformers

        config = transformers.AutoConfig.for_model(**copy.deepcopy(dict(hf_config)))  # it edits rope_scaling in place
        with torch.device("meta"):
            self.model = transformers.AutoModelForCausalLM.from_config(config)

    def __call__(self, key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        from transformers.core_model_loading import revert_weight_conversion

        return dict(revert_weight_conversion(self.model, {key: tensor}))

    def names(self, ckpt: DcpCheckpoint) -> dict[str, Released]:
        """Every HF tensor of the checkpoint's model tensors, by its released name."""
        import torch

        out: dict[str, Released] = {}
        for key, stored in ckpt.tensors.items():
            meta = torch.empty(stored.shape, dtype=torch_dtype(stored.dtype_name), device="meta")
            for name, tensor in self(key, meta).items():
                out[name] = Released(key, tuple(tensor.shape), stored.dtype_name)
        return out


def check_against_dcp(doc: Mapping[str, Any], ckpt: DcpCheckpoint, released: Mapping[str, Released]) -> list[Planned]:
    """The HF tensors to write, in the mapping's order, once every row's tensor is in the checkpoint (`released`:
    its tensors by their released names) with its shape and dtype and every model tensor of the checkpoint is
    mapped; else every problem at once (nothing read yet: the checkpoint's .metadata says all of it)."""
    plan: list[Planned] = []
    problems: list[str] = []
    for i, t in enumerate(doc["tensors"]):
        source, hf = t.get("source"), t.get("hf")
        if not (isinstance(source, dict) and isinstance(hf, list) and len(hf) == 1 and source["key"] == hf[0]["name"]):
            raise ConversionError(f"{MAPPING}: tensors[{i}] is not a row of the {TORCHTITAN_DCP_FORMAT} format")
        name, shape = hf[0]["name"], tuple(hf[0]["shape"])
        plan.append(Planned(name, shape, t["hf_dtype"]))
        if (found := released.get(name)) is None:
            continue
        held = "" if found.key == name else f" (of {found.key})"
        if found.shape != shape:
            problems.append(f"{name}: checkpoint shape {list(found.shape)}{held}, mapping says {list(shape)}")
        if found.dtype_name != source["dtype"]:
            problems.append(f"{name}: checkpoint dtype {found.dtype_name}{held}, mapping says {source['dtype']}")
    mapped = {p.name for p in plan}
    unknown = sorted((released.keys() | set(ckpt.not_tensors)) - mapped)
    if doc["hf_config"].get("tie_word_embeddings") and _TIED_HEAD in unknown:
        unknown.remove(_TIED_HEAD)
    missing = sorted(mapped - released.keys())
    if unknown:
        problems.insert(0, f"{len(unknown)} checkpoint tensor(s) not in the mapping: {_listing(unknown)}")
    if missing:
        problems.insert(0, f"{len(missing)} mapped tensor(s) missing from the checkpoint: {_listing(missing)}")
    if problems:
        raise ConversionError(f"{ckpt.path}: checkpoint does not match {MAPPING}:\n  " + "\n  ".join(problems))
    return plan


def _read_batches(
    plan: list[Planned], ckpt: DcpCheckpoint, released: Mapping[str, Released], budget: int
) -> list[list[str]]:
    """The checkpoint tensors to read, in the order the mapping writes what they hold, cut into loads of
    about `budget` bytes."""
    batches: list[list[str]] = [[]]
    held, seen = 0, set()
    for planned in plan:
        key = released[planned.name].key
        if key in seen:
            continue
        seen.add(key)
        stored = ckpt.tensors[key]
        nbytes = math.prod(stored.shape) * DTYPE_BYTES[stored.dtype_name]
        if batches[-1] and held + nbytes > budget:
            batches.append([])
            held = 0
        batches[-1].append(key)
        held += nbytes
    return batches


def convert_torchtitan(
    doc: Mapping[str, Any],
    step_dir: Path,
    output: Path,
    tokenizer: TrainingTokenizer | None = None,
    read_bytes: int = DCP_READ_BYTES,
) -> dict[str, Any]:
    """torchtitan's DCP checkpoint (FSDP2 shards) -> full tensors (DCP's loader) -> HF tensors as released
    (ReleaseForm) -> the mapping's rows, in its order."""
    from lmspec.runtime.convert.dcp_reader import DcpCheckpoint, DcpReadError

    try:
        ckpt = DcpCheckpoint(step_dir / TORCHTITAN_DIR)
        form = ReleaseForm(doc["hf_config"])
        released = form.names(ckpt)
        plan = check_against_dcp(doc, ckpt, released)
        batches = _read_batches(plan, ckpt, released, read_bytes)
        ckpt.check_files(key for batch in batches for key in batch)  # a missing or truncated shard, named first
        with replace_directory(output, CONVERTED, OUTPUT_LABEL) as staging:
            writer = ShardedWriter(staging, plan)
            mapped, written = {p.name for p in plan}, 0
            pending: dict[str, torch.Tensor] = {}  # HF tensors read, not yet written (the writer takes them in order)
            for batch in batches:
                for key, tensor in ckpt.read(batch).items():
                    pending.update((name, t) for name, t in form(key, tensor).items() if name in mapped)
                while written < len(plan) and plan[written].name in pending:
                    planned = plan[written]
                    writer.write(planned.name, pending.pop(planned.name).to(torch_dtype(planned.dtype)))
                    written += 1
            writer.finish()
            _write_configs(doc, staging, tokenizer)
    except DcpReadError as exc:
        raise ConversionError(str(exc)) from None
    return {"tensors": len(plan), "bytes": writer.total_bytes, "shards": len(writer.shards), "dcp_loads": len(batches)}


def convert_build(
    build: Build, *, progress: bool = False, classes: Mapping[SplitKind, type[Transform]] = TRANSFORMS
) -> tuple[Path, dict[str, Any]]:
    spec = build.training()
    doc = build.mapping
    if doc["checkpoint_format"] == TORCH_DIST_FORMAT:  # sharded rows: a malformed entry is refused before any read
        mapped_tensors(build, doc, classes)
    output = Path(build.plan.conversion().output)
    require_run_paths_apart(spec)
    require_replaceable(output, CONVERTED, OUTPUT_LABEL)  # refused before the checkpoint is read
    tokenizer = training_tokenizer(spec.train.data)  # likewise: a tokenizer gone is known before the work
    step = latest_checkpoint(Path(spec.train.checkpoint.dir))
    if doc["checkpoint_format"] == DEEPSPEED_ZERO_FORMAT:
        return output, convert_deepspeed(doc, step, output, tokenizer)
    if doc["checkpoint_format"] == TORCHTITAN_DCP_FORMAT:
        return output, convert_torchtitan(doc, step, output, tokenizer)
    return output, convert_megatron(
        doc, step / DIST_CKPT_DIR, output, classes=classes, progress=progress, tokenizer=tokenizer
    )


def run_stage(build: Build, options: argparse.Namespace) -> int:
    spec = build.training()
    doc = build.mapping
    if doc["checkpoint_format"] == TORCH_DIST_FORMAT:
        mapped_tensors(build, doc)
    if getattr(options, "dry_run", False):
        step = Path(spec.train.checkpoint.dir) / LATEST
        print(
            f"would convert the checkpoint named by {step} ({len(doc['tensors'])} mapping entries, "
            f"{doc['hf_tensor_count']} HF tensors) into {build.plan.conversion().output}"
        )
        return EXIT_OK
    start = time.perf_counter()
    try:
        output, summary = convert_build(build, progress=sys.stderr.isatty())
    except ConversionError as exc:
        logger.error(f"lmspec: convert: {exc}")
        return EXIT_FAILED
    seconds = time.perf_counter() - start
    logger.info(
        f"converted {summary['tensors']} tensors ({summary['bytes'] / 1e9:.3f} GB, {summary['shards']} shard(s)) "
        f"into {output} in {seconds:.1f} s ({summary['bytes'] / 1e9 / seconds:.2f} GB/s)"
    )
    return EXIT_OK


def main(argv: list[str]) -> int:
    """`python -m lmspec.runtime.convert.to_hf <build dir>` (what the stage runs, also usable alone)."""
    if len(argv) != 1:
        logger.error("usage: python -m lmspec.runtime.convert.to_hf <build dir>")
        return EXIT_USAGE
    try:
        return run_stage(Build.open(Path(argv[0])), argparse.Namespace(dry_run=False))
    except UsageError as exc:
        logger.error(f"lmspec: error: {exc}")
        return EXIT_USAGE


if __name__ == "__main__":
    from lmspec.runtime.log import setup_logging

    setup_logging()  # as every runtime process's entry (runtime/log.py)
    sys.exit(main(sys.argv[1:]))
