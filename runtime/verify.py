"""`lmspec run <build> --stage verify`: the converted HF model must compute what the trained one does.

Loads the conversion output with transformers' `AutoModelForCausalLM.from_pretrained`
and the newest checkpoint with the training backend (megatron: lmspec.runtime.train.megatron.model's
builder, one process, TP=PP=EP=1, dist_checkpointing reshards whatever layout was
trained; deepspeed: the trainer's own HF model with DeepSpeed's ZeRO consolidation; torchtitan: the same
HF model with the full tensors of its DCP checkpoint, read by DCP's loader in this one process),
runs the same token batch through both and compares logits: the max absolute difference must
stay within MAX_LOGITS_ABS_DIFF (fp32: a routing or renormalisation error that a cosine >= 0.99
cannot see moves logits by 1e-2). Cosine similarity is reported; forward hooks record every
decoder layer's output on both sides, and a failure names the first layer whose outputs fall
below MIN_LAYER_COSINE, which is where a bad mapping entry lives.

`--from HF_DIR` compares another HF directory; on a build that imported weights (`--stage import`)
the reference is then the imported checkpoint (runs/<name>/imported/step_0), so the import is judged
against transformers on the very directory it read. A block-FP8 directory (DeepSeek-V3's release) is
judged by transformers' model on the weights dequantised with the release's formula
(lmspec.runtime.convert.hf_source.BlockFp8): transformers' own FP8 loader needs `accelerate`, which
this environment does not install, and its dequantisation assumes blocks that divide the weight.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from lmspec.compiler.backends import backend_of
from lmspec.compiler.backends.backend import load
from lmspec.compiler.build.files import DEEPSPEED_DIR, DIST_CKPT_DIR, MAPPING, MEGATRON_CONFIG
from lmspec.compiler.build.reader import Build
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError

logger = logging.getLogger(__name__)

MAX_LOGITS_ABS_DIFF = 1e-4  # fp32 (issue 18); a wrong norm_topk_prob measured 0.0137
MIN_LAYER_COSINE = 0.999  # a layer whose outputs fall below this is "diverging" (the locator, not the criterion)
VERIFY_SEQUENCES = 2
VERIFY_TOKENS = 64


@dataclass
class Report:
    cosine: float
    max_abs_diff: float
    layers: list[tuple[str, float]] = field(default_factory=list)  # (layer, cosine of its outputs)

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= MAX_LOGITS_ABS_DIFF

    def first_divergence(self) -> str | None:
        """Where a failure starts: the first layer below MIN_LAYER_COSINE, else the output head."""
        for name, cos in self.layers:
            if cos < MIN_LAYER_COSINE:
                return name
        return None if self.ok else "the output head (lm_head / output_layer)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "logits_cosine": self.cosine,
            "max_abs_diff": self.max_abs_diff,
            "ok": self.ok,
            "max_abs_diff_allowed": MAX_LOGITS_ABS_DIFF,
            "min_layer_cosine": MIN_LAYER_COSINE,
            "first_diverging": self.first_divergence(),
            "layers": {name: cos for name, cos in self.layers},
        }


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def token_batch(spec: Any, run_dir: Path) -> torch.Tensor:
    """The first VERIFY_SEQUENCES x VERIFY_TOKENS tokens of the shipped corpus in the training tokenizer
    (ids the model was trained to take, whatever train.data.sources holds)."""
    from lmspec.runtime.data.builtin_corpus import builtin_documents
    from lmspec.runtime.data.datasets import run_tokenizer

    tokenizer = run_tokenizer(spec, run_dir)
    eod = [] if tokenizer.eod_id is None else [tokenizer.eod_id]
    ids = [i for doc in tokenizer.encode_batch(builtin_documents()) for i in [*doc, *eod]]
    return torch.tensor(ids[: VERIFY_SEQUENCES * VERIFY_TOKENS]).reshape(VERIFY_SEQUENCES, VERIFY_TOKENS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _single_process_group() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)


def megatron_reference(build: Build, step_dir: Path, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits [b, s, V] and every decoder layer's output [b, s, h] of the trained checkpoint, the model
    built from the build's megatron/config.json for one process (the Megatron backend's reference)."""
    from lmspec.runtime.compat.megatron import megatron_on_cpu, without_transformer_engine

    document, seed = build.json(MEGATRON_CONFIG), build.training().train.seed
    _single_process_group()
    with megatron_on_cpu(), without_transformer_engine():  # the local path, also on a GPU without TE
        return _megatron_forward(document, seed, step_dir / DIST_CKPT_DIR, tokens)


def _megatron_forward(
    document: dict[str, Any], seed: int, ckpt_dir: Path, tokens: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    from megatron.core import dist_checkpointing, tensor_parallel
    from megatron.core import parallel_state as ps

    from lmspec.runtime.train.megatron.model import build_model

    ps.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(seed)  # megatron's attention forks this RNG
    try:
        # logits only: megatron runs an MTP block only with labels, and HF models hold no MTP layers
        model = build_model(document, pre_process=True, post_process=True, parallel=False, mtp=False)
        wanted = model.sharded_state_dict()
        state = dist_checkpointing.load(wanted, str(ckpt_dir))
        model.load_state_dict({k: v for k, v in state.items() if k in wanted})  # common.pt adds optimizer groups
        model.eval()
        hidden: list[torch.Tensor] = []
        hooks = [
            layer.register_forward_hook(
                lambda _m, _i, out: hidden.append((out[0] if isinstance(out, tuple) else out).transpose(0, 1).float())
            )
            for layer in model.decoder.layers
        ]
        b, s = tokens.shape
        device = next(model.parameters()).device
        position_ids = torch.arange(s, device=device).unsqueeze(0).expand(b, s)
        mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool, device=device), diagonal=1)
        with torch.no_grad():
            logits = model(tokens.to(device), position_ids, mask).float().cpu()
        for hook in hooks:
            hook.remove()
        return logits, [h.cpu() for h in hidden]
    finally:
        ps.destroy_model_parallel()


def deepspeed_reference(build: Build, step_dir: Path, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The DeepSpeed backend's own model (lmspec.runtime.train.hf_model.causal_lm) with DeepSpeed's
    consolidation of the ZeRO shards loaded into it (the DeepSpeed backend's reference)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from lmspec.runtime.train.hf_model import causal_lm

    model = causal_lm(build.training())
    state = get_fp32_state_dict_from_zero_checkpoint(str(step_dir / DEEPSPEED_DIR))
    model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()}, strict=True)
    return _forward(model, tokens)


def torchtitan_reference(build: Build, step_dir: Path, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The torchtitan backend's own model (lmspec.runtime.train.hf_model.causal_lm) with the full tensors of
    its FSDP2 DCP checkpoint loaded into it (the torchtitan backend's reference): every tensor the model
    holds must be in the checkpoint and nothing else (a tied output head is the embedding's, DCP saves both)."""

    from lmspec.compiler.build.files import TORCHTITAN_DIR
    from lmspec.runtime.convert.dcp_reader import DcpCheckpoint, DcpReadError
    from lmspec.runtime.train.hf_model import causal_lm

    model = causal_lm(build.training())
    try:
        ckpt = DcpCheckpoint(step_dir / TORCHTITAN_DIR)
        state = ckpt.read(ckpt.tensors)
    except DcpReadError as exc:
        raise UsageError(str(exc)) from None
    model.load_state_dict(state, strict=True)
    return _forward(model, tokens)


def hf_outputs(hf_dir: Path, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    from lmspec.runtime.convert.hf_source import QUANTIZATION, read_config

    model = _dequantized_hf_model(hf_dir) if QUANTIZATION in read_config(hf_dir) else _loaded_cleanly(hf_dir)
    return _forward(model, tokens)


def _loaded_cleanly(hf_dir: Path) -> Any:
    """transformers' model of `hf_dir`; UsageError if any weight is missing or left over."""
    from transformers import AutoModelForCausalLM

    # transformers annotates from_pretrained's return as the model alone, even with output_loading_info=True
    model, info = cast(
        tuple[Any, dict[str, Any]],
        AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, output_loading_info=True),
    )
    info["unexpected_keys"] = [name for name in info["unexpected_keys"] if not _is_mtp(str(name), model.config)]
    bad = {kind: sorted(map(str, names)) for kind, names in info.items() if names and kind != "error_msgs"}
    if bad:  # transformers initialises missing weights randomly: that must not pass as "converted"
        raise UsageError(f"{hf_dir}: transformers did not load it cleanly: {bad}")
    return model


def _dequantized_hf_model(hf_dir: Path) -> Any:
    """transformers' own loading of a block-FP8 directory's weights dequantised by the release's formula
    (module docstring), from a temporary float32 copy of the directory without its quantization_config."""
    import tempfile

    from safetensors.torch import save_file

    from lmspec.runtime.convert.hf_source import CONFIG, QUANTIZATION, SCALE_SUFFIX, SINGLE, HfTensors, read_config

    config = {k: v for k, v in read_config(hf_dir).items() if k != QUANTIZATION}
    hf = HfTensors(hf_dir)
    with tempfile.TemporaryDirectory(prefix="lmspec-verify-dequantised-") as tmp:
        (Path(tmp) / CONFIG).write_text(json.dumps(config), encoding="utf-8")
        weights = {name: hf.get(name).float() for name in hf.weight_map if not name.endswith(SCALE_SUFFIX)}
        save_file(weights, str(Path(tmp) / SINGLE), metadata={"format": "pt"})
        del weights
        return _loaded_cleanly(Path(tmp))


def _is_mtp(name: str, config: Any) -> bool:
    """A tensor of the checkpoint's multi-token-prediction layers (DeepSeek-V3: model.layers.{num_hidden_layers
    + i}), which transformers does not build (it ignores only the release's own model.layers.61)."""
    mtp = range(
        config.num_hidden_layers, config.num_hidden_layers + (getattr(config, "num_nextn_predict_layers", 0) or 0)
    )
    return any(name.startswith(f"model.layers.{i}.") for i in mtp)


def _forward(model: Any, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.eval()
    hidden: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_hook(
            lambda _m, _i, out: hidden.append((out[0] if isinstance(out, tuple) else out).float())
        )
        for layer in model.model.layers
    ]
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()
    for hook in hooks:
        hook.remove()
    return logits, hidden


def compare(
    reference: tuple[torch.Tensor, list[torch.Tensor]], converted: tuple[torch.Tensor, list[torch.Tensor]]
) -> Report:
    (ref_logits, ref_layers), (hf_logits, hf_layers) = reference, converted
    if ref_logits.shape != hf_logits.shape:
        raise UsageError(f"logits shapes differ: trained {tuple(ref_logits.shape)}, converted {tuple(hf_logits.shape)}")
    layers = [(f"layer {i}", cosine(a, b)) for i, (a, b) in enumerate(zip(ref_layers, hf_layers, strict=True))]
    return Report(cosine(ref_logits, hf_logits), float((ref_logits - hf_logits).abs().max()), layers)


def reference_step(build: Build, hf_dir: Path | None) -> Path:
    """The checkpoint to judge: the imported one when comparing with another HF directory and the build
    has one (module docstring), else the newest of train.checkpoint.dir."""
    from lmspec.compiler.build.files import step_dir
    from lmspec.runtime.convert.import_stage import imported_root
    from lmspec.runtime.convert.to_hf import latest_checkpoint

    imported = imported_root(build) / step_dir(0)
    if hf_dir is not None and imported.is_dir():
        return imported
    return latest_checkpoint(Path(build.training().train.checkpoint.dir))


def verify_build(build: Build, hf_dir: Path | None = None) -> Report:
    """Compare the build's checkpoint (reference_step) with `hf_dir` (default: the build's convert.output)."""
    spec, paths = build.training(), build.plan.paths
    _ = build.mapping  # the table the comparison judges, checked before anything is loaded
    step = reference_step(build, hf_dir)
    hf_dir = Path(build.plan.conversion().output) if hf_dir is None else hf_dir
    if not (hf_dir / "config.json").is_file():
        raise UsageError(f"{hf_dir}: no converted model; run `lmspec run {build.root} --stage convert` first")
    tokens = token_batch(spec, Path(paths.run_dir))
    reference = load(backend_of(spec).reference_outputs)(build, step, tokens)
    return compare(reference, hf_outputs(hf_dir, tokens))


def run_stage(build: Build, options: argparse.Namespace) -> int:
    if getattr(options, "dry_run", False):
        spec = build.training()
        _ = build.mapping  # what the comparison reads, checked without running it
        print(
            f"would compare the logits of the converted model and the newest checkpoint of {build.root} "
            f"({build.plan.conversion().output} against {spec.train.backend} {spec.train.checkpoint.dir})"
        )
        return EXIT_OK
    report = verify_build(build, getattr(options, "hf_dir", None))
    print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    if report.ok:
        logger.info(
            f"verify: ok: logits max |diff| {report.max_abs_diff:.3e} <= {MAX_LOGITS_ABS_DIFF:g}, "
            f"cosine {report.cosine:.6f}"
        )
        return EXIT_OK
    logger.error(
        f"verify: FAILED: logits max |diff| {report.max_abs_diff:.3e} (<= {MAX_LOGITS_ABS_DIFF:g} required), "
        f"cosine {report.cosine:.6f}; first diverging: {report.first_divergence()} (layer outputs below "
        f"{MIN_LAYER_COSINE} cosine); check its entries in {MAPPING}"
    )
    return EXIT_FAILED


def main(argv: list[str]) -> int:
    """`python -m lmspec.runtime.verify <build dir> [<hf dir>]` (an HF directory other than convert.output)."""
    if len(argv) not in (1, 2):
        logger.error("usage: python -m lmspec.runtime.verify <build dir> [<hf dir>]")
        return EXIT_USAGE
    hf_dir = Path(argv[1]) if len(argv) > 1 else None
    try:
        return run_stage(Build.open(Path(argv[0])), argparse.Namespace(dry_run=False, hf_dir=hf_dir))
    except UsageError as exc:
        logger.error(f"lmspec: error: {exc}")
        return EXIT_USAGE


if __name__ == "__main__":
    from lmspec.runtime.log import setup_logging

    setup_logging()  # as every runtime process's entry (runtime/log.py)
    sys.exit(main(sys.argv[1:]))
