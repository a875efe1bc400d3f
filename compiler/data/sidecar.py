"""The sidecar `lmspec data prepare` writes beside a Megatron dataset: `PREFIX.lmspec.json`.

Megatron's `.idx` holds sequence lengths and document boundaries but not which tokenizer made
the ids; the sidecar records that (tokenizer.json's sha256, its vocabulary, the end-of-document
id) with the document and token counts, so `lmspec compile` can report tokens per source and
epochs without reading the data, and `lmspec run` can refuse a dataset made with another
tokenizer before any worker starts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from lmspec.compiler.build.safe_read import Unreadable, read_regular_below, strict_json

SIDECAR_SUFFIX = ".lmspec.json"
SIDECAR_FORMAT = 1
SIDECAR_LIMIT = 2**20


class SidecarError(ValueError):
    """A sidecar that exists but cannot be trusted; the text reads after "<path>: "."""


@dataclass(frozen=True)
class DatasetSidecar:
    tokenizer_sha256: str
    vocab_size: int
    eod_id: int | None  # appended after every document (--append-eod), else None
    documents: int
    tokens: int
    format: int = SIDECAR_FORMAT

    def text(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def sidecar_path(prefix: Path) -> Path:
    return prefix.with_name(prefix.name + SIDECAR_SUFFIX)


def read_sidecar(prefix: Path) -> DatasetSidecar | None:
    """The sidecar of the dataset at `prefix`; None when there is none (a dataset made by Megatron-LM)."""
    path = sidecar_path(prefix)
    if not path.exists():
        return None
    try:
        document = strict_json(read_regular_below(path.parent, path.name, SIDECAR_LIMIT))
    except (Unreadable, ValueError) as exc:
        raise SidecarError(str(exc)) from None
    if not isinstance(document, dict) or document.get("format") != SIDECAR_FORMAT:
        raise SidecarError(f"not an lmspec dataset sidecar of format {SIDECAR_FORMAT}")
    try:
        return DatasetSidecar(**document)
    except TypeError as exc:
        raise SidecarError(f"unexpected fields ({exc})") from None
