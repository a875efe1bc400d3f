"""megatron-core's objects from megatron/config.json (lmspec.compiler.backends.megatron_config), and nothing else.

The document holds JSON values; the three kinds that name an object are looked up here (an activation of
torch.nn.functional, a torch dtype, an AttnBackend member). Two settings are the machine's, decided at
start-up as Megatron-LM's arguments.py decides them: gradient-accumulation fusion only where APEX's fused
weight-gradient kernel is installed, CPU initialisation where no GPU is.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import torch

from lmspec.runtime.dtypes import torch_dtype

_log = logging.getLogger(__name__)
DTYPE_SETTINGS = ("params_dtype", "pipeline_dtype")


def wgrad_fusion_kernel() -> bool:
    """Whether APEX's fused weight-gradient kernel is installed: megatron-core's own linear layers
    (the output layer, also on the TE path) refuse gradient_accumulation_fusion without it."""
    return importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None


def transformer_config_kwargs(document: dict[str, Any], *, parallel: bool = True, mtp: bool = True) -> dict[str, Any]:
    """Every argument of the document's TransformerConfig as live objects; `parallel=False` builds it for one
    process (all degrees one: verify loads any checkpoint into it, dist_checkpointing resharding),
    `mtp=False` without the multi-token-prediction layers (megatron 0.16.1 cannot run them without labels)."""
    from megatron.core.transformer.enums import AttnBackend

    settings = {k: v for k, v in document["transformer_config"].items() if k != "class"}
    kwargs: dict[str, Any] = {**settings, **(document["parallel"] if parallel else {})}
    kwargs["activation_func"] = getattr(torch.nn.functional, settings["activation_func"])
    for key in DTYPE_SETTINGS:
        kwargs[key] = torch_dtype(settings[key])
    if "attention_backend" in settings:
        kwargs["attention_backend"] = AttnBackend[settings["attention_backend"]]
    if not mtp:
        kwargs["mtp_num_layers"] = None
    if kwargs["gradient_accumulation_fusion"] and not wgrad_fusion_kernel():
        _log.info("gradient_accumulation_fusion off: APEX's fused_weight_gradient_mlp_cuda is not installed")
        kwargs["gradient_accumulation_fusion"] = False
    kwargs["use_cpu_initialization"] = not torch.cuda.is_available()
    return kwargs


def transformer_config(document: dict[str, Any], *, parallel: bool = True, mtp: bool = True) -> Any:
    """The TransformerConfig (or MLATransformerConfig) the document names, built by megatron-core."""
    from megatron.core.transformer import transformer_config as configs

    config_class = getattr(configs, document["transformer_config"]["class"])
    return config_class(**transformer_config_kwargs(document, parallel=parallel, mtp=mtp))


def ddp_config(document: dict[str, Any]) -> Any:
    from megatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(**document["ddp"])


def optimizer_config(document: dict[str, Any]) -> Any:
    from megatron.core.optimizer import OptimizerConfig

    settings = dict(document["optimizer"])
    settings["params_dtype"] = torch_dtype(settings["params_dtype"])
    return OptimizerConfig(**settings)


def param_scheduler(document: dict[str, Any], optimizer: Any) -> Any:
    """megatron-core's OptimizerParamScheduler over `optimizer`; its num_steps is the optimizer step whose
    learning rate it has set (the trainer steps it to each step before running it)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    return OptimizerParamScheduler(optimizer, **document["scheduler"])
