"""Every shell artifact passes shellcheck, is byte-stable, and says what the Plan says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.build import compile_build

from lmspec.compiler.build.files import NCCL_ENV, SBATCH_SH, TORCHRUN_SH
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.pipeline import make_plan

SHELL_FILES = (TORCHRUN_SH, SBATCH_SH, NCCL_ENV)
ROCE = [
    "hardware.inter_node.fabric=roce",
    "cluster.nccl.ib_gid_index=3",
    "hardware.inter_node.hca=[mlx5_0,mlx5_1:1]",
    "hardware.inter_node.socket_ifname=eth0",
]
VARIANTS = {
    "tiny": ([], None),
    "tiny-slurm-resume-never": (
        ["cluster=slurm", "train.checkpoint.resume=never", "cluster.slurm.requeue=false"],
        None,
    ),
    "tiny-2-nodes": (["hardware.nodes=2", "cluster=slurm"], None),
    "tiny-deepspeed": ([], "tiny_deepspeed_zero3_2rank_cpu_fp32"),
    "llama3_70b": ([], "llama3_70b_pretrain_64gpu_h100_bf16"),
    "llama3_70b-roce-partition": (
        ROCE + ["cluster.slurm.partition=gpu", "cluster.slurm.account=proj-1"],
        "llama3_70b_pretrain_64gpu_h100_bf16",
    ),
    "llama3_70b-deepspeed-offload": (
        [
            "parallel.tp=1",
            "parallel.pp=1",
            "parallel.sequence_parallel=false",
            "parallel.distributed_optimizer=false",
            "train.backend=deepspeed",
            "train.transformer_impl=local",
            "parallel.zero_stage=3",
            "parallel.offload_optimizer=true",
            "train.recompute=full",
        ],
        "llama3_70b_pretrain_64gpu_h100_bf16",
    ),
    "llama3_70b-rtx4090-ethernet": (
        [
            "hardware=rtx4090_24g",
            "hardware.inter_node.socket_ifname=enp1s0",
            "train.recompute=full",
            "parallel.pp=8",
            "parallel.pp_layout=auto",
            "train.flash_attention=false",
        ],
        "llama3_70b_pretrain_64gpu_h100_bf16",
    ),
    "deepseek_v3": ([], "deepseek_v3_pretrain_2048gpu_h800_bf16"),
    "llama3_70b-mi300x-roce": (["hardware=mi300x_192g", *ROCE], "llama3_70b_pretrain_64gpu_h100_bf16"),
    # 32 hosts of 4 GPUs in NVL72 racks of 18 hosts: 2 racks, 16 hosts of each
    "llama3_70b-gb200-rack": (
        ["hardware=gb200_nvl72", "hardware.nodes=32", "cluster=slurm"],
        "llama3_70b_pretrain_64gpu_h100_bf16",
    ),
}


class _Builds(dict):
    """Compiles a variant on first use, so one invalid variant fails only its own tests."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, variant: str) -> Path:
        overrides, spec = VARIANTS[variant]
        self[variant] = compile_build(self.root / variant, overrides, spec).dir
        return self[variant]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Builds(tmp_path_factory.mktemp("builds"))


@pytest.mark.parametrize("variant", VARIANTS)
def test_shellcheck_has_no_findings(variant: str, builds: dict[str, Path], shellcheck: str) -> None:
    files = [str(builds[variant] / rel) for rel in SHELL_FILES]
    result = subprocess.run([shellcheck, "--format=gcc", *files], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    for path in files:
        assert subprocess.run(["bash", "-n", path], check=False).returncode == 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiling_twice_is_byte_identical_and_machine_free(variant: str, builds: dict[str, Path]) -> None:
    overrides, spec = VARIANTS[variant]
    again = build_files(make_plan(list(overrides), Path(spec) if spec else None))
    for rel, text in again.items():
        assert (builds[variant] / rel).read_bytes() == text.encode("utf-8"), rel
    for rel in SHELL_FILES:
        # Artifacts are reviewed and committed: nothing of this machine or checkout in them.
        assert str(Path.cwd()) not in again[rel] and str(builds.root) not in again[rel]


def _sbatch_options(text: str) -> dict[str, str]:
    lines = [ln.removeprefix("#SBATCH ") for ln in text.splitlines() if ln.startswith("#SBATCH ")]
    return dict(ln.split("=", 1) if "=" in ln else (ln, "") for ln in lines)


@pytest.mark.parametrize("variant", VARIANTS)
def test_scripts_carry_the_plans_numbers(variant: str, builds: dict[str, Path]) -> None:
    overrides, spec = VARIANTS[variant]
    plan = make_plan(list(overrides), Path(spec) if spec else None)
    s, layout = plan.spec, plan.trained().layout
    torchrun = (builds[variant] / TORCHRUN_SH).read_text()
    assert f"NNODES={layout.nodes}\n" in torchrun
    assert f"NPROC_PER_NODE={layout.gpus_per_node}\n" in torchrun
    port = s.cluster.master_port
    if port is not None:
        assert f'MASTER_PORT="${{MASTER_PORT:-{port}}}"' in torchrun
    elif layout.nodes > 1:
        assert 'MASTER_PORT="${MASTER_PORT:?set MASTER_PORT' in torchrun  # sbatch.sh derives it per job
    else:
        assert 'MASTER_PORT="${MASTER_PORT:-0}"' in torchrun  # one node: a free port
    assert "  train) MODULE=lmspec.runtime.train ;;\n" in torchrun
    assert "  import) MODULE=lmspec.runtime.convert.from_hf ;;\n" in torchrun
    assert '-m "$MODULE" "$BUILD_DIR" "${ENTRY_ARGS[@]}"' in torchrun
    options = _sbatch_options((builds[variant] / SBATCH_SH).read_text())
    assert options["--nodes"] == str(layout.nodes)
    assert options["--ntasks-per-node"] == "1"
    assert options["--time"] == s.cluster.slurm.time
    assert options["--signal"] == f"B:USR1@{s.cluster.slurm.signal_seconds}"
    assert ("--requeue" in options) == s.cluster.slurm.requeue
    assert options.get("--partition") == s.cluster.slurm.partition
    assert options.get("--account") == s.cluster.slurm.account
    gpus = str(layout.gpus_per_node) if plan.device == "gpu" else None
    assert options.get("--gpus-per-node") == gpus


def _exports(build: Path) -> dict[str, str]:
    text = (build / NCCL_ENV).read_text()
    return dict(ln.removeprefix("export ").split("=", 1) for ln in text.splitlines() if ln.startswith("export "))


def test_nccl_env_follows_the_fabric(builds: dict[str, Path]) -> None:
    def exports(variant: str) -> dict[str, str]:
        return _exports(builds[variant])

    ib, roce, eth, cpu = (
        exports(v) for v in ("llama3_70b", "llama3_70b-roce-partition", "llama3_70b-rtx4090-ethernet", "tiny")
    )
    assert ib["NCCL_IB_DISABLE"] == "0" and "NCCL_IB_GID_INDEX" not in ib and "NCCL_IB_HCA" not in ib
    assert ib["NCCL_IB_TIMEOUT"] == "22" and ib["NCCL_IB_RETRY_CNT"] == "7"
    assert ib["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and ib["NCCL_DEBUG"] == "WARN"
    assert ib["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == str(30 * 60) and ib["DEEPSPEED_TIMEOUT"] == "30"
    assert roce["NCCL_IB_GID_INDEX"] == "3" and roce["NCCL_IB_HCA"] == "mlx5_0,mlx5_1:1"
    assert roce["NCCL_SOCKET_IFNAME"] == "eth0"
    assert eth["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_TIMEOUT" not in eth
    assert eth["NCCL_SOCKET_IFNAME"] == "enp1s0"
    assert cpu == {"DEEPSPEED_TIMEOUT": "30", "GLOO_SOCKET_IFNAME": "lo"}  # gloo only on the cpu hardware
    # megatron on GPUs: one CUDA queue; TE's unfused attention only where train.flash_attention=false
    assert ib["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and "NVTE_FLASH_ATTN" not in ib
    assert eth["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and eth["NVTE_FLASH_ATTN"] == eth["NVTE_FUSED_ATTN"] == "0"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in exports("llama3_70b-deepspeed-offload")
    text = (builds["llama3_70b"] / NCCL_ENV).read_text().splitlines()
    for i, line in enumerate(text):
        if line.startswith("export "):
            assert text[i - 1].startswith("# "), f"{line!r} has no reason above it"


def test_multi_node_torchrun_needs_master_addr(builds: dict[str, Path], tmp_path: Path) -> None:
    script = builds["llama3_70b"] / TORCHRUN_SH
    env = {"PATH": "/usr/bin:/bin", "LMSPEC_PYTHON": "/bin/false"}
    result = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "MASTER_ADDR" in result.stderr


# what only RCCL and ROCm read, and what only NVIDIA's NCCL does
ROCM_ONLY = ("HSA_NO_SCRATCH_RECLAIM", "HSA_FORCE_FINE_GRAIN_PCIE", "TORCH_NCCL_HIGH_PRIORITY", "NCCL_MIN_NCHANNELS")
NVIDIA_ONLY = ("NCCL_MNNVL_ENABLE", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE")


def test_an_mi300x_build_holds_rccl_settings_for_its_roce_fabric(builds: dict[str, Path]) -> None:
    build = builds["llama3_70b-mi300x-roce"]
    text = (build / NCCL_ENV).read_text()
    assert text.splitlines()[1].startswith("# RCCL and kernel settings for llama3_70b")
    env = _exports(build)
    # the NCCL_* names RCCL reads, from the spec's fabric keys
    assert env["NCCL_IB_DISABLE"] == "0" and env["NCCL_IB_GID_INDEX"] == "3" and env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1:1"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    # ROCm's own; 112 channels is AMD's MI300X (CDNA3) figure
    assert [env[name] for name in ROCM_ONLY] == ["1", "1", "1", "112"]
    assert not set(NVIDIA_ONLY) & set(env)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("export "):
            assert lines[i - 1].startswith("# "), f"{line!r} has no reason above it"


def test_cdna4_keeps_rccls_default_channels_and_nvidia_gets_no_rocm_settings(tmp_path: Path) -> None:
    spec = "llama3_8b_pretrain_8gpu_h100_bf16"
    mi355x = _exports(compile_build(tmp_path / "mi355x", ["hardware=mi355x_288g"], spec).dir)
    assert mi355x["HSA_NO_SCRATCH_RECLAIM"] == "1" and "NCCL_MIN_NCHANNELS" not in mi355x
    h100 = _exports(compile_build(tmp_path / "h100", [], spec).dir)
    assert not set(ROCM_ONLY) & set(h100)


def test_a_rack_job_turns_on_multi_node_nvlink_and_asks_slurm_for_whole_segments(builds: dict[str, Path]) -> None:
    rack, host = builds["llama3_70b-gb200-rack"], builds["llama3_70b"]
    env = _exports(rack)
    assert env["NCCL_MNNVL_ENABLE"] == "1" and env["NCCL_CUMEM_ENABLE"] == "1"
    assert "NCCL_NVLS_ENABLE" not in env  # NCCL's default (on where NVLink SHARP is) stays
    # Slurm's topology/block: 32 nodes in segments of 16, each inside one 18-host rack (16 divides 32)
    options = _sbatch_options((rack / SBATCH_SH).read_text())
    assert options["--segment"] == "16" and options["--nodes"] == "32"
    # an NVLink domain of one host (H100): neither
    assert "--segment" not in _sbatch_options((host / SBATCH_SH).read_text())
    assert not {"NCCL_MNNVL_ENABLE", "NCCL_CUMEM_ENABLE"} & set(_exports(host))
