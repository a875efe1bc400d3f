"""train.recompute=full on the DeepSpeed backend: DeepSpeed's activation checkpointing around every decoder layer.

The build asks for it with ds_config's `activation_checkpointing` section (the compiler writes it for
train.recompute=full; the capability table refuses selective recompute here). DeepSpeed's engine does
not act on that section itself: `deepspeed.checkpointing.configure` reads it, and its `checkpoint`
becomes the transformers model's gradient-checkpointing function, which each decoder layer
(`GradientCheckpointingLayer`) calls in training. A layer then keeps only its input for backward and
recomputes the rest, which is what the memory model prices for full recompute.
"""

from __future__ import annotations

from typing import Any

SECTION = "activation_checkpointing"


def enable_activation_checkpointing(model: Any, ds_config: dict[str, Any]) -> bool:
    """Checkpoint every decoder layer of `model` with DeepSpeed's function when `ds_config` asks for
    it; returns whether it did. Call after `deepspeed.init_distributed` (configure reads the world)."""
    if SECTION not in ds_config:
        return False
    import deepspeed

    deepspeed.checkpointing.configure(None, deepspeed_config=ds_config)
    # transformers' own seam for a custom checkpoint function (gradient_checkpointing_enable always
    # binds torch.utils.checkpoint); it sets the function and the flag on every checkpointable layer.
    model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)
    return True
