"""Training data through megatron-core: the blend, the built-in corpus, DP shards that tile the global batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.blend import WEIGHTS, blend_overrides
from helpers.build import compile_build
from helpers.ports import free_port

from lmspec.compiler.build.files import DATA_DIR, TOKENIZER_DIR
from lmspec.compiler.data.sidecar import read_sidecar
from lmspec.runtime.data.datasets import DataError, build_datasets, run_tokenizer
from lmspec.runtime.train.data import micro_batches


@pytest.fixture(scope="module", autouse=True)
def one_rank() -> Iterator[None]:
    """megatron-core's BlendedDataset asks torch.distributed for the rank: a group of one, as `torchrun
    --nproc-per-node=1` gives."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def blend(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("blend")
    return root, blend_overrides(root)


def _sorted_tree(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_blend_draws_both_sources_by_weight_and_caches_in_the_run_dir(
    blend: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, overrides = blend
    user_data = _sorted_tree(root / "data")
    monkeypatch.chdir(tmp_path)
    plan = compile_build(tmp_path / "build", overrides).plan
    data = build_datasets(plan.spec, plan)
    assert (
        len(data.train) >= plan.trained().batch.samples.train and len(data.valid) >= plan.trained().batch.samples.valid
    )
    drawn = torch.bincount(torch.from_numpy(data.train.dataset_index[: plan.trained().batch.samples.train]).long())
    assert drawn.tolist() == [round(w * plan.trained().batch.samples.train) for w in WEIGHTS]
    sample = data.train[0]
    assert sample["tokens"].shape == (plan.spec.train.seq_length,)
    assert int(sample["tokens"].max()) < data.tokenizer.files.vocab_size <= plan.spec.model.vocab_size
    assert _sorted_tree(root / "data") == user_data  # nothing written beside the user's datasets
    assert any((Path(plan.paths.run_dir) / DATA_DIR / "cache").iterdir())


def test_builtin_corpus_is_prepared_once_with_the_byte_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plan = compile_build(tmp_path / "build").plan
    data = build_datasets(plan.spec, plan)
    run_dir = Path(plan.paths.run_dir)
    assert data.tokenizer.directory == run_dir / TOKENIZER_DIR
    (prefix,) = (p.with_suffix("") for p in (run_dir / DATA_DIR).glob("builtin_*.bin"))
    sidecar = read_sidecar(prefix)
    assert sidecar is not None and sidecar.tokenizer_sha256 == data.tokenizer.files.sha256
    assert sidecar.documents == 14 and sidecar.eod_id == 256
    bin_mtime = prefix.with_suffix(".bin").stat().st_mtime_ns
    again = build_datasets(plan.spec, plan)
    assert prefix.with_suffix(".bin").stat().st_mtime_ns == bin_mtime  # found, not prepared again
    assert torch.equal(again.train[3]["tokens"], data.train[3]["tokens"])
    text = bytes(int(i) for i in data.train[0]["tokens"] if i < 256).decode("utf-8", errors="replace")
    assert " " in text  # byte ids of the shipped English text


def test_dp_ranks_tile_the_global_batch_and_any_dp_degree_reads_the_same(
    blend: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plan = compile_build(tmp_path / "build", blend[1]).plan
    train = build_datasets(plan.spec, plan).train
    consumed, micro, dp, accum = 16, 2, 2, 2
    rows = []
    for m in range(accum):
        for r in range(dp):
            batch = micro_batches(train, consumed, micro, r, dp, accum)[m]
            assert torch.equal(batch.tokens[:, 1:], batch.labels[:, :-1])
            rows.append(batch.tokens)
    expected = torch.stack([train[consumed + i]["tokens"] for i in range(micro * dp * accum)])
    assert torch.equal(torch.cat(rows), expected)
    one = micro_batches(train, consumed, micro, 0, 1, dp * accum)
    assert torch.equal(torch.cat([b.tokens for b in one]), expected)


def test_tokenizer_larger_than_the_vocabulary_is_refused(
    blend: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plan = compile_build(tmp_path / "build", blend[1]).plan
    small = dataclasses.replace(plan.spec, model=dataclasses.replace(plan.spec.model, vocab_size=300))
    with pytest.raises(DataError) as info:
        run_tokenizer(small, Path(plan.paths.run_dir))
    message = str(info.value)
    assert "train.data.tokenizer_path=" in message and "384 ids" in message
    assert "model.vocab_size=300" in message and "model.vocab_size=384" in message
