"""Rules of `train.megatron.extra`: each field a field of megatron-core's own config dataclass, each value of
that field's type, and none a field lmspec writes from its own keys.

The dataclasses are the installed megatron-core's (the release lmspec pins), read with dataclasses.fields
and typing.get_type_hints: transformer_config against the TransformerConfig or MLATransformerConfig the
build names, ddp against DistributedDataParallelConfig, optimizer against OptimizerConfig. megatron-core is
imported only when extra holds something, so a spec without it compiles without megatron-core.
megatron-core's own __post_init__ checks between fields still run when the trainer builds the config.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Union

from lmspec.compiler.backends import backend_of
from lmspec.compiler.build.files import MEGATRON_CONFIG
from lmspec.compiler.errors import Problem, error
from lmspec.compiler.rules.context import TrainingContext

EXTRA = "train.megatron.extra"
_PRECISION = "train.precision"
_IMPL = "train.transformer_impl"
# megatron-core field -> the lmspec key it is written from, per section of megatron/config.json
FIELD_KEYS: dict[str, dict[str, str]] = {
    "transformer_config": {
        "num_layers": "model.num_layers",
        "hidden_size": "model.hidden_size",
        "ffn_hidden_size": "model.ffn_hidden_size",
        "num_attention_heads": "model.num_attention_heads",
        "kv_channels": "model.head_dim",
        "num_query_groups": "model.num_kv_heads",
        "layernorm_epsilon": "model.norm_eps",
        "add_qkv_bias": "model.qkv_bias",
        "qk_layernorm": "model.qk_norm",
        "multi_latent_attention": "model.attention",
        "q_lora_rank": "model.mla.q_lora_rank",
        "kv_lora_rank": "model.mla.kv_lora_rank",
        "qk_head_dim": "model.mla.qk_nope_head_dim",
        "qk_pos_emb_head_dim": "model.mla.qk_rope_head_dim",
        "v_head_dim": "model.mla.v_head_dim",
        "rotary_base": "model.rope_theta",
        "rope_type": "model.rope_scaling.type",
        "rotary_scaling_factor": "model.rope_scaling.factor",
        "original_max_position_embeddings": "model.rope_scaling.original_max_position_embeddings",
        "beta_fast": "model.rope_scaling.beta_fast",
        "beta_slow": "model.rope_scaling.beta_slow",
        "mscale": "model.rope_scaling.mscale",
        "mscale_all_dim": "model.rope_scaling.mscale_all_dim",
        "mtp_num_layers": "model.mtp_layers",
        "mtp_loss_scaling_factor": "train.mtp_loss_weight",
        "num_moe_experts": "model.moe.num_experts",
        "moe_router_topk": "model.moe.top_k",
        "moe_ffn_hidden_size": "model.moe.ffn_hidden_size",
        "moe_layer_freq": "model.moe.first_dense_layers",
        "moe_shared_expert_intermediate_size": "model.moe.num_shared_experts",
        "moe_router_score_function": "model.moe.router_score_function",
        "moe_router_enable_expert_bias": "model.moe.router_score_bias",
        "moe_router_pre_softmax": "model.moe.norm_topk_prob",
        "moe_router_num_groups": "model.moe.router_num_groups",
        "moe_router_group_topk": "model.moe.router_group_topk",
        "moe_router_topk_scaling_factor": "model.moe.routed_scaling_factor",
        "moe_token_dispatcher_type": "train.moe.dispatcher",
        "moe_flex_dispatcher_backend": "train.moe.flex_backend",
        "moe_enable_deepep": "train.moe.flex_backend",
        "moe_router_load_balancing_type": "train.moe.load_balancing",
        "moe_aux_loss_coeff": "train.moe.aux_loss_coeff",
        "moe_router_bias_update_rate": "train.moe.bias_update_rate",
        "moe_expert_capacity_factor": "train.moe.capacity_factor",
        "moe_token_drop_policy": "train.moe.drop_policy",
        "moe_pad_expert_input_to_capacity": "train.moe.pad_to_capacity",
        "moe_router_dtype": "train.moe.router_dtype",
        "moe_permute_fusion": "train.moe.permute_fusion",
        "moe_grouped_gemm": "train.moe.grouped_gemm",
        "moe_shared_expert_overlap": "train.moe.shared_expert_overlap",
        "moe_router_force_load_balancing": "train.moe.force_balance",
        "transformer_impl": _IMPL,
        "bias_dropout_fusion": _IMPL,
        "apply_rope_fusion": _IMPL,
        "masked_softmax_fusion": _IMPL,
        "persist_layer_norm": _IMPL,
        "gradient_accumulation_fusion": _IMPL,
        "attention_backend": "train.flash_attention",
        "fp8": "train.fp8_recipe",
        "fp8_recipe": "train.fp8_recipe",
        "fp4": "train.fp4_recipe",
        "fp4_recipe": "train.fp4_recipe",
        "bf16": _PRECISION,
        "fp16": _PRECISION,
        "params_dtype": _PRECISION,
        "pipeline_dtype": _PRECISION,
        "recompute_granularity": "train.recompute",
        "recompute_method": "train.recompute",
        "recompute_num_layers": "train.recompute",
        "overlap_moe_expert_parallel_comm": "parallel.overlap.moe_a2a",
        "tensor_model_parallel_size": "parallel.tp",
        "pipeline_model_parallel_size": "parallel.pp",
        "context_parallel_size": "parallel.cp",
        "expert_model_parallel_size": "parallel.ep",
        "expert_tensor_parallel_size": "parallel.etp",
        "sequence_parallel": "parallel.sequence_parallel",
        "pipeline_model_parallel_layout": "parallel.pp_layout",
        "virtual_pipeline_model_parallel_size": "parallel.virtual_stages",
        "overlap_p2p_comm": "parallel.virtual_stages",
        "batch_p2p_comm": "parallel.virtual_stages",
    },
    "ddp": {
        "grad_reduce_in_fp32": _PRECISION,
        "overlap_grad_reduce": "parallel.overlap.grad_reduce",
        "bucket_size": "parallel.overlap.grad_reduce",
        "overlap_param_gather": "parallel.overlap.param_gather",
        "use_distributed_optimizer": "parallel.distributed_optimizer",
    },
    "optimizer": {
        "optimizer": "train.optimizer.name",
        "lr": "train.optimizer.lr",
        "min_lr": "train.optimizer.min_lr",
        "weight_decay": "train.optimizer.weight_decay",
        "adam_beta1": "train.optimizer.beta1",
        "adam_beta2": "train.optimizer.beta2",
        "adam_eps": "train.optimizer.eps",
        "clip_grad": "train.grad_clip",
        "bf16": _PRECISION,
        "fp16": _PRECISION,
        "params_dtype": _PRECISION,
        "use_distributed_optimizer": "parallel.distributed_optimizer",
    },
}
# fields the trainer decides on the machine it runs on (runtime/train/megatron/config.py)
RUNTIME_DECIDES = {"transformer_config": ("use_cpu_initialization",)}


def config_class(ctx: TrainingContext, section: str) -> type:
    """The installed megatron-core's dataclass a section of megatron/config.json builds (imported quietly:
    megatron-core warns on import where Transformer Engine and APEX are absent, which a check is not about)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _config_class(ctx, section)


def _config_class(ctx: TrainingContext, section: str) -> type:
    if section == "transformer_config":
        from megatron.core.transformer import transformer_config as configs

        from lmspec.compiler.families import FAMILIES

        spec = ctx.spec
        return getattr(configs, FAMILIES[spec.model.family].megatron(spec.model).config_class)
    if section == "ddp":
        from megatron.core.distributed import DistributedDataParallelConfig

        return DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    return OptimizerConfig


def lmspec_fields(ctx: TrainingContext, section: str) -> set[str]:
    """Every field lmspec writes in `section` for this spec, from a key or fixed (the table, and what
    lmspec.compiler.backends.megatron_config writes for this spec beyond it)."""
    fields = set(FIELD_KEYS[section]) | set(RUNTIME_DECIDES.get(section, ()))
    if section == "transformer_config":
        from lmspec.compiler.backends.megatron_config import own_transformer_settings

        fields |= set(own_transformer_settings(ctx.spec)) - {"class"}
    return fields


def _name(tp: Any) -> str:
    """A type as a person reads it: `float | list[float]`, `'fp32' | 'fp64' | None`."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " | ".join(_name(a) for a in typing.get_args(tp))
    if origin is Literal:
        return " | ".join(json.dumps(v) for v in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_name(a) for a in typing.get_args(tp))}]"
    return getattr(tp, "__name__", str(tp).removeprefix("typing."))


def accepts(tp: Any, value: Any) -> bool:
    """Whether a JSON value (from YAML: null, bool, int, float, str, list, mapping) is one of type `tp`
    as megatron-core reads it: an int is a float, a list a tuple; a torch dtype, an enum or a callable
    is no JSON value."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(accepts(a, value) for a in args)
    if origin is Literal:
        return any(type(a) is type(value) and a == value for a in args)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if tp in (list, tuple):
        return isinstance(value, list | tuple)
    if origin in (list, tuple, typing.Sequence, typing.List, typing.Tuple):  # noqa: UP006
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(accepts(a, v) for a, v in zip(args, value, strict=True))
        return all(accepts(args[0], v) for v in value) if args else True
    if origin is dict or tp is dict:
        key_tp, value_tp = args or (str, Any)
        return isinstance(value, Mapping) and all(accepts(key_tp, k) and accepts(value_tp, v) for k, v in value.items())
    return False


def _shown(key: str, value: Any, ctx: TrainingContext) -> str:
    return f"{key}={json.dumps(value)} ({ctx.origins.of(key)})"


def _field_problems(ctx: TrainingContext, section: str, cls: type, settings: Mapping[str, Any]) -> Iterator[Problem]:
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    owned = lmspec_fields(ctx, section)
    for name, value in settings.items():
        key = f"{EXTRA}.{section}.{name}"
        shown = _shown(key, value, ctx)
        if name not in fields:
            near = difflib.get_close_matches(name, fields, n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            yield error(key, f"{shown}: megatron-core's {cls.__name__} has no field {name}{hint}")
        elif name in owned:
            from_key = FIELD_KEYS[section].get(name)
            if name in RUNTIME_DECIDES.get(section, ()):
                fix = "the trainer decides it on the machine it runs on; remove it"
            elif from_key is not None:
                fix = f"lmspec writes it from {from_key}; set {from_key} instead"
            else:
                fix = "lmspec writes it for this build (megatron/config.json shows the value); remove it"
            yield error(key, f"{shown}: lmspec sets {cls.__name__}.{name} itself: {fix}")
        elif not accepts(hints[name], value):
            yield error(
                key, f"{shown}: megatron-core's {cls.__name__}.{name} takes {_name(hints[name])}, not this value"
            )


def extra_fields_are_megatron_cores(ctx: TrainingContext) -> Iterator[Problem]:
    extra = ctx.spec.train.megatron.extra
    if not any(extra.values()):
        return
    if backend_of(ctx.spec).config_file != MEGATRON_CONFIG:
        for section, settings in extra.items():
            for name, value in settings.items():
                key = f"{EXTRA}.{section}.{name}"
                yield error(
                    key,
                    f"{_shown(key, value, ctx)} sets a megatron-core field, but {ctx.show('train.backend')} builds no "
                    f"megatron-core objects (no {MEGATRON_CONFIG}): set {EXTRA}={{}}",
                )
        return
    for section, settings in extra.items():
        if settings:
            yield from _field_problems(ctx, section, config_class(ctx, section), settings)


RULES = (extra_fields_are_megatron_cores,)
