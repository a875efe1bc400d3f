"""Reading training logs users already have: lmspec's metrics.jsonl, Megatron-LM and DeepSpeed
text logs (also behind torchrun/Slurm line prefixes), or any format through a user regex.

Parsing imports nothing heavy; matplotlib loads only inside `plot.draw`.
"""
