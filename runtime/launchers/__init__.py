"""How `lmspec run` starts a build under each launcher: the runtime half of lmspec.compiler.launchers.

The compiler's `Launcher` names its runtime record as "module:attribute" (`Launcher.runtime`), so the
compiler never imports the runtime; here that name becomes the record, imported on first use. The stages
(runtime/train/launch.py, runtime/convert/import_stage.py, runtime/serve/stage.py) do what every launcher
shares (the manifest check of the scripts, the data preflight, the dry run's command line, the smoke
checks of the scripts) and ask the record for the rest, so a new launcher is a module here and a field of
its compiler record, not a branch in each stage. A record compares no launcher name: it is the launcher.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lmspec.compiler.backends.backend import load
from lmspec.compiler.build.reader import Build
from lmspec.compiler.launchers import launcher_of
from lmspec.compiler.models.serve_layout import ServeLayout
from lmspec.compiler.spec.sections import ClusterSpec, TrainingSpec
from lmspec.runtime.smoke_checks import Check

Env = dict[str, str]


@dataclass(frozen=True)
class LauncherRuntime:
    """What starting a build's processes means under one launcher; each field is what a stage asks of it."""

    # training, and `--stage import` (launch/torchrun.sh's `import` entry, started the same way):
    # (the build's absolute path, torchrun.sh's ENTRY ARGS...) -> the command that runs it on every node to its end
    command: Callable[[Path, tuple[str, ...]], list[str]]
    dry_run_lines: tuple[str, ...]  # what a dry run prints after that command: how the job is then followed
    run: Callable[[list[str], Env, str], int]  # (command, env, spec name) -> the job's exit code, once it ended
    # (build, env) -> True when this machine cannot start the job and the launcher printed what to run on
    # each node instead; then nothing is checked or started
    prints_node_commands: Callable[[Build, Env], bool]
    # (build path, spec, env) -> whether the ranks it starts here can run the build (what is not checked by the
    # ranks themselves before they start); False after reporting why
    ranks_ready: Callable[[Path, TrainingSpec, Env], bool]
    smoke_checks: Callable[[Path], list[Check]]  # build path -> `--smoke`'s checks beyond the scripts' syntax
    # serving: the build files bash and vLLM read for this layout (checked against the manifest first)
    engine_files: Callable[[ServeLayout], tuple[str, ...]]
    # (build, env, the $LMSPEC_VLLM assignment a shown command starts with, options) -> the serve stage's exit code
    start_serving: Callable[[Build, Env, str, argparse.Namespace], int]
    # a launcher whose training is objects a cluster's own controllers start (Kubernetes): (build, options) -> the
    # train stage's exit code, the launcher checking and handing over the whole job itself; nothing of this
    # machine's (its data, its interpreter, torchrun) is asked. None: the stage checks them and starts `command`
    submit_training: Callable[[Build, argparse.Namespace], int] | None = None


def runtime_of(cluster: ClusterSpec) -> LauncherRuntime:
    """The spec's launcher's runtime record (its compiler record's `runtime`)."""
    runtime: LauncherRuntime = load(launcher_of(cluster).runtime)
    return runtime
