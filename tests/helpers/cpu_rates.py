"""This machine's matrix-multiply rate and memory bandwidth, measured with torch as vLLM's CPU engine meets them.

What the serving model calls `hardware.gpu.bf16_tflops` and `hbm_gb_per_s` on `hardware=cpu` (fp32 there),
through the kernel vLLM 0.32 runs an fp32 Llama's linear layers with on x86 (`vllm._custom_ops.onednn_mm`,
vllm/model_executor/layers/utils.py dispatch_cpu_unquantized_gemm; torch.nn.functional.linear without oneDNN):

- gemm: a model's four linear layers (qkv, o, gate_up, down, as vLLM fuses them) at a prefill's token count:
  their FLOPs over their summed time;
- read: the same kernel at one token (a decode step's GEMV) cycling over a set of layer weights larger than
  the last-level cache: weight bytes over time, the rate decode reads weights at;
- own_read: the same over the window's own model's weights (the tiny model's 9 MB sit in the 32 MiB L3);
- stream: one read-only pass (`sum`) over 256 MiB, the plain memory bandwidth, for comparison.

A `Bench` is prepared once (weights, oneDNN handles) and sampled between the engine's timed rounds, so the
rates come from the same minutes (and the same neighbours on a shared machine) as the times they predict.
Each sample is the fastest of SAMPLE_RUNS back-to-back runs (timeit's rule: slower runs are interference).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

SAMPLE_RUNS = 3
STREAM_BYTES = 256 * 2**20  # 8x this machine's 32 MiB L3
FP32_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class LinearDims:
    """The widths of a Llama's linear layers (what a GEMM's K and N are)."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int

    def weights(self) -> list[tuple[int, int]]:
        """(out, in) of one layer's qkv, o, gate_up and down, as vLLM fuses them."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [(q + 2 * kv, self.hidden), (self.hidden, q), (2 * self.ffn, self.hidden), (self.hidden, self.ffn)]


@dataclass(frozen=True, kw_only=True)
class Rates:
    """Samples of one window (medians as properties)."""

    gemm_tokens: int
    gemm: list[float]  # FLOP/s
    read_bytes: int  # the GEMV working set
    read: list[float]  # bytes/s
    own_read_bytes: int
    own_read: list[float]  # bytes/s
    stream: list[float]  # bytes/s

    @property
    def gemm_flops_per_s(self) -> float:
        return statistics.median(self.gemm)

    @property
    def read_bytes_per_s(self) -> float:
        return statistics.median(self.read)

    @property
    def own_read_bytes_per_s(self) -> float:
        return statistics.median(self.own_read)

    @property
    def stream_bytes_per_s(self) -> float:
        return statistics.median(self.stream)


def fastest(run: Callable[[], object], runs: int = SAMPLE_RUNS) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def linear_kernel() -> tuple[str, Callable[[Any, Any], Callable[[], object]]]:
    """vLLM's fp32 linear on this CPU as a factory (input, weight) -> call, and its name."""
    import torch

    try:
        from vllm import _custom_ops as ops

        if ops._supports_onednn:

            def onednn(x: torch.Tensor, w: torch.Tensor) -> Callable[[], object]:
                handler = ops.create_onednn_mm(w.t(), 32)
                return lambda: ops.onednn_mm(handler, x, None)

            return "vllm onednn_mm", onednn
    except ImportError:
        pass
    return "torch.nn.functional.linear", lambda x, w: lambda: torch.nn.functional.linear(x, w)


def _chain(calls: Sequence[Callable[[], object]]) -> Callable[[], None]:
    def run() -> None:
        for call in calls:
            call()

    return run


class Bench:
    """GEMMs of `dims` at `tokens`, GEMVs over `read_dims`' and `dims`' weights (all layers), a stream buffer."""

    def __init__(self, dims: LinearDims, tokens: int, read_dims: LinearDims) -> None:
        import torch

        self.kernel, make = linear_kernel()
        self.tokens = tokens
        self.gemm_flops = sum(2 * tokens * n * k for n, k in dims.weights())
        self._gemm = _chain([make(torch.randn(tokens, k), torch.randn(n, k)) for n, k in dims.weights()])
        gemv: dict[str, Callable[[], None]] = {}
        self.bytes: dict[str, int] = {}
        for name, of in (("read", read_dims), ("own_read", dims)):
            shapes = of.weights() * of.layers
            self.bytes[name] = sum(n * k * FP32_BYTES for n, k in shapes)
            gemv[name] = _chain([make(torch.randn(1, k), torch.randn(n, k)) for n, k in shapes])
        self._read, self._own_read = gemv["read"], gemv["own_read"]
        self._buffer = torch.ones(STREAM_BYTES // FP32_BYTES)
        self.samples: dict[str, list[float]] = {"gemm": [], "read": [], "own_read": [], "stream": []}
        self.sample(keep=False)  # oneDNN primitives, first touch

    def sample(self, keep: bool = True) -> None:
        gemm, read, own = fastest(self._gemm), fastest(self._read), fastest(self._own_read)
        stream = fastest(self._buffer.sum)
        if keep:
            self.samples["gemm"].append(self.gemm_flops / gemm)
            self.samples["read"].append(self.bytes["read"] / read)
            self.samples["own_read"].append(self.bytes["own_read"] / own)
            self.samples["stream"].append(STREAM_BYTES / stream)

    def rates(self) -> Rates:
        return Rates(
            gemm_tokens=self.tokens,
            read_bytes=self.bytes["read"],
            own_read_bytes=self.bytes["own_read"],
            **self.samples,
        )
