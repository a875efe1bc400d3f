"""Executes a build directory: `python -m runtime.train build/<name>` trains what was compiled.

Heavy imports (torch, megatron.core, deepspeed, transformers) live in the modules
that need them and are imported lazily, so `import runtime` stays cheap.
"""
