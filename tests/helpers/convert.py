"""Helpers of the conversion tests: compile, train a few steps, run commands, read results.

Every command runs in its own process group (killed as a group on timeout), in a
per-session work directory, because runs/ and checkpoints are relative to the working
directory. Builds use their own master port so parallel test sessions do not collide.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from helpers.build import compile_build
from helpers.cli import LMSPEC
from helpers.ports import free_port
from helpers.processes import run_in_group
from lmspec.runtime.verify import MAX_LOGITS_ABS_DIFF

TRAIN_TIMEOUT_S = 300
STEP_TIMEOUT_S = 240
TRAIN_STEPS = 3
# megatron-core refuses to train MoE with TP but without sequence parallelism; one MTP module as
# DeepSeek-V3 has, so every conversion test of the MoE model carries it (model.layers.4.*)
MOE_TP2_EP2 = ["parallel.tp=2", "parallel.sequence_parallel=true", "model.mtp_layers=1"]
# tiny_moe as DeepSeek-V2 has it: softmax scores over all experts, never renormalised, no correction bias,
# no query compression; group-limited (the best expert of each group scores it), routed output scaled
V2_TP2_EP2 = [
    "parallel.tp=2",
    "parallel.sequence_parallel=true",
    "model.family=deepseek_v2",
    "model.mla.q_lora_rank=null",
    "model.moe.router_score_function=softmax",
    "model.moe.router_score_bias=false",
    "model.moe.norm_topk_prob=false",
    "model.moe.top_k=2",
    "model.moe.routed_scaling_factor=1.5",
]


def _one_thread() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def run(cmd: list[str], cwd: Path, timeout_s: float = STEP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return run_in_group(cmd, cwd=cwd, timeout_s=timeout_s, env=_one_thread())


def lmspec(*args: str, cwd: Path, timeout_s: float = STEP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return run([LMSPEC, *args], cwd, timeout_s)


@dataclass(frozen=True)
class Trained:
    workdir: Path
    build: Path  # relative to workdir
    name: str

    @property
    def hf_dir(self) -> Path:
        return self.workdir / "runs" / self.name / "hf"


def compile_run_build(workdir: Path, name: str, overrides: list[str], spec: str | None = None) -> Path:
    """workdir/build/<name> with its own master port; returned relative to workdir, as `lmspec run` takes it."""
    compiled = compile_build(
        workdir / "build", [*overrides, f"name={name}", f"cluster.master_port={free_port()}"], spec
    )
    return compiled.dir.relative_to(workdir)


def train(workdir: Path, name: str, overrides: list[str], spec: str | None = None) -> Trained:
    steps = [f"train.steps={TRAIN_STEPS}", f"train.checkpoint.interval={TRAIN_STEPS}"]
    build = compile_run_build(workdir, name, [*steps, *overrides], spec)
    result = lmspec("run", str(build), cwd=workdir, timeout_s=TRAIN_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    return Trained(workdir, build, name)


def verify_report(trained: Trained, hf_dir: Path | None = None) -> tuple[int, dict, str]:
    cmd = [sys.executable, "-m", "lmspec.runtime.verify", str(trained.build)] + ([str(hf_dir)] if hf_dir else [])
    result = run(cmd, trained.workdir)
    out = result.stdout
    report = json.loads(out[out.index("{\n") : out.rindex("}") + 1]) if "{\n" in out else {}
    return result.returncode, report, result.stderr


def convert_then_verify(trained: Trained) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """`lmspec run --stage convert`, then `--stage verify`, of a trained build: its mapping.json, the HF
    tensors written (every one the mapping counts, with its config.json) and verify's report (passed)."""
    result = lmspec("run", str(trained.build), "--stage", "convert", cwd=trained.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    mapping = json.loads((trained.workdir / trained.build / "convert" / "mapping.json").read_text())
    tensors = hf_tensors(trained.hf_dir)
    assert len(tensors) == mapping["hf_tensor_count"]
    assert json.loads((trained.hf_dir / "config.json").read_text()) == mapping["hf_config"]
    result = lmspec("run", str(trained.build), "--stage", "verify", cwd=trained.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    report = json.loads(out[out.index("{\n") : out.rindex("}") + 1])
    assert report["ok"] and report["max_abs_diff"] <= MAX_LOGITS_ABS_DIFF
    return mapping, tensors, report


def hf_tensors(directory: Path) -> dict[str, torch.Tensor]:
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(directory / shard))
    assert sorted(tensors) == sorted(index["weight_map"])
    return tensors


def peak_rss_bytes(cmd: list[str], cwd: Path, timeout_s: float = STEP_TIMEOUT_S) -> tuple[int, int, str]:
    """(exit code, peak RSS of the process in bytes, stdout) of `cmd`, measured by the kernel (wait4)."""
    import threading

    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=_one_thread(),
    )
    timer = threading.Timer(timeout_s, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        out = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024, out  # ru_maxrss is in KiB on Linux
