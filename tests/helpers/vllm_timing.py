"""TTFT and TPOT of vLLM's CPU engine on random Llamas, with this machine's rates measured in the same run.

`measure(models, work)` runs vllm_timing_child.py as a child process (vLLM's state, threads and memory stay out of the
caller) that writes work/timing.json. One engine at a time, each for a window of rounds:

1. the probes: two models too small to compute anything (hidden 64, 1 and 8 layers) decoding 1 and 8
   sequences and prefilling 2,048 tokens: what a step, a layer and a sequence cost beside the arithmetic;
   the same again cold, a stream of the largest model's weight bytes read before every step (a model larger
   than the last-level cache streams that through it each step, and its host work, ~1 ms a step here, then
   runs from memory: the cold figures price such models); and one of wide heads on hidden 64 at two
   contexts, all else equal: vLLM's CPU attention kernel's rate;
2. each measured model at its points: `batch` requests of `prompt` random tokens, `output` tokens each, all
   submitted at once (vllm bench latency's batch: one prefill step for the whole batch, then decode steps).
   Each round of its window first samples the machine's rates (cpu_rates.Bench: the GEMM rate at each of
   the model's prefill shapes, the weight-read rate of a decode step at each batch over weights larger than
   cache, a plain stream), runs the first point untimed (the sample left the caches cold), then runs every
   point once; one untimed round first warms every shape.

The engine is vLLM's offline engine (`LLM`, driven step by step through its `llm_engine`), float32, eager,
prefix caching off (a repeat must prefill again), its core and worker in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, the "uni" executor): every request of a batch is queued before the first
step, so the batch prefills together, and the torch thread count is the one pinned here (OMP_NUM_THREADS;
vLLM's multiprocess executor on this 2-core machine gives its worker 1 core and keeps 1 for the scheduler).
The child raises its own priority where allowed (nice -10), so other work on a shared machine takes less of
its core (memory bandwidth stays shared: that is why the rates are sampled in the same window).

Per run of a point: TTFT = from queueing the batch to the end of the step that returns its first tokens;
TPOT = the median of its decode steps (a burst of interference on one step does not move it). vLLM's own
figures from its engine timestamps (RequestOutput.metrics, vLLM 0.32's RequestStateStats kept with
disable_log_stats=False: first_token_ts - queued_ts, and (last_token_ts - first_token_ts) / (tokens - 1),
the mean step; a cold probe's includes the untimed stream) are kept beside them. A point's figure is the
median over its rounds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.cpu_rates import LinearDims, Rates

MAX_MODEL_LEN = 512
MAX_NUM_SEQS = 8
MAX_NUM_BATCHED_TOKENS = 2048  # every batch of the points prefills in one step
KV_CACHE_GIB = 1
VOCAB = 512  # the tiny spec's; the byte tokenizer's ids are below 258
PROMPT_IDS = range(3, 250)  # bytes: no end-of-text (256) or pad (257)
CHILD = Path(__file__).with_name("vllm_timing_child.py")
CHILD_TIMEOUT_S = 900.0
THREADS = 1
NICE = -10
PROBE = "probe"  # name prefix of the overhead probes
COLD = "_cold"  # name suffix of a probe stepped after a stream of weights


@dataclass(frozen=True, kw_only=True)
class Shape:
    """A random Llama: the dimensions vLLM and the serving model see."""

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int = VOCAB

    def dims(self) -> LinearDims:
        return LinearDims(
            layers=self.layers,
            hidden=self.hidden,
            ffn=self.ffn,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
        )

    def weight_bytes(self) -> int:
        return 4 * sum(n * k for n, k in self.dims().weights()) * self.layers


@dataclass(frozen=True, kw_only=True)
class Point:
    batch: int
    prompt: int
    output: int

    def __str__(self) -> str:
        return f"b{self.batch} p{self.prompt} o{self.output}"


@dataclass(frozen=True, kw_only=True)
class Timed:
    """One model at one point: one figure per round (ours, and vLLM's from its engine timestamps)."""

    model: str
    point: Point
    ttft_runs: list[float]
    tpot_runs: list[float]  # median decode step of each run
    vllm_ttft_runs: list[float]  # first_token_ts - queued_ts, median over the batch
    vllm_tpot_runs: list[float]  # (last_token_ts - first_token_ts) / (output - 1): the mean step

    @property
    def ttft_s(self) -> float:
        return statistics.median(self.ttft_runs)

    @property
    def tpot_s(self) -> float:
        return statistics.median(self.tpot_runs)

    @staticmethod
    def spread(runs: Sequence[float]) -> float:
        """(max - min) / median over the rounds: the noise the median was taken through."""
        return (max(runs) - min(runs)) / statistics.median(runs) if runs else 0.0


@dataclass(frozen=True, kw_only=True)
class Window:
    """One engine's rounds: its points and the machine's rates sampled between them (none for a probe)."""

    shape: Shape
    rates: Rates | None
    timed: list[Timed]


# Models that hardly compute: a step of them is vLLM's work around the arithmetic.
PROBE_1 = Shape(name=f"{PROBE}_1layer", layers=1, hidden=64, ffn=128, heads=2, kv_heads=2, head_dim=32)
PROBE_8 = dataclasses.replace(PROBE_1, name=f"{PROBE}_8layer", layers=8)
PROBE_DECODE = (Point(batch=1, prompt=16, output=64), Point(batch=8, prompt=16, output=64))
PROBE_PREFILL = (Point(batch=1, prompt=16, output=2), Point(batch=8, prompt=256, output=2))
# Attention's own rate: wide heads on a narrow model, at two contexts with all else equal. Decode: 8 sequences
# at context 16 against 448; prefill: 992 tokens either way, as 2 x 496 (mean prefix 248) against 8 x 124 (62).
PROBE_ATTN = Shape(name=f"{PROBE}_attention", layers=4, hidden=64, ffn=128, heads=16, kv_heads=4, head_dim=64)
ATTN_DECODE = (Point(batch=8, prompt=16, output=32), Point(batch=8, prompt=448, output=32))
ATTN_PREFILL = (Point(batch=8, prompt=124, output=2), Point(batch=2, prompt=496, output=2))


def cold(shape: Shape) -> Shape:
    return dataclasses.replace(shape, name=shape.name + COLD)


def is_cold(shape: Shape) -> bool:
    return shape.name.endswith(COLD)


PROBES = (
    (PROBE_1, PROBE_DECODE + PROBE_PREFILL),
    (PROBE_8, PROBE_DECODE + PROBE_PREFILL),
    (cold(PROBE_1), PROBE_DECODE + PROBE_PREFILL),
    (cold(PROBE_8), PROBE_DECODE + PROBE_PREFILL),
    (PROBE_ATTN, ATTN_DECODE + ATTN_PREFILL),
)


def attention_flops(shape: Shape, queries: float, context: float) -> float:
    """Scores and values of `queries` tokens over `context` keys each, every layer: 2 x 2 x heads x head_dim."""
    return 4 * shape.heads * shape.head_dim * shape.layers * queries * context


@dataclass(frozen=True, kw_only=True)
class Overheads:
    """What vLLM spends beside the arithmetic, from the probes (none of the measured models' points).

    Decode (the probes' median decode step, 1 and 8 layers x 1 and 8 sequences): a step costs
    step_s + layers x layer_s + seqs x seq_s + seqs x (layers - 1) x seq_layer_s. Prefill (the probes' TTFT,
    one 16-token request against 8 x 256 tokens): prefill_s + layers x prefill_layer_s
    + tokens x (prefill_token_s + layers x prefill_token_layer_s), request admission included.
    """

    step_s: float  # per decode step: scheduler, input preparation, sampler, output processing
    layer_s: float  # per decoder layer per decode step: its eager operators' dispatch
    seq_s: float  # per decoding sequence per step, at one layer
    seq_layer_s: float  # per decoding sequence per further layer (the 2x2 design's interaction)
    prefill_s: float  # a prefill step of one short request, beside its layers, from queueing to first token
    prefill_layer_s: float  # per layer of that step
    prefill_token_s: float  # per further prompt token (and its share of admitting requests)
    prefill_token_layer_s: float  # per further prompt token per layer (norms, rope, attention's own kernel)
    attention_decode_flops_per_s: float  # vLLM's CPU attention decoding (cpu_attention_with_kv_cache)
    attention_prefill_flops_per_s: float  # the same kernel over a prompt's causal prefix

    @staticmethod
    def of(timed: Sequence[Timed], cold_steps: bool = False) -> Overheads:
        """The host terms of the warm probes, or of the cold ones (`cold_steps`); attention's from its own."""
        by = {(t.model, t.point): t for t in timed}
        probe_1, probe_8 = (cold(PROBE_1), cold(PROBE_8)) if cold_steps else (PROBE_1, PROBE_8)
        one, many = probe_1.layers, probe_8.layers
        b1, b8 = PROBE_DECODE
        a, b = by[probe_1.name, b1].tpot_s, by[probe_1.name, b8].tpot_s
        c, d = by[probe_8.name, b1].tpot_s, by[probe_8.name, b8].tpot_s
        layer = (c - a) / (many - one)
        seqs = b8.batch - b1.batch
        short, long = PROBE_PREFILL
        tokens = long.batch * long.prompt - short.batch * short.prompt
        p1s, p1l = by[probe_1.name, short].ttft_s, by[probe_1.name, long].ttft_s
        p8s, p8l = by[probe_8.name, short].ttft_s, by[probe_8.name, long].ttft_s
        prefill_layer = (p8s - p1s) / (many - one)
        token_layer = ((p8l - p8s) - (p1l - p1s)) / (tokens * (many - one))
        near, far = ATTN_DECODE
        decode_s = by[PROBE_ATTN.name, far].tpot_s - by[PROBE_ATTN.name, near].tpot_s
        decode_flops = attention_flops(PROBE_ATTN, far.batch, far.prompt - near.prompt)  # the same steps' contexts
        short_prefix, long_prefix = ATTN_PREFILL
        prefill_s = by[PROBE_ATTN.name, long_prefix].ttft_s - by[PROBE_ATTN.name, short_prefix].ttft_s
        prefill_flops = attention_flops(
            PROBE_ATTN, long_prefix.batch * long_prefix.prompt, long_prefix.prompt / 2
        ) - attention_flops(PROBE_ATTN, short_prefix.batch * short_prefix.prompt, short_prefix.prompt / 2)
        return Overheads(
            step_s=a - one * layer,
            layer_s=layer,
            seq_s=(b - a) / seqs,
            seq_layer_s=((d - c) - (b - a)) / (seqs * (many - one)),
            prefill_s=p1s - one * prefill_layer,
            prefill_layer_s=prefill_layer,
            prefill_token_s=(p1l - p1s) / tokens - one * token_layer,
            prefill_token_layer_s=token_layer,
            attention_decode_flops_per_s=decode_flops / decode_s,
            attention_prefill_flops_per_s=prefill_flops / prefill_s,
        )


@dataclass(frozen=True, kw_only=True)
class Run:
    """One child run: the probes' and the models' windows, and what else the machine was doing."""

    threads: int
    nice: int
    gemm_kernel: str
    windows: list[Window]
    load_before: tuple[float, float, float]  # os.getloadavg()
    load_after: tuple[float, float, float]
    seconds: float
    cache_bytes: int  # the last-level cache (0: not known, every model priced cold)

    @property
    def probes(self) -> list[Timed]:
        return [t for w in self.windows if w.shape.name.startswith(PROBE) for t in w.timed]

    @property
    def measured(self) -> list[Window]:
        return [w for w in self.windows if not w.shape.name.startswith(PROBE)]

    @property
    def overheads(self) -> Overheads:
        return Overheads.of(self.probes)

    def overheads_for(self, shape: Shape) -> Overheads:
        """The cold probes' terms for a model whose weights overflow the last-level cache, else the warm."""
        return Overheads.of(self.probes, cold_steps=shape.weight_bytes() > self.cache_bytes)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "overheads": dataclasses.asdict(self.overheads)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Run:
        def window(w: dict[str, Any]) -> Window:
            timed = [Timed(**{**t, "point": Point(**t["point"])}) for t in w["timed"]]
            rates = Rates.from_json(w["rates"]) if w["rates"] else None
            return Window(shape=Shape(**w["shape"]), rates=rates, timed=timed)

        fields = {k: d[k] for k in ("threads", "nice", "gemm_kernel", "seconds", "cache_bytes")}
        return Run(
            **fields,
            windows=[window(w) for w in d["windows"]],
            load_before=tuple(d["load_before"]),
            load_after=tuple(d["load_after"]),
        )


def write_model(shape: Shape, directory: Path, seed: int = 0) -> None:
    """A HuggingFace Llama directory of `shape`, random fp32 weights, with the byte tokenizer."""
    import torch
    import transformers

    from lmspec.runtime.data.byte_tokenizer import EOT_ID, PAD_ID, save_byte_tokenizer

    config = transformers.LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=2 * MAX_MODEL_LEN,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=EOT_ID,
        pad_token_id=PAD_ID,
        dtype="float32",
    )
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(str(directory))
    save_byte_tokenizer(directory)


def child_env(threads: int, cache: Path) -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "OMP_NUM_THREADS": str(threads),
        "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(cache),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def model_dir(work: Path, shape: Shape) -> Path:
    return work / "models" / shape.name.removesuffix(COLD)


def measure(
    models: Sequence[tuple[Shape, Sequence[Point]]], work: Path, rounds: int = 5, threads: int = THREADS
) -> Run:
    """Write the models and the probes under `work`, run the child, read its JSON (work/timing.json)."""
    config: dict[str, Any] = {"threads": threads, "rounds": rounds, "models": []}
    for shape, points in [*PROBES, *models]:
        directory = model_dir(work, shape)
        if not (directory / "config.json").is_file():
            write_model(shape, directory)
        config["models"].append(
            {
                "shape": dataclasses.asdict(shape),
                "dir": str(directory),
                "points": [dataclasses.asdict(p) for p in points],
            }
        )
    (work / "timing_config.json").write_text(json.dumps(config, indent=1))
    log = work / "timing_child.log"
    with log.open("w") as out:
        result = subprocess.run(
            [sys.executable, str(CHILD), str(work / "timing_config.json"), str(work / "timing.json")],
            env=child_env(threads, work / "vllm_cache"),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=CHILD_TIMEOUT_S,
            check=False,
            start_new_session=True,
        )
    if result.returncode != 0:
        raise RuntimeError(f"the timing child exited {result.returncode}:\n{log.read_text()[-4000:]}")
    return Run.from_json(json.loads((work / "timing.json").read_text()))
