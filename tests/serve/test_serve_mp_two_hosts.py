"""serve.multi_node=mp for real: the tiny model served with tensor parallel 2 across two "hosts" (network
namespaces joined by a bridge, tests/helpers/netns.py) on vLLM's CPU engine. A serve-only spec
(hardware=cpu, 2 nodes x 1, serve.tp=2, auto picks mp) compiles to serve/head.sh + serve/worker.sh; host 0
runs head.sh with its own address, host 1 worker.sh with that address and node rank 1; no Ray anywhere.
vLLM's multiprocessing executor starts rank 0 on host 0 and rank 1 (headless) on host 1, the two meet at
host 0's torch.distributed store (--master-addr/--master-port) and all-reduce over gloo on the interface
the spec names (hardware.inter_node.socket_ifname, in the build's nccl.env); a client on host 1 gets a
completion from host 0's API, which reports tp2, and host 1's log shows it ran TP rank 1.

Each host gets a default route, as a cluster node has: vLLM finds the address its message queues
advertise by routing towards one (vllm.utils.network_utils.get_ip), and without any route falls back
to 0.0.0.0. Two vLLM process trees (~1-2 min to healthy on 2 idle cores, ~3 GB each). Needs root.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.hf import save_random_hf_llama
from helpers.marks import needs_vllm
from helpers.netns import IFNAME, hosts, netns_missing_reason
from helpers.processes import kill_group
from helpers.specs import SERVED_TP2_ON_TWO_HOSTS
from helpers.two_host_engine import assert_one_tp2_engine_answers, wait_healthy

from lmspec.compiler.build.files import SERVE_HEAD_SH, SERVE_WORKER_SH
from lmspec.compiler.launch_names import CPU_VLLM_CLI, VLLM_CLI_ENV
from lmspec.runtime.data.byte_tokenizer import save_byte_tokenizer

pytestmark = [
    needs_vllm,
    pytest.mark.slow,
    pytest.mark.skipif(netns_missing_reason() is not None, reason=str(netns_missing_reason())),
]

PORT = 8000  # each namespace has its own ports: no other job can hold this one there


def test_tensor_parallel_across_two_hosts_with_vllms_mp_executor(tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny"
    save_random_hf_llama(compile_build(tmp_path / "probe", [])[0], model)  # the tiny spec's model, random weights
    save_byte_tokenizer(model)
    plan, build = compile_build(
        tmp_path / "build",
        [
            *SERVED_TP2_ON_TWO_HOSTS,
            f"serve.model_path={model}",
            f"serve.port={PORT}",
        ],
    )
    layout = plan.served().layout
    assert (layout.mode, layout.nodes, [r.gpus_per_node for r in layout.roles]) == ("mp", 2, [1, 1])
    env = {k: v for k, v in os.environ.items() if k != "VLLM_HOST_IP"}
    env.update({VLLM_CLI_ENV: str(Path(sys.executable).parent / CPU_VLLM_CLI), "PYTHONUNBUFFERED": "1"})
    logs = [tmp_path / "head.log", tmp_path / "worker.log"]
    procs: list[subprocess.Popen] = []
    with hosts(2, "mp") as (node0, node1):
        for host in (node0, node1):
            subprocess.run(["ip", "-n", host.netns, "route", "add", "default", "dev", IFNAME], check=True)
        commands = [
            node0.command(["bash", str(build / SERVE_HEAD_SH), node0.address]),
            node1.command(["bash", str(build / SERVE_WORKER_SH), node0.address, "1"]),
        ]
        try:
            for command, log in zip(commands, logs, strict=True):
                with log.open("w") as out:
                    procs.append(
                        subprocess.Popen(
                            command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                        )
                    )
            api = f"http://{node0.address}:{PORT}"
            wait_healthy(node1, f"{api}/health", procs, logs)
            worker = assert_one_tp2_engine_answers(node1, api, plan.spec.serve.served_model_name, logs[1])
            assert f"distributed_init_method=tcp://{node0.address}:{plan.spec.serve.master_port}" in worker
        finally:
            for proc in procs:
                kill_group(proc)
