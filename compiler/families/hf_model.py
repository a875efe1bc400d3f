"""A HuggingFace config.json as lmspec's model group: the family whose class it names, the fields that
family's importer reads, or an error naming every field lmspec does not model.

Shared by `lmspec import-model` (which writes the group as a model preset) and the serving check
(compiler/serve_config.py: is the served directory the spec's model?), so "the same model" means what
an import means; pure, no transformers.
"""

from __future__ import annotations

from typing import Any

from lmspec.compiler.errors import UsageError
from lmspec.compiler.families import FAMILIES
from lmspec.compiler.families.hf_import import HfConfig


def model_group(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The model group of `config` (name and family first, then the family's fields), or an error
    naming every field lmspec would have to drop."""
    by_class = {family.hf_class: family_name for family_name, family in FAMILIES.items()}
    architectures = config.get("architectures")
    arch = architectures[0] if isinstance(architectures, list) and architectures else None
    if arch not in by_class:
        raise UsageError(
            f"config.json field architectures: {architectures!r} is no class lmspec supports "
            f"({', '.join(sorted(by_class))})"
        )
    family_name = by_class[arch]
    read = HfConfig(config)
    fields = FAMILIES[family_name].from_hf_config(read)
    read.expect_built(fields, family_name)
    unread = read.unread()
    if unread:
        raise UsageError(
            f"config.json field(s) {', '.join(unread)}: lmspec does not model them, so importing would train "
            f"and serve a different model than the release ({arch})"
        )
    return {"name": name, "family": family_name, **fields}


# A model key a family refuses -> the config.json fields that set it (every family's spelling).
HF_FIELDS: dict[str, tuple[str, ...]] = {
    "model.moe.router_group_topk": ("topk_method", "n_group", "topk_group"),
    "model.moe.router_num_groups": ("topk_method", "n_group"),
    "model.moe.router_score_function": ("scoring_func",),
    "model.moe.router_score_bias": ("topk_method",),
    "model.moe.norm_topk_prob": ("norm_topk_prob",),
    "model.moe.top_k": ("num_experts_per_tok",),
    "model.rope_scaling": ("rope_scaling",),
}


def refuse_unchecked(config: dict[str, Any], group: dict[str, Any]) -> None:
    """Refuse a group `lmspec check` would refuse for its family (Family.refusals, .training_refusals):
    an import that only fails later, at the first check of a job, is no import. Names the config.json
    fields that set the refused key, and the key with check's reason."""
    from lmspec.compiler.spec.sections import ModelSpec
    from lmspec.compiler.spec.typed import from_dict

    model = from_dict(ModelSpec, group)
    family = FAMILIES[group["family"]]
    refused = [*family.refusals(model), *family.training_refusals(model)]
    if not refused:
        return
    path, why = refused[0]  # the first, as import-model's other refusals: the fix of one may change the next
    key = next((k for k in HF_FIELDS if path == k or path.startswith(f"{k}.")), "")
    named = [f"{field}={config[field]!r}" for field in HF_FIELDS.get(key, ()) if field in config]
    fields = f"field(s) {', '.join(named)}" if named else f"(as {path})"
    raise UsageError(f"config.json {fields}: lmspec check refuses such a model ({path}): {why}; nothing was written")
