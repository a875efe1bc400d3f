"""convert/mapping.json: the reviewed checkpoint -> HuggingFace mapping that `lmspec run --stage convert` executes.

megatron backend: every full Megatron tensor (one layer's slice of a stacked tensor; one
entry per layer stands for all experts, `{e}` the global and `{i}` the local expert id),
its split kind (compiler/conversion/transforms.py draws each), the shape of one rank's
shard, its place in the running model, and the HF tensor(s) it becomes, with
shapes and dtypes before and after. deepspeed backend: the ZeRO partitions are
consolidated to full tensors (DeepSpeed's own zero_to_fp32) that already carry HF
names, so every entry is `direct`. Both carry the HF config.json, derived from the spec.

One tensor per line: a reviewer's diff names exactly the tensors a spec change touched,
and the rows go through json's C encoder (an indented dump of DeepSeek-V3's ~900 rows
took 17 ms, a third of a compile's own time).
"""

from __future__ import annotations

from typing import Any

from lmspec.compiler.build.files import DIST_CKPT_DIR, MAPPING
from lmspec.compiler.conversion.mapping import Entry, build_entries, hf_config
from lmspec.compiler.conversion.transforms import Direct, MappingError
from lmspec.compiler.emit.spec_files import dump_json, dump_json_line
from lmspec.compiler.errors import SpecError, error
from lmspec.compiler.plan import Plan

FORMAT = "lmspec-convert-mapping/1"


def _deepspeed_tensors(entries: list[Entry]) -> list[dict[str, Any]]:
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


def mapping_document(plan: Plan) -> dict[str, Any]:
    entries = build_entries(plan)
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
    if backend == "megatron":
        doc["checkpoint_format"] = DIST_CKPT_DIR
        doc["tensors"] = [e.describe() for e in entries]
    else:
        doc["checkpoint_format"] = "deepspeed_zero"
        doc["tensors"] = _deepspeed_tensors(entries)
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
    try:
        return {MAPPING: dump_mapping(mapping_document(plan))}
    except MappingError as exc:  # a size the rules let through but no rank split can hold
        lay = plan.trained().layout
        raise SpecError(
            [
                error(
                    "parallel.tp",
                    f"parallel.tp={lay.tp} (ep {lay.ep}, etp {lay.etp}): {MAPPING} cannot shard the model: {exc}; "
                    "use a parallel.tp that divides model.ffn_hidden_size, model.vocab_size and "
                    "model.num_kv_heads (and parallel.ep/etp that divide the experts' sizes)",
                )
            ]
        ) from None
