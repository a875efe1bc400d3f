"""REPORT.md's data section: the tokenizer, the blend, the split, and what the run reads of each source.

This is the one part of a build that depends on files outside the spec: a tokenizer directory
and the datasets' sidecars (PREFIX.lmspec.json, written by `lmspec data prepare`), as the
compile's inputs read them where it runs (compiler/inputs.py, before planning; plan.inputs), and
only to report. A compile on a machine without the data (CI) reports less: "(no sidecar: tokens
unknown)"; a later compile beside the data reports tokens and epochs, so `lmspec compile --check`
sees the two differ. The text depends on nothing else (no absolute path, no time), so it is
deterministic given the inputs, and shows every input it used.

The run's sample counts are the Plan's (plan.trained().batch.samples); only the per-source shares and the
epochs are computed here, and they are estimates, said so in the report.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmspec.compiler.data.sidecar import DatasetSidecar, SidecarError
from lmspec.compiler.data.tokenizer_files import TokenizerFiles, TokenizerFilesError
from lmspec.compiler.inputs import CompileInputs
from lmspec.compiler.plan import Plan
from lmspec.compiler.rules.data import BYTE_TOKENIZER_IDS, split_weights
from lmspec.compiler.spec.sections import DataSourceSpec

SHA_SHOWN = 12  # hex digits of tokenizer.json's sha256 shown (the sidecar and the run compare all 64)
SOURCE_COLUMNS = ("source", "weight", "documents", "tokens", "train tokens read", "epochs")
NO_SIDECAR = "(no sidecar: tokens unknown)"
EPOCHS_NOTE = (
    "Epochs: the tokens the run reads from a source (train samples x sequence length x its normalised weight) "
    "over that source's train-split tokens, the train split taken as its split weight's share of the source's "
    "tokens (Megatron splits by documents, so this is an approximation)."
)


@dataclass(frozen=True)
class DataSection:
    rows: list[tuple[str, str]]  # label, value
    sources: list[tuple[str, ...]]  # one row per source, SOURCE_COLUMNS; empty for the built-in corpus
    notes: list[str]


def code(text: str) -> str:
    """`text` as a Markdown code span inside a table cell: backticks fenced, `|` escaped."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    escaped = text.replace("|", "\\|")
    return f"{fence}{pad}{escaped}{pad}{fence}"


def data_section(plan: Plan) -> DataSection:
    t, batch = plan.trained().spec.train, plan.trained().batch
    weights = split_weights(t.data.split)
    shares = [w / sum(weights) for w in weights]
    samples = batch.samples
    validation = (
        f"{samples.evaluations:,} evaluation(s) x {samples.samples_per_evaluation:,} sequences "
        f"= {samples.valid:,} valid samples"
        if samples.evaluations
        else "none (train.eval_iters=0)"
    )
    tokenizer, files = _tokenizer(plan)
    rows = [
        ("training tokenizer", tokenizer),
        (
            "split (train, valid, test)",
            f"{code(t.data.split)}: {', '.join(f'{s:.1%}' for s in shares)} of each source's documents",
        ),
        (
            "train samples",
            f"{samples.train:,} sequences x {batch.seq_length:,} tokens = {samples.train * batch.seq_length:,} tokens",
        ),
        ("validation", validation),
    ]
    if t.data.sources is None:
        rows.append(("sources", "the demo corpus shipped with lmspec (train.data.sources=null)"))
        return DataSection(rows, [], [])
    total_weight = sum(s.weight for s in t.data.sources)
    train_tokens = samples.train * batch.seq_length
    table, notes = [], []
    for index, source in enumerate(t.data.sources):
        share = source.weight / total_weight
        cells, note = _source_cells(plan.inputs, source, train_tokens * share, shares[0], files)
        table.append((code(source.path), f"{source.weight:g} ({share:.1%})", *cells))
        if note:
            notes.append(f"train.data.sources.{index}.path {code(source.path)}: {note}")
    return DataSection(rows, table, [*notes, EPOCHS_NOTE])


def _tokenizer(plan: Plan) -> tuple[str, TokenizerFiles | None]:
    data = plan.trained().spec.train.data
    if data.tokenizer == "byte" or data.tokenizer_path is None:
        return f"byte ({BYTE_TOKENIZER_IDS} ids: 256 bytes, end-of-text, pad)", None
    files = plan.inputs.tokenizer(data.tokenizer_path)
    if isinstance(files, TokenizerFilesError):
        return f"hf at {code(data.tokenizer_path)} (not readable here: {files}; `lmspec run` checks it)", None
    return (
        f"hf at {code(data.tokenizer_path)}: tokenizer.json sha256 {files.sha256[:SHA_SHOWN]}, "
        f"{files.vocab_size:,} ids",
        files,
    )


def _source_cells(
    inputs: CompileInputs,
    source: DataSourceSpec,
    read_tokens: float,
    train_share: float,
    tokenizer: TokenizerFiles | None,
) -> tuple[tuple[str, ...], str | None]:
    """documents, tokens, train tokens read, epochs; and a note when the sidecar says something is off."""
    read = f"{read_tokens:,.0f}"
    sidecar = inputs.sidecar(source.path)
    if isinstance(sidecar, SidecarError):
        return ("(sidecar unreadable: tokens unknown)", "-", read, "-"), f"sidecar: {sidecar}"
    if sidecar is None:
        return (NO_SIDECAR, "-", read, "-"), None
    train_tokens = sidecar.tokens * train_share
    epochs = f"{read_tokens / train_tokens:.3g}" if train_tokens else "-"
    return (f"{sidecar.documents:,}", f"{sidecar.tokens:,}", read, epochs), _mismatch(sidecar, tokenizer)


def _mismatch(sidecar: DatasetSidecar, tokenizer: TokenizerFiles | None) -> str | None:
    if tokenizer is None or sidecar.tokenizer_sha256 == tokenizer.sha256:
        return None
    return (
        f"prepared with another tokenizer (sha256 {sidecar.tokenizer_sha256[:SHA_SHOWN]}, not "
        f"{tokenizer.sha256[:SHA_SHOWN]}): `lmspec run` refuses it; prepare it again with train.data.tokenizer_path"
    )
