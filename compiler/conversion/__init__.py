"""Checkpoint conversion as data: split kinds, one transform class per kind, per-family tables.

Imports no torch: the runtime (runtime/convert.py, runtime/hf_to_megatron.py) executes
what `compiler/emit/conversion.py` writes to convert/mapping.json.
"""
