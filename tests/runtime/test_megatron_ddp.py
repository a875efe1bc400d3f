"""The DDP config the megatron trainer wraps its model with: Megatron-LM's overlapped, bucketed reduce
where parallel.overlap asks for it (the default, on GPUs and CPU ranks alike), the plain one-bucket reduce
after the backward where it does not."""

from __future__ import annotations

import pytest

from lmspec.compiler.backends.megatron_config import megatron_config
from lmspec.compiler.pipeline import make_plan
from lmspec.runtime.train.megatron.config import ddp_config

H200 = ["hardware=h200_141g", "train.seq_length=1024", "serve.max_model_len=1024"]


def _ddp(*overrides: str):
    """The layout and megatron-core's DistributedDataParallelConfig built from the build's megatron/config.json."""
    plan = make_plan(list(overrides), None)
    return plan.trained().layout, ddp_config(megatron_config(plan))


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_gpus_overlap_the_gradient_reduce_and_with_the_distributed_optimizer_the_param_gather(
    distributed_optimizer: bool,
) -> None:
    layout, config = _ddp(*H200, "train.global_batch_size=8", f"parallel.distributed_optimizer={distributed_optimizer}")
    assert layout.dp == 8
    assert config.overlap_grad_reduce is True
    assert config.overlap_param_gather is distributed_optimizer
    assert config.use_distributed_optimizer is distributed_optimizer
    assert config.grad_reduce_in_fp32 is True  # bf16 weights, fp32 reduce
    assert config.bucket_size == 40_000_000  # Megatron-LM's floor: 1M per DP rank is below it at dp=8


def test_the_bucket_grows_by_a_million_elements_per_data_and_context_parallel_rank() -> None:
    layout, config = _ddp(*H200, "hardware.nodes=16", "parallel.cp=2", "train.global_batch_size=64")
    assert (layout.dp, layout.cp) == (64, 2)
    assert config.bucket_size == 128_000_000


def test_cpu_ranks_overlap_the_reduce_as_the_spec_asks() -> None:
    _, config = _ddp()  # hardware=cpu, fp32: no distributed optimizer to gather for
    assert (config.overlap_grad_reduce, config.overlap_param_gather, config.bucket_size) == (True, False, 40_000_000)
    assert (config.grad_reduce_in_fp32, config.use_distributed_optimizer) == (False, False)


def test_without_grad_reduce_overlap_one_bucket_is_reduced_after_the_backward() -> None:
    _, config = _ddp(*H200, "train.global_batch_size=8", "parallel.overlap.grad_reduce=false")
    assert (config.overlap_grad_reduce, config.bucket_size) == (False, None)
    _, config = _ddp(
        *H200, "train.global_batch_size=8", "parallel.distributed_optimizer=true", "parallel.overlap.param_gather=false"
    )
    assert (config.overlap_grad_reduce, config.overlap_param_gather) == (True, False)
