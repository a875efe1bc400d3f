"""Megatron-LM's `pretrain_gpt.py` arguments for the settings of megatron/config.json.

A team that runs Megatron-LM directly takes megatron/pretrain_gpt_args.sh: the same model, parallel layout,
precision, DDP, optimizer and schedule, as the flags of Megatron-LM's arguments.py (core_v0.16.1, the
release of the megatron-core lmspec pins). They are read off the document the Megatron trainer builds from
(lmspec.compiler.backends.megatron_config), so the two cannot drift apart; the batch, the steps and the
seed come from the Plan. Where Megatron-LM's defaults differ from megatron-core's (its fusions on,
softmax in fp16, LayerNorm, learned positions, an MLA's small latents) the flag is written even when it
repeats the value. What no flag of Megatron-LM can say is returned as a note, not dropped silently.

The mapping follows arguments.py's `core_transformer_config_from_args`: a TransformerConfig field is
copied from the argument of the same name, except the renamed and derived ones below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmspec.compiler.plan import Plan

# TransformerConfig fields copied by name from `--<field-with-dashes> VALUE` (None: the flag is left out)
SAME_NAME_VALUES = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "kv_channels",
    "normalization",
    "hidden_dropout",
    "attention_dropout",
    "init_method_std",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "cp_comm_type",
    "fp8_recipe",
    "fp4_recipe",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "transformer_impl",
    "attention_backend",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_router_load_balancing_type",
    "moe_aux_loss_coeff",
    "moe_router_score_function",
    "moe_router_topk_scaling_factor",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend",
    "moe_router_dtype",
    "moe_router_bias_update_rate",
    "moe_expert_capacity_factor",
    "moe_token_drop_policy",
    "mtp_num_layers",
    "mtp_loss_scaling_factor",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "rope_type",
    "rotary_scaling_factor",
    "mscale",
    "mscale_all_dim",
)
RENAMED_VALUES = {
    "layernorm_epsilon": "--norm-epsilon",
    "num_moe_experts": "--num-experts",
    "fp8": "--fp8-format",
    "fp4": "--fp4-format",
}
# store_true flags: written when the field is true
SWITCHES_ON = (
    "add_qkv_bias",
    "qk_layernorm",
    "sequence_parallel",
    "moe_router_enable_expert_bias",
    "moe_grouped_gemm",
    "moe_router_pre_softmax",
    "moe_pad_expert_input_to_capacity",
    "moe_permute_fusion",
    "moe_shared_expert_overlap",
    "moe_router_force_load_balancing",
    "overlap_moe_expert_parallel_comm",
    "bf16",
    "fp16",
)
# fields Megatron-LM turns on by default: the flag that turns each off, written when the field is false
SWITCHES_OFF = {
    "add_bias_linear": "--disable-bias-linear",
    "bias_dropout_fusion": "--no-bias-dropout-fusion",
    "apply_rope_fusion": "--no-rope-fusion",
    "masked_softmax_fusion": "--no-masked-softmax-fusion",
    "persist_layer_norm": "--no-persist-layer-norm",
    "gradient_accumulation_fusion": "--no-gradient-accumulation-fusion",
    "bias_activation_fusion": "--no-bias-swiglu-fusion",
}
# MLATransformerConfig's YaRN settings arguments.py has no flag for: their defaults always apply
MLA_FIXED = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
PIPELINE_PARTS = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
# the fields written above by other means, or not arguments at all (the checker reads this)
DERIVED = {
    "class",
    "activation_func",
    "gated_linear_unit",
    "num_query_groups",
    "params_dtype",
    "pipeline_dtype",
    "perform_initialization",
    "moe_layer_freq",
    "rotary_base",
    "pipeline_model_parallel_layout",
    "virtual_pipeline_model_parallel_size",
    "overlap_p2p_comm",
    "batch_p2p_comm",
    *MLA_FIXED,
}
COVERED = {*SAME_NAME_VALUES, *RENAMED_VALUES, *SWITCHES_ON, *SWITCHES_OFF, *DERIVED}
# the ddp and optimizer fields _training_args writes (bf16 and params_dtype come with the model's flags)
TRAINING_COVERED = {
    "ddp": {"grad_reduce_in_fp32", "overlap_grad_reduce", "overlap_param_gather", "use_distributed_optimizer"}
    | {"bucket_size"},
    "optimizer": {"optimizer", "lr", "min_lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad"}
    | {"bf16", "fp16", "params_dtype", "use_distributed_optimizer"},
}


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _value(value: Any) -> str:
    return str(value)


def layer_freq(pattern: list[int]) -> str:
    """`--moe-layer-freq` as Megatron-LM evaluates it: a Python list expression of 0 (dense) and 1 (MoE)."""
    dense = pattern.index(1) if 1 in pattern else len(pattern)
    if pattern == [0] * dense + [1] * (len(pattern) - dense):
        return f"([0]*{dense}+[1]*{len(pattern) - dense})"
    return "[" + ",".join(map(str, pattern)) + "]"


def pipeline_layout_text(chunks: list[list[str]]) -> str:
    """`--pipeline-model-parallel-layout`: one `|`-separated stage per chunk (E embedding, t decoder layer,
    m MTP layer, L loss), in Megatron's flat chunk order."""
    return "|".join("".join(PIPELINE_PARTS[part] for part in chunk) for chunk in chunks)


def _transformer_args(config: dict[str, Any], parallel: dict[str, Any]) -> tuple[list[str], list[str]]:
    fields = {**config, **parallel}
    args: list[str] = []
    notes: list[str] = []
    for field in SAME_NAME_VALUES:
        if fields.get(field) is not None:
            args += [_flag(field), _value(fields[field])]
    for field, flag in RENAMED_VALUES.items():
        if fields.get(field) is not None:
            args += [flag, _value(fields[field])]
    args += [_flag(f) for f in SWITCHES_ON if fields.get(f)]
    args += [flag for f, flag in SWITCHES_OFF.items() if f in fields and not fields[f]]
    if fields["activation_func"] == "silu" and fields.get("gated_linear_unit"):
        args.append("--swiglu")
    if config["class"] == "MLATransformerConfig":
        args += ["--multi-latent-attention", "--rotary-base", _value(int(config["rotary_base"]))]
        notes += [
            f"{name}={config[name]}: Megatron-LM has no flag for it and builds MLA with {fixed}"
            for name, fixed in MLA_FIXED.items()
            if name in config and config[name] != fixed
        ]
    else:
        args += ["--group-query-attention", "--num-query-groups", _value(config["num_query_groups"])]
    if config.get("moe_layer_freq") is not None:
        args += ["--moe-layer-freq", layer_freq(config["moe_layer_freq"])]
    if parallel.get("pipeline_model_parallel_layout") is not None:
        args += ["--pipeline-model-parallel-layout", pipeline_layout_text(parallel["pipeline_model_parallel_layout"])]
    # megatron-core computes the softmax in fp32 by default; Megatron-LM only with this flag
    args.append("--attention-softmax-in-fp32")
    # train.megatron.extra's fields: megatron-core's names, whose Megatron-LM flag (if any) lmspec does not know
    notes += [
        f"{name}={value}: no Megatron-LM flag written for it (train.megatron.extra)"
        for name, value in fields.items()
        if name not in COVERED
    ]
    return args, notes


def _gpt_model_args(gpt: dict[str, Any], mla: bool) -> tuple[list[str], list[str]]:
    args = [
        "--position-embedding-type",
        gpt["position_embedding_type"],
        "--padded-vocab-size",
        _value(gpt["vocab_size"]),
    ]
    args += ["--max-position-embeddings", _value(gpt["max_sequence_length"])]
    if not gpt["share_embeddings_and_output_weights"]:
        args.append("--untie-embeddings-and-output-weights")
    if not mla:
        args += ["--rotary-base", _value(gpt["rotary_base"])]
    notes: list[str] = []
    if gpt.get("rope_scaling"):
        args.append("--use-rope-scaling")
        notes.append(
            f"rope_scaling_factor={gpt['rope_scaling_factor']}: pretrain_gpt.py does not pass --rope-scaling-factor "
            "to GPTModel, which applies its default 8.0"
        )
    if gpt.get("seq_len_interpolation_factor") is not None:
        notes.append(
            f"seq_len_interpolation_factor={gpt['seq_len_interpolation_factor']}: pretrain_gpt.py does not pass "
            "--rotary-seq-len-interpolation-factor to GPTModel"
        )
    return args, notes


def _training_args(document: dict[str, Any]) -> list[str]:
    ddp, opt, sched = document["ddp"], document["optimizer"], document["scheduler"]
    args = ["--distributed-timeout-minutes", _value(document["parallel_state"]["distributed_timeout_minutes"])]
    args += [_flag(f) for f in ("overlap_grad_reduce", "overlap_param_gather", "use_distributed_optimizer") if ddp[f]]
    if ddp["grad_reduce_in_fp32"]:
        args.append("--accumulate-allreduce-grads-in-fp32")
    if ddp["bucket_size"] is not None:
        args += ["--ddp-bucket-size", _value(ddp["bucket_size"])]
    args += ["--optimizer", opt["optimizer"], "--lr", _value(opt["lr"]), "--min-lr", _value(opt["min_lr"])]
    args += ["--weight-decay", _value(opt["weight_decay"]), "--clip-grad", _value(opt["clip_grad"])]
    args += ["--adam-beta1", _value(opt["adam_beta1"]), "--adam-beta2", _value(opt["adam_beta2"])]
    args += ["--adam-eps", _value(opt["adam_eps"])]
    args += ["--lr-warmup-init", _value(sched["init_lr"]), "--lr-warmup-iters", _value(sched["lr_warmup_steps"])]
    args += ["--lr-decay-iters", _value(sched["lr_decay_steps"]), "--lr-decay-style", sched["lr_decay_style"]]
    return args


def megatron_lm_args(plan: Plan, document: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(Megatron-LM arguments, notes on what they cannot say) for the plan's megatron/config.json `document`."""
    trained = plan.trained()
    config = document["transformer_config"]
    model_args, model_notes = _transformer_args(config, document["parallel"])
    gpt_args, gpt_notes = _gpt_model_args(document["gpt_model"], config["class"] == "MLATransformerConfig")
    batch = trained.batch
    run = ["--seq-length", _value(batch.seq_length), "--micro-batch-size", _value(batch.micro_batch_size)]
    run += ["--global-batch-size", _value(batch.global_batch_size), "--train-iters", _value(trained.spec.train.steps)]
    run += ["--seed", _value(trained.spec.train.seed)]
    training_notes = [
        f"{section}.{name}={value}: no Megatron-LM flag written for it (train.megatron.extra)"
        for section, covered in TRAINING_COVERED.items()
        for name, value in document[section].items()
        if name not in covered
    ]
    return model_args + gpt_args + _training_args(document) + run, model_notes + gpt_notes + training_notes
