"""vLLM is the judge: every emitted serve/vllm.yaml, and the same options as flags, go through
vLLM's own `vllm serve` command line (parsing, serve validation, engine config against the
model's config.json) without serving. A wrong spec value is stopped by lmspec first, with the
key named, and vLLM refuses the same value too.

All command lines go to one `lmspec-vllm --check-batch` process: importing vLLM costs
seconds, judging a command line milliseconds. ~15-40 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.build import compile_build
from helpers.marks import needs_vllm
from helpers.vllm_check import check_batch

from lmspec.compiler.build.files import VLLM_YAML
from lmspec.compiler.conversion.mapping import hf_config
from lmspec.compiler.emit.serve import vllm_options, vllm_serve_args
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan

pytestmark = [needs_vllm, pytest.mark.slow]  # one vLLM process judges every case: ~65 s

PRESETS = {
    "tiny": (None, []),
    "llama3_70b": ("llama3_70b_pretrain_64gpu_h100_bf16", []),
    # DeepSeek-V3 serves in fp8 (its released weights are fp8): 671B in bf16 does not fit 16 H800s.
    "deepseek_v3": ("deepseek_v3_pretrain_2048gpu_h800_bf16", ["train.recompute=full", "serve.quantization=fp8"]),
}
# (preset, spec override lmspec must refuse, the vLLM flag carrying the same bad value)
WRONG = {
    "tp-vs-heads": ("llama3_70b", "serve.tp=3", ["--tensor-parallel-size", "3"]),
    "utilization": ("tiny", "serve.gpu_memory_utilization=1.5", ["--gpu-memory-utilization", "1.5"]),
    "len-vs-positions": ("llama3_70b", "serve.max_model_len=16384", ["--max-model-len", "16384"]),
}


def _build(root: Path, name: str) -> tuple[Plan, Path]:
    """A build serving a model directory that holds the converted model's config.json."""
    spec, overrides = PRESETS[name]
    model = root / f"{name}-model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(hf_config(make_plan(overrides, Path(spec) if spec else None))))
    return compile_build(root / name, [*overrides, f"serve.model_path={model}"], spec)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("judge")
    argvs: dict[str, list[str]] = {}
    plans: dict[str, Plan] = {}
    for name in PRESETS:
        plan, build = _build(root, name)
        plans[name] = plan
        argvs[f"{name}/yaml"] = ["serve", "--config", str(build / VLLM_YAML)]
        argvs[f"{name}/flags"] = ["serve", *vllm_serve_args(plan)]
    for case, (name, _, bad_flags) in WRONG.items():
        argvs[f"wrong/{case}"] = [*argvs[f"{name}/yaml"], *bad_flags]
    results = check_batch(list(argvs.values()), root)
    return {"plans": plans, "results": dict(zip(argvs, results))}


@pytest.mark.parametrize("name", PRESETS)
def test_vllm_accepts_the_emitted_yaml_and_builds_its_engine_config(name: str, verdicts: dict[str, Any]) -> None:
    result = verdicts["results"][f"{name}/yaml"]
    assert result["exit"] == 0, result["error"]
    assert result["args"]["_engine_config_built"] is True


@pytest.mark.parametrize("name", PRESETS)
def test_vllm_reads_every_option_as_the_plan_says(name: str, verdicts: dict[str, Any]) -> None:
    plan, args = verdicts["plans"][name], verdicts["results"][f"{name}/yaml"]["args"]
    for option, value in vllm_options(plan):
        expected = [value] if option == "served-model-name" else value
        assert args[option.replace("-", "_")] == expected, option


@pytest.mark.parametrize("name", PRESETS)
def test_flags_are_the_same_command_line_as_the_yaml(name: str, verdicts: dict[str, Any]) -> None:
    results = verdicts["results"]
    from_yaml, from_flags = results[f"{name}/yaml"], results[f"{name}/flags"]
    assert from_flags["exit"] == 0, from_flags["error"]
    differing = {
        k
        for k in from_yaml["args"].keys() | from_flags["args"].keys()
        if from_yaml["args"].get(k) != from_flags["args"].get(k)
    }
    # vLLM turns a config file's `model:` into --model and the positional into model_tag; the
    # serve action uses model_tag over model, so the model served is args["model"] in both.
    assert differing <= {"config", "model_tag"}, differing
    assert from_flags["args"]["model"] == from_yaml["args"]["model"] == verdicts["plans"][name].spec.serve.model_path


@pytest.mark.parametrize("case", WRONG)
def test_wrong_value_is_stopped_by_lmspec_first_and_refused_by_vllm(
    case: str, lmspec, verdicts: dict[str, Any]
) -> None:
    name, override, _ = WRONG[case]
    spec, overrides = PRESETS[name]
    checked = lmspec("check", *(["--spec", spec] if spec else []), *overrides, override)
    assert checked.code == 1, checked.err
    assert f"error: {override} (command-line override)" in checked.err and "Traceback" not in checked.err
    refused = verdicts["results"][f"wrong/{case}"]
    assert refused["exit"] != 0, f"vLLM accepted {override}"
