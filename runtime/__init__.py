"""Executes a build directory: `python -m lmspec.runtime.train build/<name>` trains what was compiled.

Heavy imports (torch, megatron.core, deepspeed, transformers) live in the modules
that need them and are imported lazily, so `import lmspec.runtime` stays cheap.
"""
