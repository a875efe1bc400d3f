"""The `serve` group: the vLLM engine that serves the trained (or a released) model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import Auto, FrozenMapping, JsonValue, key
from lmspec.compiler.spec.sections.serve_scale import All2AllBackend, DisaggregationSpec, EplbSpec, SpeculativeSpec
from lmspec.compiler.spec.sections.serve_workload import SloSpec, WorkloadSpec


@dataclass(frozen=True, kw_only=True)
class ServeSpec:
    """Serving a HuggingFace model directory with vLLM: the converted one, or serve.model_path."""

    engine: Literal["vllm"] = key("Serving engine.", example="vllm")
    tp: int = key("vLLM --tensor-parallel-size.", example=8, minimum=1, maximum=kinds.RANKS_MAX)
    pp: int = key("vLLM --pipeline-parallel-size.", example=1, minimum=1, maximum=kinds.RANKS_MAX)
    dp: int = key("vLLM --data-parallel-size.", example=1, minimum=1, maximum=kinds.RANKS_MAX)
    expert_parallel: bool = key("vLLM --enable-expert-parallel (MoE only).", example=False)
    eplb: EplbSpec | None = key(
        "Expert-parallel load balancing (vLLM --enable-eplb with --eplb-config; MoE with serve.expert_parallel, "
        "on GPUs); null = off.",
        example=None,
    )
    all2all_backend: All2AllBackend | None = key(
        "Kernels of the expert all-to-all (vLLM --all2all-backend; with serve.expert_parallel): deepep_* and "
        "mori_* need their packages, flashinfer_nvlink_* an NVLink domain; null = vLLM's default "
        "(allgather_reducescatter).",
        example="deepep_low_latency",
    )
    max_model_len: int = key(
        "Longest request (prompt + output) in tokens; sizes the KV cache.",
        example=8192,
        minimum=1,
        maximum=kinds.TOKENS_MAX,
    )
    gpu_memory_utilization: float = key(
        "Fraction of device memory vLLM may use, in (0, 1].", example=0.9, exclusive_minimum=0, maximum=1
    )
    enforce_eager: bool = key("Disable CUDA graphs (debugging, CPU).", example=False)
    served_model_name: str = key("Model name clients send in requests.", example="llama3-8b", kind=kinds.LABEL)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = key("Weight and activation dtype.", example="bfloat16")
    quantization: Literal["awq", "gptq", "fp8", "bitsandbytes", "compressed-tensors"] | None = key(
        "Quantization method; null = none. AWQ/GPTQ need a calibrated checkpoint; compressed-tensors is "
        "llm-compressor's format, the checkpoint the quantize stage writes (quantize.output).",
        example="fp8",
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = key(
        "KV cache dtype; auto = model dtype.", example="auto"
    )
    max_num_seqs: int | None = key(
        "Most sequences batched at once; null = vLLM's default for the hardware (1024 on H100/H200-class "
        "GPUs, 256 on others).",
        example=256,
        minimum=1,
        maximum=kinds.SEQS_MAX,
    )
    max_num_batched_tokens: int | None = key(
        "Token budget per scheduler step; null = vLLM's default.",
        example=8192,
        minimum=1,
        maximum=kinds.BATCHED_TOKENS_MAX,
    )
    prefix_caching: bool = key(
        "Reuse the KV cache of prompt prefixes already computed (vLLM --enable-prefix-caching / "
        "--no-enable-prefix-caching).",
        example=True,
    )
    speculative: SpeculativeSpec | None = key(
        "Speculative decoding with the model's MTP modules (vLLM --speculative-config); null = off.", example=None
    )
    disaggregation: DisaggregationSpec | None = key(
        "Disaggregated prefill and decode: two pools of engines joined by vLLM's KV connector, each started by "
        "its own serve/<pool>/serve.sh with serve/<pool>/vllm.yaml; null = one engine (serve.tp/pp/dp).",
        example=None,
    )
    host: str = key(
        "Address the API server binds (node 0's in a multi-node engine, which must not be loopback).",
        example="127.0.0.1",
        kind=kinds.HOST,
    )
    port: int = key("Port of the OpenAI-compatible API.", example=8000, minimum=1, maximum=kinds.PORT_MAX)
    multi_node: Auto | Literal["mp", "ray", "data_parallel"] = key(
        "How an engine larger than one node spans nodes: mp = tensor/pipeline parallel across nodes with "
        "vLLM's own multiprocessing executor, one `vllm serve --nnodes N --node-rank R` per node, nothing but "
        "vLLM needed (--distributed-executor-backend mp; serve.dp=1, the same GPUs on every node); ray = one "
        "Ray cluster, tensor/pipeline parallel across nodes (--distributed-executor-backend ray); "
        "data_parallel = vLLM's data parallel with one headless engine per further node (each data-parallel "
        "rank inside a node); auto = data_parallel where serve.tp x serve.pp fits in a node, else mp where it "
        "applies, else ray. Unused by a one-node engine.",
        example="auto",
    )
    ray_port: int = key(
        "Port of the Ray head on node 0 (serve.multi_node=ray).", example=6379, minimum=1, maximum=kinds.PORT_MAX
    )
    data_parallel_rpc_port: int = key(
        "vLLM --data-parallel-rpc-port on node 0 (serve.multi_node=data_parallel).",
        example=13345,
        minimum=1,
        maximum=kinds.PORT_MAX,
    )
    master_port: int = key(
        "vLLM --master-port on node 0: the torch.distributed store every node's ranks join (serve.multi_node=mp).",
        example=29501,
        minimum=1,
        maximum=kinds.PORT_MAX,
    )
    api_key_env: str | None = key(
        "Name of the environment variable holding the API key (never the key itself); null = no auth.",
        example="VLLM_API_KEY",
        kind=kinds.ENV_NAME,
    )
    model_path: str | None = key(
        "HuggingFace model directory to serve (a released or converted one); null = the conversion output "
        "(convert.output). Required when train is null.",
        example="runs/llama3_8b/hf",
        kind=kinds.PATH,
    )
    cpu_kvcache_space_gib: float = key(
        "VLLM_CPU_KVCACHE_SPACE for the CPU backend, GiB.", example=1, exclusive_minimum=0, maximum=kinds.MEMORY_GIB_MAX
    )
    replicas: int = key(
        "Copies of the whole engine behind one load balancer (each its own `vllm serve` on its own GPUs); "
        "the deployment's throughput is theirs together.",
        example=1,
        minimum=1,
        maximum=kinds.RANKS_MAX,
    )
    workload: WorkloadSpec = key("The traffic the deployment is sized for (lmspec explain prices it).")
    slo: SloSpec | None = key("Latency targets; null = none (goodput = throughput).")
    extra_args: Mapping[str, JsonValue] = key(
        "vLLM serve options lmspec has no key for: option name (as in vllm.yaml, without --) -> value, written "
        "into serve/vllm.yaml after lmspec's own. Each is checked at compile time by vLLM's own argument "
        "parser; an option lmspec writes from a key is refused with that key. On the command line: "
        "+serve.extra_args.OPTION=VALUE, or ++serve.extra_args={...} for the whole mapping.",
        example={"enable-chunked-prefill": True},
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_args", FrozenMapping(self.extra_args))
