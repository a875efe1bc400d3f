"""Checkpoint conversion as data: split kinds, one transform class per kind, the rows every family shares
(each family's own rows live in its module, lmspec.compiler.families).

Imports no torch: the runtime (runtime/convert/to_hf.py, runtime/convert/from_hf.py) executes
what `compiler/emit/conversion.py` writes to convert/mapping.json.
"""
