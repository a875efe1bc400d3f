"""The training data, checked at `lmspec run` before any worker starts and before anything is written.

Compile cannot check the data (CI may not hold it); a run that finds it wrong only after torchrun
started, or after Megatron's builder wrote its index cache, wastes the allocation and leaves
files behind. So, for the typed Plan of a build: the tokenizer loads and its ids fit
`model.vocab_size`; every `train.data.sources.N` has PREFIX.bin and PREFIX.idx as regular files
that megatron-core's IndexedDataset reads and that agree (the .bin holds exactly the tokens the
.idx describes); its sidecar (PREFIX.lmspec.json, written by `lmspec data prepare`) records this
tokenizer's sha256 and the same documents and tokens (no sidecar: a warning, the tokenizer cannot
be checked); and every split the run reads (train; valid when the run validates) gets, in Megatron's
own division of each source's documents (BlendedMegatronDatasetBuilder over the .idx), at least
one sample of `train.seq_length + 1` tokens (runtime/data/index_probe.py asks megatron-core). All
problems are returned at once; each names the key, the path and the fix. Nothing here writes a file.
"""

from __future__ import annotations

import functools
import logging
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lmspec.compiler.data.sidecar import DatasetSidecar, SidecarError, read_sidecar, sidecar_path
from lmspec.compiler.data.tokenizer_files import TokenizerFiles, padded_vocab_size, read_tokenizer_files
from lmspec.compiler.errors import Problem, error, print_problems, warning
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.sections import DataSourceSpec

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from lmspec.runtime.data.index_probe import OpenedDataset

TOKENIZER_KEY = "train.data.tokenizer_path"
SPLIT_KEY = "train.data.split"


@dataclass(frozen=True)
class _Tokenizer:
    files: TokenizerFiles | None  # None: it could not be read (already reported)
    directory: str  # what a fix passes to `lmspec data prepare --tokenizer`


def check_training_data(plan: Plan) -> list[Problem]:
    """Every problem of the tokenizer and of `train.data.sources` for this plan, errors and warnings."""
    problems: list[Problem] = []
    tokenizer = _check_tokenizer(plan, problems)
    for index, source in enumerate(plan.trained().spec.train.data.sources or ()):
        problems += _check_source(plan, index, source, tokenizer)
    return problems


def data_ready(plan: Plan, *, report: bool = True) -> bool:
    """Print the preflight's problems (when `report`); False when any is an error."""
    problems = check_training_data(plan)
    errors = [p for p in problems if p.severity == "error"]
    if report:
        print_problems(sorted(problems, key=lambda p: p.severity != "error"))
        if errors:
            logger.error(
                f"lmspec run: the training data is not ready ({len(errors)} error(s)); nothing was started or written"
            )
    return not errors


def _check_tokenizer(plan: Plan, problems: list[Problem]) -> _Tokenizer:
    data, vocab = plan.trained().spec.train.data, plan.spec.model.vocab_size
    if data.tokenizer == "byte":
        return _Tokenizer(None, "DIR")  # the byte tokenizer is built in: nothing to load
    from lmspec.runtime.data.tokenizer import TokenizerError, load_tokenizer

    if data.tokenizer_path is None:
        problems.append(
            error(TOKENIZER_KEY, f"{TOKENIZER_KEY}=null with train.data.tokenizer=hf: give the tokenizer's directory")
        )
        return _Tokenizer(None, "DIR")
    try:
        files = load_tokenizer(Path(data.tokenizer_path), key=TOKENIZER_KEY).files
    except TokenizerError as exc:
        problems.append(error(TOKENIZER_KEY, str(exc)))
        return _Tokenizer(None, data.tokenizer_path)
    if files.vocab_size > vocab:
        problems.append(
            error(
                "model.vocab_size",
                f"{TOKENIZER_KEY}={data.tokenizer_path!r}: its ids need {files.vocab_size} embedding rows but "
                f"model.vocab_size={vocab}; set model.vocab_size={padded_vocab_size(files.vocab_size)} "
                "or use a smaller tokenizer",
            )
        )
    return _Tokenizer(files, data.tokenizer_path)


@functools.cache
def _byte_tokenizer_files() -> TokenizerFiles:
    """The identity a dataset prepared with the byte tokenizer's HF files records (save_byte_tokenizer)."""
    from lmspec.runtime.data.byte_tokenizer import save_byte_tokenizer

    with tempfile.TemporaryDirectory(prefix="lmspec-byte-tokenizer-") as scratch:
        save_byte_tokenizer(Path(scratch))
        return read_tokenizer_files(Path(scratch))


def _check_source(plan: Plan, index: int, source: DataSourceSpec, tokenizer: _Tokenizer) -> list[Problem]:
    key = f"train.data.sources.{index}.path"
    prefix = Path(source.path)
    named = f"{key}={source.path!r}"
    where = "" if prefix.is_absolute() else f" (relative to {Path.cwd()})"
    prepare = f"run `lmspec data prepare FILE... --tokenizer {tokenizer.directory} --output {source.path}`"
    paths = [prefix.with_name(prefix.name + suffix) for suffix in (".bin", ".idx")]
    missing = [str(p) for p in paths if not os.path.lexists(p)]
    if missing:
        exist = "does not exist" if len(missing) == 1 else "do not exist"
        return [error(key, f"{named}: {' and '.join(missing)} {exist}{where}; {prepare} to make the dataset")]
    odd = [str(p) for p in paths if not p.is_file()]
    if odd:
        what = "is not a regular file" if len(odd) == 1 else "are not regular files"
        return [error(key, f"{named}: {' and '.join(odd)} {what}; {prepare}, or point {key} at one")]
    dataset, reason = _open(prefix)
    if dataset is None:
        return [error(key, f"{named}: megatron-core cannot read it as an indexed dataset ({reason}); {prepare} again")]
    index_reader = dataset.index
    tokens = int(index_reader.sequence_lengths.sum(dtype="int64"))
    documents = len(index_reader.document_indices) - 1
    bin_path = paths[0]
    expected = tokens * index_reader.dtype_size
    actual = bin_path.stat().st_size
    if actual != expected:
        return [
            error(
                key,
                f"{named}: {bin_path} holds {actual} bytes but {prefix.name}.idx describes {tokens} tokens of "
                f"{index_reader.dtype.__name__} ({expected} bytes): the two files were not written together "
                f"(a copy cut short?); copy both again, or {prepare} again",
            )
        ]
    if documents < 1:
        return [error(key, f"{named}: the dataset holds no documents; {prepare} from a non-empty input")]
    problems = _check_sidecar(plan, key, named, prefix, prepare, (documents, tokens), tokenizer)
    problems += _check_splits(plan, index, source.path, prefix, tokens)
    return problems


def _open(prefix: Path) -> tuple[OpenedDataset | None, str]:
    """megatron-core's own reader over PREFIX.idx, or None and why it refused."""
    from lmspec.runtime.data.index_probe import OpenedDataset

    try:
        return OpenedDataset(str(prefix)), ""
    except (AssertionError, ValueError, OSError, IndexError, TypeError, struct.error) as exc:
        return None, str(exc) or type(exc).__name__


def _check_sidecar(
    plan: Plan,
    key: str,
    named: str,
    prefix: Path,
    prepare: str,
    counts: tuple[int, int],
    tokenizer: _Tokenizer,
) -> list[Problem]:
    sidecar_file = sidecar_path(prefix)
    try:
        sidecar = read_sidecar(prefix)
    except SidecarError as exc:
        return [error(key, f"{named}: {sidecar_file}: {exc}; {prepare} again, or remove {sidecar_file.name}")]
    if sidecar is None:
        return [
            warning(
                key,
                f"{named}: no {sidecar_file.name} beside it (a dataset made by Megatron-LM?): whether it was "
                f"tokenized with train.data.tokenizer={plan.trained().spec.train.data.tokenizer} "
                f"({tokenizer.directory}) could not be checked; {prepare} to have lmspec record it",
            )
        ]
    problems = []
    if (sidecar.documents, sidecar.tokens) != counts:
        problems.append(
            error(
                key,
                f"{named}: {sidecar_file.name} records {sidecar.documents} documents and {sidecar.tokens} tokens, "
                f"the .idx holds {counts[0]} and {counts[1]}: the sidecar belongs to another dataset; {prepare} again",
            )
        )
    problems += _check_identity(plan, key, named, sidecar, sidecar_file, prepare, tokenizer)
    vocab = plan.spec.model.vocab_size
    if sidecar.vocab_size > vocab:
        problems.append(
            error(
                "model.vocab_size",
                f"{named}: its tokenizer has {sidecar.vocab_size} ids ({sidecar_file.name}) but "
                f"model.vocab_size={vocab}; set model.vocab_size={padded_vocab_size(sidecar.vocab_size)}",
            )
        )
    return problems


def _check_identity(
    plan: Plan,
    key: str,
    named: str,
    sidecar: DatasetSidecar,
    sidecar_file: Path,
    prepare: str,
    tokenizer: _Tokenizer,
) -> list[Problem]:
    data = plan.trained().spec.train.data
    if data.tokenizer == "byte":
        files, using = _byte_tokenizer_files(), "the byte tokenizer (train.data.tokenizer=byte)"
    elif tokenizer.files is None:
        return []  # the tokenizer itself is unusable: reported once, under train.data.tokenizer_path
    else:
        files, using = tokenizer.files, f"{TOKENIZER_KEY}={data.tokenizer_path!r}"
    if sidecar.tokenizer_sha256 == files.sha256:
        return []
    return [
        error(
            key,
            f"{named}: made with another tokenizer ({sidecar_file.name} records tokenizer.json sha256 "
            f"{sidecar.tokenizer_sha256[:12]}..., {using} is {files.sha256[:12]}...): its ids would mean other "
            f"tokens; {prepare} with this tokenizer, or set {TOKENIZER_KEY} to the one it was made with",
        )
    ]


def _check_splits(plan: Plan, index: int, path: str, prefix: Path, tokens: int) -> list[Problem]:
    """Megatron's builder divides each source's documents between the splits; each split the run reads
    needs one sample: seq_length + 1 tokens (GPTDataset's samples overlap by the one extra token)."""
    train, samples = plan.trained().spec.train, plan.trained().batch.samples
    need = train.seq_length + 1
    read = [("train", samples.train, "")]
    if samples.valid:
        read.append(("valid", samples.valid, f", or set train.eval_iters=0 (no validation; {train.eval_iters} now)"))
    from lmspec.runtime.data.index_probe import SPLIT_NAMES, split_shares

    shares = split_shares(str(prefix), train.data.split, train.seed, train.seq_length)
    problems = []
    for name, wanted, no_eval in read:
        share = shares[SPLIT_NAMES.index(name)]
        if share is not None and share.tokens >= need:
            continue
        got = (
            "no documents"
            if share is None or share.documents == 0
            else f"{share.documents} document(s), {share.tokens} tokens"
        )
        problems.append(
            error(
                SPLIT_KEY,
                f"{SPLIT_KEY}={train.data.split!r}: Megatron's division gives the {name} split of "
                f"train.data.sources.{index} ({path!r}, {tokens} tokens in all) {got}, but "
                f"one {name} sample takes train.seq_length+1={need} tokens (the run reads {wanted}); give "
                f"{name} a larger share of {SPLIT_KEY}, prepare more documents, or lower train.seq_length{no_eval}",
            )
        )
    return problems
