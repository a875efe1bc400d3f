"""Skip marks for tests that need an optional stack (the serve extra)."""

from __future__ import annotations

import importlib.util

import pytest

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install '.[serve]')"
)


def quantize_python() -> str | None:
    """The interpreter with llm-compressor the quantize stage runs (lmspec.runtime.quantize.stage): .ci/setup's
    .venv-quantize, $LMSPEC_QUANTIZE_PYTHON, or this one when it has llm-compressor; None without any."""
    import os
    import sys

    from helpers.paths import ROOT
    from lmspec.runtime.quantize.stage import QUANTIZE_PYTHON_ENV

    for candidate in (os.environ.get(QUANTIZE_PYTHON_ENV), str(ROOT / ".venv-quantize" / "bin" / "python")):
        if candidate and os.path.isfile(candidate):
            return candidate
    return sys.executable if importlib.util.find_spec("llmcompressor") else None


needs_llmcompressor = pytest.mark.skipif(
    quantize_python() is None,
    reason="no environment with llm-compressor (bash .ci/setup makes .venv-quantize; or set LMSPEC_QUANTIZE_PYTHON)",
)
