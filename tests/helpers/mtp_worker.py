"""Megatron-core's MTP block as lmspec builds it, in one process (gloo, world size 1); prints a JSON report.

`python tests/helpers/mtp_worker.py`: builds tiny_moe with one MTP module and runs forward/backward at
three MTP loss weights, builds the same model without MTP for its LM loss, and builds DeepSeek-V3's MTP
block alone on the meta device. The test (tests/models/test_mtp_megatron.py) judges the numbers.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

WEIGHTS = (0.0, 0.1, 0.2)
SEQ = 16


def _forward_backward(model, tokens):  # noqa: ANN001, ANN202
    s = tokens.shape[1]
    position_ids = torch.arange(s).unsqueeze(0).expand_as(tokens)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    model.zero_grad(set_to_none=True)
    loss = model(tokens, position_ids, mask, labels=tokens).float().mean()
    loss.backward()
    return loss.item()


def main() -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionBlock

    from helpers.specs import spec_of
    from lmspec.compiler.backends.megatron_config import ParallelDegrees, model_settings
    from lmspec.compiler.models.params import count_params
    from lmspec.runtime.compat.megatron import megatron_on_cpu
    from lmspec.runtime.train.megatron.config import transformer_config
    from lmspec.runtime.train.megatron.layer_specs import decoder_block_spec, mtp_block_spec
    from lmspec.runtime.train.megatron.model import build_model

    report: dict = {}
    with megatron_on_cpu():
        ps.initialize_model_parallel()
        tensor_parallel.model_parallel_cuda_manual_seed(1)
        spec = spec_of("model=tiny_moe", "hardware=cpu", "model.mtp_layers=1")
        model = build_model(model_settings(spec, ParallelDegrees()), True, True)
        report["tiny_moe_built"] = sum(p.numel() for n, p in model.named_parameters() if n.startswith("mtp."))
        report["tiny_moe_counted"] = count_params(spec.model).mtp
        report["tiny_moe_model_built"] = sum(p.numel() for p in model.parameters())
        layer = model.mtp.layers[0]
        report["modules"] = sorted(
            {type(layer.enorm).__name__, type(layer.transformer_layer.self_attention.core_attention).__name__}
        )
        tokens = torch.randint(0, spec.model.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(0))
        runs = []
        for weight in WEIGHTS:
            model.config.mtp_loss_scaling_factor = weight  # megatron reads it at every forward
            loss = _forward_backward(model, tokens)
            eh_proj = layer.eh_proj.weight.grad
            qkv = model.decoder.layers[0].self_attention.linear_q_down_proj.weight.grad
            runs.append((loss, eh_proj.clone(), qkv.clone()))
        (l0, eh0, d0), (l1, eh1, d1), (l2, eh2, d2) = runs
        report["lm_losses"] = [l0, l1, l2]
        report["eh_proj_grad_at_weight_0"] = float(eh0.abs().max())
        report["eh_proj_grad_linear_in_weight"] = bool(torch.allclose(eh2, 2 * eh1, rtol=1e-4, atol=1e-7))
        report["decoder_grad_linear_in_weight"] = bool(torch.allclose(d2 - d0, 2 * (d1 - d0), rtol=1e-3, atol=1e-7))
        report["decoder_grad_moves_with_weight"] = float((d1 - d0).abs().max())
        plain = build_model(model_settings(spec, ParallelDegrees()), True, True, mtp=False)
        plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("mtp.")})
        report["lm_loss_without_mtp"] = _forward_backward(plain, tokens)

        v3 = spec_of("model=deepseek_v3", "hardware=cpu")
        config = transformer_config(model_settings(v3, ParallelDegrees()))
        config.perform_initialization = False  # shapes only
        with torch.device("meta"):
            block = MultiTokenPredictionBlock(config=config, spec=mtp_block_spec(config, decoder_block_spec(config)))
        report["deepseek_v3_built"] = sum(p.numel() for p in block.parameters())
        report["deepseek_v3_counted"] = count_params(v3.model).mtp
        ps.destroy_model_parallel()
    return report


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", sys.argv[1] if len(sys.argv) > 1 else "29631")
    dist.init_process_group("gloo", rank=0, world_size=1)
    print(json.dumps(main()), flush=True)
    dist.destroy_process_group()
