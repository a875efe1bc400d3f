"""REPORT.md's data section: the tokenizer, the blend and the split from the spec; documents, tokens and
epochs from the sidecars `lmspec data prepare` writes (PREFIX.lmspec.json), when this machine holds them."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.tokenizers import train_bpe_tokenizer

from lmspec.compiler.data.sidecar import DatasetSidecar, sidecar_path
from lmspec.compiler.data.tokenizer_files import read_tokenizer_files

# tiny on the CPU preset: 30 steps x 16 sequences = 480 train samples of 128 tokens = 61,440 tokens.
BLEND = ["train.data.sources=[{path:data/a,weight:3},{path:data/b,weight:1}]", 'train.data.split="3,1,0"']


def _data_section(build: Path) -> str:
    report = (build / "REPORT.md").read_text()
    return report[report.index("## Data") : report.index("## Parameters")]


def _sidecar(prefix: Path, sha256: str, documents: int, tokens: int) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    sidecar_path(prefix).write_text(DatasetSidecar(sha256, 384, 0, documents, tokens).text())


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_builtin_corpus_and_the_byte_tokenizer(workdir: Path) -> None:
    plan, build = compile_build(workdir / "build")
    section = _data_section(build)
    assert "| training tokenizer | byte (258 ids: 256 bytes, end-of-text, pad) |" in section
    assert "| split (train, valid, test) | `949,50,1`: 94.9%, 5.0%, 0.1% of each source's documents |" in section
    assert "| train samples | 480 sequences x 128 tokens = 61,440 tokens |" in section
    samples = plan.trained().batch.samples
    assert (
        f"| validation | {samples.evaluations} evaluation(s) x {samples.samples_per_evaluation} sequences "
        f"= {samples.valid} valid samples |" in section
    )
    assert "| sources | the demo corpus shipped with lmspec (train.data.sources=null) |" in section


def test_tokens_and_epochs_per_source_from_the_sidecars(workdir: Path) -> None:
    tokenizer = read_tokenizer_files(train_bpe_tokenizer(workdir / "tok"))
    _sidecar(workdir / "data" / "a", tokenizer.sha256, documents=7, tokens=30_720)
    _, build = compile_build(workdir / "build", ["train.data.tokenizer=hf", "train.data.tokenizer_path=tok", *BLEND])
    section = _data_section(build)
    assert f"| training tokenizer | hf at `tok`: tokenizer.json sha256 {tokenizer.sha256[:12]}, 384 ids |" in section
    # a: 3/4 of 61,440 tokens read, against 3/4 (its train split) of 30,720 tokens: two epochs.
    assert "| `data/a` | 3 (75.0%) | 7 | 30,720 | 46,080 | 2 |" in section
    assert "| `data/b` | 1 (25.0%) | (no sidecar: tokens unknown) | - | 15,360 | - |" in section
    assert "Epochs: the tokens the run reads from a source" in section and "approximation" in section
    assert "another tokenizer" not in section


def test_without_the_data_the_report_says_what_it_does_not_know(workdir: Path) -> None:
    _, build = compile_build(workdir / "build", ["train.data.tokenizer=hf", "train.data.tokenizer_path=tok", *BLEND])
    section = _data_section(build)
    assert "| training tokenizer | hf at `tok` (not readable here: no such directory; `lmspec run` checks it) |" in (
        section
    )
    assert section.count("(no sidecar: tokens unknown)") == 2


def test_a_dataset_of_another_tokenizer_is_noted(workdir: Path) -> None:
    train_bpe_tokenizer(workdir / "tok")
    _sidecar(workdir / "data" / "a", "0" * 64, documents=7, tokens=30_720)
    _, build = compile_build(workdir / "build", ["train.data.tokenizer=hf", "train.data.tokenizer_path=tok", *BLEND])
    assert "train.data.sources.0.path `data/a`: prepared with another tokenizer (sha256 000000000000" in (
        _data_section(build)
    )


def test_an_unreadable_sidecar_is_reported_not_raised(workdir: Path) -> None:
    (workdir / "data").mkdir()
    sidecar_path(workdir / "data" / "a").write_text("{not json")
    _, build = compile_build(workdir / "build", BLEND)
    section = _data_section(build)
    assert "| `data/a` | 3 (75.0%) | (sidecar unreadable: tokens unknown) | - | 46,080 | - |" in section
    assert "train.data.sources.0.path `data/a`: sidecar: " in section


def test_the_section_is_the_same_bytes_when_compiled_twice_from_elsewhere(workdir: Path, monkeypatch) -> None:
    tokenizer = read_tokenizer_files(train_bpe_tokenizer(workdir / "tok"))
    _sidecar(workdir / "data" / "a", tokenizer.sha256, documents=7, tokens=30_720)
    overrides = ["train.data.tokenizer=hf", "train.data.tokenizer_path=tok", *BLEND]
    _, first = compile_build(workdir / "one", overrides)
    copy = workdir / "copy"
    copy.mkdir()
    for name in ("tok", "data"):
        (copy / name).symlink_to(workdir / name)
    monkeypatch.chdir(copy)
    _, second = compile_build(copy / "two", overrides)
    assert (first / "REPORT.md").read_bytes() == (second / "REPORT.md").read_bytes()


def test_a_path_with_markdown_in_it_stays_in_its_cell(workdir: Path) -> None:
    _, build = compile_build(workdir / "build", ["train.data.sources=[{path:'data/a|b`c',weight:1}]"])
    assert "| ``data/a\\|b`c`` | 1 (100.0%) |" in _data_section(build)
