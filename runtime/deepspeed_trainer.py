"""DeepSpeed backend: a transformers causal LM built from the spec, ZeRO from ds_config.json.

The model is built from `model.*` alone (no download): Llama for `family: llama`,
Mixtral for `mixtral`, DeepSeek-V2/V3 (MLA, routed + shared experts, dense first
layers) for `deepseek_v2`/`deepseek_v3`. `deepspeed.initialize` gets the build's
emitted `ds_config.json` unchanged (ZeRO stage, precision, optimizer, scheduler,
gradient accumulation, clipping), so the learning rate follows DeepSpeed's
scheduler from that file. Checkpoints use DeepSpeed's own save/load under
`<step dir>/deepspeed/` (model, optimizer and scheduler states per ZeRO rank).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from compiler.sections import Spec
from runtime.data import Batch

DS_CONFIG = "ds_config.json"
DS_DIR = "deepspeed"
DS_TAG = "state"


def hf_config(spec: Spec) -> Any:
    """The transformers config of `spec.model` (architecture only, float32 master weights)."""
    import transformers

    m = spec.model
    common = dict(vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
                  num_attention_heads=m.num_attention_heads, max_position_embeddings=m.max_position_embeddings,
                  rms_norm_eps=m.norm_eps, tie_word_embeddings=m.tie_embeddings, hidden_act="silu",
                  rope_parameters={"rope_type": "default", "rope_theta": m.rope_theta},
                  attention_dropout=0.0, use_cache=False)
    if m.family == "llama":
        return transformers.LlamaConfig(**common, intermediate_size=m.ffn_hidden_size,
                                        num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim,
                                        attention_bias=False, mlp_bias=False)
    if m.family == "mixtral":
        assert m.moe is not None, "validate() requires model.moe for mixtral"
        return transformers.MixtralConfig(**common, intermediate_size=m.moe.ffn_hidden_size,
                                          num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim,
                                          num_local_experts=m.moe.num_experts,
                                          num_experts_per_tok=m.moe.top_k)
    assert m.mla is not None and m.moe is not None, "validate() requires mla and moe for deepseek"
    cls = transformers.DeepseekV3Config if m.family == "deepseek_v3" else transformers.DeepseekV2Config
    return cls(**common, intermediate_size=m.ffn_hidden_size, moe_intermediate_size=m.moe.ffn_hidden_size,
               num_key_value_heads=m.num_kv_heads, n_shared_experts=m.moe.num_shared_experts,
               n_routed_experts=m.moe.num_experts, num_experts_per_tok=m.moe.top_k,
               first_k_dense_replace=m.moe.first_dense_layers, kv_lora_rank=m.mla.kv_lora_rank,
               q_lora_rank=m.mla.q_lora_rank, qk_rope_head_dim=m.mla.qk_rope_head_dim,
               qk_nope_head_dim=m.mla.qk_nope_head_dim, v_head_dim=m.mla.v_head_dim,
               n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0)


def _skip_cpu_shm_op_build() -> None:
    """On CPU, `deepspeed.init_distributed` JIT-compiles a shared-memory comm op (40-75 s,
    ~4 GB RAM); gloo does the same collectives, so the op is skipped. Never on GPU."""
    if torch.cuda.is_available():
        return
    import deepspeed.comm.torch as ds_torch

    ds_torch.build_shm_op = lambda: None


class DeepSpeedTrainer:
    def __init__(self, spec: Spec, plan: dict[str, Any], build_dir: Path) -> None:
        import deepspeed
        import transformers

        config_path = build_dir / DS_CONFIG
        if not config_path.is_file():
            raise FileNotFoundError(f"{config_path}: missing; recompile the build with train.backend=deepspeed")
        ds_config = json.loads(config_path.read_text(encoding="utf-8"))
        _skip_cpu_shm_op_build()
        deepspeed.init_distributed(dist_backend=dist.get_backend())
        self.spec = spec
        batch = plan["batch"]
        self.micro_batch_size = batch["micro_batch_size"]
        self.num_micro_batches = batch["grad_accum_steps"]
        self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()
        model = transformers.AutoModelForCausalLM.from_config(hf_config(spec), dtype=torch.float32)
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                    config=ds_config)
        self.device = self.engine.device

    def train_step(self, batches: list[Batch], lr: float) -> tuple[float, float, float]:
        """One optimizer step of `grad_accum_steps` micro-batches; `lr` comes from ds_config's scheduler."""
        totals = torch.zeros(2, dtype=torch.float64)
        for batch in batches:
            tokens, labels = batch.tokens.to(self.device), batch.labels.to(self.device)
            logits = self.engine(input_ids=tokens).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))
            self.engine.backward(loss)
            self.engine.step()
            totals += torch.tensor([float(loss.detach()) * labels.numel(), labels.numel()], dtype=torch.float64)
        totals = totals.to(self.device)
        dist.all_reduce(totals)
        grad_norm = self.engine.get_global_grad_norm()
        used_lr = self.engine.get_lr()[0]
        return float(totals[0] / totals[1]), float(grad_norm) if grad_norm is not None else math.nan, used_lr

    def save(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory / DS_DIR), tag=DS_TAG)

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory / DS_DIR), tag=DS_TAG)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load {directory / DS_DIR}")

    def rng_state(self) -> dict[str, Any]:
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None
