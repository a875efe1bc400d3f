"""The launch environment of the GPU kernels Megatron-LM sets beside NCCL's (launch/nccl.env).

- `CUDA_DEVICE_MAX_CONNECTIONS=1`: one hardware work queue, so a tensor-parallel (and sequence-
  parallel) communication kernel is scheduled before the GEMM it overlaps with; Megatron-LM's
  pretraining scripts export it and megatron-core's linear layers warn without it
  (megatron/core/tensor_parallel/layers.py). CPU ranks have no CUDA queues: not set.
- `train.flash_attention=false` with Transformer Engine: `NVTE_FLASH_ATTN=0` and `NVTE_FUSED_ATTN=0`
  select TE's unfused attention (transformer_engine/pytorch/attention: the backend choice reads
  both), which stores the s x s scores the memory model then prices.
"""

from __future__ import annotations

from lmspec.compiler.backends import backend_of
from lmspec.compiler.emit.quoting import Quoted, shell
from lmspec.compiler.plan import Plan


def kernel_settings(plan: Plan) -> list[tuple[str, str, Quoted]]:
    """(why, NAME, shell-quoted value) for every exported variable, in file order."""
    if plan.train is None:  # vLLM sets its own
        return []
    t = plan.train.spec.train
    if plan.device == "cpu" or not backend_of(plan.train.spec).one_cuda_work_queue:
        return []  # Transformer Engine runs only where the queue matters (the capability table: TE is Megatron's)
    out = [
        (
            "one CUDA work queue: Megatron's tensor/sequence-parallel communication is queued ahead of the "
            "GEMM it overlaps (Megatron-LM sets it; megatron-core warns without it)",
            "CUDA_DEVICE_MAX_CONNECTIONS",
            shell(1),
        )
    ]
    if t.transformer_impl == "transformer_engine" and not t.flash_attention:
        why = "train.flash_attention=false: Transformer Engine's unfused attention (stores the s x s scores)"
        out += [(why, "NVTE_FLASH_ATTN", shell(0)), (why, "NVTE_FUSED_ATTN", shell(0))]
    return out
