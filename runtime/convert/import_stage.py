"""`lmspec run BUILD --stage import --from HF_DIR`: released HF weights -> a checkpoint at the build's layout.

Checked here, before any rank starts: the build's backend has an HF importer (TrainingBackend.hf_importer:
megatron's and torchtitan's; a deepspeed build is refused with the way out), and HF_DIR
holds the build's model with a quantisation lmspec can undo (lmspec.runtime.convert.hf_source). Then
the build's own launcher runs the `import` entry of launch/torchrun.sh (lmspec.runtime.convert.from_hf)
exactly as `--stage train` runs training: torchrun locally, or sbatch with one torchrun per node. The
checkpoint lands in runs/<name>/imported/step_0 (IMPORTED_DIR, outside train.checkpoint.dir: a run's
own checkpoints are resumed, not initialised from), written under a temporary name and renamed when
every rank has saved; the stage then prints the override that trains from it.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

from lmspec.compiler.backends import BACKENDS, backend_of
from lmspec.compiler.build.files import run_dir, step_dir
from lmspec.compiler.build.reader import Build
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, UsageError
from lmspec.runtime.convert.hf_source import check_source
from lmspec.runtime.launchers import runtime_of
from lmspec.runtime.slurm import in_container
from lmspec.runtime.train.checkpoint import TMP_PREFIX
from lmspec.runtime.train.launch import launch_env, launch_root, print_dry_run

logger = logging.getLogger(__name__)

IMPORTED_DIR = "imported"  # under the run directory: the checkpoints `--stage import` writes
IMPORT_ENTRY = "import"  # launch/torchrun.sh's entry for lmspec.runtime.convert.from_hf


def imported_root(build: Build) -> Path:
    """runs/<name>/imported, relative to the working directory as every run path is."""
    return Path(run_dir(build.spec.name)) / IMPORTED_DIR


def run_import(build: Build, options: argparse.Namespace) -> int:
    hf_dir: Path | None = getattr(options, "hf_dir", None)
    if hf_dir is None:
        raise UsageError("--stage import needs --from HF_DIR (a HuggingFace model directory)")
    backend = backend_of(build.training())
    if not backend.imports_hf:
        importing = [name for name, other in BACKENDS.items() if other.imports_hf]
        raise UsageError(
            f"--stage import writes a checkpoint of a backend with an HF importer; this build has train.backend="
            f"{backend.name!r}, which has none. Compile it with train.backend={' or '.join(importing)}"
        )
    out = imported_root(build)
    launcher = runtime_of(build.spec.cluster)
    entry = (IMPORT_ENTRY, str(hf_dir.resolve()), str(out.resolve()))
    command = launcher.command(launch_root(build), entry)  # a launcher that cannot run it here says so first
    fp8 = check_source(hf_dir, build.mapping["hf_config"])
    env = launch_env(in_container(build.spec.cluster))
    if options.dry_run:
        return print_dry_run(command, env, launcher)
    if not launcher.ranks_ready(launch_root(build), build.training(), env):  # as training checks its ranks
        return EXIT_FAILED
    if fp8 is not None:
        logger.info(f"import: {hf_dir} is block-FP8 ({fp8.block[0]}x{fp8.block[1]}); dequantising while reading")
    code = launcher.run(command, env, build.spec.name)
    if code != EXIT_OK:
        for partial in out.glob(f"{TMP_PREFIX}*"):  # the save's temporary directory: never a checkpoint
            shutil.rmtree(partial, ignore_errors=True)
        logger.error(f"lmspec run: the import failed (exit code {code}); no checkpoint was written")
        return code
    logger.info(
        f"import: wrote {out / step_dir(0)}; train from it by compiling with the override "
        f"train.init_from={out / step_dir(0)}"
    )
    return EXIT_OK
