"""ZeRO-Offload's optimizer: DeepSpeedCPUAdam where its C++ op builds, torch's Adam/AdamW where it cannot.

The build's ds_config asks for DeepSpeedCPUAdam by leaving `torch_adam` out of an offloaded Adam
(DeepSpeed then picks its CPU Adam, which JIT-compiles `cpu_adam` with the host's C++ compiler on
first use and caches it under torch's extensions directory). Whether the op builds is a fact of the
machine, not of the spec, so the runtime decides: it builds the op before `deepspeed.initialize`,
and when that fails it runs torch's optimizer instead (`torch_adam: true`) and says why, once.
"""

from __future__ import annotations

import copy
from typing import Any

TORCH_ADAM = "torch_adam"
ADAM_TYPES = ("adam", "adamw")


def wants_cpu_adam(ds_config: dict[str, Any]) -> bool:
    """Whether DeepSpeed would build DeepSpeedCPUAdam for this config: an offloaded Adam without torch_adam."""
    optimizer = ds_config.get("optimizer", {})
    offload = ds_config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device") == "cpu"
    return offload and optimizer.get("type", "").lower() in ADAM_TYPES and TORCH_ADAM not in optimizer["params"]


def cpu_adam_problem() -> str | None:
    """Why DeepSpeed's cpu_adam op cannot be loaded here (it builds it now if it must), or None."""
    from deepspeed.ops.op_builder import CPUAdamBuilder

    builder = CPUAdamBuilder()
    if not builder.is_compatible():
        return f"DeepSpeed's {builder.name} op is not compatible with this machine"
    try:
        builder.load(verbose=False)
    except Exception as error:  # noqa: BLE001 -- any build failure (compiler, headers, ninja) means fall back
        return f"DeepSpeed's {builder.name} op did not build: {type(error).__name__}: {error}"
    return None


def with_available_optimizer(ds_config: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`ds_config` as DeepSpeed should get it on this machine, and why it differs from the build's: unchanged
    (None), or with torch's Adam when the config asks for DeepSpeedCPUAdam and its op cannot be built."""
    if not wants_cpu_adam(ds_config):
        return ds_config, None
    problem = cpu_adam_problem()
    if problem is None:
        return ds_config, None
    fallback = copy.deepcopy(ds_config)
    fallback["optimizer"]["params"][TORCH_ADAM] = True
    return fallback, f"{problem}; the offloaded optimizer falls back to torch's {ds_config['optimizer']['type']}"
