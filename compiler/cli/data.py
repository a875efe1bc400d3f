"""`lmspec data prepare`: tokenize .jsonl / .jsonl.gz / parquet / text files into a Megatron dataset.

The work is lmspec.runtime.data.prepare's; this verb loads the tokenizer, turns SIGTERM into the
same clean stop as Ctrl-C (the staging directory removed, no PREFIX.* left), and maps bad data
to exit 1 and a wrong command line to exit 2, one line each, no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from lmspec.compiler.cli.help_text import described
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK


class _Terminated(Exception):
    """SIGTERM, raised in the main thread so the staging directory is removed on the way out."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


def _cmd_prepare(args: argparse.Namespace) -> int:
    from lmspec.compiler.errors import UsageError
    from lmspec.runtime.data.prepare import prepare
    from lmspec.runtime.data.readers import DataInputError
    from lmspec.runtime.data.tokenizer import TokenizerError, load_tokenizer

    try:
        tokenizer = load_tokenizer(args.tokenizer, key="--tokenizer")
    except TokenizerError as exc:
        raise UsageError(str(exc)) from None
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        sidecar = prepare(
            list(args.inputs),
            tokenizer,
            args.output,
            text_key=args.text_key,
            workers=args.workers,
            append_eod=args.append_eod,
            progress=True,
        )
    except DataInputError as exc:
        if os.environ.get("LMSPEC_DEBUG") == "1":
            raise
        print(f"lmspec: error: {exc}; nothing was written", file=sys.stderr)
        return EXIT_FAILED
    except (KeyboardInterrupt, _Terminated) as exc:
        print(f"lmspec: interrupted; nothing was written under --output {str(args.output)!r}", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(exc, _Terminated) else signal.SIGINT)  # as a shell reports it
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(
        f"prepared {sidecar.documents:,} documents, {sidecar.tokens:,} tokens into {args.output}.bin/.idx "
        f"(tokenizer {sidecar.tokenizer_sha256[:12]}, vocabulary {sidecar.vocab_size})"
    )
    print(f"train on it: {dataset_overrides(str(args.output), str(args.tokenizer))}")
    return EXIT_OK


def dataset_overrides(prefix: str, tokenizer: str) -> str:
    """The overrides (or spec keys) that train on the dataset at `prefix`, as a shell reads them."""
    source = json.dumps(prefix)
    return " ".join(
        (
            "train.data.tokenizer=hf",
            shlex.quote(f"train.data.tokenizer_path={json.dumps(tokenizer)}"),
            shlex.quote(f"train.data.sources=[{{path:{source},weight:1.0}}]"),
        )
    )


def register(subparsers: Any) -> None:
    data = subparsers.add_parser(
        "data",
        help="prepare your own data for training",
        **described(
            "Turn your own corpus into the Megatron indexed dataset train.data.sources reads.",
            "lmspec data prepare corpus.jsonl --tokenizer /models/Meta-Llama-3-8B --output data/corpus",
        ),
    )
    verbs = data.add_subparsers(dest="data_command", required=True, metavar="VERB")
    p = verbs.add_parser(
        "prepare",
        help="tokenize .jsonl/.jsonl.gz/parquet/text files into a Megatron PREFIX.bin/.idx for train.data.sources",
        **described(
            "Tokenize documents with a Hugging Face tokenizer into PREFIX.bin/PREFIX.idx (megatron-core's "
            "indexed dataset), then point train.data.sources at PREFIX.",
            "lmspec data prepare corpus.jsonl --tokenizer /models/Meta-Llama-3-8B --output data/corpus",
            "lmspec data prepare shard-*.parquet --tokenizer /models/Qwen2.5-7B --output data/web",
        ),
    )
    p.add_argument(
        "inputs",
        nargs="+",
        type=Path,
        metavar="INPUT",
        help=".jsonl, .jsonl.gz, .parquet, or plain UTF-8 text (documents separated by blank lines)",
    )
    p.add_argument("--tokenizer", type=Path, required=True, metavar="DIR", help="a local HF tokenizer directory")
    p.add_argument(
        "--output",
        type=Path,
        required=True,
        metavar="PREFIX",
        help="dataset prefix: writes PREFIX.bin, PREFIX.idx and PREFIX.lmspec.json (never over existing files)",
    )
    p.add_argument("--text-key", default="text", help="jsonl key / parquet column holding the text (default: text)")
    p.add_argument(
        "--workers", type=int, default=1, metavar="N", help="processes encoding batches (same output for any N)"
    )
    p.add_argument("--append-eod", action="store_true", help="append the tokenizer's eos token after each document")
    p.set_defaults(handler=_cmd_prepare)
