"""What a site asks of a job (cluster.slurm's options, srun arguments, a pyxis container, cluster.env and
cluster.setup) reaches the scripts that start it: shellcheck-clean, accepted by a real sbatch --test-only on a
4-node partition, and carried out on every node before the launcher."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers.build import compile_build
from helpers.slurm import LocalSlurm, slurm_missing_reason

from lmspec.compiler.build.files import SBATCH_SH, SERVE_SBATCH_SH, SERVE_SH, TORCHRUN_SH

SITE = {
    "env": ["HF_HOME=/lustre/hf", "LMSPEC_SITE=two words $HOME `id`"],
    "setup": ['module() { echo "module $*" >>site-setup.log; }', "module load cuda/12.4", "export LMSPEC_SETUP=done"],
    "slurm": {
        "qos": "high",
        "constraint": "h100&ib",
        "exclusive": True,
        "mem": "0",
        "extra_options": ["--mail-type=END", "--comment=lmspec site test"],
        "srun_args": ["--cpu-bind=none"],
        "container": {
            "image": "nvcr.io#nvidia/pytorch:25.01-py3",
            "mounts": ["/lustre/data:/data:ro", "/scratch/$USER space:/scratch"],
            "workdir": None,
        },
    },
}
# the 4 nodes sbatch --test-only schedules on: what the job's #SBATCH lines ask for (8 GPUs, 64 cores,
# the h100 and ib features)
DECLARED_NODES = "fake[1-4] CPUs=128 RealMemory=1000000 Gres=gpu:8 Features=h100,ib"


def _spec(directory: Path, nodes: int, serve: bool) -> Path:
    spec = {
        "defaults": [
            "config",
            {"override hardware": "h100_80g"},
            {"override model": "llama3_70b"},
            {"override cluster": "slurm"},
            "_self_",
        ],
        "name": "site",
        "hardware": {"nodes": nodes},
        "parallel": {"tp": 8, "pp": 2, "sequence_parallel": True, "distributed_optimizer": True},
        "cluster": SITE,
    }
    if serve:
        spec["serve"] = {"host": "0.0.0.0", "tp": 8}
    else:
        spec["serve"] = None
    path = directory / "site.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


@pytest.fixture
def build(tmp_path: Path) -> Path:
    return compile_build(tmp_path / "builds", [], _spec(tmp_path, nodes=4, serve=True)).dir


def test_every_site_option_is_an_sbatch_line_and_the_container_is_pyxis_flags(build: Path, shellcheck: str) -> None:
    sbatch = (build / SBATCH_SH).read_text()
    for line in (
        "#SBATCH --qos=high",
        "#SBATCH --constraint=h100&ib",
        "#SBATCH --exclusive",
        "#SBATCH --mem=0",
        "#SBATCH --mail-type=END",
        '#SBATCH --comment="lmspec site test"',  # sbatch splits a directive at blanks
    ):
        assert f"\n{line}\n" in sbatch
        assert f"\n{line}\n" in (build / SERVE_SBATCH_SH).read_text()
    site = next(line for line in sbatch.splitlines() if line.startswith("SITE=("))
    assert site == (
        "SITE=(--cpu-bind=none '--container-image=nvcr.io#nvidia/pytorch:25.01-py3' "
        '"--container-mounts=$BUILD_DIR:$BUILD_DIR,$SLURM_SUBMIT_DIR:$SLURM_SUBMIT_DIR,/lustre/data:/data:ro,'
        '/scratch/\\$USER space:/scratch" --container-workdir="$SLURM_SUBMIT_DIR")'
    )
    assert '--kill-on-bad-exit=1 "${SITE[@]}" \\\n  bash "$BUILD_DIR/launch/torchrun.sh"' in sbatch
    for script in (SBATCH_SH, TORCHRUN_SH, SERVE_SBATCH_SH, SERVE_SH):
        done = subprocess.run([shellcheck, str(build / script)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{script}:\n{done.stdout}"


def _executable(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


RECORDING_PYTHON = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD"], "w", encoding="utf-8") as fh:
    json.dump({{k: os.environ.get(k) for k in ("HF_HOME", "LMSPEC_SITE", "LMSPEC_SETUP")}}, fh)
"""


@pytest.mark.parametrize("script", [TORCHRUN_SH, SERVE_SH])
def test_env_and_setup_run_before_the_launcher(build: Path, tmp_path: Path, script: str) -> None:
    """cluster.env as data (nothing in it expands), then cluster.setup as code, in the shell that starts the
    launcher: torchrun.sh (training) and serve.sh (serving)."""
    record = tmp_path / "record.json"
    python = _executable(tmp_path / "python", RECORDING_PYTHON)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RECORD": str(record), "LMSPEC_PYTHON": str(python)}
    run_dir = tmp_path / "run"
    (run_dir / "served").mkdir(parents=True)
    if script == TORCHRUN_SH:
        env.update(NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    else:
        env.update(LMSPEC_VLLM=str(python), VLLM_API_KEY="k")
        model = (build / "serve" / "vllm.yaml").read_text().split("model: ")[1].splitlines()[0].strip("'\"")
        (run_dir / model).mkdir(parents=True, exist_ok=True)
        (run_dir / model / "config.json").write_text("{}")
    done = subprocess.run(
        ["bash", str(build / script), *([str(build)] if script == TORCHRUN_SH else [])],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(record.read_text()) == {
        "HF_HOME": "/lustre/hf",
        "LMSPEC_SITE": "two words $HOME `id`",
        "LMSPEC_SETUP": "done",
    }
    assert (run_dir / "site-setup.log").read_text() == "module load cuda/12.4\n"


@pytest.fixture(scope="module")
def four_node_controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    reason = slurm_missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm4"), declared_nodes=DECLARED_NODES)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.parametrize("script", [SBATCH_SH, SERVE_SBATCH_SH])
def test_a_real_sbatch_accepts_the_four_node_job(
    four_node_controller: LocalSlurm, build: Path, tmp_path: Path, script: str
) -> None:
    """sbatch parses every #SBATCH line (qos, constraint, exclusive, mem, the extra options) and schedules the
    job on the 4 declared nodes; the container flags are srun's, which --test-only does not run (pyxis, the
    SPANK plugin that reads them, is not installed here)."""
    done = subprocess.run(
        ["sbatch", "--test-only", str(build / script), str(build)],
        cwd=tmp_path,
        env=four_node_controller.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    nodes = "fake[1-4]" if script == SBATCH_SH else "fake1"
    assert f"on nodes {nodes} in partition debug" in done.stderr


def test_mem_from_the_command_line_is_megabytes_or_a_size(tmp_path: Path) -> None:
    """`cluster.slurm.mem=0` on the command line parses as a number, which sbatch reads as megabytes."""
    for value, line in (("0", "#SBATCH --mem=0"), ("500G", "#SBATCH --mem=500G")):
        build = compile_build(tmp_path / value, ["cluster=slurm", f"cluster.slurm.mem={value}"]).dir
        assert f"\n{line}\n" in (build / SBATCH_SH).read_text()
