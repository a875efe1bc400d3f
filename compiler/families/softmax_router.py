"""What a softmax-routed MoE without shared experts (Mixtral, Qwen3-MoE) cannot express.

Their transformers and vLLM classes route by a softmax over all experts, take the top-k, and
combine the routed experts' outputs as they are: no score bias, no expert groups, no scaling
factor, no shared expert. A spec asking for any of these under such a family would train one model
and convert to another, so each is refused naming its key (lmspec.compiler.rules.model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmspec.compiler.spec.sections import ModelSpec


def refusals(m: ModelSpec, family: str) -> list[tuple[str, str]]:
    """(key, why and the way out) of every MoE key value `family`'s HF class cannot carry."""
    moe = m.moe
    if moe is None:
        return [("model.moe", f"{family} is a mixture-of-experts architecture; set the model.moe block")]
    wanted = {
        "router_score_function": ("softmax", "its router scores experts by softmax"),
        "router_score_bias": (False, "its router has no score-correction bias"),
        "router_num_groups": (None, "its router has no expert groups"),
        "router_group_topk": (None, "its router has no expert groups"),
        "routed_scaling_factor": (1.0, "it adds the routed experts' outputs unscaled"),
        "num_shared_experts": (0, "it has no shared expert"),
    }
    return [
        (f"model.moe.{key}", f"{why} in {family}; set model.moe.{key}={'null' if value is None else value}")
        for key, (value, why) in wanted.items()
        if getattr(moe, key) != value
    ]
