"""Checkpoint conversion as data: split kinds, one transform class per kind, per-family tables.

Imports no torch: the runtime (runtime/convert/to_hf.py, runtime/convert/from_hf.py) executes
what `compiler/emit/conversion.py` writes to convert/mapping.json.
"""
