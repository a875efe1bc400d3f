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
    unread = read.unread()
    if unread:
        raise UsageError(
            f"config.json field(s) {', '.join(unread)}: lmspec does not model them, so importing would train "
            f"and serve a different model than the release ({arch})"
        )
    return {"name": name, "family": family_name, **fields}
