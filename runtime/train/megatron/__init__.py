"""megatron-core backend: GPTModel from the spec, its pipeline schedule."""
