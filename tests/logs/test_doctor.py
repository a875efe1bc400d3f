"""`lmspec doctor` golden tests: one per failure signature, healthy logs exit 0.

Every excerpt in tests/data/logs follows its upstream's format strings (the source file is
named in the excerpt's header comment).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.doctor_corpus import CORPUS, cases
from helpers.paths import LOG_DATA, ROOT

from lmspec.compiler.observe.doctor import SIGNATURES


def _doctor(lmspec, log: str, *argv: str) -> tuple[int, list[dict]]:
    result = lmspec("doctor", str(LOG_DATA / log), *argv, "--format", "json")
    assert result.err == "" or "warning" in result.err, result.err
    return result.code, json.loads(result.out)


GOLDEN = [
    pytest.param(
        "torchrun_nccl_timeout.log",
        "nccl_timeout",
        ["OpType=ALLREDUCE", "cluster.nccl.timeout_minutes=30", "collective #48213"],
        id="nccl-timeout",
    ),
    pytest.param(
        "slurm_nccl_connection.log",
        "nccl_connection",
        [
            "unhandled system error",
            "cluster.nccl.debug=INFO",
            "hardware.inter_node.socket_ifname=",
            "cluster.nccl.ib_timeout=22",
        ],
        id="nccl-connection",
    ),
    pytest.param(
        "gloo_peer_closed.log",
        "nccl_connection",
        ["Connection closed by peer", "runs/<name>/rank_logs/", "hardware.inter_node.socket_ifname="],
        id="gloo-peer-closed",
    ),
    pytest.param(
        "slurm_usr1_requeue.log",
        "stopped_for_requeue",
        ["checkpointed at step 4", "requeued job 1", "did not fail", "cluster.slurm.time="],
        id="slurm-usr1-requeue",
    ),
    pytest.param(
        "torchrun_sh_no_interface.log",
        "nccl_interface",
        ["launch/torchrun.sh found no interface ib7", "hardware.inter_node.socket_ifname="],
        id="torchrun-sh-no-interface",
    ),
    pytest.param(
        "nccl_wrong_interface.log",
        "nccl_interface",
        ["docker0", "hardware.inter_node.socket_ifname=enp65s0f0"],
        id="nccl-interface",
    ),
    pytest.param(
        "cuda_oom.log",
        "cuda_oom",
        ["Tried to allocate 3.50 GiB", "train.micro_batch_size=", "train.recompute=", "parallel.zero_stage="],
        id="cuda-oom",
    ),
    pytest.param(
        "world_size_mismatch.log", "world_size_mismatch", ["8/16 clients joined", "hardware.nodes="], id="world-size"
    ),
    pytest.param(
        "rendezvous_timeout.log", "rendezvous", ["gpu-node-001:29500", "cluster.master_port="], id="rendezvous-timeout"
    ),
    pytest.param(
        "rendezvous_port_in_use.log", "rendezvous", ["EADDRINUSE", "cluster.master_port="], id="rendezvous-port-in-use"
    ),
    pytest.param(
        "megatron_nan.log",
        "nan_loss",
        [
            "number of nan iterations:   3",
            "train.precision=bf16",
            "train.grad_clip=1.0",
            "train.optimizer.lr=6e-05",
            "train.data.sources=",
        ],
        id="nan-megatron",
    ),
    pytest.param(
        "megatron_loss_vanished.log",
        "nan_loss",
        ["iteration     3385/", "left the iteration line without it", "train.optimizer.lr=1.34e-06"],
        id="nan-megatron-loss-field-gone",
    ),
    pytest.param(
        "lmspec_metrics_nan.jsonl", "nan_loss", ['"loss": NaN', "train.optimizer.lr=0.0006"], id="nan-lmspec-jsonl"
    ),
    pytest.param(
        "lmspec_train_nan.log",
        "nan_loss",
        ["loss is nan at step 17", "train.optimizer.lr=0.0006"],
        id="nan-lmspec-runtime",
    ),
    pytest.param(
        "deepspeed_loss_scale_collapse.log",
        "nan_loss",
        ["reducing to 1", "already at minimum", "train.precision=bf16", "train.optimizer.lr=0.00012"],
        id="loss-scale-collapse",
    ),
    pytest.param(
        "slurm_time_limit.log",
        "slurm_time_limit",
        ["DUE TO TIME LIMIT", "cluster.slurm.requeue=true", "cluster.slurm.signal_seconds=600"],
        id="slurm-time-limit",
    ),
    pytest.param(
        "slurm_host_oom.log", "host_oom", ["oom_kill event", "parallel.offload_optimizer=false"], id="slurm-host-oom"
    ),
    pytest.param(
        "vllm_kv_cache_too_small.log",
        "vllm_kv_cache",
        ["8.00 GiB KV cache", "serve.max_model_len=25344"],
        id="vllm-kv-cache",
    ),
    pytest.param("vllm_tp_heads.log", "vllm_parallel", ["attention heads (32)", "serve.tp=2"], id="vllm-tp-heads"),
    pytest.param(
        "k8s_oom_killed.log",
        "k8s_oom_killed",
        ["Reason:       OOMKilled", "Exit Code:    137", "cluster.kubernetes.memory=", "parallel.offload_optimizer="],
        id="k8s-oom-killed",
    ),
    pytest.param(
        "k8s_evicted_disk.log",
        "k8s_evicted",
        ["low on resource: ephemeral-storage", "cluster.kubernetes.volume_claim=", "train.checkpoint.keep_last_k="],
        id="k8s-evicted-disk",
    ),
    pytest.param(
        "k8s_evicted_memory.log",
        "k8s_evicted",
        ["low on resource: memory", "cluster.kubernetes.memory=", "cluster.kubernetes.shm_gib="],
        id="k8s-evicted-memory",
    ),
    pytest.param(
        "k8s_image_pull.log",
        "k8s_image_pull",
        [
            'Failed to pull image "ghcr.io/my-team/lmspec:0.1"',
            "credentials",
            "cluster.kubernetes.image_pull_secrets=",
            "cluster.kubernetes.image=",
        ],
        id="k8s-image-pull",
    ),
    pytest.param(
        "k8s_failed_scheduling_gpu.log",
        "k8s_failed_scheduling",
        ["4 Insufficient nvidia.com/gpu", "hardware.gpus_per_node=", "cluster.kubernetes.gpu_resource="],
        id="k8s-failed-scheduling-gpu",
    ),
    pytest.param(
        "k8s_failed_scheduling_rdma.log",
        "k8s_failed_scheduling",
        ["3 Insufficient rdma/ib", "cluster.kubernetes.rdma_resource=", "[{key: nvidia.com/gpu, operator: Exists}]"],
        id="k8s-failed-scheduling-rdma",
    ),
    pytest.param(
        "k8s_stopped_mid_save.log",
        "k8s_stopped_mid_save",
        ["pod.sh: SIGTERM: sending USR1", "Stopping container node", "cluster.kubernetes.termination_grace_seconds="],
        id="k8s-stopped-mid-save",
    ),
]


@pytest.mark.parametrize(("log", "signature", "expected"), GOLDEN)
def test_signature(lmspec, log: str, signature: str, expected: list[str]) -> None:
    code, findings = _doctor(lmspec, log)
    assert code == 1
    assert [f["signature"] for f in findings] == [signature]
    finding = findings[0]
    assert finding["cause"] and finding["evidence"] and finding["fixes"]
    lines = (LOG_DATA / log).read_text().splitlines()
    for evidence in finding["evidence"]:  # evidence quotes the log's own lines, numbered
        assert evidence["text"].strip(".") in lines[evidence["line"] - 1]
    shown = "\n".join(
        [
            finding["cause"],
            *(e["text"] for e in finding["evidence"]),
            *(f"{x['key']}={x['value']}" for x in finding["fixes"]),
        ]
    )
    for text in expected:
        assert text in shown


@pytest.mark.parametrize("log", sorted(p.name for p in LOG_DATA.glob("healthy_*")))
def test_healthy_logs_exit_0(lmspec, log: str) -> None:
    path = LOG_DATA / log
    result = lmspec("doctor", str(path))
    lines = len(path.read_text().splitlines())
    assert (result.code, result.err) == (0, "")
    assert result.out == f"{path}: healthy — none of {len(SIGNATURES)} known failure signatures in {lines} lines\n"
    assert _doctor(lmspec, log) == (0, [])


def test_every_signature_has_a_golden_or_real_case() -> None:
    """A golden log here, or a real excerpt of the corpus (tests/logs/test_doctor_corpus.py), for each."""
    covered = {p.values[1] for p in GOLDEN} | {case.verdict for case in cases()}
    assert {s.name for s in SIGNATURES} - covered == {"tp_slowdown"}  # needs a Plan comm estimate: tests below


@pytest.fixture
def build(lmspec, tmp_path: Path):
    def compile_build(*overrides: str) -> Path:
        result = lmspec("compile", *overrides, "-o", str(tmp_path))
        assert result.code == 0, result.err
        return tmp_path / result.out.split()[1].rsplit("/", 1)[-1]

    return compile_build


def test_build_makes_fixes_exact(lmspec, build) -> None:
    b = build(
        "model=llama3_8b",
        "hardware=h100_80g",
        "hardware.nodes=2",
        "train.micro_batch_size=2",
        "train.global_batch_size=64",
        "train.recompute=none",
        "train.backend=deepspeed",
        "train.transformer_impl=local",
        "parallel.zero_stage=3",
        "hardware.inter_node.socket_ifname=ens3",
    )
    oom = _doctor(lmspec, "cuda_oom.log", "--build", str(b))[1][0]
    plan = json.loads((b / "plan.json").read_text())["memory"]
    assert f"planned {plan['total_bytes'] / 1024**3:,.1f} GiB" in oom["cause"]
    # 78.08 GiB in use + 3.50 GiB tried: what the run needed, against the model's plan
    assert f"needed at least {(78.08 + 3.50):.1f} GiB" in oom["cause"]
    fixes = [(f["key"], f["value"], f["why"].rsplit("(", 1)[-1]) for f in oom["fixes"]]
    assert fixes[:2] == [("train.micro_batch_size", "1", "fits)"), ("train.recompute", "full", "fits)")]
    assert {k for k, _, _ in fixes} <= {
        "train.micro_batch_size",
        "train.recompute",
        "parallel.offload_optimizer",
        "parallel.offload_params",
    }
    world = _doctor(lmspec, "world_size_mismatch.log", "--build", str(b))[1][0]
    assert world["fixes"][0]["key"] == "hardware.nodes" and world["fixes"][0]["value"] == "1"  # 8 ranks = 1 node
    # NCCL used TCP sockets on docker0 while the spec says IB through ens3 on 2 nodes
    nic = _doctor(lmspec, "nccl_wrong_interface.log", "--build", str(b))[1][0]
    assert "fell back to TCP sockets" in nic["cause"] and "asks for ens3" in nic["cause"]
    assert any(f["key"] == "hardware.inter_node.hca" for f in nic["fixes"])
    kv_finding = _doctor(lmspec, "vllm_kv_cache_too_small.log", "--build", str(b))[1][0]
    kv = {f["key"]: f["value"] for f in kv_finding["fixes"]}
    assert kv["serve.max_model_len"] == "25344" and kv["serve.kv_cache_dtype"] == "fp8"


def test_single_node_loopback_is_not_a_problem(lmspec, tmp_path: Path) -> None:
    log = tmp_path / "lo.log"
    log.write_text(
        "h:1:1 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>\n"
        "h:1:1 [0] NCCL INFO Using network Socket\n"
        "h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n"
    )
    assert lmspec("doctor", str(log)).code == 0


def test_tp_slowdown_from_plan_comm_estimate(lmspec, build) -> None:
    b = build(
        "model=llama3_8b",
        "hardware=rtx4090_24g",
        "hardware.nodes=2",
        "parallel.tp=8",
        "parallel.sequence_parallel=true",
        "parallel.distributed_optimizer=true",
        "train.global_batch_size=64",
    )
    plan = json.loads((b / "plan.json").read_text())
    if "comm" not in plan:
        pytest.skip("plan.json carries no comm estimate yet (compiler/models, issue 3)")
    code, findings = _doctor(lmspec, "healthy_megatron.log", "--build", str(b))
    assert code == 1 and "tp_slowdown" in [f["signature"] for f in findings]


def test_console_script_exit_codes() -> None:
    """The installed entry point, not only the in-process CLI: 1 on a problem, 0 when healthy."""
    lmspec = [str(Path(sys.executable).parent / "lmspec"), "doctor"]
    sick = subprocess.run(
        [*lmspec, str(LOG_DATA / "cuda_oom.log")], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    well = subprocess.run(
        [*lmspec, str(LOG_DATA / "healthy_megatron.log")], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert (sick.returncode, well.returncode) == (1, 0)
    assert "problem: CUDA out of memory" in sick.stdout and "train.micro_batch_size=" in sick.stdout


def test_nccl_fixes_leave_out_what_the_spec_already_has(lmspec, build) -> None:
    b = build(
        "model=llama3_8b",
        "hardware=h100_80g",
        "hardware.nodes=2",
        "parallel.distributed_optimizer=true",
        "cluster.nccl.timeout_minutes=20",
        "cluster.nccl.ib_timeout=14",
    )

    def fixes(log: str) -> dict[str, str]:
        return {f["key"]: f["value"] for f in _doctor(lmspec, log, "--build", str(b))[1][0]["fixes"]}

    timeout = fixes("torchrun_nccl_timeout.log")
    assert timeout == {"cluster.nccl.timeout_minutes": "40"}  # 2 x the spec's 20; INFO lines already present
    connection = fixes("slurm_nccl_connection.log")
    assert connection["cluster.nccl.ib_timeout"] == "22" and "cluster.nccl.ib_retry_cnt" not in connection
    assert "cluster.nccl.ib_gid_index" not in connection  # IB, not RoCE


def test_tp_slowdown_signature_given_a_plan_comm_share(lmspec, build) -> None:
    """The signature's own logic, fed a Plan whose comm estimate puts TP (or DP) over (or under) the limit."""
    import dataclasses

    pytest.importorskip(
        "lmspec.compiler.models.comm", reason="the comm model (compiler/models, issue 3) is not here yet"
    )
    from lmspec.compiler.models.comm import CommEstimate
    from lmspec.compiler.observe.doctor.comm import TpSlowdown
    from lmspec.compiler.observe.doctor.findings import LogText
    from lmspec.compiler.observe.logs.context import load_build

    context = load_build(
        build(
            "model=llama3_8b",
            "hardware=rtx4090_24g",
            "hardware.nodes=2",
            "parallel.tp=8",
            "parallel.sequence_parallel=true",
            "parallel.distributed_optimizer=true",
            "train.global_batch_size=64",
        )
    )
    log = LogText((LOG_DATA / "healthy_megatron.log").read_text().splitlines())

    def with_comm(tp_s: float, dp_s: float, compute_s: float):
        comm = CommEstimate(tp_s=tp_s, dp_s=dp_s, ep_s=0.0, pp_s=0.0, compute_s=compute_s)
        train = dataclasses.replace(context.plan.trained())
        vars(train)["comm"] = comm  # TrainPlan.comm is derived when first read and kept (a cached_property)
        return dataclasses.replace(context, plan=dataclasses.replace(context.plan, train=train))

    assert TpSlowdown().detect(log, with_comm(0.3, 0.03, 1.0)) is None  # 25% of the step: under the seed's 30%
    assert TpSlowdown().detect(log, with_comm(0.2, 0.6, 1.0)) is None  # DP traffic dominates, not TP
    finding = TpSlowdown().detect(log, with_comm(0.7, 0.2, 1.1))  # 0.9 s of 2.0: 45% of the step
    assert finding is not None and "45%" in finding.cause and "0.7 s of all-reduces" in finding.cause
    # the fixes are lower-TP layouts scored by the comm and memory models: fitting, lowest comm first
    assert finding.fixes and all(f.key == "parallel.tp" and int(f.value) < 8 for f in finding.fixes)
    assert "(fits)" in finding.fixes[0].why
    shares = [float(re.search(r"comm (\d+)% of the step", f.why).group(1)) for f in finding.fixes]
    fitting = [share for fix, share in zip(finding.fixes, shares, strict=True) if "(fits)" in fix.why]
    assert shares[0] <= 30 and fitting == sorted(fitting)
    assert (
        finding.evidence[0].text
        == "plan.json comm: share_of_step=0.45, compute_s=1.1, tp_s=0.7, dp_s=0.2, ep_s=0, pp_s=0"
    )
    assert finding.evidence[-1].text in log.lines[finding.evidence[-1].line - 1]


def test_cp_crash_is_an_unrecognised_failure_quoting_the_exception(lmspec) -> None:
    """The crash of issue 17 (CP on megatron-core's local attention) was called healthy."""
    code, findings = _doctor(lmspec, "megatron_cp_local_crash.log")
    assert code == 1
    assert [f["signature"] for f in findings] == ["unrecognised_failure"]
    (finding,) = findings
    assert "`AssertionError: Context parallelism is only supported by TEDotProductAttention!`" in finding["cause"]
    lines = (LOG_DATA / "megatron_cp_local_crash.log").read_text().splitlines()
    quoted = [(e["line"], e["text"]) for e in finding["evidence"]]
    assert quoted == [
        (5, "[rank0]: Traceback (most recent call last):"),
        (17, "[rank0]: AssertionError: Context parallelism is only supported by TEDotProductAttention!"),
        (21, lines[20].strip()),
    ]
    assert "exitcode: 1" in quoted[-1][1]
    text = lmspec("doctor", str(LOG_DATA / "megatron_cp_local_crash.log"))
    assert text.code == 1 and "problem: unrecognised failure [unrecognised_failure]" in text.out


@pytest.mark.parametrize(
    ("lines", "died"),
    [
        (
            ["step 3 loss 2.1", "lmspec: training exited with code 3"],
            "a non-zero exit (lmspec: training exited with code 3)",
        ),
        (["Traceback (most recent call last):", '  File "x.py", line 1', "KeyError"], "the exception `KeyError`"),
    ],
    ids=["exit-code-only", "bare-exception"],
)
def test_unrecognised_failure_without_a_full_traceback(lines: list[str], died: str) -> None:
    from lmspec.compiler.observe.doctor import diagnose
    from lmspec.compiler.observe.doctor.findings import LogText

    (finding,) = diagnose(LogText(lines), None)
    assert finding.signature == "unrecognised_failure" and f"The run failed with {died}" in finding.cause


def test_a_known_signature_is_not_also_unrecognised(lmspec) -> None:
    """torchrun's ChildFailedError follows every rank crash: a known cause is reported alone."""
    code, findings = _doctor(lmspec, "torchrun_nccl_timeout.log")
    assert code == 1 and [f["signature"] for f in findings] == ["nccl_timeout"]


def test_an_amd_build_names_rccl_and_hip_where_the_log_does_not(lmspec, build, tmp_path: Path) -> None:
    """ROCm/rccl#1728's excerpt says only "NCCL version 2.20.5": with the MI300X build it ran from, the internal
    error is RCCL's; an OOM is priced by the build's memory model, as CUDA's is."""
    b = build("model=llama3_8b", "hardware=mi300x_192g", "train.micro_batch_size=1")
    log = CORPUS / "rccl-internal-mi300x-four-gpus-reverse-path.log"
    rccl = json.loads(lmspec("doctor", str(log), "--build", str(b), "--format", "json").out)
    assert [f["signature"] for f in rccl] == ["rccl_error"]
    assert "xGMI mesh" in rccl[0]["cause"] and "internal error" in rccl[0]["evidence"][0]["text"]
    assert [f["key"] for f in rccl[0]["fixes"]] == ["cluster.nccl.debug"]
    hip_log = tmp_path / "hip_oom.log"  # torch's ROCm allocator message, as the corpus' threads quote it
    hip_log.write_text(
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "191.98 GiB of which 1.25 GiB is free. Of the allocated memory 185.08 GiB is allocated by PyTorch, and "
        "1.23 GiB is reserved by PyTorch but unallocated.\n"
    )
    (oom,) = json.loads(lmspec("doctor", str(hip_log), "--build", str(b), "--format", "json").out)
    assert oom["signature"] == "hip_oom" and oom["title"] == "HIP out of memory"
    assert "GPU 0: 191.98 GiB total, 1.25 GiB free" in oom["cause"] and "The memory model planned" in oom["cause"]
    # 191.98 - 1.25 + 2.00 GiB: what the run needed
    assert "needed at least 192.7 GiB" in oom["cause"]
