"""Rules of the training data, checked at compile time without the data (CI may not hold it).

The spec alone decides most of it: the tokenizer kind and its directory agree; every source is
a Megatron prefix (not PREFIX.bin/.idx, nor a raw corpus `lmspec data prepare` must turn into
one) listed once; validation has a valid split to read; the byte tokenizer's ids fit the
embedding. One rule judges a file when this machine holds it: a tokenizer directory's vocabulary
against model.vocab_size, as the compile's inputs read it (compiler/inputs.py). A tokenizer directory
or dataset not here is no error, a warning (`data_here`): `lmspec run` checks the tokenizer and the
datasets where the job runs, before any worker starts.

Paths are compared as the runtime opens them, relative to the working directory (as
lmspec.compiler.run_paths), resolved by the compile's inputs. A job too big to be a demo (several nodes, or a model of
LARGE_MODEL_PARAMS or more) that trains on lmspec's demo data gets a warning, not an error:
the presets do, on purpose, so that their layouts compile anywhere.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator

from lmspec.compiler.data.sidecar import SIDECAR_SUFFIX
from lmspec.compiler.data.tokenizer_files import MEGATRON_VOCAB_MULTIPLE, TokenizerFilesError, padded_vocab_size
from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.models.params import count_params
from lmspec.compiler.rules.budget import computable
from lmspec.compiler.rules.context import TrainingContext

# The ids of lmspec.runtime.data.byte_tokenizer (256 bytes, end-of-text, pad), which the compiler
# cannot import; tests count them in the tokenizer.json it writes.
BYTE_TOKENIZER_IDS = 258
LARGE_MODEL_PARAMS = 10**9  # from here on a model is trained for real, not as a smoke test
DATASET_FILE_SUFFIXES = (".bin", ".idx", SIDECAR_SUFFIX)  # files of a prefix, never the prefix itself
RAW_CORPUS_SUFFIXES = (".jsonl.gz", ".jsonl", ".json", ".parquet", ".txt")  # `lmspec data prepare` inputs
PREPARE = "lmspec data prepare"
PLAIN_VALUE = re.compile(r"[A-Za-z0-9_./-]+")  # a path Hydra reads as itself, unquoted


def source_key(index: int, field: str = "path") -> str:
    """`train.data.sources.0.path`: the dotted key of one source, as schema messages and overrides write it."""
    return f"train.data.sources.{index}.{field}"


def show_source(ctx: TrainingContext, index: int) -> str:
    """`train.data.sources.0.path="a" (file:line)`: TrainingContext.show for a list item."""
    sources = ctx.spec.train.data.sources or ()
    key = source_key(index)
    return f"{key}={json.dumps(sources[index].path)} ({ctx.origins.of(key)})"


def override(key: str, value: str) -> str:
    """`key=value` as typed on the command line: a value Hydra would not read plain is quoted."""
    if PLAIN_VALUE.fullmatch(value):
        return f"{key}={value}"
    return shlex.quote(f"{key}={json.dumps(value)}")


def tokenizer_needs_its_path(ctx: TrainingContext) -> Iterator[Problem]:
    data = ctx.spec.train.data
    if data.tokenizer == "hf" and data.tokenizer_path is None:
        yield error(
            "train.data.tokenizer_path",
            (
                f"{ctx.show('train.data.tokenizer_path')} with {ctx.show('train.data.tokenizer')}: the HF tokenizer "
                "is read from a local directory (offline, never downloaded); set train.data.tokenizer_path=DIR "
                "(a directory holding tokenizer.json), or train.data.tokenizer=byte"
            ),
        )
    if data.tokenizer == "byte" and data.tokenizer_path is not None:
        yield error(
            "train.data.tokenizer_path",
            (
                f"{ctx.show('train.data.tokenizer_path')} is set but {ctx.show('train.data.tokenizer')} never reads "
                "it; set train.data.tokenizer=hf to train with that tokenizer, or train.data.tokenizer_path=null "
                "for the byte tokenizer"
            ),
        )


def _prefix_of(path: str) -> str | None:
    """`path` without the dataset file's suffix when it names one of a prefix's files."""
    for suffix in DATASET_FILE_SUFFIXES:
        if path.endswith(suffix) and len(path) > len(suffix):
            return path[: -len(suffix)]
    return None


def _raw_corpus(path: str) -> str | None:
    """`path` without its suffix when it names a corpus `lmspec data prepare` reads."""
    lowered = path.lower()
    for suffix in RAW_CORPUS_SUFFIXES:
        if lowered.endswith(suffix) and len(path) > len(suffix):
            return path[: -len(suffix)]
    return None


def sources_are_prefixes(ctx: TrainingContext) -> Iterator[Problem]:
    data = ctx.spec.train.data
    hf = data.tokenizer == "hf" and data.tokenizer_path is not None
    tokenizer = shlex.quote(data.tokenizer_path) if hf and data.tokenizer_path else "DIR"
    also = "" if hf else " with train.data.tokenizer=hf train.data.tokenizer_path=DIR"
    for index, source in enumerate(data.sources or ()):
        if (prefix := _prefix_of(source.path)) is not None:
            yield error(
                source_key(index),
                (
                    f"{show_source(ctx, index)} names one file of a Megatron dataset; sources are given by the "
                    f"prefix PREFIX.bin and PREFIX.idx share: pass the prefix: {override(source_key(index), prefix)}"
                ),
            )
        elif (stem := _raw_corpus(source.path)) is not None:
            yield error(
                source_key(index),
                (
                    f"{show_source(ctx, index)} is a raw corpus, not a Megatron dataset prefix: run "
                    f"`{PREPARE} {shlex.quote(source.path)} --tokenizer {tokenizer} --output {shlex.quote(stem)}` "
                    "and pass "
                    f"{override(source_key(index), stem)}{also}"
                ),
            )


def sources_listed_once(ctx: TrainingContext) -> Iterator[Problem]:
    first: dict[str, int] = {}
    sources = ctx.spec.train.data.sources or ()
    for index, source in enumerate(sources):
        seen = ctx.inputs.resolved(source.path) or source.path
        if seen not in first:
            first[seen] = index
            continue
        earlier = first[seen]
        weight = sources[earlier].weight + source.weight
        yield warning(
            source_key(index),
            (
                f"{show_source(ctx, index)} is the same dataset as {show_source(ctx, earlier)}: Megatron samples "
                f"it under both weights ({sources[earlier].weight:g} + {source.weight:g}); list it once, with "
                f"{source_key(earlier, 'weight')}={weight:g}"
            ),
        )


def vocabulary_fits_the_embedding(ctx: TrainingContext) -> Iterator[Problem]:
    data, rows = ctx.spec.train.data, ctx.spec.model.vocab_size
    if data.tokenizer == "byte" and BYTE_TOKENIZER_IDS > rows:
        yield error(
            "model.vocab_size",
            (
                f"{ctx.show('model.vocab_size')} is below the {BYTE_TOKENIZER_IDS} ids (256 bytes, end-of-text, "
                f"pad) of {ctx.show('train.data.tokenizer')}; set "
                f"model.vocab_size={padded_vocab_size(BYTE_TOKENIZER_IDS)} (rounded up to a multiple of "
                f"{MEGATRON_VOCAB_MULTIPLE}, as Megatron pads), or train.data.tokenizer=hf with a tokenizer of at "
                f"most {rows} ids"
            ),
        )
    if data.tokenizer != "hf" or data.tokenizer_path is None:
        return
    files = ctx.inputs.tokenizer(data.tokenizer_path)
    if isinstance(files, TokenizerFilesError) or files.vocab_size <= rows:
        return  # not readable here: `lmspec run` checks the tokenizer where the job runs
    yield error(
        "model.vocab_size",
        (
            f"the tokenizer at {ctx.show('train.data.tokenizer_path')} uses {files.vocab_size} ids (tokenizer.json's "
            f"largest id + 1) but {ctx.show('model.vocab_size')} has {rows} embedding rows; set "
            f"model.vocab_size={padded_vocab_size(files.vocab_size)} (rounded up to a multiple of "
            f"{MEGATRON_VOCAB_MULTIPLE}, as Megatron pads), or use a tokenizer of at most {rows} ids"
        ),
    )


def split_weights(split: str) -> tuple[float, float, float]:
    """`"949,50,1"` as its three weights (the schema's SPLIT kind guarantees the shape)."""
    train, valid, test = (float(part) for part in split.split(","))
    return train, valid, test


def validation_has_a_split(ctx: TrainingContext) -> Iterator[Problem]:
    t = ctx.spec.train
    if t.eval_iters > 0 and split_weights(t.data.split)[1] == 0:
        yield error(
            "train.data.split",
            (
                f"{ctx.show('train.data.split')} gives the valid split weight 0 but {ctx.show('train.eval_iters')} "
                "reads that many global batches of it at every validation; give the valid split a weight "
                "('train.data.split=\"949,50,1\"'), or set train.eval_iters=0 for no validation"
            ),
        )


def real_data_at_scale(ctx: TrainingContext) -> Iterator[Problem]:
    s = ctx.spec
    params = count_params(s.model).total if computable(s) else 0  # else the model rules report it
    scale = []
    if s.hardware.nodes > 1:
        scale.append(ctx.show("hardware.nodes"))
    if params >= LARGE_MODEL_PARAMS:
        scale.append(f"a model of {params / 1e9:,.1f} B parameters")
    if not scale:
        return
    job = f"a job on {' with '.join(scale)}" if s.hardware.nodes > 1 else f"a job of {scale[0]}"
    if s.train.data.sources is None:
        yield warning(
            "train.data.sources",
            (
                f"{ctx.show('train.data.sources')}: {job} trains on the small demo corpus shipped with lmspec; "
                f"make your corpus a dataset with `{PREPARE} FILE --tokenizer DIR --output PREFIX` and set "
                "'train.data.sources=[{path:PREFIX,weight:1.0}]'"
            ),
        )
    if s.train.data.tokenizer == "byte":
        yield warning(
            "train.data.tokenizer",
            (
                f"{ctx.show('train.data.tokenizer')}: {job} trains on {BYTE_TOKENIZER_IDS} byte ids, and "
                f"{s.model.vocab_size - BYTE_TOKENIZER_IDS:,} rows of {ctx.show('model.vocab_size')} never see a "
                "token; set "
                "train.data.tokenizer=hf train.data.tokenizer_path=DIR (a local directory holding the model's "
                "tokenizer.json)"
            ),
        )


def data_here(ctx: TrainingContext) -> Iterator[Problem]:
    """Data this machine does not hold: valid (CI compiles without the data), but said, since `lmspec run`
    refuses it (runtime/data/preflight.py) and a first compile is where a wrong path is cheapest to see."""
    data = ctx.spec.train.data
    refused = "`lmspec run` refuses it until it is there (check and compile accept it, so CI needs no data)"
    hf = data.tokenizer == "hf" and data.tokenizer_path is not None
    tokenizer = shlex.quote(data.tokenizer_path) if hf and data.tokenizer_path else "DIR"
    if hf and data.tokenizer_path is not None:
        files = ctx.inputs.tokenizer(data.tokenizer_path)
        if isinstance(files, TokenizerFilesError):
            yield warning(
                "train.data.tokenizer_path",
                f"{ctx.show('train.data.tokenizer_path')}: not readable here ({files}); {refused}",
            )
    for index, source in enumerate(data.sources or ()):
        if (
            _prefix_of(source.path) is None
            and _raw_corpus(source.path) is None
            and not ctx.inputs.dataset_here(source.path)
        ):
            yield warning(
                source_key(index),
                f"{show_source(ctx, index)}: no dataset here ({source.path}.bin and .idx); {refused}; make it "
                f"with `{PREPARE} FILE --tokenizer {tokenizer} --output {shlex.quote(source.path)}`",
            )


RULES = (
    tokenizer_needs_its_path,
    sources_are_prefixes,
    sources_listed_once,
    vocabulary_fits_the_embedding,
    validation_has_a_split,
    real_data_at_scale,
    data_here,
)
