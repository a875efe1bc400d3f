"""`lmspec run BUILD` checks the training data before any worker starts: every bad input is refused
with exit 1, naming the key, the path and the fix, and nothing is written (no run directory, no
checkpoints, no index cache beside the dataset). Datasets are made by the real `lmspec data prepare`
(helpers.datasets); the builds are compiled as a user compiles them. No test here trains.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.cli import CliResult
from helpers.datasets import prepare_dataset
from helpers.tokenizers import builtin_documents, train_bpe_tokenizer

PREPARE = "run `lmspec data prepare FILE... --tokenizer"
NOT_READY = "the training data is not ready"
SOURCE0 = "train.data.sources.0.path"
SPLIT = "train.data.split"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tokenizers and datasets prepared with them, shared (read-only) by the module's tests."""
    root = tmp_path_factory.mktemp("data")
    tok = train_bpe_tokenizer(root / "tok")
    other = train_bpe_tokenizer(root / "other_tok", vocab_size=320)
    docs = builtin_documents()
    return {
        "tok": tok,
        "other_tok": other,
        "good": prepare_dataset(root / "good" / "corpus", docs, tok),
        "other": prepare_dataset(root / "other" / "corpus", docs, other),
        "tiny": prepare_dataset(root / "tiny" / "corpus", [d[:12] for d in docs], tok),
    }


def _dataset_copy(prefix: Path, into: Path, *, sidecar: bool = True) -> Path:
    """A copy of the dataset at `prefix` under `into` (which the test may damage)."""
    into.mkdir(parents=True, exist_ok=True)
    suffixes = (".bin", ".idx", ".lmspec.json") if sidecar else (".bin", ".idx")
    for suffix in suffixes:
        shutil.copyfile(prefix.with_name(prefix.name + suffix), into / f"corpus{suffix}")
    return into / "corpus"


def _build(tmp_path: Path, tok: Path, *sources: Path, extra: tuple[str, ...] = ()) -> Path:
    blend = ",".join(f"{{path:{p},weight:1.0}}" for p in sources)
    overrides = ["hardware=cpu", "train.data.tokenizer=hf", f"train.data.tokenizer_path={tok}"]
    return compile_build(tmp_path / "build", [*overrides, f"train.data.sources=[{blend}]", *extra]).dir


def _files(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


def _refused(lmspec: Callable[..., CliResult], build: Path, cwd: Path, fragments: list[str]) -> CliResult:
    """`lmspec run build` from `cwd`: exit 1, every fragment and NOT_READY on stderr, no traceback,
    and no run directory or checkpoint created."""
    before = _files(cwd)
    result = lmspec("run", str(build))
    result.assert_reports(1, [*fragments, NOT_READY])
    assert _files(cwd) == before  # no runs/<name>, no checkpoints, no dataset cache
    return result


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The job's working directory (run and checkpoint directories are relative to it)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_good_data_passes_and_smoke_runs(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    build = _build(tmp_path, data["tok"], data["good"])
    result = lmspec("run", str(build), "--smoke")
    assert result.code == 0, result.err
    assert "smoke: ok" in result.out and "warning" not in result.err
    assert _files(cwd) == set()


def test_missing_bin(lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path) -> None:
    prefix = _dataset_copy(data["good"], tmp_path / "d")
    prefix.with_suffix(".bin").unlink()
    build = _build(tmp_path, data["tok"], prefix)
    _refused(lmspec, build, cwd, [f"{SOURCE0}='{prefix}'", f"{prefix}.bin does not exist", PREPARE])


def test_missing_idx_of_a_relative_prefix_names_the_working_directory(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    _dataset_copy(data["good"], cwd / "data").with_suffix(".idx").unlink()
    build = _build(tmp_path, data["tok"], Path("data/corpus"))
    _refused(
        lmspec,
        build,
        cwd,
        [f"{SOURCE0}='data/corpus'", f"data/corpus.idx does not exist (relative to {cwd})", "--output data/corpus"],
    )


def test_truncated_bin_disagrees_with_idx(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    prefix = _dataset_copy(data["good"], tmp_path / "d")
    size = prefix.with_suffix(".bin").stat().st_size
    with prefix.with_suffix(".bin").open("r+b") as f:
        f.truncate(size - 10)
    build = _build(tmp_path, data["tok"], prefix)
    _refused(
        lmspec,
        build,
        cwd,
        [SOURCE0, f"{prefix}.bin holds {size - 10} bytes but corpus.idx describes", f"({size} bytes)", PREPARE],
    )


def test_unreadable_idx(lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path) -> None:
    prefix = _dataset_copy(data["good"], tmp_path / "d")
    prefix.with_suffix(".idx").write_bytes(b"not an index")
    build = _build(tmp_path, data["tok"], prefix)
    _refused(lmspec, build, cwd, [SOURCE0, "megatron-core cannot read it as an indexed dataset", PREPARE])


def test_tokenizer_directory_gone(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    tok = shutil.copytree(data["tok"], tmp_path / "tok")
    build = _build(tmp_path, tok, data["good"])
    shutil.rmtree(tok)  # moved away after the compile
    _refused(lmspec, build, cwd, [f"train.data.tokenizer_path='{tok}': no such directory", "tokenizer.json"])


def test_tokenizer_unloadable(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    tok = shutil.copytree(data["tok"], tmp_path / "tok")
    build = _build(tmp_path, tok, data["good"])
    (tok / "tokenizer.json").write_text("{ truncated")
    _refused(
        lmspec, build, cwd, [f"train.data.tokenizer_path='{tok}'", "tokenizer.json is not JSON", "save_pretrained"]
    )


def test_dataset_of_another_tokenizer(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    build = _build(tmp_path, data["tok"], data["good"], data["other"])
    result = _refused(
        lmspec,
        build,
        cwd,
        [
            f"train.data.sources.1.path='{data['other']}': made with another tokenizer",
            f"--tokenizer {data['tok']} --output {data['other']}` with this tokenizer",
            "or set train.data.tokenizer_path to the one it was made with",
        ],
    )
    assert "sources.0" not in result.err


def test_byte_tokenizer_refuses_a_dataset_of_an_hf_tokenizer(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    blend = f"train.data.sources=[{{path:{data['good']},weight:1.0}}]"
    overrides = ["hardware=cpu", "train.data.tokenizer=byte", "model.vocab_size=320", blend]
    build = compile_build(tmp_path / "build", overrides).dir
    byte = "the byte tokenizer (train.data.tokenizer=byte)"
    # 320 rows hold the byte tokenizer's 258 ids but not the 384 of the BPE the dataset was made with
    fragments = [SOURCE0, "made with another tokenizer", byte, "has 384 ids", "set model.vocab_size=384"]
    _refused(lmspec, build, cwd, fragments)


def test_train_split_too_small_for_one_sequence(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    build = _build(tmp_path, data["tok"], data["tiny"])
    _refused(
        lmspec,
        build,
        cwd,
        [f"{SPLIT}='949,50,1'", "the train split of train.data.sources.0", "train.seq_length+1=129 tokens"],
    )


def test_split_giving_valid_no_documents_while_the_run_validates(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    # 14 documents: Megatron's rounding gives valid the documents [round(.999 x 14), round(1.0 x 14)) = none
    build = _build(tmp_path, data["tok"], data["good"], extra=('train.data.split="999,1,0"',))
    result = _refused(
        lmspec,
        build,
        cwd,
        [f"{SPLIT}='999,1,0'", "the valid split of train.data.sources.0", "no documents", "train.eval_iters=0"],
    )
    assert "the train split" not in result.err
    fixed = compile_build(
        tmp_path / "fixed",
        [
            "hardware=cpu",
            "train.data.tokenizer=hf",
            f"train.data.tokenizer_path={data['tok']}",
            f"train.data.sources=[{{path:{data['good']},weight:1.0}}]",
            'train.data.split="999,1,0"',
            "train.eval_iters=0",
        ],
    ).dir
    assert lmspec("run", str(fixed), "--smoke").code == 0  # without validation the valid split is not read


def test_source_without_sidecar_warns_and_passes(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    prefix = _dataset_copy(data["good"], tmp_path / "megatron_made", sidecar=False)
    build = _build(tmp_path, data["tok"], prefix)
    result = lmspec("run", str(build), "--smoke")
    assert result.code == 0, result.err
    assert f"warning: {SOURCE0}='{prefix}': no corpus.lmspec.json beside it" in result.err
    assert "could not be checked" in result.err and PREPARE in result.err
    assert "smoke: ok" in result.out and "Traceback" not in result.err


def test_every_problem_of_a_blend_in_one_run(
    lmspec: Callable[..., CliResult], data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    truncated = _dataset_copy(data["good"], tmp_path / "t")
    truncated.with_suffix(".bin").write_bytes(b"\0" * 8)
    build = _build(tmp_path, data["tok"], data["good"], tmp_path / "absent", truncated, data["other"])
    _refused(
        lmspec,
        build,
        cwd,
        [
            "train.data.sources.1.path=",
            "absent.bin and",
            "absent.idx do not exist",
            "train.data.sources.2.path=",
            "holds 8 bytes",
            "train.data.sources.3.path=",
            "made with another tokenizer",
            "(3 error(s))",
        ],
    )


def test_the_trainer_run_directly_checks_the_data_before_the_ranks_meet(
    data: dict[str, Path], tmp_path: Path, cwd: Path
) -> None:
    """launch/torchrun.sh run by hand reaches loop.main: the same refusal, before init_distributed."""
    prefix = _dataset_copy(data["good"], tmp_path / "d")
    prefix.with_suffix(".bin").unlink()
    build = _build(tmp_path, data["tok"], prefix)
    result = subprocess.run(
        [sys.executable, "-m", "lmspec.runtime.train", str(build)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert f"{prefix}.bin does not exist" in result.stderr and NOT_READY in result.stderr
    assert "torchrun" not in result.stderr  # refused before the world-size check of init_distributed
    assert "Traceback" not in result.stderr and _files(cwd) == set()
