"""convert/mapping.json: the reviewed checkpoint -> HuggingFace mapping that `lmspec run --stage convert` executes.

megatron backend: every full Megatron tensor (one layer's slice of a stacked tensor; one
entry per layer stands for all experts, `{e}` the global and `{i}` the local expert id),
its split kind (compiler/conversion/transforms.py draws each), the shape of one rank's
shard, its place in the running model, and the HF tensor(s) it becomes, with
shapes and dtypes before and after. deepspeed backend: the ZeRO partitions are
consolidated to full tensors (DeepSpeed's own zero_to_fp32) that already carry HF
names, so every entry is `direct`; torchtitan backend: the DCP checkpoint's FSDP2 shards are
read as full tensors (torch.distributed.checkpoint), HF names too. All carry the HF config.json,
derived from the spec.

One tensor per line: a reviewer's diff names exactly the tensors a spec change touched,
and the rows go through json's C encoder (an indented dump of DeepSeek-V3's ~900 rows
took 17 ms, a third of a compile's own time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmspec.compiler.backends import backend_of
from lmspec.compiler.build.files import DEEPSPEED_ZERO_FORMAT, MAPPING, TORCH_DIST_FORMAT, TORCHTITAN_DCP_FORMAT
from lmspec.compiler.conversion.mapping import Entry, build_entries, hf_config
from lmspec.compiler.conversion.transforms import Direct
from lmspec.compiler.emit.spec_files import dump_json, dump_json_line
from lmspec.compiler.plan import Plan

FORMAT = "lmspec-convert-mapping/1"


def _hf_named_tensors(entries: list[Entry]) -> list[dict[str, Any]]:
    """A checkpoint of transformers' modules: every tensor is its HF self, in fp32 (the trainers' master weights)."""
    tensors = []
    for entry in entries:
        experts = range(entry.experts[0]) if entry.experts is not None else [None]
        for expert in experts:
            for pattern, shape in entry.transform.hf_shapes().items():
                name = pattern.format(e=expert)
                direct = Direct(name, (name,), shape)
                tensors.append(
                    {
                        **direct.describe(),
                        "megatron": None,
                        "source": {"key": name, "dtype": "float32"},
                        "hf_dtype": entry.hf_dtype,
                    }
                )
    return tensors


# TrainingBackend.checkpoint_format -> the tensors its checkpoint holds, as the mapping lists them
TENSOR_LISTS: dict[str, Callable[[list[Entry]], list[dict[str, Any]]]] = {
    TORCH_DIST_FORMAT: lambda entries: [e.describe() for e in entries],
    DEEPSPEED_ZERO_FORMAT: _hf_named_tensors,
    TORCHTITAN_DCP_FORMAT: _hf_named_tensors,
}


def mapping_document(plan: Plan) -> dict[str, Any]:
    entries = build_entries(plan.trained().spec, plan.trained().layout.stage_layers)
    lay, backend = plan.trained().layout, plan.trained().spec.train.backend
    doc: dict[str, Any] = {
        "format": FORMAT,
        "backend": backend,
        "family": plan.spec.model.family,
        "layout": {"tp": lay.tp, "pp": lay.pp, "ep": lay.ep, "etp": lay.etp, "stage_layers": list(lay.stage_layers)},
        "output": plan.conversion().output,
        "checkpoint_dir": plan.trained().spec.train.checkpoint.dir,
        "hf_config": hf_config(plan),
    }
    doc["checkpoint_format"] = checkpoint_format = backend_of(plan.trained().spec).checkpoint_format
    doc["tensors"] = TENSOR_LISTS[checkpoint_format](entries)
    doc["hf_tensor_count"] = sum(
        len(t["hf"]) * (t["experts"]["count"] if "experts" in t else 1) for t in doc["tensors"]
    )
    return doc


def dump_mapping(doc: dict[str, Any]) -> str:
    """`dump_json`'s layout for the header keys, then `tensors` (last, as in sorted order) a row per line."""
    head = {key: value for key, value in doc.items() if key != "tensors"}
    rows = ",\n".join(f"    {dump_json_line(row)}" for row in doc["tensors"])
    return f'{dump_json(head).rstrip().removesuffix("}").rstrip()},\n  "tensors": [\n{rows}\n  ]\n}}\n'


def emit_conversion(plan: Plan) -> dict[str, str]:
    """A Plan's model always shards over its layout: rules/conversion.py refused the spec otherwise."""
    return {MAPPING: dump_mapping(mapping_document(plan))}
