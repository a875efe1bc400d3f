"""Tokenizers and datasets: `lmspec data prepare`, and what training reads through megatron-core."""
