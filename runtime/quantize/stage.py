"""`lmspec run BUILD --stage quantize`: the converted model calibrated by llm-compressor, measured, then published.

Order, each step refusing before the next costs anything:
1. the build quantizes (quantize set), the converted model is at convert.output, quantize.output is free or
   lmspec's own, and an interpreter with llm-compressor is found (LMSPEC_QUANTIZE_PYTHON, else this one);
2. the calibration and held-back sequences are read (runtime/quantize/calibration.py) into
   runs/<name>/quantize_stage/sequences.safetensors;
3. runtime/quantize/worker.py calibrates, writes the compressed-tensors checkpoint into a staging directory
   beside quantize.output and measures both models (its output in runs/<name>/quantize_stage/quantize.log);
4. the quality report (runs/<name>/quantize_stage/lmspec-quality.json and quality.md) is written whatever the
   verdict; a perplexity increase beyond quantize.max_perplexity_increase fails the stage (exit 1) and the
   staging directory is discarded, so nothing the serve stage could pick up was published;
5. otherwise the checkpoint, its quality record inside, takes quantize.output's place in one rename
   (compiler/build/atomic.py replace_directory): a killed stage leaves the previous checkpoint as it was.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from lmspec.compiler.build.atomic import replace_directory
from lmspec.compiler.build.files import QUALITY_JSON, QUALITY_MD, QUANTIZE_DIR, QUANTIZE_LOG
from lmspec.compiler.build.ownership import QUANTIZED, require_replaceable
from lmspec.compiler.build.reader import Build
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, UsageError
from lmspec.compiler.quantize_modules import kept_modules
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.compiler.spec.sections.quantize import QuantizeSpec
from lmspec.runtime.process_group import EXIT_SIGINT, EXIT_SIGTERM, Terminated, sigterm_raises, stop_group
from lmspec.runtime.quantize.quality import Quality, quality_markdown

logger = logging.getLogger(__name__)

QUANTIZE_PYTHON_ENV = "LMSPEC_QUANTIZE_PYTHON"  # the interpreter with llm-compressor (.ci/setup: .venv-quantize)
WORKER = Path(__file__).with_name("worker.py")
SEQUENCES = "sequences.safetensors"
REQUEST = "request.json"
RESULT = "result.json"
OUTPUT_LABEL = "quantize.output="
LOG_TAIL_LINES = 30


class QuantizeFailure(Exception):
    """The worker failed, or the quantized model lost more than the spec accepts; the text says which."""


def quantize_section(spec: TrainingSpec, build: Build) -> QuantizeSpec:
    if spec.quantize is None:
        raise UsageError(
            f"{build.root} does not quantize (quantize: null); compile with a quantize preset "
            "(quantize=w4a16_gptq, fp8_dynamic, int8_smoothquant, ...: specs/quantize/)"
        )
    return spec.quantize


def converted_model(build: Build) -> Path:
    source = Path(build.plan.conversion().output)
    if not (source / "config.json").is_file():
        raise UsageError(
            f"quantize needs the converted model at convert.output={source}, which holds no config.json; "
            f"run `lmspec run {build.root} --stage convert` first"
        )
    return source


def interpreter() -> str:
    """The Python that runs the worker: $LMSPEC_QUANTIZE_PYTHON, else this one when it has llm-compressor."""
    named = os.environ.get(QUANTIZE_PYTHON_ENV)
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise UsageError(
                f"{QUANTIZE_PYTHON_ENV}={named} is not an executable file; name the python of an "
                "environment with llm-compressor (bash .ci/setup makes .venv-quantize)"
            )
        return named
    if importlib.util.find_spec("llmcompressor") is not None:
        return sys.executable
    raise UsageError(
        "llm-compressor is not installed with lmspec (vLLM pins the compressed-tensors release it reads, "
        f"llm-compressor the one it writes, so it lives in an environment of its own): set {QUANTIZE_PYTHON_ENV} "
        "to that environment's python, e.g. .venv-quantize/bin/python (bash .ci/setup makes it; or "
        "python3 -m venv .venv-quantize && .venv-quantize/bin/pip install -e '.[quantize]')"
    )


def run_stage(build: Build, options: argparse.Namespace) -> int:
    spec = build.training()
    q = quantize_section(spec, build)
    source, output = converted_model(build), Path(q.output)
    require_replaceable(output, QUANTIZED, OUTPUT_LABEL)  # refused before any sequence is read
    python = interpreter()
    work = Path(build.plan.paths.run_dir) / QUANTIZE_DIR
    command = [python, str(WORKER), str(work / REQUEST)]
    if options.dry_run:
        print(f"would quantize {source} into {output} ({q.scheme}, {q.method}): {shlex.join(command)}")
        return EXIT_OK
    from lmspec.runtime.quantize.calibration import held_out

    work.mkdir(parents=True, exist_ok=True)
    sequences = held_out(spec, q, Path(build.plan.paths.run_dir))
    _save_sequences(work / SEQUENCES, sequences.calibration, sequences.evaluation)
    logger.info(
        f"quantize: {q.scheme} ({q.method}) of {source}: {len(sequences.calibration)} calibration and "
        f"{len(sequences.evaluation)} held-back sequences of {q.calibration.seq_length} tokens from {sequences.source}"
    )
    try:
        with replace_directory(output, QUANTIZED, OUTPUT_LABEL) as staging:
            request = _request(spec, q, source, staging, work)
            (work / REQUEST).write_text(json.dumps(request, indent=2, sort_keys=True) + "\n")
            result = _run_worker(command, work)
            quality = Quality.of(q, result, sequences.source)
            _write_quality(quality, work, staging)
            if not quality.accepted:
                raise QuantizeFailure(quality.refusal())
    except QuantizeFailure as exc:
        logger.error(f"quantize: FAILED: {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        logger.warning("\nquantize: interrupted; nothing published")
        return EXIT_SIGINT
    except Terminated:
        return EXIT_SIGTERM
    logger.info(quality.summary())
    logger.info(
        f"quantize: wrote {output} (report {work / QUALITY_MD}); serve it: lmspec run {build.root} --stage serve"
    )
    return EXIT_OK


def _save_sequences(path: Path, calibration: Any, evaluation: Any) -> None:
    from safetensors.torch import save_file

    temporary = path.with_name(path.name + ".tmp")
    save_file({"calibration": calibration.contiguous(), "evaluation": evaluation.contiguous()}, str(temporary))
    os.replace(temporary, path)


def _request(spec: TrainingSpec, q: QuantizeSpec, source: Path, staging: Path, work: Path) -> dict[str, Any]:
    return {
        "model": str(source.resolve()),
        "output": str(staging.resolve()),
        "tokens": str((work / SEQUENCES).resolve()),
        "result": str((work / RESULT).resolve()),
        "scheme": q.scheme,
        "method": q.method,
        "group_size": q.group_size,
        "smoothquant_strength": q.smoothquant_strength,
        "ignore": list(kept_modules(spec)),
    }


def _run_worker(command: list[str], work: Path) -> dict[str, Any]:
    """The worker in its own process group, its output in quantize.log; its result, or QuantizeFailure."""
    result_path = work / RESULT
    result_path.unlink(missing_ok=True)
    log_path = work / QUANTIZE_LOG
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        with sigterm_raises():
            code = proc.wait()
    except (KeyboardInterrupt, Terminated):
        stop_group(proc, sweep=True)
        raise
    if code != 0 or not result_path.is_file():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        raise QuantizeFailure(f"llm-compressor's worker exited with {code}; the end of {log_path}:\n{tail}")
    result: dict[str, Any] = json.loads(result_path.read_text())
    return result


def _write_quality(quality: Quality, work: Path, staging: Path) -> None:
    text = json.dumps(quality.as_dict(), indent=2, sort_keys=True) + "\n"
    (work / QUALITY_JSON).write_text(text)
    (work / QUALITY_MD).write_text(quality_markdown(quality))
    if quality.accepted:
        (staging / QUALITY_JSON).write_text(text)
