"""Hostile spec values go through every emitted script as data; nothing in them executes.

Each script runs for real with the trainer replaced: LMSPEC_PYTHON points at a script that
records its argv and environment, and srun/scontrol/scancel are stand-ins on PATH. The
recorded values must equal the spec's strings byte for byte, no `pwned` file may appear, and
shellcheck finds nothing in the scripts that hold them. A path may hold any printable text
(HOSTILE); a value with a control character, or one of a kind that cannot be quoted where it
goes (an interface name, a Slurm name, a host), is refused by its kind before anything is written.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.build import compile_build

from lmspec.compiler.build.files import SBATCH_SH, TORCHRUN_SH
from lmspec.compiler.cli.main import run as lmspec

HOSTILE = {
    "command-substitution": "$(touch pwned)",
    "backticks": "`touch pwned`",
    "single-quotes": "'; touch pwned; echo '",
    "double-quotes": '"; touch pwned; echo "',
    "spaces": "sp ace  s ; touch pwned",
    "unicode": "ünïcødé ✓ 模型 $(touch pwned)",
    "variables-backslash": "$HOME ${PATH} \\ touch\\ pwned",
    "leading-dash": "-rf --no-preserve-root $(touch pwned)",
    "globs-braces": "*? [ab] {x,y} ~root $((1+1)) !! touch pwned",
    "pipes-redirects": "a | touch pwned & b; c > d < e && f || g",
    "comment-and-percent": "# not a comment %s %n \\x41 $'touch pwned'",
}
IFNAME = "lo"  # an interface torchrun.sh finds on this machine (it refuses a missing one)
RECORDED_ENV = (
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "DEEPSPEED_TIMEOUT",
    "LMSPEC_HOSTILE",  # cluster.env
)
FAKE_PYTHON = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["FAKE_OUT"], "w", encoding="utf-8") as fh:
    json.dump({{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in {RECORDED_ENV!r}}}}}, fh)
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""
FAKE_SRUN = """#!/bin/bash
# srun stand-in: drop srun's own options, run the task command
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
exec "$@"
"""
FAKE_SCONTROL = """#!/bin/bash
[[ $1 == show && $2 == hostnames ]] && printf 'node-a\\nnode-b\\n'
"""


def _executable(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _spec_file(directory: Path, value: str, gpu: bool) -> Path:
    """A user spec holding the hostile value (OmegaConf needs `${` escaped to stay literal)."""
    literal = value.replace("${", "\\${")
    spec = {
        "defaults": ["config", "_self_"],
        "name": "hostile",
        "train": {"checkpoint": {"dir": f"runs/{literal}"}},
        "hardware": {"inter_node": {"socket_ifname": IFNAME}},
        "serve": {"model_path": f"served/{literal}/hf"},  # not inside the checkpoint dir (a rule)
        "cluster": {"env": [f"LMSPEC_HOSTILE={literal}"]},
    }
    if gpu:
        spec["defaults"] = [
            "config",
            {"override hardware": "h100_80g"},
            {"override model": "llama3_8b"},
            {"override cluster": "slurm"},
            "_self_",
        ]
        spec["hardware"]["nodes"] = 2
        spec["parallel"] = {"distributed_optimizer": True}
    path = directory / "hostile.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True), encoding="utf-8")
    return path


def _pwned(root: Path) -> list[Path]:
    return [p for p in root.rglob("pwned")] + [p for p in Path.cwd().glob("pwned")]


SCRIPTS = ("launch/torchrun.sh", "launch/sbatch.sh", "launch/nccl.env", "serve/serve.sh")


def _shellcheck_clean(shellcheck: str, build: Path) -> None:
    for script in SCRIPTS:
        result = subprocess.run([shellcheck, str(build / script)], capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{script}:\n{result.stdout}"


@pytest.fixture
def workspace(tmp_path: Path) -> dict[str, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "srun", FAKE_SRUN)
    _executable(bin_dir / "scontrol", FAKE_SCONTROL)
    _executable(bin_dir / "scancel", "#!/bin/bash\n")
    run_dir = tmp_path / "run dir $(touch pwned) ü"
    run_dir.mkdir()
    return {
        "root": tmp_path,
        "bin": bin_dir,
        "python": _executable(tmp_path / "fake-python", FAKE_PYTHON),
        "run": run_dir,
    }


def _run(script: Path, build: Path, ws: dict[str, Path], extra_env: dict[str, str]) -> tuple[dict, str]:
    out = ws["root"] / "recorded.json"
    env = {
        "PATH": f"{ws['bin']}:/usr/bin:/bin",
        "LMSPEC_PYTHON": str(ws["python"]),
        "FAKE_OUT": str(out),
        "HOME": str(ws["root"]),
        **extra_env,
    }
    result = subprocess.run(
        ["bash", str(script), str(build)],
        cwd=ws["run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text(encoding="utf-8")), result.stdout


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_cpu_torchrun_passes_hostile_values_as_data(value: str, workspace: dict[str, Path], shellcheck: str) -> None:
    ws = workspace
    build_root = ws["root"] / f"builds {value.splitlines()[0]}"  # a hostile build path too
    build = compile_build(build_root, [], _spec_file(ws["root"], value, gpu=False)).dir
    checkpoint_dir = ws["run"] / "runs" / value
    checkpoint_dir.mkdir(parents=True)
    (checkpoint_dir / "latest").write_text("step_3\n")

    recorded, stdout = _run(build / TORCHRUN_SH, build, ws, {})

    assert recorded["argv"] == [
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--node-rank=0",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",  # cluster.master_port=null, one node: a free port
        "--rdzv-id=lmspec-hostile",
        "--rdzv-conf=is_host=1",
        "--max-restarts=0",
        recorded["argv"][10],  # --log-dir of this launch (checked below)
        "--tee=3",  # node 0: rank 0 on the console, every rank in its own file
        "--local-ranks-filter=0",
        "-m",
        "lmspec.runtime.train",
        str(build.resolve()),
    ]
    assert recorded["argv"][10].startswith("--log-dir=runs/hostile/rank_logs/local-")
    assert recorded["env"]["LMSPEC_HOSTILE"] == value
    assert recorded["env"]["GLOO_SOCKET_IFNAME"] == IFNAME
    assert recorded["env"]["NCCL_SOCKET_IFNAME"] is None
    assert f"torchrun.sh: resuming from runs/{value}/step_3\n" in stdout
    assert _pwned(ws["root"]) == []
    _shellcheck_clean(shellcheck, build)


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_multi_node_sbatch_passes_hostile_values_as_data(
    value: str, workspace: dict[str, Path], shellcheck: str
) -> None:
    ws = workspace
    build = compile_build(ws["root"] / "builds", [], _spec_file(ws["root"], value, gpu=True)).dir
    slurm_env = {
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_NODEID": "1",
    }

    recorded, stdout = _run(build / SBATCH_SH, build, ws, slurm_env)

    assert recorded["argv"] == [
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node-a:10042",  # cluster.master_port=null: 10000 + SLURM_JOB_ID % 20000
        "--rdzv-id=42",
        "--rdzv-conf=is_host=0",
        "--max-restarts=0",
        "--log-dir=runs/hostile/rank_logs/job42-restart0",  # one folder per job and requeue
        "--redirects=3",  # node 1: every rank to its own file, nothing on the console
        "-m",
        "lmspec.runtime.train",
        str(build.resolve()),
    ]
    assert recorded["env"]["NCCL_SOCKET_IFNAME"] == IFNAME
    assert recorded["env"]["GLOO_SOCKET_IFNAME"] == IFNAME
    assert recorded["env"]["MASTER_ADDR"] == "node-a"
    assert recorded["env"]["LMSPEC_HOSTILE"] == value
    assert f"torchrun.sh: no checkpoint under runs/{value}; starting at step 0\n" in stdout
    assert _pwned(ws["root"]) == []
    _shellcheck_clean(shellcheck, build)


UNQUOTABLE = (
    "cluster.slurm.partition",
    "cluster.slurm.account",
    "hardware.inter_node.hca",
    "hardware.inter_node.socket_ifname",
    "serve.host",
    "serve.api_key_env",
)
CONTROL = {
    "newline-injection": "x\ntouch pwned\n#",
    "trailing-newline": "runs/x\n",
    "tab": "sp ace\t tab",
    "carriage-return": "x\r$(touch pwned)",
    "escape": "x\x1b[31m",
    "nul": "x\x00y",
    "line-separator": "x\u2028touch pwned",
}
CONTROL_HELD = ("name", "train.checkpoint.dir", "convert.output", "serve.served_model_name", "serve.model_path")


@pytest.mark.parametrize("value", (*HOSTILE.values(), *CONTROL.values()), ids=(*HOSTILE.keys(), *CONTROL.keys()))
def test_values_sbatch_nccl_or_vllm_cannot_quote_are_refused(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#SBATCH lines are parsed by sbatch, NCCL_IB_HCA and *_SOCKET_IFNAME are comma lists, the host is
    bound and the API key variable is expanded: each is refused by its kind, each key named."""
    literal = value.replace("${", "\\${")
    spec = tmp_path / "hostile.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "defaults": ["config", "_self_"],
                "cluster": {"slurm": {"partition": literal, "account": literal}},
                "hardware": {"inter_node": {"hca": ["mlx5_0", literal], "socket_ifname": literal}},
                "serve": {"host": literal, "api_key_env": literal},
            },
            allow_unicode=True,
        ),
        encoding="utf-8",
    )

    assert lmspec(["compile", "--spec", str(spec), "-o", str(tmp_path / "build")]) == 1
    err = capsys.readouterr().err
    for key in UNQUOTABLE:
        assert f"error: {key}=" in err
    assert "Traceback" not in err
    assert not (tmp_path / "build").exists()
    assert _pwned(tmp_path) == []


@pytest.mark.parametrize("value", CONTROL.values(), ids=CONTROL.keys())
def test_control_characters_are_refused_in_every_string(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Even where any printable text is data (paths, the served name), a control character is refused."""
    literal = value.replace("${", "\\${")
    spec = tmp_path / "hostile.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "defaults": ["config", "_self_"],
                "name": f"n{literal}",
                "train": {"checkpoint": {"dir": literal}},
                "convert": {"output": literal},
                "serve": {"served_model_name": literal, "model_path": literal},
            },
            allow_unicode=True,
        ),
        encoding="utf-8",
    )

    assert lmspec(["compile", "--spec", str(spec), "-o", str(tmp_path / "build")]) == 1
    err = capsys.readouterr().err
    for key in CONTROL_HELD:
        assert f"error: {key}=" in err and "it holds" in err
    assert "Traceback" not in err and "\n#" not in err  # values are shown escaped
    assert not (tmp_path / "build").exists()
    assert _pwned(tmp_path) == []


def test_secrets_are_never_written(tmp_path: Path) -> None:
    """Launch artifacts carry no credentials from the environment lmspec compiled in."""
    secret = "hf_SECRET_TOKEN_value_1234"
    old = {k: os.environ.get(k) for k in ("HF_TOKEN", "VLLM_API_KEY")}
    os.environ.update(HF_TOKEN=secret, VLLM_API_KEY=secret)
    try:
        build = compile_build(tmp_path, ["cluster=slurm"]).dir
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    for path in build.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(encoding="utf-8"), path
