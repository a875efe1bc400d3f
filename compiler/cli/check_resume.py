"""`lmspec check --resume-from DIR`: whether the spec can resume from the checkpoint in DIR, and why not.

DIR is a `train.checkpoint.dir` (the step a run would resume from: `latest`'s, else the newest whose
manifest is sound) or one `step_<N>` directory. Only the structure is read (manifests, that the files they
list are there; lmspec.runtime.train.checkpoint.choose without hashing, which imports no torch); the
verdict is lmspec.compiler.resume_layout's on the manifest's `saved_with`, the one the runtime applies.
"""

from __future__ import annotations

import os
from pathlib import Path

from lmspec.compiler.build.files import STEP_MANIFEST, TRAINER_STATE
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, UsageError, error, print_problems, warning
from lmspec.compiler.plan import Plan
from lmspec.compiler.resume_layout import readable, resume_problems, saved_with, summary

KEY = "train.checkpoint.dir"
REQUIRED = (f"{TRAINER_STATE}/rank_0.pt",)  # what the runtime's resume requires of a step (runtime/train/loop.py)


def _step(directory: Path) -> tuple[Path | None, dict | None, list[str], str | None]:
    """(the step to judge, its saved_with, warnings on the way, why there is none)."""
    from lmspec.runtime.train.checkpoint import choose, read_manifest, verify

    if (directory / STEP_MANIFEST).exists():
        why = verify(directory, REQUIRED, hashes=False)
        if why is not None:
            return None, None, [], f"{directory} is not a usable checkpoint step: {why}"
        manifest, _ = read_manifest(directory)
        assert manifest is not None
        return directory, manifest.saved_with, [], None
    choice = choose(directory, REQUIRED, hashes=False)
    if choice.error is not None:
        return None, None, choice.warnings, choice.error
    if choice.path is None:
        return None, None, choice.warnings, f"{directory} holds no checkpoint: a run would start from scratch"
    return choice.path, choice.saved_with, choice.warnings, None


def check_resume(plan: Plan, directory: Path) -> int:
    """Print the verdict on resuming `plan`'s training from `directory`; exit 1 when it cannot."""
    if not directory.is_dir():
        raise UsageError(f"--resume-from {directory}: no such directory (a train.checkpoint.dir or a step_<N> in it)")
    train = plan.trained()
    step, saved, warnings, why = _step(directory)
    print_problems(warning(KEY, w) for w in warnings)
    if step is None:
        print_problems([error(KEY, f"--resume-from: {why}")])
        return EXIT_FAILED
    assert why is None
    here = summary(saved_with(train.spec, plan))
    if (unknown := readable(saved)) is not None:
        print_problems([warning(KEY, f"--resume-from {step}: {unknown}; the run will try to load it at {here}")])
        return EXIT_OK
    assert saved is not None
    problems = resume_problems(train.spec, plan, saved)
    if problems:
        print_problems(error(KEY, f"cannot resume from {step} (saved with {summary(saved)}): {p}") for p in problems)
        return EXIT_FAILED
    print(f"{plan.name}: can resume from {step} (saved with {summary(saved)}; here {here})")
    ckpt = train.spec.train.checkpoint
    root = step.parent if (directory / STEP_MANIFEST).exists() else directory
    if os.path.realpath(root) != os.path.realpath(ckpt.dir):
        print(f"  note: the run resumes from {KEY}={ckpt.dir}; compile with {KEY}={root} to resume from this one")
    elif ckpt.resume == "never":
        print("  note: train.checkpoint.resume=never: the run moves these checkpoints aside and starts afresh")
    return EXIT_OK
