"""The directories a run writes, resolved from a working directory, and where they overlap.

Three directories are written at run time, relative to the working directory:

- the run directory `runs/<name>/` (lmspec.compiler.build.files.run_dir): metrics.jsonl (training),
  vllm.log, tokenizer/ and vllm_cache/ (serving);
- `train.checkpoint.dir`: step directories that `keep_last_k` prunes and
  `train.checkpoint.resume=never` moves aside (lmspec.runtime.train.checkpoint);
- `convert.output`: replaced as a whole by every `lmspec run BUILD --stage convert`;
- `quantize.output`: replaced as a whole by every `lmspec run BUILD --stage quantize`, which reads
  convert.output.

So convert.output and train.checkpoint.dir may not be the same directory nor inside one
another (the conversion would delete the checkpoints, or write among them); neither may be the
run directory, contain it, or be one of the run directory's own entries (the conversion would
delete metrics.jsonl; the checkpoint directory would hold the run's logs). Both may live inside
the run directory, as the presets put them (runs/<name>/checkpoints, runs/<name>/hf).
quantize.output keeps apart from both as convert.output does, and from convert.output too (the quantize
stage would delete the model it calibrates, or the conversion the quantized one).
`serve.model_path`, when set, may not be the checkpoint directory nor inside it: what is there
is a training checkpoint (not a HuggingFace model) that keep_last_k deletes under the server.
`train.init_from`, when set, names one step directory (`step_<N>`, lmspec.compiler.build.files) of
another run's checkpoints, never the run's own train.checkpoint.dir nor inside it: a checkpoint there is
resumed instead (resume=auto), or moved aside before it is read (resume=never), so the key would do nothing.

Paths are compared after normalisation: `.`, `..`, `./x`, trailing slashes and symlinks that
exist now (os.path.realpath), relative ones joined to the working directory. That is the
directory the runtime resolves them against: launch/torchrun.sh, sbatch and `lmspec run` do not
change directory. The rule (compiler/rules/run_paths.py) checks from the compiling directory, as
the compile's inputs recorded it (compiler/inputs.py);
the runtime repeats the check with its own working directory (`require_run_paths_apart`, called
by lmspec.runtime.train.loop and the converter) in case the job starts elsewhere, which is why
this module is the runtime's to import (compiler/contract.py) and the rule's home is not.

Empty strings and strings with a NUL byte are left to the string validation of the schema.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from lmspec.compiler.build.files import RUN_DIR_ENTRIES, run_dir
from lmspec.compiler.errors import UsageError
from lmspec.compiler.spec.sections import Spec

RUN_DIR = "the run directory"  # the label of `runs/<name>/` in messages (its key is `name`)

Relation = Literal["same", "inside", "contains"]


def resolve(path: str | None, cwd: str) -> str | None:
    """`path` as the runtime opens it from `cwd`, normalised; None when it cannot be a path."""
    if not path:
        return None
    try:
        return os.path.realpath(os.path.join(cwd, path))
    except ValueError:  # an embedded NUL byte
        return None


def relation(a: str, b: str) -> Relation | None:
    """How resolved path `a` stands to resolved path `b`: the same, inside it, containing it, or apart."""
    pa, pb = PurePosixPath(a), PurePosixPath(b)
    if pa == pb:
        return "same"
    if pa.is_relative_to(pb):
        return "inside"
    if pb.is_relative_to(pa):
        return "contains"
    return None


@dataclass(frozen=True)
class Clash:
    """Two owned directories that overlap: `key`'s directory stands in `relation` to `other`'s."""

    key: str  # the key to change: convert.output, quantize.output, train.checkpoint.dir or serve.model_path
    other: str  # the key it clashes with, or RUN_DIR
    relation: Relation  # of `path` to `other_path`
    path: str  # resolved
    other_path: str  # resolved; for a run directory entry, that entry
    entry: str | None  # the run directory's own entry it is or is inside (other=RUN_DIR only)
    consequence: str
    fix: str


def _defaults(spec: Spec) -> dict[str, str]:
    """The presets' values (specs/train/default.yaml, specs/convert/default.yaml, specs/quantize/), offered as fixes."""
    run = run_dir(spec.name)
    defaults = {"convert.output": f"{run}/hf", "train.checkpoint.dir": f"{run}/checkpoints"}
    if spec.quantize is not None:
        defaults["quantize.output"] = f"{run}/hf-{spec.quantize.scheme}"
    return defaults


_CONVERT_HARM = "`lmspec run BUILD --stage convert` replaces convert.output as a whole and would delete"
_QUANTIZE_HARM = "`lmspec run BUILD --stage quantize` replaces quantize.output as a whole and would delete"
_STAGE_HARM = {"convert.output": _CONVERT_HARM, "quantize.output": _QUANTIZE_HARM}
_HARM: dict[tuple[str, str, Relation], str] = {
    ("convert.output", "train.checkpoint.dir", "same"): f"{_CONVERT_HARM} every checkpoint",
    ("convert.output", "train.checkpoint.dir", "contains"): f"{_CONVERT_HARM} the checkpoints inside it",
    ("convert.output", "train.checkpoint.dir", "inside"): (
        "the conversion would write among the checkpoints, replacing whatever is at its path"
    ),
    ("convert.output", RUN_DIR, "same"): f"{_CONVERT_HARM} the run's metrics.jsonl, logs and checkpoints",
    ("convert.output", RUN_DIR, "contains"): f"{_CONVERT_HARM} the run directory with everything in it",
    ("quantize.output", "train.checkpoint.dir", "same"): f"{_QUANTIZE_HARM} every checkpoint",
    ("quantize.output", "train.checkpoint.dir", "contains"): f"{_QUANTIZE_HARM} the checkpoints inside it",
    ("quantize.output", "train.checkpoint.dir", "inside"): (
        "the quantize stage would write among the checkpoints, replacing whatever is at its path"
    ),
    ("quantize.output", "convert.output", "same"): f"{_QUANTIZE_HARM} the converted model it calibrates",
    ("quantize.output", "convert.output", "contains"): f"{_QUANTIZE_HARM} the converted model it calibrates",
    ("quantize.output", "convert.output", "inside"): f"{_CONVERT_HARM} the quantized checkpoint inside it",
    ("quantize.output", RUN_DIR, "same"): f"{_QUANTIZE_HARM} the run's metrics.jsonl, logs and checkpoints",
    ("quantize.output", RUN_DIR, "contains"): f"{_QUANTIZE_HARM} the run directory with everything in it",
    ("train.checkpoint.dir", RUN_DIR, "same"): (
        "lmspec prunes the checkpoint directory and moves it aside (resume=never), so it must hold "
        "only checkpoints, not the run's metrics.jsonl and logs"
    ),
    ("train.checkpoint.dir", RUN_DIR, "contains"): (
        "lmspec prunes the checkpoint directory and moves it aside (resume=never), so it must hold "
        "only checkpoints, not the run directory"
    ),
}


def path_values(spec: Spec) -> dict[str, str | None]:
    """The run's directories as the spec writes them; None where its section is null (train: null, ...).
    A serve-only job reads neither convert.output nor a checkpoint directory."""
    t, c, v, q = spec.train, spec.convert, spec.serve, spec.quantize
    return {
        "convert.output": c.output if c is not None and t is not None else None,
        "quantize.output": q.output if q is not None and c is not None and t is not None else None,
        "train.checkpoint.dir": t.checkpoint.dir if t is not None else None,
        "serve.model_path": v.model_path if v is not None else None,
        "train.init_from": t.init_from if t is not None else None,
    }


def compared_paths(spec: Spec) -> list[str]:
    """Every path `overlaps` resolves, as the spec writes it: what a compile reads of its working
    directory (compiler/inputs.py) before the rule compares them."""
    written = [*path_values(spec).values(), run_dir(spec.name), *_defaults(spec).values()]
    return [path for path in written if path]


def overlaps(spec: Spec, resolved: Callable[[str | None], str | None]) -> list[Clash]:
    """Every overlap of the run's directories, each path as `resolved` gives it (`resolve` from one
    working directory: the compile's, recorded in its inputs, or the running job's)."""
    run = resolved(run_dir(spec.name))
    written = path_values(spec)
    paths = {key: resolved(written[key]) for key in ("convert.output", "quantize.output", "train.checkpoint.dir")}
    ckpt = paths["train.checkpoint.dir"]
    defaults = _defaults(spec)
    clashes: list[Clash] = []

    def fix_for(key: str) -> str:
        """The preset's value for `key` when it is free of every clash, else a generic fix."""
        suggested = resolved(defaults[key])
        others = [p for k, p in paths.items() if k != key and p is not None]
        if suggested is not None and all(relation(suggested, p) is None for p in others):
            return f"use {key}={defaults[key]}"
        return f"point {key} at a directory of its own, apart from {' and '.join(k for k in paths if k != key)}"

    for key, other in (
        ("convert.output", "train.checkpoint.dir"),
        ("quantize.output", "train.checkpoint.dir"),
        ("quantize.output", "convert.output"),
    ):
        path, other_path = paths[key], paths[other]
        if path is not None and other_path is not None and (rel := relation(path, other_path)) is not None:
            harm = _HARM[(key, other, rel)]
            clashes.append(Clash(key, other, rel, path, other_path, None, harm, fix_for(key)))

    for key, path in paths.items():
        if path is None or run is None or (rel := relation(path, run)) is None:
            continue
        if rel != "inside":
            clashes.append(Clash(key, RUN_DIR, rel, path, run, None, _HARM[(key, RUN_DIR, rel)], fix_for(key)))
            continue
        entry = PurePosixPath(path).relative_to(run).parts[0]
        if entry not in RUN_DIR_ENTRIES:
            continue  # a directory of its own inside the run directory: the presets' layout
        at = str(PurePosixPath(run) / entry)
        harm = (
            f"{_STAGE_HARM[key]} the run's {entry}"
            if key in _STAGE_HARM
            else f"the checkpoints would be written over the run's {entry}"
        )
        clashes.append(Clash(key, RUN_DIR, relation(path, at) or "inside", path, at, entry, harm, fix_for(key)))

    model = resolved(written["serve.model_path"])
    if model is not None and ckpt is not None and (rel := relation(model, ckpt)) in ("same", "inside"):
        clashes.append(
            Clash(
                "serve.model_path",
                "train.checkpoint.dir",
                rel,
                model,
                ckpt,
                None,
                "a training checkpoint is not a HuggingFace model vLLM can load, and keep_last_k deletes old steps",
                "serve the conversion output (serve.model_path=null, after `lmspec run BUILD --stage convert`) "
                "or a directory outside train.checkpoint.dir",
            )
        )
    start = resolved(written["train.init_from"])
    if start is not None and ckpt is not None and (rel := relation(start, ckpt)) in ("same", "inside"):
        clashes.append(
            Clash(
                "train.init_from",
                "train.checkpoint.dir",
                rel,
                start,
                ckpt,
                None,
                "a checkpoint in train.checkpoint.dir is resumed instead of initialising from train.init_from "
                "(resume=auto), or moved aside before it is read (resume=never)",
                "to continue that run leave train.init_from=null; to start a new run from its weights give this "
                "run a train.checkpoint.dir of its own",
            )
        )
    return clashes


_VERB = {"same": "is the same directory as", "inside": "is inside", "contains": "contains"}


def describe(clash: Clash, show: dict[str, str]) -> str:
    """One line: both keys with value and origin, the normalised paths, the harm, the fix."""
    other = f"{RUN_DIR} {show[RUN_DIR]}" if clash.other == RUN_DIR else show[clash.other]
    if clash.entry is not None:
        verb = "is" if clash.relation == "same" else "is inside"
        head = f"{show[clash.key]} {verb} the run's {clash.entry} in {other}"
    else:
        head = f"{show[clash.key]} {_VERB[clash.relation]} {other}"
    paths = f"both resolve to {clash.path}" if clash.relation == "same" else f"{clash.path} vs {clash.other_path}"
    return f"{head} ({paths}): {clash.consequence}; {clash.fix}"


def require_run_paths_apart(spec: Spec) -> None:
    """The rule again at run time, from the working directory a stage really has (the build may have
    been compiled elsewhere): UsageError listing every clash."""
    cwd = os.getcwd()
    problems = runtime_problems(spec, cwd)
    if problems:
        raise UsageError("; and ".join(problems) + "; recompile the build")


def runtime_problems(spec: Spec, cwd: str) -> list[str]:
    """The same check at run time, from the job's own working directory (no origins there)."""
    values: dict[str, str | None] = {**path_values(spec), "name": spec.name}
    show = {key: f"{key}={json.dumps(value)}" for key, value in values.items()}
    show[RUN_DIR] = f"{run_dir(spec.name)}/ of {show['name']}"
    clashes = overlaps(spec, lambda path: resolve(path, cwd))
    return [f"{describe(clash, show)} (working directory {cwd})" for clash in clashes]
