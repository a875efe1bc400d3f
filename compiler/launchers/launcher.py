"""What a launcher is: how `lmspec run` gets a build's processes onto machines, and how it stops them.

A launcher is one module here (lmspec.compiler.launchers.<name>) holding one `Launcher`; the registry in
lmspec.compiler.launchers names it. Everything outside those modules asks the record (`launcher_of(spec.cluster)`)
instead of comparing `cluster.launcher` with a name, so a new launcher is a new module and a row, not an edit
of every rule, emitter and runtime stage that branches on it (tests/compiler/test_plugin_names.py holds that).
The record is plain data and functions: no torch, and the rule contexts are only types here, so the rules,
the emitters, the doctor and the runtime can all import the registry without importing each other.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmspec.compiler.errors import Problem

if TYPE_CHECKING:  # the rules package imports the registry to run these: only types cross back
    from lmspec.compiler.plan import Plan
    from lmspec.compiler.rules.context import RuleContext, TrainingContext

    Rule = Callable[[RuleContext], Iterator[Problem]]
    TrainingRule = Callable[[TrainingContext], Iterator[Problem]]


@dataclass(frozen=True)
class Launcher:
    """One value of `cluster.launcher`; each field is what some rule, emitter or stage asks of it."""

    name: str  # its `cluster.launcher` value, the registry's key
    # the spec group only this launcher reads ("cluster.slurm"), or None; every spec has it (defaults), so
    # its `rules` judge it whatever the launcher: a spec compiled for one launcher stays valid for the other
    section: str | None
    rules: tuple[Rule, ...]  # judge `section` in every spec (lmspec.compiler.rules.launch.RULES)
    training_rules: tuple[TrainingRule, ...]  # only when it is the spec's launcher and the spec trains
    # how `lmspec run` starts a build under it: "module:attribute" of its lmspec.runtime.launchers.LauncherRuntime
    # (named, not imported: the compiler never imports the runtime)
    runtime: str
    serve_instructions: Callable[[Plan], str]  # REPORT.md's serving "run" row: what starts the engine, where
    serve_files: tuple[str, ...]  # build files only it emits for serving (lmspec.compiler.emit.serve)
    # "module:function", (Plan, the build's other files) -> {build file: text}: the files only it writes, made
    # after every other emitter's (lmspec.compiler.emit.emit_all; Kubernetes' pods list the files they mount);
    # named like `runtime`: its emitters are the compiler's, and the runtime, which imports this record, must not
    # import them (lmspec.compiler.contract). None = no files of its own.
    files: str | None
    # (Plan, every file of the finished build, manifest.json included) -> {build file: text}: files made from
    # the build itself, so the manifest cannot list them (lmspec.compiler.emit.manifest.build_files); a pure
    # function of files the manifest lists, which `lmspec run` calls again to compare. None = none.
    carries: Callable[[Plan, dict[str, str]], dict[str, str]] | None
    # "module:function", Plan -> (heading, rows) of REPORT.md's section on what it starts; None = no section
    report: str | None
    container: bool  # runs every node's processes in cluster.slurm.container's image (pyxis on srun)
    # what asks the trainer to checkpoint and exit for requeue (runtime/train/signals.py handles each): Slurm's
    # `--signal=B:USR1@N` before the time limit, forwarded by sbatch.sh; lmspec run's own stop of a local group
    stop_signal: signal.Signals
    # module holding SIGNATURES, its `lmspec doctor` signatures (a module path: the doctor imports the
    # registry, so the registry must not import the doctor)
    doctor_module: str | None
