"""The multi-node torchrun.sh for real: two "nodes" on this machine (NODE_RANK 0 and 1, one
MASTER_ADDR and port) meet through the c10d rendezvous and all-reduce over all 4 ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.ports import free_port
from helpers.swap_trainer import write_wrapper

from lmspec.compiler.build.files import TORCHRUN_SH

pytestmark = pytest.mark.slow
TIMEOUT_S = 180


def test_two_nodes_rendezvous_into_one_world(tmp_path: Path) -> None:
    build = compile_build(
        tmp_path / "build", ["hardware.nodes=2", "cluster=slurm", f"cluster.master_port={free_port()}"]
    ).dir
    out = tmp_path / "ranks"
    out.mkdir()
    env = dict(os.environ, LMSPEC_PYTHON=str(write_wrapper(tmp_path)), ALLREDUCE_OUT=str(out), MASTER_ADDR="127.0.0.1")
    env.pop("MASTER_PORT", None)
    nodes = [
        subprocess.Popen(
            ["bash", str(build / TORCHRUN_SH)],
            env=dict(env, NODE_RANK=str(rank)),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]
    try:
        logs = [node.communicate(timeout=TIMEOUT_S)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(logs)
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["world_size"] for r in ranks} == {4}
    assert sorted(r["local_rank"] for r in ranks) == [0, 0, 1, 1]
    assert {r["sum"] for r in ranks} == {1.0 + 2.0 + 3.0 + 4.0}
