"""Golden error tests: one case per semantic rule; the message names the key, every factor,
the origin and a fix, and no traceback is printed."""

from __future__ import annotations

import json

import pytest

CASES = [
    pytest.param(
        ["model=deepseek_v3", "hardware=h800_80g", "model.rope_scaling.low_freq_factor=1.0"],
        [
            "model.rope_scaling.low_freq_factor=1.0 (command-line override): rope_scaling type yarn does not use it",
            "set model.rope_scaling.low_freq_factor=null",
        ],
        id="rope-scaling-fields-of-its-type",
    ),
    pytest.param(
        ["model=qwen2_5_7b", "hardware=h100_80g", "model.qkv_bias=false"],
        [
            "model.qkv_bias=false (command-line override): Qwen2ForCausalLM",
            'model.family="qwen2" (lmspec:specs/model/qwen2_5_7b.yaml:',
            "always has qkv_bias=true; set model.qkv_bias=true or pick the family that has it",
        ],
        id="model-keys-fit-the-family",
    ),
    pytest.param(
        ["model=qwen2_5_7b", "hardware=h100_80g", "model.head_dim=64"],
        ["model.head_dim=64 (command-line override): Qwen2ForCausalLM", "set model.head_dim=128 or use family qwen3"],
        id="qwen2-head-dim-derived",
    ),
    pytest.param(
        [
            "model=qwen3_8b",
            "hardware=h100_80g",
            "parallel.tp=4",
            "+model.rope_scaling={type:llama3,factor:8.0,original_max_position_embeddings:4096,low_freq_factor:1.0,"
            "high_freq_factor:4.0,beta_fast:null,beta_slow:null,mscale:null,mscale_all_dim:null}",
        ],
        [
            "model.rope_scaling.original_max_position_embeddings=4096 (command-line override): megatron-core 0.16.1",
            "only with original_max_position_embeddings=8192",
            "use train.backend=deepspeed",
        ],
        id="megatron-llama3-rope-band-fixed",
    ),
    pytest.param(
        ["model=deepseek_v3", "hardware=h800_80g", "model.moe.router_num_groups=3"],
        [
            "model.moe.router_num_groups=3 (command-line override) must divide model.moe.num_experts=256",
            "valid: 1, 2, 4",
        ],
        id="router-groups-divide-experts",
    ),
    pytest.param(
        ["model=deepseek_v3", "hardware=h800_80g", "model.moe.router_group_topk=null"],
        ["model.moe.router_num_groups=8", "are set together or both null"],
        id="router-groups-set-together",
    ),
    pytest.param(
        ["model=deepseek_v2_lite", "hardware=h800_80g", "model.moe.norm_topk_prob=true"],
        [
            "model.moe.norm_topk_prob=true (command-line override) under model.family=",
            "transformers' DeepseekV2 ignores norm_topk_prob",
            "set model.moe.norm_topk_prob=false",
        ],
        id="deepseek-v2-cannot-renormalise",
    ),
    pytest.param(
        ["model=deepseek_v3", "hardware=h800_80g", "model.moe.router_group_topk=2"],
        [
            "model.moe.router_group_topk=2 (command-line override) under model.family=",
            "with model.moe.top_k=8 megatron-core",
            "scores a group by its top 4 experts, transformers' and vLLM's deepseek_v3 by its top 2",
            "set model.moe.top_k=4 or model.moe.router_group_topk=4",
        ],
        id="deepseek-v3-group-score-width",
    ),
    pytest.param(
        ["model=deepseek_v3", "hardware=h800_80g", "model.moe.router_score_function=softmax"],
        ["transformers' and vLLM's deepseek_v3 score experts with sigmoid", "router_score_function=sigmoid"],
        id="deepseek-v3-scores-with-sigmoid",
    ),
    pytest.param(
        [
            "model=deepseek_v3",
            "hardware=h800_80g",
            "model.rope_scaling={type: linear, factor: 4.0}",
        ],
        ["multi-latent attention scales rope only with yarn", "model.rope_scaling=null"],
        id="mla-rope-is-yarn",
    ),
    pytest.param(
        ["model.mtp_layers=1"],
        [
            "model.mtp_layers=1 (command-line override)",
            'model.family="llama" (lmspec:specs/model/tiny.yaml:',
            "(only deepseek_v3 do); set model.mtp_layers=0",
        ],
        id="mtp-only-where-the-checkpoints-have-it",
    ),
    pytest.param(
        ["model=llama3_70b", "hardware=h100_80g", "parallel.tp=6"],
        [
            "parallel.tp=6 (command-line override) does not divide model.num_attention_heads=64",
            "specs/model/llama3_70b.yaml:8",
            "valid: 1, 2, 4, 8, 16, 32, 64",
        ],
        id="heads-divide-by-tp",
    ),
    pytest.param(
        ["model=llama3_8b", "hardware=h100_80g", "parallel.tp=16", "hardware.nodes=2"],
        ["parallel.tp=16 (command-line override) crosses nodes", "hardware.gpus_per_node=8", "keep tp <= 8"],
        id="tp-inside-node",
    ),
    pytest.param(
        ["hardware=h100_80g", "parallel.tp=3"],
        [
            "parallel.tp(3) x parallel.pp(1) x parallel.cp(1) = 3 does not divide the world size",
            "hardware.gpus_per_node(8) x hardware.nodes(1) = 8",
        ],
        id="world-size-auto-dp",
    ),
    pytest.param(
        ["parallel.dp=4"],
        [
            "parallel.tp(1) x parallel.pp(1) x parallel.cp(1) x parallel.dp(4) = 4 != world size",
            "set parallel.dp=auto (gives 2)",
        ],
        id="world-size-explicit-dp",
    ),
    pytest.param(
        ["parallel.tp=2", "parallel.pp=3", "hardware.gpus_per_node=6"],
        ["parallel.pp=3 (command-line override) does not divide model.num_layers=4", "parallel.pp_layout=auto"],
        id="layers-divide-by-pp",
    ),
    pytest.param(
        ["parallel.pp=2", "parallel.pp_layout=[1,2]"],
        ["parallel.pp_layout=[1, 2]", "summing to model.num_layers=4", "it has 2 summing to 3"],
        id="pp-layout-sum",
    ),
    pytest.param(
        ["model.num_kv_heads=3"],
        ["model.num_kv_heads=3 (command-line override) must divide model.num_attention_heads=8", "valid: 1, 2, 4, 8"],
        id="gqa-groups",
    ),
    pytest.param(
        [
            "model=llama3_8b",
            "hardware=h100_80g",
            "parallel.tp=8",
            "model.num_kv_heads=4",
            "model.num_attention_heads=20",
        ],
        ["parallel.tp=8 (command-line override) does not divide model.num_attention_heads=20"],
        id="tp-vs-heads-override",
    ),
    pytest.param(
        ["model=tiny_moe", "parallel.ep=3"],
        ["parallel.ep=3 (command-line override) does not divide model.moe.num_experts=8", "specs/model/tiny_moe.yaml"],
        id="experts-divide-by-ep",
    ),
    pytest.param(
        ["model=tiny_moe", "parallel.ep=4"],
        [
            "parallel.ep(4) x parallel.etp(1) = 4 does not divide dp(2) x parallel.tp(1) x parallel.cp(1) = 2",
            "ep x etp must be one of 1, 2",
        ],
        id="ep-fits-ranks",
    ),
    pytest.param(
        ["parallel.ep=2"],
        ["parallel.ep=2 (command-line override) needs a MoE model, but model.moe=null"],
        id="ep-needs-moe",
    ),
    pytest.param(
        ["train.global_batch_size=18"],
        [
            "train.global_batch_size=18 (command-line override) is "
            "not a multiple of train.micro_batch_size(4) x dp(2) = 8",
            "use 16, 24",
        ],
        id="global-batch",
    ),
    pytest.param(
        ["parallel.zero_stage=3"],
        [
            "parallel.zero_stage=3 (command-line override) needs train.backend=deepspeed",
            "ZeRO stages are DeepSpeed's; Megatron shards optimizer states with parallel.distributed_optimizer",
            "or set parallel.zero_stage=0",
        ],
        id="zero-is-deepspeed",
    ),
    pytest.param(
        ["train.backend=deepspeed", "parallel.zero_stage=1", "parallel.pp=2"],
        ["parallel.pp=2 (command-line override) needs train.backend=megatron", "or set parallel.pp=1"],
        id="deepspeed-pp",
    ),
    pytest.param(
        ["train.backend=deepspeed", "train.checkpoint.async_save=true"],
        [
            "train.checkpoint.async_save=true (command-line override) needs train.backend=megatron",
            "DeepSpeed has no asynchronous save lmspec can configure: its Nebula engine is Azure's service",
            "FastPersist decoupled writer needs the async_io op built and NVMe or GPUDirect Storage",
            "or set train.checkpoint.async_save=false",
        ],
        id="async-save-is-megatron",
    ),
    pytest.param(
        ["model=llama3_8b", "hardware=h100_80g", "parallel.tp=8", "hardware.host_memory_gib=64"],
        [
            # 8.03 B parameters x 14 B = 112.4 GB, over 8 ranks: 13.1 GiB each, 104.7 GiB on the node
            "a checkpoint save stages 13.1 GiB per rank, 104.7 GiB per node of hardware.gpus_per_node=8",
            "more than hardware.host_memory_gib=64 (command-line override)",
            "spread the save over more ranks: hardware.nodes=2 or more",
        ],
        id="staged-save-fits-host-memory",
    ),
    pytest.param(
        ["train.backend=deepspeed", "parallel.tp=2"],
        ["parallel.tp=2 (command-line override) needs train.backend=megatron", "or set parallel.tp=1"],
        id="deepspeed-tp",
    ),
    pytest.param(
        ["train.backend=torchtitan", "hardware.gpus_per_node=2", "parallel.tp=2"],
        [
            "parallel.sequence_parallel=false (lmspec:specs/parallel/default.yaml:9) needs train.backend=megatron",
            "torchtitan's tensor parallelism always splits the norms and the residual stream along the sequence",
            "or set parallel.sequence_parallel=true",
        ],
        id="torchtitan-tp-is-sequence-parallel",
    ),
    pytest.param(
        ["train.backend=torchtitan", "hardware.gpus_per_node=2", "model=tiny_moe", "serve=null"]
        + ["parallel.tp=2", "parallel.sequence_parallel=true", "model.attention=gqa", "model.mla=null"],
        [
            "parallel.tp=2 (command-line override) needs train.backend=megatron",
            "torchtitan's tensor parallelism of MoE blocks (its expert tensor parallel plan) is not in lmspec's "
            "torchtitan trainer yet",
            "or set parallel.tp=1",
        ],
        id="torchtitan-tp-of-moe",
    ),
    pytest.param(
        ["train.backend=torchtitan", "hardware.gpus_per_node=2", "parallel.tp=2", "parallel.sequence_parallel=true"]
        + ["parallel.overlap.tp_comm=true"],
        [
            "parallel.overlap.tp_comm=true (command-line override) needs GPU hardware",
            "torchtitan's async TP (parallelism.enable_async_tensor_parallel) runs in torch.compile'd regions over "
            "CUDA symmetric memory",
            "or set parallel.overlap.tp_comm=false",
        ],
        id="torchtitan-async-tp",
    ),
    pytest.param(
        ["train.backend=torchtitan", "hardware.gpus_per_node=2", "parallel.pp=2", "model.tie_embeddings=true"],
        [
            "model.tie_embeddings=true (command-line override) with parallel.pp=2 (command-line override): "
            "torchtitan's pipeline stages share no weight",
            "set parallel.pp=1, or train.backend=megatron",
        ],
        id="torchtitan-pp-tied-embeddings",
    ),
    pytest.param(
        ["train.backend=torchtitan", "hardware.gpus_per_node=2", "parallel.pp=2", "parallel.virtual_stages=3"],
        [
            "parallel.virtual_stages=3 (command-line override) splits stages of [2, 2] layers into 3 each, leaving "
            "a stage without a decoder layer ([1, 1, 1, 1, 0, 0])",
            "set parallel.virtual_stages to at most 2 (the shortest stage's layers), or to null",
        ],
        id="torchtitan-pp-stage-without-a-layer",
    ),
    pytest.param(
        ["train.backend=torchtitan", "hardware.gpus_per_node=4", "parallel.pp=2", "train.global_batch_size=8"],
        [
            "torch's 1F1B schedule runs at least one micro-batch per stage (parallel.pp(2)), but a step has 1",
            "set train.global_batch_size=16 (a multiple of 8 x 2), or a smaller train.micro_batch_size",
        ],
        id="torchtitan-pp-fewer-micro-batches-than-stages",
    ),
    pytest.param(
        ["parallel.distributed_optimizer=true", "train.backend=deepspeed"],
        [
            "parallel.distributed_optimizer=true (command-line override) needs GPU hardware with "
            "train.backend=megatron (no CPU target runs it)",
            "or set parallel.distributed_optimizer=false",
        ],
        id="distopt-is-megatron",
    ),
    pytest.param(
        ["parallel.cp=2"],
        [
            "parallel.cp=2 (command-line override) needs GPU hardware with train.transformer_impl=transformer_engine",
            "megatron-core's local (pure-PyTorch) implementation has no context-parallel attention",
            "or set parallel.cp=1",
        ],
        id="cp-on-cpu",
    ),
    pytest.param(
        ["hardware=h100_80g", "train.transformer_impl=local", "parallel.cp=2", "train.flash_attention=false"],
        [
            "parallel.cp=2 (command-line override) needs train.transformer_impl=transformer_engine; "
            "megatron-core's local (pure-PyTorch) implementation has no context-parallel attention; "
            "or set parallel.cp=1"
        ],
        id="cp-on-local-gpu",
    ),
    pytest.param(
        ["hardware=h100_80g", "train.transformer_impl=local"],
        [
            "train.flash_attention=true (lmspec:specs/train/default.yaml:13) needs "
            "train.transformer_impl=transformer_engine or train.backend=deepspeed",
            "or set train.flash_attention=false",
        ],
        id="flash-on-local-gpu",
    ),
    pytest.param(
        ["train.precision=bf16"],
        [
            'train.precision="bf16" (command-line override) needs train.backend=deepspeed',
            "megatron-core's mixed-precision optimizer and distributed optimizer accept only CUDA tensors",
            "or set train.precision=fp32",
        ],
        id="megatron-bf16-on-cpu",
    ),
    pytest.param(
        ["hardware=h100_80g", "train.backend=deepspeed", "train.transformer_impl=local"],
        ['train.recompute="selective" (lmspec:specs/train/default.yaml:12) needs train.backend=megatron', "full"],
        id="deepspeed-selective-recompute",
    ),
    pytest.param(
        ["train.transformer_impl=transformer_engine"],
        [
            'train.transformer_impl="transformer_engine" (command-line override) with train.backend="megatron"',
            "on cpu: Transformer Engine runs on GPUs only (NVIDIA's, and AMD Instinct through ROCm's build); "
            "set train.transformer_impl=local",
        ],
        id="no-target-te-on-cpu",
    ),
    pytest.param(
        ["hardware=h100_80g", "train.backend=deepspeed"],
        [
            "lmspec's DeepSpeed trainer runs transformers' PyTorch modeling code, not Transformer Engine; "
            "set train.transformer_impl=local"
        ],
        id="no-target-deepspeed-te",
    ),
    pytest.param(
        ["hardware=a100_80g", "train.precision=fp8", "train.fp8_recipe=delayed"],
        [
            'train.precision="fp8" (command-line override) needs FP8 tensor cores',
            "hardware.gpu.fp8_tflops=null",
            "set train.precision=bf16",
        ],
        id="fp8-needs-tensor-cores",
    ),
    pytest.param(
        ["hardware=h100_80g", "train.precision=fp8"],
        ['train.precision="fp8" (command-line override) needs a scaling recipe', "train.fp8_recipe=delayed"],
        id="fp8-needs-recipe",
    ),
    pytest.param(
        ["train.fp8_recipe=blockwise"],
        ['train.fp8_recipe="blockwise" (command-line override) does nothing with train.precision="fp32"'],
        id="fp8-recipe-without-fp8",
    ),
    pytest.param(
        ["hardware=h100_80g", "train.precision=fp8", "train.fp8_recipe=mxfp8"],
        [
            'train.fp8_recipe="mxfp8" (command-line override) does not run on hardware.gpu.generation="hopper"',
            "compute capability 10.0",
            "it runs on blackwell, cdna4 with Transformer Engine >= 2.1.0",
            "set train.fp8_recipe=delayed or tensorwise or blockwise, or train.precision=bf16",
        ],
        id="mxfp8-needs-blackwell",
    ),
    pytest.param(
        ["hardware=mi300x_192g", "train.precision=fp8", "train.fp8_recipe=blockwise"],
        [
            'train.fp8_recipe="blockwise" (command-line override) does not run on hardware.gpu.generation="cdna3"',
            "ROCm's Transformer Engine has no Float8BlockScaling recipe",
            "Transformer Engine >= 2.3.0.dev0",
            "set train.fp8_recipe=delayed or tensorwise",
        ],
        id="blockwise-not-on-rocm",
    ),
    pytest.param(
        ["hardware=mi355x_288g", "train.precision=fp4", "train.fp4_recipe=nvfp4"],
        [
            'train.fp4_recipe="nvfp4" (command-line override) does not run on hardware.gpu.generation="cdna4"',
            "CDNA4's FP4 is MXFP4",
            "it runs on blackwell with Transformer Engine >= 2.7.0.dev0",
            "set train.precision=bf16 and train.fp4_recipe=null",
        ],
        id="nvfp4-needs-blackwell",
    ),
    pytest.param(
        ["hardware=h100_80g", "train.precision=fp4", "train.fp4_recipe=nvfp4"],
        [
            'train.precision="fp4" (command-line override) needs FP4 tensor cores',
            "hardware.gpu.fp4_tflops=null",
            "Blackwell does",
        ],
        id="fp4-needs-tensor-cores",
    ),
    pytest.param(
        ["hardware=b200_180g", "train.backend=deepspeed", "train.transformer_impl=local", "train.recompute=full"]
        + ["train.precision=fp4", "train.fp4_recipe=nvfp4"],
        [
            'train.precision="fp4" (command-line override) needs train.backend=megatron and '
            "train.transformer_impl=transformer_engine; FP4 GEMMs come from Transformer Engine"
        ],
        id="fp4-is-transformer-engines",
    ),
    pytest.param(
        ["train.precision=fp8", "train.fp8_recipe=tensorwise"],
        [
            'train.precision="fp8" (command-line override) needs GPU hardware with '
            "train.transformer_impl=transformer_engine (no CPU target runs it)"
        ],
        id="fp8-not-on-cpu",
    ),
    pytest.param(
        ["hardware=b200_180g", "train.precision=fp4"],
        ['train.precision="fp4" (command-line override) needs a scaling recipe', "train.fp4_recipe=nvfp4"],
        id="fp4-needs-recipe",
    ),
    pytest.param(
        ["train.fp4_recipe=nvfp4"],
        [
            'train.fp4_recipe="nvfp4" (command-line override) does nothing with train.precision="fp32"',
            "set train.fp4_recipe=null, or train.precision=fp4",
        ],
        id="fp4-recipe-without-fp4",
    ),
    pytest.param(
        ["train.backend=deepspeed", "train.init_from=runs/a/checkpoints/step_00000010"],
        ['train.init_from="runs/a/checkpoints/step_00000010" (command-line override) needs train.backend=megatron'],
        id="deepspeed-init-from",
    ),
    pytest.param(
        ["parallel.offload_params=true", "train.backend=deepspeed", "parallel.zero_stage=2"],
        ["parallel.offload_params=true (command-line override) needs parallel.zero_stage>=3"],
        id="offload-params-zero3",
    ),
    pytest.param(
        ["train.seq_length=2048"],
        ["train.seq_length=2048 (command-line override) exceeds model.max_position_embeddings=1024"],
        id="seq-within-positions",
    ),
    pytest.param(
        ["serve.tp=3"],
        ["serve.tp=3 (command-line override) does not divide model.num_attention_heads=8"],
        id="serve-tp",
    ),
    pytest.param(
        ["serve.max_model_len=4096"],
        ["serve.max_model_len=4096 (command-line override) exceeds the 1,024 tokens vLLM derives from the model"],
        id="serve-len",
    ),
    pytest.param(
        ["model.attention=mla"],
        ['model.attention="mla" (command-line override) needs the model.mla block'],
        id="mla-block",
    ),
    pytest.param(
        ["model=tiny_moe", "model.head_dim=32"],
        ["model.head_dim=32 (command-line override) must equal", "set model.head_dim=64"],
        id="mla-head-dim",
    ),
    pytest.param(
        ["model=tiny_moe", "model.moe.top_k=9"],
        ["model.moe.top_k=9 (command-line override) exceeds model.moe.num_experts=8"],
        id="moe-top-k",
    ),
    pytest.param(
        ["parallel.cp=2", "train.seq_length=126", "parallel.tp=1"],
        ["train.seq_length=126 (command-line override) must divide by 2 x parallel.cp=2"],
        id="cp-sequence",
    ),
    pytest.param(
        [
            "model=llama3_8b",
            "hardware=h100_80g",
            "parallel.cp=2",
            "parallel.distributed_optimizer=true",
            "train.flash_attention=false",
        ],
        [
            "parallel.cp=2 (command-line override) runs ring attention, which needs flash attention, but "
            "train.flash_attention=false (command-line override); set train.flash_attention=true or parallel.cp=1"
        ],
        id="cp-needs-flash-attention",
    ),
    pytest.param(
        ["cluster=slurm", 'cluster.slurm.extra_options=["--nodes=4"]'],
        [
            "cluster.slurm.extra_options[0]='--nodes=4' (command-line override) repeats an option lmspec writes "
            "itself, and the later one would win; drop it: set hardware.nodes instead"
        ],
        id="extra-sbatch-option-lmspec-owns",
    ),
    pytest.param(
        ["cluster=slurm", 'cluster.slurm.srun_args=["--kill-on-bad-exit=0"]'],
        [
            "cluster.slurm.srun_args[0]='--kill-on-bad-exit=0'",
            "launch/sbatch.sh itself (one failed node ends the step)",
        ],
        id="srun-arg-lmspec-owns",
    ),
    pytest.param(
        ["parallel.virtual_stages=2"],
        ["parallel.virtual_stages=2 (command-line override) needs parallel.pp=1"],
        id="virtual-stages",
    ),
    pytest.param(
        [
            "model=llama3_8b",
            "hardware=h100_80g",
            "parallel.tp=8",
            "parallel.sequence_parallel=true",
            "parallel.overlap.tp_comm=true",
        ],
        [
            "parallel.overlap.tp_comm=true (command-line override) runs on no target",
            "Transformer Engine's userbuffers",
            "set parallel.overlap.tp_comm=false",
        ],
        id="tp-comm-overlap-runs-nowhere",
    ),
    pytest.param(
        [
            "model=mixtral_8x7b",
            "hardware=h100_80g",
            "hardware.nodes=8",
            "parallel.ep=8",
            "parallel.pp=4",
            "parallel.distributed_optimizer=true",
            "parallel.overlap.moe_a2a=true",
        ],
        [
            "parallel.overlap.moe_a2a=true (command-line override) with parallel.pp=4 (command-line override)",
            "parallel.virtual_stages=null (lmspec:specs/parallel/default.yaml:",
            "set parallel.virtual_stages=2 (or more) or parallel.overlap.moe_a2a=false",
        ],
        id="moe-a2a-overlap-needs-interleaving",
    ),
    pytest.param(
        [
            "model=llama3_8b",
            "hardware=h100_80g",
            "parallel.distributed_optimizer=true",
            "parallel.overlap.moe_a2a=true",
        ],
        ["parallel.overlap.moe_a2a=true (command-line override) overlaps expert all-to-alls, but parallel.ep=1"],
        id="moe-a2a-overlap-needs-experts",
    ),
    pytest.param(
        ["hardware.intra_node.link=nvlink"],
        [
            'hardware.intra_node.link="nvlink" (command-line override) and hardware.gpu.generation="cpu" '
            "(lmspec:specs/hardware/cpu.yaml:15) disagree on whether the ranks are CPU processes",
            "set hardware.intra_node.link=shm for CPU ranks, or hardware.gpu.generation=ampere, ada, hopper, "
            "blackwell, cdna3 or cdna4 for GPUs",
        ],
        id="gpu-link-on-cpu-generation",
    ),
    pytest.param(
        ["hardware=h100_80g", "hardware.intra_node.link=shm"],
        [
            'hardware.intra_node.link="shm" (command-line override) and hardware.gpu.generation="hopper" '
            "(lmspec:specs/hardware/h100_80g.yaml:12) disagree on whether the ranks are CPU processes",
            "set hardware.gpu.generation=cpu for CPU ranks, "
            "or hardware.intra_node.link=nvlink, nvlink5 or pcie for GPUs",
        ],
        id="shm-link-on-gpu-generation",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), CASES)
def test_rule_reports_key_factors_origin_and_fix(lmspec, overrides: list[str], expected: list[str]) -> None:
    result = lmspec("check", *overrides)
    result.assert_reports(1, expected)
    assert result.err.strip().splitlines()[-1].startswith("lmspec: spec invalid:")


def test_each_refusal_is_said_once(lmspec) -> None:
    """A feature the target lacks is one error on its key, whatever other rules also know of it."""
    result = lmspec("check", "train.backend=deepspeed", "parallel.tp=2", "parallel.distributed_optimizer=true")
    errors = [line for line in result.err.splitlines() if line.startswith("error:")]
    assert sorted(e.split(" ", 2)[1].split("=")[0] for e in errors) == ["parallel.distributed_optimizer", "parallel.tp"]


def test_all_problems_reported_at_once_errors_before_warnings(lmspec) -> None:
    result = lmspec("check", "model=llama3_70b", "parallel.tp=6")
    assert result.code == 1
    lines = result.err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(errors) >= 3  # world size, heads, kv heads, node crossing
    assert lines.index(errors[-1]) < lines.index(warnings[0])


def test_warning_does_not_fail(lmspec) -> None:
    result = lmspec(
        "check", "model=llama3_8b", "hardware=h100_80g", "parallel.tp=2", "parallel.distributed_optimizer=true"
    )
    assert result.code == 0
    assert "warning: parallel.sequence_parallel=false" in result.err


def test_debug_shows_traceback(monkeypatch) -> None:
    from lmspec.compiler.cli.main import run
    from lmspec.compiler.errors import SpecError

    monkeypatch.setenv("LMSPEC_DEBUG", "1")
    with pytest.raises(SpecError):
        run(["check", "parallel.tp=3"])


def test_deepseek_2048_gpu_layout_compiles(lmspec, tmp_path) -> None:
    result = lmspec(
        "compile",
        "model=deepseek_v3",
        "hardware=h800_80g",
        "hardware.nodes=256",
        "parallel.tp=1",
        "parallel.pp=16",
        "parallel.ep=64",
        "parallel.pp_layout=auto",
        "parallel.distributed_optimizer=true",
        "train.recompute=full",
        "serve.pp=3",
        "serve.host=0.0.0.0",
        "-o",
        str(tmp_path),
    )
    assert result.code == 0, result.err
    stages = json.loads((tmp_path / "deepseek_v3" / "plan.json").read_text())["layout"]["stage_layers"]
    # pp_layout=auto: 4 layers a stage, the last one (MTP layer and two output heads: ~4 layers' work) keeps 1
    assert stages == [4] * 15 + [1]


def test_seed_671b_layout_reports_every_rule(lmspec) -> None:
    result = lmspec(
        "check", "model=deepseek_v3", "hardware=a100_80g", "hardware.nodes=4", "parallel.tp=8", "parallel.zero_stage=3"
    )
    assert result.code == 1
    assert "parallel.zero_stage=3 (command-line override) needs train.backend=deepspeed" in result.err
