"""This machine's matrix-multiply rate and memory bandwidth, measured with torch as vLLM's CPU engine meets them.

What the serving model calls `hardware.gpu.bf16_tflops` and `hbm_gb_per_s` on `hardware=cpu` (fp32 there),
through the kernel vLLM 0.32 runs an fp32 Llama's linear layers with on x86 (`vllm._custom_ops.onednn_mm`,
vllm/model_executor/layers/utils.py dispatch_cpu_unquantized_gemm; torch.nn.functional.linear without oneDNN):

- gemm: a model's four linear layers (qkv, o, gate_up, down, as vLLM fuses them) at each prefill's token
  count: their FLOPs over their summed time (oneDNN at 32 rows reaches ~0.8 of its rate at 256: the rate at
  the point's own rows is what its prefill meets);
- read: the same kernel at a decode step's rows (one per sequence: 1, the GEMV, and each batch a point
  decodes) cycling over a set of layer weights larger than the last-level cache: weight bytes over time, the
  rate decode reads weights at. A CPU kernel at 8 rows is neither the GEMV's bandwidth nor the GEMM's rate
  (oneDNN reaches ~0.65 of the GEMV's bytes/s at 8 rows on a 2-core EPYC, whose GEMM/bandwidth ridge is
  ~6 FLOP/byte against fp32 decode's 2 x rows / 4): the rate at the point's own rows is what its steps meet;
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

    gemm: dict[int, list[float]]  # rows (prompt tokens of a prefill step) -> FLOP/s
    read_bytes: int  # the decode working set
    read: dict[int, list[float]]  # rows (sequences decoding) -> bytes/s
    own_read_bytes: int
    own_read: list[float]  # bytes/s
    stream: list[float]  # bytes/s

    @property
    def gemm_tokens(self) -> int:
        """The middle prefill's rows: the one GEMM rate a machine's constants state."""
        return statistics.median_low(self.gemm)

    @property
    def gemm_flops_per_s(self) -> float:
        return self.prefill_flops_per_s(self.gemm_tokens)

    def prefill_flops_per_s(self, tokens: int) -> float:
        return statistics.median(self.gemm[tokens])

    @property
    def read_bytes_per_s(self) -> float:
        """The GEMV's rate: the machine's weight-read bandwidth."""
        return self.decode_read_bytes_per_s(1)

    def decode_read_bytes_per_s(self, rows: int) -> float:
        return statistics.median(self.read[rows])

    @property
    def own_read_bytes_per_s(self) -> float:
        return statistics.median(self.own_read)

    @property
    def stream_bytes_per_s(self) -> float:
        return statistics.median(self.stream)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Rates:
        by_rows = {key: {int(rows): rates for rows, rates in d[key].items()} for key in ("gemm", "read")}
        return Rates(**{**d, **by_rows})


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
    """GEMMs of `dims` at each of `tokens`; decode steps of each of `rows` (1 always) over `read_dims`' weights
    and GEMVs over `dims`' (all layers); a stream buffer."""

    def __init__(self, dims: LinearDims, tokens: Sequence[int], read_dims: LinearDims, rows: Sequence[int]) -> None:
        import torch

        self.kernel, make = linear_kernel()
        layer = [torch.randn(n, k) for n, k in dims.weights()]  # one layer's, at every token count
        self.gemm_flops = {m: sum(2 * m * n * k for n, k in dims.weights()) for m in sorted(set(tokens))}
        self._gemm = {m: _chain([make(torch.randn(m, w.shape[1]), w) for w in layer]) for m in self.gemm_flops}
        read_shapes, own_shapes = read_dims.weights() * read_dims.layers, dims.weights() * dims.layers
        self.read_bytes = sum(n * k * FP32_BYTES for n, k in read_shapes)
        self.own_read_bytes = sum(n * k * FP32_BYTES for n, k in own_shapes)
        read_weights = [torch.randn(n, k) for n, k in read_shapes]  # one copy, read at every row count
        self._read = {
            m: _chain([make(torch.randn(m, w.shape[1]), w) for w in read_weights]) for m in sorted({1, *rows})
        }
        self._own_read = _chain([make(torch.randn(1, k), torch.randn(n, k)) for n, k in own_shapes])
        self._buffer = torch.ones(STREAM_BYTES // FP32_BYTES)
        self.gemm: dict[int, list[float]] = {m: [] for m in self._gemm}
        self.read: dict[int, list[float]] = {m: [] for m in self._read}
        self.own_read: list[float] = []
        self.stream: list[float] = []
        self.sample(keep=False)  # oneDNN primitives, first touch

    def sample(self, keep: bool = True) -> None:
        gemm = {m: fastest(run) for m, run in self._gemm.items()}
        read = {m: fastest(run) for m, run in self._read.items()}
        own, stream = fastest(self._own_read), fastest(self._buffer.sum)
        if keep:
            for m, seconds in gemm.items():
                self.gemm[m].append(self.gemm_flops[m] / seconds)
            for m, seconds in read.items():
                self.read[m].append(self.read_bytes / seconds)
            self.own_read.append(self.own_read_bytes / own)
            self.stream.append(STREAM_BYTES / stream)

    def rates(self) -> Rates:
        return Rates(
            gemm=self.gemm,
            read_bytes=self.read_bytes,
            read=self.read,
            own_read_bytes=self.own_read_bytes,
            own_read=self.own_read,
            stream=self.stream,
        )
