"""The backends whose checkpoints the crash-safety tests run (tests/runtime/test_resume.py, test_async_save.py):
train.backend -> the overrides of its two-rank layout (megatron data parallel; torchtitan FSDP2 fully sharded)."""

from __future__ import annotations

BACKEND_LAYOUTS = {"megatron": [], "torchtitan": ["train.backend=torchtitan", "parallel.zero_stage=3"]}
