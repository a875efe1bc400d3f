"""A BPE tokenizer trained offline once per session, and one that declares no eos token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.tokenizers import train_bpe_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_bpe_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def no_eos_tokenizer_dir(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tokenizer with eos_token taken out of its config files."""
    directory = tmp_path_factory.mktemp("no-eos-tokenizer")
    for source in tokenizer_dir.iterdir():
        shutil.copy(source, directory / source.name)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = directory / name
        if path.exists():
            config = json.loads(path.read_text(encoding="utf-8"))
            config.pop("eos_token", None)
            path.write_text(json.dumps(config), encoding="utf-8")
    return directory
