"""The names people type for lmspec's keys (Megatron's and DeepSpeed's flags, torchrun's, vLLM's,
the usual short forms), so an unknown key is answered with the key lmspec uses."""

from __future__ import annotations

_TP = ("parallel.tp", "serve.tp")
_PP = ("parallel.pp", "serve.pp")
_GROUPS: dict[tuple[str, ...], tuple[str, ...]] = {
    _TP: ("tp", "tensor_parallel", "tensor_parallel_size", "tensor_model_parallel_size", "tp_size", "mp"),
    _PP: ("pp", "pipeline_parallel", "pipeline_parallel_size", "pipeline_model_parallel_size", "pp_size"),
    ("parallel.dp",): ("dp", "data_parallel", "data_parallel_size", "dp_size"),
    ("parallel.cp",): ("cp", "context_parallel", "context_parallel_size", "cp_size"),
    ("parallel.ep",): ("ep", "expert_parallel", "expert_parallel_size", "expert_model_parallel_size", "ep_size"),
    ("parallel.etp",): ("expert_tensor_parallel_size", "etp_size"),
    ("parallel.virtual_stages",): ("virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage"),
    ("parallel.zero_stage",): ("zero", "zero_stage", "zero_optimization_stage"),
    ("hardware.nodes", "hardware.gpus_per_node"): ("world_size", "num_gpus", "gpus"),  # world = their product
    ("hardware.nodes",): ("nodes", "nnodes", "num_nodes"),
    ("hardware.gpus_per_node",): ("nproc_per_node", "gpus_per_node", "num_gpus_per_node"),
    ("train.micro_batch_size",): ("micro_batch_size", "micro_batch", "train_micro_batch_size_per_gpu", "mbs"),
    ("train.global_batch_size",): ("global_batch_size", "train_batch_size", "global_batch", "gbs"),
    ("train.seq_length",): ("seq_length", "seq_len", "sequence_length", "max_seq_len", "seqlen"),
    ("train.optimizer.lr",): ("lr", "learning_rate"),
    ("train.precision",): ("bf16", "fp16", "dtype", "precision"),
    ("serve.max_model_len",): ("max_model_len",),
    ("serve.gpu_memory_utilization",): ("gpu_memory_utilization",),
}
ALIASES: dict[str, tuple[str, ...]] = {name: keys for keys, names in _GROUPS.items() for name in names}


def lmspec_keys(typed: str) -> tuple[str, ...]:
    """The lmspec keys a typed key means (its last part, in any case, `-` or `_`); those in the typed
    key's own section first. () when it is no known alias."""
    section, _, leaf = typed.rpartition(".")
    keys = ALIASES.get(leaf.lower().replace("-", "_"), ())
    own = tuple(k for k in keys if section and k.startswith(section + "."))
    return own or keys
