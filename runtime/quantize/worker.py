"""The quantize stage's worker: llm-compressor calibrates one HuggingFace checkpoint, then both are measured.

Run by runtime/quantize/stage.py as `PYTHON worker.py REQUEST.json` in the interpreter that has
llm-compressor, which is often not lmspec's own: vLLM pins compressed-tensors to the version it was
built against and llm-compressor to the one it writes, so teams keep the two apart (`.ci/setup` makes
`.venv-quantize`). Hence this file imports nothing from lmspec: torch, transformers, datasets,
compressed-tensors and llm-compressor only, and it reads its whole task from the request.

What it does, in order:
1. the unquantized model's mean token negative log-likelihood on the held-back sequences, and its
   logits on the first of them (the fixed batch the agreement is measured on);
2. `oneshot` with the recipe the scheme and method name (GPTQ, AWQ, SmoothQuant, or round to nearest),
   on the calibration sequences, every MoE expert shown every calibration token
   (`moe_calibrate_all_experts`: llm-compressor's own answer to experts the router rarely picks);
3. `save_pretrained(save_compressed=True)`: a compressed-tensors checkpoint, with the tokenizer beside it;
4. that directory loaded back by transformers (through compressed-tensors, as a user would load it) and
   measured as in 1: the checkpoint is judged as written, not the model in memory.
The result (JSON) goes to the request's `result` path.
"""

from __future__ import annotations

import gc
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

# The scheme of each spec value in llm-compressor's preset names, for the schemes whose preset is used as is.
PRESETS = {"fp8": "FP8", "fp8_dynamic": "FP8_DYNAMIC", "int8": "W8A8"}
# Files of the source directory the quantized one keeps as they are (the converter writes them beside the weights).
CARRIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
EVAL_BATCH = 4  # held-back sequences per forward pass


def w4a16_scheme(group_size: int | None, symmetric: bool) -> Any:
    """4-bit integer weights, by group along the input dimension or per output channel; no activation quantization."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(
        num_bits=4,
        type="int",
        symmetric=symmetric,
        strategy="group" if group_size else "channel",
        group_size=group_size,
    )
    return QuantizationScheme(targets=["Linear"], weights=weights)


def recipe(task: dict[str, Any]) -> list[Any]:
    """llm-compressor modifiers for the task's scheme and method."""
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier

    scheme, method, ignore = task["scheme"], task["method"], task["ignore"]
    modifiers: list[Any] = []
    if task.get("smoothquant_strength") is not None:
        from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

        modifiers.append(SmoothQuantModifier(smoothing_strength=task["smoothquant_strength"]))
    quantizer = GPTQModifier if method == "gptq" else QuantizationModifier  # AWQ only scales: RTN quantizes
    if scheme != "w4a16":
        return [*modifiers, quantizer(targets="Linear", scheme=PRESETS[scheme], ignore=ignore)]
    if method == "awq":
        from llmcompressor.modifiers.transform.awq import AWQModifier

        modifiers.append(AWQModifier(ignore=ignore))
    # AWQ's scales come with zero points (its presets are W4A16_ASYM); GPTQ and RTN are symmetric
    groups = {"group_0": w4a16_scheme(task["group_size"], symmetric=method != "awq")}
    return [*modifiers, quantizer(config_groups=groups, ignore=ignore)]


def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def load(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    return model.to(device()).eval()


@torch.no_grad()
def measure(model: Any, evaluation: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Mean next-token negative log-likelihood over the held-back sequences (float32 loss), and the
    float32 logits of the first sequence."""
    total, count, first = 0.0, 0, None
    for start in range(0, evaluation.shape[0], EVAL_BATCH):
        ids = evaluation[start : start + EVAL_BATCH].to(device())
        logits = model(input_ids=ids).logits.float()
        if first is None:
            first = logits[0].cpu()
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"
        )
        total += loss.item()
        count += ids[:, 1:].numel()
    assert first is not None
    return total / count, first


def agreement(reference: torch.Tensor, quantized: torch.Tensor) -> dict[str, float]:
    """How far the quantized logits of the fixed batch are from the reference: the share of positions
    whose greedy token is the same, KL(reference || quantized) per token, and the largest logit change."""
    p_log = torch.log_softmax(reference, dim=-1)
    q_log = torch.log_softmax(quantized, dim=-1)
    kl = torch.sum(p_log.exp() * (p_log - q_log), dim=-1)
    return {
        "top1_agreement": (reference.argmax(-1) == quantized.argmax(-1)).float().mean().item(),
        "kl_mean": kl.mean().item(),
        "max_abs_logit_diff": (reference - quantized).abs().max().item(),
    }


def calibrate(task: dict[str, Any], calibration: torch.Tensor) -> None:
    """oneshot over the calibration sequences, then the compressed checkpoint into task['output']."""
    from datasets import Dataset
    from llmcompressor import oneshot

    model = load(task["model"])
    rows = calibration.tolist()
    data = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]})
    oneshot(
        model=model,
        dataset=data,
        recipe=recipe(task),
        max_seq_length=calibration.shape[1],
        num_calibration_samples=calibration.shape[0],
        shuffle_calibration_samples=False,
        moe_calibrate_all_experts=True,
    )
    model.save_pretrained(task["output"], save_compressed=True)
    for name in CARRIED:
        source = Path(task["model"]) / name
        if source.is_file():
            shutil.copyfile(source, Path(task["output"]) / name)


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("llmcompressor", "compressed-tensors", "transformers", "torch")}


def main(request: Path) -> int:
    task = json.loads(request.read_text())
    from safetensors.torch import load_file

    tokens = load_file(task["tokens"])
    calibration, evaluation = tokens["calibration"].long(), tokens["evaluation"].long()
    started = time.monotonic()
    model = load(task["model"])
    nll_before, logits_before = measure(model, evaluation)
    del model
    gc.collect()
    calibrate(task, calibration)
    calibrated = time.monotonic()
    gc.collect()
    nll_after, logits_after = measure(load(task["output"]), evaluation)
    result = {
        "nll_before": nll_before,
        "nll_after": nll_after,
        "perplexity_before": math.exp(nll_before),
        "perplexity_after": math.exp(nll_after),
        "eval_tokens": int(evaluation[:, 1:].numel()),
        "calibration_tokens": int(calibration.numel()),
        **agreement(logits_before, logits_after),
        "calibration_seconds": calibrated - started,
        "seconds": time.monotonic() - started,
        "device": str(device()),
        "versions": versions(),
    }
    Path(task["result"]).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
