"""The tokenizer a model was trained with, as the files of an HF model directory.

A converted model carries its training tokenizer, so transformers and vLLM load it with its own
ids (the byte tokenizer's or the user's HF tokenizer), never a guess. hf: the tokenizer's own
files are copied as they are; byte: runtime/data/byte_tokenizer.py writes them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from lmspec.compiler.data.tokenizer_files import TOKENIZER_JSON
from lmspec.compiler.errors import UsageError
from lmspec.compiler.spec.sections import DataSpec

GENERATION_CONFIG = "generation_config.json"
# what transformers' save_pretrained writes for a fast tokenizer (the chat template, when it has one)
HF_TOKENIZER_FILES = (TOKENIZER_JSON, "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


@dataclass(frozen=True)
class TrainingTokenizer:
    files: tuple[Path, ...]  # hf: the files copied; () for the byte tokenizer, which is written

    def write(self, directory: Path) -> None:
        """Put the tokenizer's files into `directory` (which exists)."""
        if not self.files:
            from lmspec.runtime.data.byte_tokenizer import save_byte_tokenizer

            save_byte_tokenizer(directory)
            return
        for path in self.files:
            shutil.copyfile(path, directory / path.name)


def training_tokenizer(data: DataSpec) -> TrainingTokenizer:
    """The training tokenizer of `data`; UsageError naming train.data.tokenizer_path when its files are gone."""
    if data.tokenizer == "byte":
        return TrainingTokenizer(())
    directory = Path(data.tokenizer_path or "")
    if not (directory / TOKENIZER_JSON).is_file():
        raise UsageError(
            f"train.data.tokenizer_path={data.tokenizer_path!r}: no {TOKENIZER_JSON} there to put beside the "
            f"model; restore the tokenizer the model was trained with, or compile with its directory"
        )
    return TrainingTokenizer(tuple(directory / name for name in HF_TOKENIZER_FILES if (directory / name).is_file()))


def generation_config(directory: Path) -> str:
    """generation_config.json for a model whose tokenizer is in `directory`: its bos, eos and pad ids.

    transformers' generate and vLLM take the stop token from there and fall back to config.json,
    where the family's class defaults (Llama's bos 1, eos 2) would name ordinary tokens of this
    tokenizer: a BPE model would stop at whatever id 2 is.
    """
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
    ids = {"bos_token_id": fast.bos_token_id, "eos_token_id": fast.eos_token_id, "pad_token_id": fast.pad_token_id}
    return json.dumps(ids, indent=2, sort_keys=True) + "\n"
