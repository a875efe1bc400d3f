"""The convert stage: Megatron torch_dist to HuggingFace safetensors, and HuggingFace weights in."""
