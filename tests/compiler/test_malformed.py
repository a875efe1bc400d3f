"""A corpus of malformed specs and overrides: each exits 1 (spec invalid) or 2 (usage/IO) with
a one-line message naming the key or file, no traceback, and leaves the build untouched."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from helpers.paths import ROOT

BAD_YAML = "defaults:\n  - model: tiny\nparallel: {tp: 2\n"
UNKNOWN_KEY = "defaults:\n  - config\n  - _self_\nparallel:\n  tpp: 2\n"
WRONG_TYPE = "defaults:\n  - config\n  - _self_\ntrain:\n  steps: many\n"
BAD_GROUP = "defaults:\n  - config\n  - override model: llama9\n  - _self_\n"
NOT_A_MAPPING = "- just\n- a list\n"

# (argv after `compile`, expected exit code, fragments the message must contain)
CASES = [
    # wrong types
    pytest.param(["parallel.tp=two"], 1, ['parallel.tp="two"', "expected an integer >= 1"], id="tp-string"),
    pytest.param(
        ["parallel.sequence_parallel=maybe"], 1, ["parallel.sequence_parallel", "true or false"], id="bool-string"
    ),
    pytest.param(["train.optimizer.lr=fast"], 1, ["train.optimizer.lr", "expected a number > 0"], id="lr-string"),
    pytest.param(
        ["hardware.gpu.memory_gib=[80]"], 1, ["hardware.gpu.memory_gib", "expected a number"], id="list-for-number"
    ),
    pytest.param(["parallel.pp_layout=sometimes"], 1, ["parallel.pp_layout", "'auto'"], id="pp-layout-word"),
    pytest.param(["model.moe=3"], 1, ["model.moe=3", "a mapping or null"], id="moe-scalar"),
    pytest.param(["serve.port=http"], 1, ["serve.port", "<= 65535"], id="port-string"),
    # enums
    pytest.param(
        ["train.precision=bf8"], 1, ['train.precision="bf8"', "one of 'bf16', 'fp16', 'fp32'"], id="precision"
    ),
    pytest.param(["train.backend=jax"], 1, ['train.backend="jax"', "'megatron', 'deepspeed'"], id="backend"),
    pytest.param(["train.recompute=some"], 1, ["train.recompute", "'selective'"], id="recompute"),
    pytest.param(["parallel.zero_stage=4"], 1, ["parallel.zero_stage=4", "one of 0, 1, 2, 3"], id="zero-stage-4"),
    # negative or zero sizes, out of range
    pytest.param(["model.num_layers=-2"], 1, ["model.num_layers=-2", ">= 1"], id="negative-layers"),
    pytest.param(["model.hidden_size=0"], 1, ["model.hidden_size=0", ">= 1"], id="zero-hidden"),
    pytest.param(["train.micro_batch_size=-1"], 1, ["train.micro_batch_size=-1"], id="negative-micro-batch"),
    pytest.param(["hardware.nodes=0"], 1, ["hardware.nodes=0", ">= 1"], id="zero-nodes"),
    pytest.param(["serve.gpu_memory_utilization=1.5"], 1, ["serve.gpu_memory_utilization=1.5", "<= 1"], id="gpu-util"),
    pytest.param(["serve.gpu_memory_utilization=0"], 1, ["serve.gpu_memory_utilization=0", "> 0"], id="gpu-util-zero"),
    pytest.param(["cluster.slurm.time=forever"], 1, ["cluster.slurm.time", "matching"], id="slurm-time"),
    pytest.param(["name=my job"], 1, ['name="my job"', "matching"], id="name-with-space"),
    # unknown keys (override of a key that does not exist, and a new key added with +)
    pytest.param(
        ["parallel.tpp=2"], 1, ["parallel.tpp", "unknown key", "did you mean parallel.tp?"], id="unknown-override"
    ),
    pytest.param(
        ["+parallel.tpp=2"], 1, ["parallel.tpp", "unknown key", "did you mean parallel.tp?"], id="unknown-added"
    ),
    pytest.param(["+trian.steps=3"], 1, ["trian", "unknown key", "did you mean train?"], id="unknown-section"),
    # the names people type for lmspec's keys (compiler/spec/aliases.py), and never a "+key" the schema rejects
    pytest.param(["tp=2"], 1, ["tp (", "lmspec has parallel.tp and serve.tp"], id="alias-tp"),
    pytest.param(
        ["parallel.tensor_parallel=2"], 1, ["lmspec calls it parallel.tp: parallel.tp=2"], id="alias-in-its-section"
    ),
    pytest.param(
        ["tensor_model_parallel_size=4"], 1, ["lmspec has parallel.tp and serve.tp"], id="alias-megatron-flag"
    ),
    pytest.param(["world_size=16"], 1, ["lmspec has hardware.nodes and hardware.gpus_per_node"], id="alias-world-size"),
    pytest.param(["train.lr=1e-4"], 1, ["lmspec calls it train.optimizer.lr: train.optimizer.lr=1e-4"], id="alias-lr"),
    pytest.param(["+parallel.pipeline_model_parallel_size=2"], 1, ["lmspec calls it parallel.pp."], id="alias-added"),
    pytest.param(
        ["--spec", str(ROOT / "specs" / "model" / "llama3_8b.yaml")],
        2,
        ["a model group file", "not a whole spec", "model=llama3_8b", "`- model: llama3_8b`"],
        id="group-file-as-spec",
    ),
    pytest.param(["+parallel.tp=2"], 1, ["parallel.tp", "drop the '+'"], id="append-existing"),
    # missing required
    pytest.param(["~model.hidden_size"], 1, ["model.hidden_size: missing"], id="missing-hidden"),
    pytest.param(["~train.checkpoint"], 1, ["train.checkpoint: missing"], id="missing-section"),
    # bad group names
    pytest.param(["model=llama9"], 1, ["model/llama9", "llama3_8b"], id="unknown-model"),
    pytest.param(["hardware=b200"], 1, ["hardware/b200", "h100_80g"], id="unknown-hardware"),
    pytest.param(["model=llama3-8b"], 1, ["model/llama3-8b: no such config", "mean llama3_8b?"], id="dashed-model"),
    pytest.param(
        ["--spec", "llama3-70b-pretrain"],
        2,
        ["no such file, nor a built-in preset", "did you mean llama3_70b_pretrain_64gpu_h100_bf16?"],
        id="dashed-preset",
    ),
    # non-divisible layouts
    pytest.param(["parallel.tp=3"], 1, ["parallel.tp=3", "does not divide"], id="tp-3"),
    pytest.param(["parallel.pp=3"], 1, ["parallel.pp(3)", "does not divide the world size"], id="pp-3"),
    pytest.param(["train.global_batch_size=7"], 1, ["train.global_batch_size=7", "not a multiple"], id="gbs-7"),
    # usage and I/O errors
    pytest.param(["parallel.tp=="], 2, ["cannot parse override"], id="override-grammar"),
    pytest.param(["--spec", "does/not/exist.yaml"], 2, ["does/not/exist.yaml: no such file"], id="missing-spec-file"),
    pytest.param(["--spec", "{dir}/bad.yaml"], 1, ["bad.yaml", "YAML syntax error"], id="yaml-syntax"),
    pytest.param(
        ["--spec", "{dir}/unknown_key.yaml"],
        1,
        ["parallel.tpp", "unknown_key.yaml:5", "did you mean parallel.tp?"],
        id="unknown-key-in-file",
    ),
    pytest.param(
        ["--spec", "{dir}/wrong_type.yaml"], 1, ['train.steps="many"', "wrong_type.yaml:5"], id="wrong-type-in-file"
    ),
    pytest.param(["--spec", "{dir}/bad_group.yaml"], 1, ["model/llama9"], id="bad-group-in-file"),
    pytest.param(["--spec", "{dir}/not_a_mapping.yaml"], 1, ["not_a_mapping"], id="spec-not-a-mapping"),
]


def _snapshot(root: Path) -> dict[str, str]:
    return (
        {
            p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }
        if root.exists()
        else {}
    )


@pytest.fixture(scope="module")
def bad_specs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad_specs")
    for name, text in {
        "bad.yaml": BAD_YAML,
        "unknown_key.yaml": UNKNOWN_KEY,
        "wrong_type.yaml": WRONG_TYPE,
        "bad_group.yaml": BAD_GROUP,
        "not_a_mapping.yaml": NOT_A_MAPPING,
    }.items():
        (d / name).write_text(text)
    return d


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize(("argv", "code", "fragments"), CASES)
def test_malformed_input_fails_cleanly_and_leaves_build_untouched(
    lmspec, tmp_path: Path, bad_specs: Path, argv: list[str], code: int, fragments: list[str]
) -> None:
    out = tmp_path / "build"
    assert lmspec("compile", "-o", str(out)).code == 0
    before = _snapshot(out)
    argv = [a.replace("{dir}", str(bad_specs)) for a in argv]
    result = lmspec("compile", "-o", str(out), *argv)
    result.assert_reports(code, fragments)
    assert _snapshot(out) == before
