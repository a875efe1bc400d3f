"""HF -> Megatron at the build's TP/PP/EP: start training from released HuggingFace weights.

`python -m lmspec.runtime.convert.from_hf <build dir> <hf dir>` under torchrun (the build's world
size; `reverse_build()` starts it). Every rank builds the training backend's model and
optimizer (lmspec.runtime.train.megatron.trainer), reads from the HF safetensors only the tensors
its pipeline stage and expert-parallel rank hold, cuts them with the mapping's own
transforms (`split`: QKV interleave, [gate_i; up_i], row/column shards, global expert id
-> local expert on its EP rank) and copies its shard into each parameter. Every
parameter must be written exactly once. The result is saved with the trainer's
checkpoint code as step 0 under `train.checkpoint.dir`, so `lmspec run <build>` resumes
from it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from lmspec.compiler.conversion.document import Tensor, tensors
from lmspec.compiler.errors import EXIT_OK, UsageError

LOAD_TIMEOUT_S = 600


class _HfTensors:
    """Lazily opened safetensors shards of an HF directory, by tensor name."""

    def __init__(self, hf_dir: Path) -> None:
        import json

        from safetensors import safe_open

        index = hf_dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        else:
            single = hf_dir / "model.safetensors"
            with safe_open(str(single), "pt") as fh:
                weight_map = {name: single.name for name in fh.keys()}
        self.weight_map: dict[str, str] = weight_map
        self._open = {file: safe_open(str(hf_dir / file), "pt") for file in sorted(set(weight_map.values()))}

    def get(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise UsageError(f"HF checkpoint has no tensor {name}")
        return self._open[self.weight_map[name]].get_tensor(name)


def _ranks(t: Tensor, ps: Any) -> tuple[bool, int]:
    """Whether this process holds `t`, and its rank among the transform's shards."""
    if t.pp_rank != ps.get_pipeline_model_parallel_rank():
        return False, 0
    if t.ep_rank is not None:
        if t.ep_rank != ps.get_expert_model_parallel_rank():
            return False, 0
        return True, ps.get_expert_tensor_parallel_rank()
    return True, ps.get_tensor_model_parallel_rank()


def load_into_model(model: torch.nn.Module, doc: dict[str, Any], hf_dir: Path, ps: Any) -> int:
    """Copy this rank's shard of every mapped tensor into `model`; returns how many."""
    params = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    hf = _HfTensors(hf_dir)
    written: set[str] = set()
    for t in tensors(doc):
        mine, rank = _ranks(t, ps)
        if not mine:
            continue
        if t.model_key not in params:
            raise UsageError(f"mapping names {t.model_key} (pp rank {t.pp_rank}), which this model does not have")
        shard = t.transform.split({name: hf.get(name) for name in t.transform.hf}, torch.cat)[rank]
        target = params[t.model_key]
        if tuple(shard.shape) != tuple(target.shape):
            raise UsageError(
                f"{t.model_key}: HF gives a {tuple(shard.shape)} shard, the model holds {tuple(target.shape)}"
            )
        with torch.no_grad():
            target.copy_(shard)
        written.add(t.model_key)
    unwritten = sorted(params.keys() - written)
    if unwritten:
        raise UsageError(f"{len(unwritten)} model tensor(s) not in the mapping: {', '.join(unwritten[:20])}")
    return len(written)


def main(argv: list[str]) -> int:
    from megatron.core import parallel_state as ps

    from lmspec.compiler.build.reader import Build
    from lmspec.runtime.train.checkpoint import Checkpoints
    from lmspec.runtime.train.loop import init_distributed, make_trainer, save_checkpoint

    hf_dir = Path(argv[1])
    build = Build.open(Path(argv[0]))
    spec, plan, doc = build.spec, build.plan, build.mapping
    init_distributed(spec, plan)
    trainer = make_trainer(build)
    chunks = trainer.chunks  # type: ignore[attr-defined]
    if len(chunks) != 1:  # the mapping places tensors by pipeline stage, not by virtual stage
        raise UsageError(
            "HF -> Megatron loads one model chunk per pipeline rank: build it with parallel.virtual_stages=null, "
            "then start the interleaved build from that checkpoint with train.init_from"
        )
    count = load_into_model(chunks[0], doc, hf_dir, ps)
    reload = getattr(trainer.optimizer, "reload_model_params", None)  # type: ignore[attr-defined]
    if reload is not None:
        reload()  # mixed precision keeps fp32 copies made before the weights arrived
    ckpts = Checkpoints(Path(plan.paths.checkpoint_dir), spec.train.checkpoint.keep_last_k)
    path = save_checkpoint(ckpts, trainer, step=0, consumed_samples=0)
    if torch.distributed.get_rank() == 0:
        print(f"wrote {path} from {hf_dir} ({count} tensors on rank 0)", flush=True)
    trainer.close()
    torch.distributed.destroy_process_group()
    return EXIT_OK


def reverse_build(build_dir: Path, hf_dir: Path, timeout_s: float = LOAD_TIMEOUT_S) -> None:
    """Run the reverse conversion under torchrun with the build's world size (own process group)."""
    from lmspec.compiler.build.files import LATEST
    from lmspec.compiler.build.reader import Build

    build = Build.open(build_dir)
    spec, plan = build.spec, build.plan
    root = Path(plan.paths.checkpoint_dir)
    if (root / LATEST).exists():
        raise UsageError(
            f"{root} already holds checkpoints; refusing to overwrite training state "
            "(remove it or point train.checkpoint.dir elsewhere)"
        )
    world = plan.layout.world_size
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={world}",
        "--master-addr=127.0.0.1",
        f"--master-port={spec.cluster.master_port}",
        "-m",
        "lmspec.runtime.convert.from_hf",
        str(build_dir),
        str(hf_dir),
    ]
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RuntimeError(f"HF -> Megatron did not finish in {timeout_s} s: {shlex.join(cmd)}") from None
    if code != 0:
        raise RuntimeError(f"HF -> Megatron failed with exit code {code}: {shlex.join(cmd)}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
