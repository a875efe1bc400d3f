"""The child process of vllm_timing.measure: the engines, stepped by hand, and the rates between rounds.

    python tests/helpers/vllm_timing_child.py CONFIG.json OUT.json   (vllm_timing.measure writes CONFIG)

Run with vllm_timing.child_env (vLLM's core in this process, OMP_NUM_THREADS pinned); vllm_timing's
docstring says what is measured and how.
"""

from __future__ import annotations

import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: tests/ on the path, not helpers/ (its tokenizers.py shadows a package)
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from helpers.cpu_rates import Bench, linear_kernel
from helpers.vllm_timing import (
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    NICE,
    PROBE,
    PROMPT_IDS,
    Point,
    Run,
    Shape,
    Timed,
    Window,
    is_cold,
)


class _Engine:
    """vLLM's offline engine on one model directory, stepped by hand."""

    def __init__(self, directory: str) -> None:
        from vllm import LLM

        self.llm = LLM(
            directory,
            dtype="float32",
            enforce_eager=True,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            enable_prefix_caching=False,
            distributed_executor_backend="uni",
            disable_log_stats=False,
            seed=0,
        )
        self.requests = 0

    def run(
        self, point: Point, rng: random.Random, before_step: Callable[[], object] | None = None
    ) -> tuple[float, float, float, float]:
        """(TTFT, median decode step, vLLM's TTFT, vLLM's TPOT) of one batch started together; `before_step`
        runs untimed before the batch is queued and before each later step."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        engine = self.llm.llm_engine
        params = SamplingParams(max_tokens=point.output, min_tokens=point.output, ignore_eos=True, temperature=0)
        if before_step:
            before_step()
        start = time.perf_counter()
        for _ in range(point.batch):
            self.requests += 1
            prompt = TokensPrompt(prompt_token_ids=rng.choices(PROMPT_IDS, k=point.prompt))
            engine.add_request(str(self.requests), prompt, params)
        ttft, steps, finished = 0.0, [], []
        while engine.has_unfinished_requests():
            if before_step and ttft:
                before_step()
            began = time.perf_counter()
            outputs: list[Any] = engine.step()
            ended = time.perf_counter()
            if not ttft and any(o.outputs and o.outputs[0].token_ids for o in outputs):
                ttft = ended - start
            else:
                steps.append(ended - began)
            finished += [o for o in outputs if o.finished]
        stats: list[Any] = [o.metrics for o in finished]
        if len(finished) != point.batch or any(
            s is None or len(o.outputs[0].token_ids) != point.output for s, o in zip(stats, finished, strict=True)
        ):
            raise RuntimeError(f"{point}: {len(finished)} requests finished, short or without stats")
        vllm_ttft = statistics.median(s.first_token_ts - s.queued_ts for s in stats)
        vllm_tpot = statistics.median((s.last_token_ts - s.first_token_ts) / max(point.output - 1, 1) for s in stats)
        return ttft, statistics.median(steps) if steps else 0.0, vllm_ttft, vllm_tpot

    def close(self) -> None:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        del self.llm
        gc.collect()
        destroy_model_parallel()
        destroy_distributed_environment()


def last_level_cache_bytes() -> int:
    """The largest cache sysfs lists for CPU 0 (0 where it lists none)."""
    sizes = [0]
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        size = (index / "size").read_text().strip()  # "32768K"
        sizes.append(int(size.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1))
    return max(sizes)


def _window(
    shape: Shape,
    directory: str,
    points: list[Point],
    rounds: int,
    bench: Bench | None,
    before_step: Callable[[], object] | None,
) -> Window:
    rng = random.Random(0)
    engine = _Engine(directory)
    runs: dict[Point, list[list[float]]] = {p: [[], [], [], []] for p in points}
    for round_ in range(rounds + 1):  # round 0 warms every shape (oneDNN primitives, allocator) untimed
        if bench is not None and round_:
            bench.sample()
            # The sample streams hundreds of MB through the caches: one untimed point brings the engine's
            # weights and host structures back, or the round's first point is timed cold (~2 ms more TTFT).
            engine.run(points[0], rng)
        for point in points:
            figures = engine.run(point, rng, before_step)
            if round_:
                for into, figure in zip(runs[point], figures, strict=True):
                    into.append(figure)
    engine.close()
    timed = [
        Timed(model=shape.name, point=p, ttft_runs=a, tpot_runs=b, vllm_ttft_runs=c, vllm_tpot_runs=d)
        for p, (a, b, c, d) in runs.items()
    ]
    return Window(shape=shape, rates=bench.rates() if bench else None, timed=timed)


def child(config_path: Path, out_path: Path) -> None:
    import torch

    began = time.monotonic()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except PermissionError:
        pass
    config = json.loads(config_path.read_text())
    models = [(Shape(**m["shape"]), m["dir"], [Point(**p) for p in m["points"]]) for m in config["models"]]
    measured = [s for s, _, _ in models if not s.name.startswith(PROBE)]
    largest = max(measured, key=Shape.weight_bytes)  # its weights, all layers, are the GEMV read set
    load_before = os.getloadavg()
    weight_stream = torch.ones(largest.weight_bytes() // 4)  # what a decode step of it reads
    windows = []
    for shape, directory, points in models:
        bench = None
        if not shape.name.startswith(PROBE):
            tokens, rows = [p.batch * p.prompt for p in points], [p.batch for p in points]
            bench = Bench(shape.dims(), tokens, largest.dims(), rows)
        before_step = weight_stream.sum if is_cold(shape) else None
        windows.append(_window(shape, directory, points, config["rounds"], bench, before_step))
    run = Run(
        threads=torch.get_num_threads(),
        nice=os.getpriority(os.PRIO_PROCESS, 0),
        gemm_kernel=linear_kernel()[0],
        windows=windows,
        load_before=load_before,
        load_after=os.getloadavg(),
        seconds=time.monotonic() - began,
        cache_bytes=last_level_cache_bytes(),
    )
    out_path.write_text(json.dumps(run.to_json(), indent=1))


if __name__ == "__main__":
    child(Path(sys.argv[1]), Path(sys.argv[2]))
