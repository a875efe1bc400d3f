"""vLLM's CPU engine timed on this machine, beside lmspec's serving model priced with the CPU parameters
measured in the same run (issue 41's CPU check, tests/serve/test_serve_cpu_timing.py, as a table).

    .venv/bin/python bench/serve_cpu.py [--rounds 5] [--threads 1] [--out DIR] [--from DIR/timing.json]

Times the tiny model (specs/model/tiny.yaml) and a 100 MB random Llama (hidden 768, 4 layers, fp32) at
batch 1/4/8 x prompt 32/128/256 tokens (outputs 16-64), all requests of a batch started together, in one
child process (tests/helpers/vllm_timing.py says how); the CPU parameters are microbenchmarks of vLLM's
own fp32 kernel sampled between the rounds and two probe models' overheads, never the timed points
(tests/helpers/vllm_timing_predict.py says which parameter is which). Prints the parameters, each point's
median TTFT and TPOT with their spread over the rounds, vLLM's own TPOT (its engine timestamps), the
prediction and predicted/measured. DIR/timing.json keeps the run; --from prices a kept run again
without timing anything. --write records the run's CPU constants in compiler/models/serve_calibration.json
(its "cpu" part), relative to the cpu hardware preset's rates, for `lmspec explain` of a CPU serving job.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # helpers.vllm_timing: the measurement the test runs

from helpers.vllm_timing import Run, measure  # noqa: E402
from helpers.vllm_timing_predict import TOLERANCE, cpu_constants, issue_models, predict, table  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the engine and the benchmarks")
    parser.add_argument("--out", type=Path, help="where the models and timing.json go (default a new tmp dir)")
    parser.add_argument("--from", dest="source", type=Path, help="a kept timing.json: price it, time nothing")
    parser.add_argument("--write", action="store_true", help="record the run's CPU constants for CPU jobs")
    args = parser.parse_args(argv)
    if args.source:
        work = args.source.parent
        run = Run.from_json(json.loads(args.source.read_text()))
    else:
        work = args.out or Path(tempfile.mkdtemp(prefix="serve_cpu_"))
        work.mkdir(parents=True, exist_ok=True)
        run = measure(issue_models(), work, rounds=args.rounds, threads=args.threads)
    if args.write:  # first: a CPU job's plan prices its serving with these
        write_cpu_constants(run)
    compared = predict(run, work)
    print(table(run, compared))
    for name, ratios in (
        ("TTFT", [c.ttft_ratio for c in compared]),
        ("TPOT", [c.tpot_ratio for c in compared]),
    ):
        within = sum(abs(r - 1) <= TOLERANCE for r in ratios)
        print(
            f"{name:12} predicted/measured median {statistics.median(ratios):.3f}, range {min(ratios):.2f}-"
            f"{max(ratios):.2f}, within {TOLERANCE:.0%}: {within}/{len(ratios)}"
        )
    print(f"run kept in {work / 'timing.json'}")
    return 0


def write_cpu_constants(run: Run) -> None:
    """The probes' constants with the efficiencies restated against the cpu preset's bf16_tflops and
    hbm_gb_per_s (the measured rates over them: the median over the measured models' windows)."""
    from lmspec.compiler.models import serve_step
    from lmspec.compiler.spec.load import compose_spec
    from lmspec.compiler.spec.sections import Spec
    from lmspec.compiler.spec.typed import from_dict

    gpu = from_dict(Spec, compose_spec(["hardware=cpu"]).spec).hardware.gpu
    windows = [w.rates for w in run.measured if w.rates is not None]
    gemm = statistics.median(r.gemm_flops_per_s for r in windows)
    read = statistics.median(r.read_bytes_per_s for r in windows)
    measured = cpu_constants(run.overheads_for(run.measured[-1].shape), gemm)
    compute_share, read_share = gemm / (gpu.bf16_tflops * 1e12), read / (gpu.hbm_gb_per_s * 1e9)
    constants = dataclasses.replace(
        measured,
        compute_efficiency=compute_share,
        bandwidth_efficiency=read_share,
        decode_attention_efficiency=measured.decode_attention_efficiency * compute_share,
        prefill_attention_efficiency=measured.prefill_attention_efficiency * compute_share,
    )
    path = Path(serve_step.__file__).with_name(serve_step.CALIBRATION_FILE)
    document = json.loads(path.read_text(encoding="utf-8"))
    document["cpu"] = {
        "about": "vLLM's CPU backend on the machine that ran the command, relative to specs/hardware/cpu.yaml",
        "command": ".venv/bin/python bench/serve_cpu.py --write",
        "threads": run.threads,
        "gemm_gflops_per_s": round(gemm / 1e9, 1),
        "weight_read_gb_per_s": round(read / 1e9, 1),
        "constants": {k: float(f"{v:.3g}") for k, v in dataclasses.asdict(constants).items()},
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} (cpu)")


if __name__ == "__main__":
    raise SystemExit(main())
