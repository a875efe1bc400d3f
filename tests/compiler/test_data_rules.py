"""Golden error tests of the data rules, through `lmspec check` as a user types it: the exit code,
the key with its value and origin, and the fix; nothing needs the data itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.tokenizers import train_bpe_tokenizer

from lmspec.compiler.data.tokenizer_files import read_tokenizer_files
from lmspec.compiler.rules.data import BYTE_TOKENIZER_IDS

HF = ["train.data.tokenizer=hf"]
ERRORS = [
    pytest.param(
        HF,
        [
            "train.data.tokenizer_path=null",
            'train.data.tokenizer="hf" (command-line override)',
            "set train.data.tokenizer_path=DIR",
            "or train.data.tokenizer=byte",
        ],
        id="hf-needs-a-path",
    ),
    pytest.param(
        ["train.data.tokenizer_path=tokenizers/bpe"],
        [
            'train.data.tokenizer_path="tokenizers/bpe" (command-line override) is set but train.data.tokenizer="byte"',
            "set train.data.tokenizer=hf",
            "or train.data.tokenizer_path=null",
        ],
        id="byte-with-a-path",
    ),
    pytest.param(
        ["train.data.sources=[{path:data/web_text_document.bin,weight:1.0}]"],
        [
            'train.data.sources.0.path="data/web_text_document.bin" (command-line override) names one file',
            "pass the prefix: train.data.sources.0.path=data/web_text_document",
        ],
        id="bin-file",
    ),
    pytest.param(
        ["train.data.sources=[{path:a,weight:0.5},{path:data/web_text_document.idx,weight:0.5}]"],
        ["train.data.sources.1.path=", "pass the prefix: train.data.sources.1.path=data/web_text_document"],
        id="idx-file",
    ),
    pytest.param(
        [*HF, "train.data.tokenizer_path=tok", "train.data.sources=[{path:corpus/web.jsonl,weight:1.0}]"],
        [
            'train.data.sources.0.path="corpus/web.jsonl" (command-line override) is a raw corpus',
            "run `lmspec data prepare corpus/web.jsonl --tokenizer tok --output corpus/web`",
            "and pass train.data.sources.0.path=corpus/web",
        ],
        id="jsonl-corpus",
    ),
    pytest.param(
        ["train.data.sources=[{path:web.jsonl.gz,weight:1.0}]"],
        [
            "is a raw corpus",
            "`lmspec data prepare web.jsonl.gz --tokenizer DIR --output web`",
            "pass train.data.sources.0.path=web with train.data.tokenizer=hf train.data.tokenizer_path=DIR",
        ],
        id="jsonl-gz-corpus",
    ),
    pytest.param(
        ["train.data.sources=[{path:books.parquet,weight:1.0}]"],
        ["is a raw corpus", "--output books` and pass train.data.sources.0.path=books"],
        id="parquet-corpus",
    ),
    pytest.param(
        ["train.data.sources=[{path:notes.json,weight:1.0}]"],
        ["is a raw corpus", "lmspec data prepare notes.json"],
        id="json-corpus",
    ),
    pytest.param(
        ["train.data.sources=[{path:'my corpus.jsonl',weight:1.0}]"],
        [
            "`lmspec data prepare 'my corpus.jsonl' --tokenizer DIR --output 'my corpus'`",
            "and pass 'train.data.sources.0.path=\"my corpus\"'",
        ],
        id="corpus-path-quoted",
    ),
    pytest.param(
        ["train.data.sources=[{path:a,weight:0}]"],
        ["train.data.sources.0.weight=0 (command-line override): expected a number > 0"],
        id="weight-positive",
    ),
    pytest.param(
        ["model.vocab_size=256"],
        [
            f"model.vocab_size=256 (command-line override) is below the {BYTE_TOKENIZER_IDS} ids",
            'train.data.tokenizer="byte"',
            "set model.vocab_size=384 (rounded up to a multiple of 128, as Megatron pads)",
        ],
        id="byte-ids-exceed-vocab",
    ),
    pytest.param(
        ['train.data.split="98,0,2"'],
        [
            'train.data.split="98,0,2" (command-line override) gives the valid split weight 0',
            "train.eval_iters=2 (lmspec:specs/hardware/cpu.yaml:",
            'train.data.split="949,50,1"\'',
            "or set train.eval_iters=0",
        ],
        id="validation-without-valid-split",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), ERRORS)
def test_data_rule_reports_key_origin_and_fix(lmspec, overrides: list[str], expected: list[str]) -> None:
    result = lmspec("check", *overrides)
    result.assert_reports(1, expected)
    assert result.err.strip().splitlines()[-1].startswith("lmspec: spec invalid:")


def test_validation_off_needs_no_valid_split(lmspec) -> None:
    assert lmspec("check", 'train.data.split="98,0,2"', "train.eval_iters=0").code == 0


def test_a_source_listed_twice_warns_with_the_summed_weight(lmspec) -> None:
    result = lmspec("check", "train.data.sources=[{path:data/a,weight:0.7},{path:./data/a,weight:0.3}]")
    assert result.code == 0, result.err
    assert (
        'warning: train.data.sources.1.path="./data/a" (command-line override) is the same dataset as '
        'train.data.sources.0.path="data/a"' in result.err
    )
    assert "list it once, with train.data.sources.0.weight=1" in result.err


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(lmspec, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    train_bpe_tokenizer(tmp_path / "tok", vocab_size=600)
    result = lmspec("check", *HF, "train.data.tokenizer_path=tok")
    result.assert_reports(
        1,
        [
            'the tokenizer at train.data.tokenizer_path="tok" (command-line override) uses 600 ids',
            "model.vocab_size=512 (lmspec:specs/model/tiny.yaml:",
            "set model.vocab_size=640 (rounded up to a multiple of 128, as Megatron pads)",
        ],
    )
    assert lmspec("check", *HF, "train.data.tokenizer_path=tok", "model.vocab_size=640").code == 0


def test_a_tokenizer_that_fits_or_is_not_here_passes(lmspec, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    train_bpe_tokenizer(tmp_path / "tok", vocab_size=384)
    assert lmspec("check", *HF, "train.data.tokenizer_path=tok").code == 0
    # CI may not hold the tokenizer: `lmspec run` checks it where the job runs.
    assert lmspec("check", *HF, "train.data.tokenizer_path=elsewhere/tok").code == 0


@pytest.mark.parametrize(
    ("spec", "job"),
    [
        ("llama3_8b_pretrain_8gpu_h100_bf16", "a job of a model of 8.0 B parameters"),
        ("deepseek_v3_pretrain_2048gpu_h800_bf16", "a job on hardware.nodes=256"),
    ],
)
def test_demo_data_at_scale_warns_with_the_keys_to_set(lmspec, spec: str, job: str) -> None:
    result = lmspec("check", "--spec", spec)
    assert result.code == 0, result.err
    lines = result.err.splitlines()
    sources = next(line for line in lines if line.startswith("warning: train.data.sources=null"))
    assert job in sources and "'train.data.sources=[{path:PREFIX,weight:1.0}]'" in sources
    tokenizer = next(line for line in lines if line.startswith('warning: train.data.tokenizer="byte"'))
    assert "train.data.tokenizer=hf train.data.tokenizer_path=DIR" in tokenizer


def test_a_multi_node_tiny_job_warns_and_the_cpu_preset_does_not(lmspec) -> None:
    assert "train.data" not in lmspec("check").err
    result = lmspec("check", "hardware.nodes=2")
    assert result.code == 0, result.err
    assert "warning: train.data.sources=null" in result.err and "a job on hardware.nodes=2" in result.err


def test_the_byte_ids_are_the_runtime_tokenizer_s(tmp_path: Path) -> None:
    from lmspec.runtime.data.byte_tokenizer import save_byte_tokenizer

    save_byte_tokenizer(tmp_path)
    assert read_tokenizer_files(tmp_path).vocab_size == BYTE_TOKENIZER_IDS
