"""HF -> a checkpoint at the build's layout: start training from released HuggingFace weights.

`python -m lmspec.runtime.convert.from_hf <build dir> <hf dir> <out dir>` on every rank: the build's
launch/torchrun.sh entry `import`, started on every node by `lmspec run BUILD --stage import --from
HF_DIR` (lmspec.runtime.convert.import_stage). Every rank builds the training backend's model and
optimizer (its trainer), loads the HF weights with the backend's importer (TrainingBackend.hf_importer:
`load_megatron` here, torchtitan's in lmspec.runtime.convert.from_hf_fsdp2) and saves step_0 with the
trainer's own checkpoint code. Megatron's importer: every rank reads from the HF safetensors only the tensors
its pipeline stage and expert-parallel rank hold, one at a time (FP8 ones dequantised:
lmspec.runtime.convert.hf_source), cuts them with the mapping's own transforms (`split`: QKV
interleave, [gate_i; up_i], row/column shards, global expert id -> local expert on its EP rank) and
copies its shard into each parameter. Every parameter must be written exactly once. The result is
saved with the trainer's checkpoint code as `<out dir>/step_0` (written into a temporary directory,
then renamed), the directory `train.init_from` names to train from it.
"""

from __future__ import annotations

import logging
import resource
import sys
from pathlib import Path
from typing import Any

import torch

from lmspec.compiler.backends import backend_of
from lmspec.compiler.backends.backend import load
from lmspec.compiler.build.reader import Build
from lmspec.compiler.conversion.document import Tensor, tensors
from lmspec.compiler.errors import EXIT_OK, EXIT_USAGE, UsageError
from lmspec.runtime.convert.hf_source import HfTensors, Imported

logger = logging.getLogger(__name__)


def _ranks(t: Tensor, ps: Any) -> tuple[bool, int]:
    """Whether this process holds `t`, and its rank among the transform's shards."""
    if t.pp_rank != ps.get_pipeline_model_parallel_rank():
        return False, 0
    if t.ep_rank is not None:
        if t.ep_rank != ps.get_expert_model_parallel_rank():
            return False, 0
        return True, ps.get_expert_tensor_parallel_rank()
    return True, ps.get_tensor_model_parallel_rank()


def load_into_model(model: torch.nn.Module, doc: dict[str, Any], hf_dir: Path, ps: Any) -> tuple[int, int]:
    """Copy this rank's shard of every mapped tensor into `model`, one mapping row at a time; returns how many,
    and the bytes of the largest row read (its HF tensors, dequantised: what the rank holds beside its model)."""
    params = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    hf = HfTensors(hf_dir)
    written: set[str] = set()
    largest = 0
    for t in tensors(doc):
        mine, rank = _ranks(t, ps)
        if not mine:
            continue
        if t.model_key not in params:
            raise UsageError(f"mapping names {t.model_key} (pp rank {t.pp_rank}), which this model does not have")
        row = {name: hf.get(name) for name in t.transform.hf}
        largest = max(largest, sum(v.numel() * v.element_size() for v in row.values()))
        shard = t.transform.split(row, torch.cat)[rank]
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
    return len(written), largest


def main(argv: list[str]) -> int:
    from lmspec.runtime.train.loop import init_distributed

    if len(argv) != 3:
        logger.error("usage: python -m lmspec.runtime.convert.from_hf <build dir> <hf dir> <out dir>")
        return EXIT_USAGE
    build_dir, hf_dir, out_root = (Path(a) for a in argv)
    try:
        build = Build.open(build_dir)
        init_distributed(build.training(), build.plan)
        return import_weights(build, hf_dir, out_root)
    except UsageError as exc:
        logger.error(f"lmspec: error: {exc}")
        return EXIT_USAGE
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def load_megatron(trainer: Any, doc: dict[str, Any], hf_dir: Path) -> Imported:
    """The Megatron backend's importer (TrainingBackend.hf_importer): each rank's shards, cut by the mapping."""
    from megatron.core import parallel_state as ps

    chunks = trainer.chunks
    if len(chunks) != 1:  # the mapping places tensors by pipeline stage, not by virtual stage
        raise UsageError(
            "HF -> Megatron loads one model chunk per pipeline rank: build it with parallel.virtual_stages=null, "
            "then start the interleaved build from that checkpoint with train.init_from"
        )
    count, largest = load_into_model(chunks[0], doc, hf_dir, ps)
    reload = getattr(trainer.optimizer, "reload_model_params", None)
    if reload is not None:
        reload()  # mixed precision keeps fp32 copies made before the weights arrived
    shard = sum(p.numel() * p.element_size() for p in chunks[0].state_dict().values() if torch.is_tensor(p))
    return Imported(count, largest, shard)


def import_weights(build: Build, hf_dir: Path, out_root: Path) -> int:
    """Every rank: load its shard of the HF weights (its backend's importer), then save all ranks' shards as
    `out_root`/step_0 with the trainer's own checkpoint code."""
    from lmspec.runtime.train.checkpoint import Checkpoints
    from lmspec.runtime.train.loop import make_trainer, save_checkpoint

    importer = backend_of(build.training()).hf_importer
    if importer is None:  # lmspec.runtime.convert.import_stage refuses it before any rank starts
        raise UsageError(f"train.backend={build.training().train.backend} has no HF importer")
    trainer = make_trainer(build)
    imported: Imported = load(importer)(trainer, build.mapping, hf_dir)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    logger.info(
        f"import rank {torch.distributed.get_rank()}: {imported.tensors} tensors, model shard "
        f"{imported.shard_bytes / 2**20:.1f} MiB, largest read {imported.largest_read / 2**20:.1f} MiB, "
        f"peak RSS {peak / 2**20:.1f} MiB before saving"
    )
    path = save_checkpoint(Checkpoints(out_root, keep_last_k=1), trainer, step=0, consumed_samples=0)
    if torch.distributed.get_rank() == 0:
        logger.info(f"wrote {path} from {hf_dir}")
    trainer.close()
    return EXIT_OK


if __name__ == "__main__":
    from lmspec.runtime.log import setup_logging

    setup_logging()  # every rank's, as the train entry's (runtime/log.py)
    sys.exit(main(sys.argv[1:]))
