"""Skip marks for tests that need an optional stack (the serve extra)."""

from __future__ import annotations

import importlib.util

import pytest

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install '.[serve]')"
)
