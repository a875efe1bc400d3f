"""torchtitan backend: pipeline, tensor and FSDP2 data parallelism on transformers' modeling code, from torchtitan.json.

The build's torchtitan.json is torchtitan's JobConfig (`.job_config` reads it into typed sections); the
trainer (`.trainer`) applies it with the torch.distributed APIs torchtitan's own parallelize functions call
(`.parallelize`: fully_shard, MixedPrecisionPolicy, checkpoint_wrapper; `.tensor_parallel`: parallelize_module
with sequence parallelism, as torchtitan's apply_tp; `.pipeline`: torch.distributed.pipelining's stages and
schedules, as torchtitan's pipeline_llm) and saves with
torch.distributed.checkpoint. torchtitan 0.3.0's own Trainer is not run: it follows the torch nightly and
picks CUDA on a CPU host (compiler/backends/torchtitan.py).
"""
