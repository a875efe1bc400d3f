"""Megatron-LM text logs.

Formats read from NVIDIA/Megatron-LM `megatron/training/training.py::training_log`:
`` [2025-08-01 07:19:37.123456] iteration       10/    5000 | consumed samples: ... |
elapsed time per iteration (ms): 12936.1 | throughput per GPU (TFLOP/s/GPU): 118.7 |
learning rate: 1.395349E-07 | global batch size:   128 | lm loss: 1.044022E+01 |
loss scale: 1.0 | grad norm: 26.305 | number of skipped iterations:   0 |
number of nan iterations:   0 |`` (older releases print the learning rate as ``{:.3E}`` and
no timestamp; Megatron-DeepSpeed adds ``samples per second: 1.886 | TFLOPs: 78.46 |``; GPT-NeoX and
its forks print `` samples/sec: 51.234 | iteration  10/  50 | ... | approx flops per GPU: 150.3TFLOPS |
lm_loss: 7.123456E+00 |``, a field before the iteration and FLOP/s with a unit), and
`megatron/training/utils/common_utils.py::report_memory`:
``[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max allocated: 5678.90 | ...``.
A NaN loss is not printed (``if avg >= 0.0``); ``number of nan iterations`` counts it.
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.metrics_record import StepMetrics, digits_int, field_value, finite_int

_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*\d+\s*\|(.*)$")
_MEMORY = re.compile(r"\[Rank \d+\] \(after \d+ iterations\) memory \(MB\) \|(.*)$")
_MIB_BYTES = 1024 * 1024

# Megatron field name -> (record field, scale applied to the value)
_FIELDS: dict[str, tuple[str, float]] = {
    "elapsed time per iteration (ms)": ("step_time_s", 1e-3),
    "learning rate": ("lr", 1.0),
    "global batch size": ("global_batch_size", 1.0),
    "lm loss": ("loss", 1.0),
    "loss scale": ("loss_scale", 1.0),
    "grad norm": ("grad_norm", 1.0),
    "throughput per gpu (tflop/s/gpu)": ("tflops_per_gpu", 1.0),
    "tflops": ("tflops_per_gpu", 1.0),  # Megatron-DeepSpeed: ``TFLOPs: 78.46``
    "samples per second": ("samples_per_s", 1.0),  # Megatron-DeepSpeed
    "samples/sec": ("samples_per_s", 1.0),  # GPT-NeoX
    "lm_loss": ("loss", 1.0),  # GPT-NeoX
    "approx flops per gpu": ("tflops_per_gpu", 1.0),  # GPT-NeoX, as human_readable_flops writes it
    "number of nan iterations": ("nan_iterations", 1.0),
}
_FLOPS = re.compile(r"([\d.]+)\s*([KMGTPE]?)FLOPS")  # GPT-NeoX's human_readable_flops: 150.3TFLOPS
_TERA_PER_PREFIX = {"": 1e-12, "K": 1e-9, "M": 1e-6, "G": 1e-3, "T": 1.0, "P": 1e3, "E": 1e6}


def _fields(rest: str) -> dict[str, str]:
    pairs = {}
    for part in rest.split("|"):
        name, sep, value = part.rpartition(":")
        if sep:
            pairs[name.strip().lower()] = value.strip()
    return pairs


def parse_megatron_line(text: str, lineno: int) -> StepMetrics | None:
    # _ITERATION.search(text), tried only where "iteration" starts (its leading \b makes search()
    # try every position of the line: 30 us for a Megatron line, against 1 us)
    at = text.find("iteration")
    match = None
    while at >= 0 and match is None:
        match = _ITERATION.match(text, at)
        at = text.find("iteration", at + 1)
    if not match:
        return None
    step = digits_int(match.group(1))
    if step is None:
        return None
    values: dict[str, float | int] = {}
    fields = _fields(match.group(2))
    if "samples/sec" in text[: match.start()]:  # GPT-NeoX's one field before the iteration
        fields.update(_fields(text[: match.start()]))
    for name, shown in fields.items():
        target = _FIELDS.get(name)
        if target is None:
            continue
        try:
            number = float(shown) * target[1]  # float() reads Megatron's "NAN" / "INF" too
        except ValueError:
            flops = _FLOPS.fullmatch(shown)
            if flops is None:
                continue
            number = float(flops.group(1)) * _TERA_PER_PREFIX[flops.group(2)]
        if (value := field_value(target[0], number)) is not None:
            values[target[0]] = value
    return StepMetrics.of(step, lineno, values)


def parse_megatron_memory(text: str) -> int | None:
    """Peak bytes (max allocated) from a report_memory line."""
    if "memory (MB)" not in text:
        return None
    match = _MEMORY.search(text)
    if not match:
        return None
    value = _fields(match.group(1)).get("max allocated")
    try:
        return finite_int(float(value) * _MIB_BYTES) if value is not None else None
    except ValueError:
        return None
