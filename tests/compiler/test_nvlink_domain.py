"""An NVLink domain wider than a host (issue 42, item 1): GB200 NVL72's 72 GPUs on 18 hosts of 4 reach each
other over NVLink. The rules keep TP inside the domain rather than the host, the communication model prices
what stays inside it at the link's speed, and AMD's Infinity Fabric, a full mesh, gives a group of n GPUs
n - 1 of each GPU's links."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.specs import spec_of

from lmspec.compiler.models.dims import ParallelDims, domain_gpus_of, segment_nodes
from lmspec.compiler.models.steptime_inputs import bus_links
from lmspec.compiler.pipeline import derive_despite_rules
from lmspec.compiler.spec.sections.spec import training

# A GB200 NVL72 rack written from the H100 preset's keys, so this test does not depend on the preset's
# datasheet figures: hosts of 4 GPUs, 72 of them on one NVLink 5 domain.
RACK = (
    "hardware=h100_80g",
    "hardware.gpus_per_node=4",
    "hardware.nvlink_domain=72",
    "hardware.intra_node.link=nvlink5",
    "hardware.intra_node.gb_per_s=1800",
    "hardware.inter_node.nics_per_node=4",
)


def _errors(*overrides: str) -> list[str]:
    """The rules' errors for a spec whose keys all type-check (a typo'd key would pass vacuously)."""
    derived = derive_despite_rules(list(overrides))
    assert derived.params is not None, [p.message for p in derived.problems]
    return [p.message for p in derived.problems if p.severity == "error"]


@pytest.mark.parametrize(
    ("nodes", "per_domain", "segment"), [(32, 18, 16), (18, 18, 18), (1, 18, 1), (36, 18, 18), (7, 18, 7), (4, 1, 1)]
)
def test_a_job_fills_the_largest_whole_share_of_a_domain_its_nodes_divide_into(
    nodes: int, per_domain: int, segment: int
) -> None:
    assert segment_nodes(nodes, per_domain) == segment
    assert list(segment_nodes(np.array([nodes, 2 * nodes]), per_domain))[0] == segment


def test_the_domain_is_a_node_unless_the_hardware_names_a_wider_one() -> None:
    assert domain_gpus_of(spec_of("hardware=h100_80g", "hardware.nodes=4").hardware) == 8
    assert domain_gpus_of(spec_of(*RACK, "hardware.nodes=32").hardware) == 64  # 16 of the rack's 18 hosts
    assert domain_gpus_of(spec_of(*RACK, "hardware.nodes=18").hardware) == 72


def test_tp_across_hosts_of_one_nvlink_domain_is_accepted_and_beyond_it_refused_naming_the_domain() -> None:
    model = ("model=llama3_70b", "model.num_kv_heads=16", "serve=null")
    assert not [e for e in _errors(*RACK, *model, "hardware.nodes=4", "parallel.tp=16") if "parallel.tp" in e]
    refused = [e for e in _errors(*RACK, *model, "hardware.nodes=3", "parallel.tp=16") if "crosses" in e]
    assert len(refused) == 1
    assert "NVLink domain (12 GPUs of hardware.nvlink_domain=72" in refused[0] and "tp <= 12" in refused[0]
    host = [e for e in _errors("hardware=h100_80g", *model, "hardware.nodes=2", "parallel.tp=16") if "crosses" in e]
    assert len(host) == 1 and "crosses nodes (hardware.gpus_per_node=8" in host[0]


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (("hardware.nvlink_domain=12",), "must be whole nodes of hardware.gpus_per_node=8"),
        (("hardware.nvlink_domain=4",), "must be whole nodes of hardware.gpus_per_node=8"),
        (("hardware.nvlink_domain=16", "hardware.intra_node.link=pcie"), "which only NVLink does"),
        (("hardware.intra_node.link=xgmi",), "joins only AMD GPUs (hardware.gpu.generation=cdna3 or cdna4)"),
        (
            ("hardware.gpu.generation=cdna3", "hardware.intra_node.link=nvlink"),
            "joins only NVIDIA GPUs (hardware.gpu.generation=ampere, ada, hopper or blackwell)",
        ),
    ],
)
def test_hardware_whose_links_cannot_exist_is_refused_naming_the_key(overrides: tuple[str, ...], says: str) -> None:
    errors = _errors("hardware=h100_80g", "serve=null", *overrides)
    assert any(says in e for e in errors), errors


def _expert_comm_s(*overrides: str) -> float:
    """Seconds of EP all-to-all per step the step-time model prices for DeepSeek-V3 at EP64 on 128 GPUs."""
    plan = derive_despite_rules(
        [
            "model=deepseek_v3",
            *overrides,
            "hardware.nodes=32",
            "parallel.pp=8",
            "parallel.pp_layout=auto",
            "parallel.ep=64",
            "parallel.distributed_optimizer=true",
            "serve=null",
            "train.global_batch_size=1024",
        ]
    ).plan
    assert plan is not None and plan.train is not None
    return plan.train.comm.ep_s


def test_expert_parallelism_inside_the_rack_is_priced_at_nvlink_speed_and_beyond_it_at_the_nics() -> None:
    """EP64 on 32 hosts of 4: inside one NVLink domain of 64 GPUs, every all-to-all stays on NVLink 5
    (1,800 GB/s); the same hosts without the rack's NVLink send 60 of 63 peers' tokens over 4 x 400 Gbit/s."""
    inside = _expert_comm_s(*RACK)
    hosts = _expert_comm_s(*RACK[:-1], "hardware.nvlink_domain=null", "hardware.inter_node.nics_per_node=4")
    links = bus_links(spec_of(*RACK).hardware)
    assert inside > 0 and hosts / inside > 0.5 * links.intra_bytes_per_s / links.inter_bytes_per_s


def test_an_xgmi_mesh_gives_a_group_the_links_to_its_members_only() -> None:
    """MI300X: 7 Infinity Fabric links per GPU, one to each other GPU of the platform; a TP2 pair moves its
    all-reduce over one of them, a TP8 group over all seven (NVSwitch gives every group the whole link)."""
    mesh = bus_links(
        spec_of("hardware=h100_80g", "hardware.gpu.generation=cdna3", "hardware.intra_node.link=xgmi").hardware
    )
    switch = bus_links(spec_of("hardware=h100_80g").hardware)
    assert mesh.mesh_peers == 7 and switch.mesh_peers == 0
    assert mesh.intra_for(2) == pytest.approx(mesh.intra_bytes_per_s / 7)
    assert mesh.intra_for(8) == pytest.approx(mesh.intra_bytes_per_s)
    assert switch.intra_for(2) == switch.intra_bytes_per_s


def test_a_group_that_straddles_two_domains_is_priced_off_the_link() -> None:
    """Groups of 6 on nodes of 8 (Megatron's rank order): ranks 6-11 span two nodes, and the slowest group
    sets the pace, so a span that does not divide the domain leaves it."""
    spec = training(spec_of("hardware=h100_80g", "hardware.nodes=3", "model=llama3_70b", "parallel.tp=2"))
    assert spec is not None
    dims = ParallelDims.from_spec(spec)
    assert dims is not None
    assert not dims.spans_nodes(8) and not dims.spans_nodes(4)
    assert dims.spans_nodes(6) and dims.spans_nodes(16)


def test_a_rack_job_on_kubernetes_is_refused_until_its_pods_claim_an_imex_channel() -> None:
    k8s = ("cluster=kubernetes", "cluster.kubernetes.image=ghcr.io/team/lmspec:1", "serve=null")
    model = ("model=deepseek_v2_lite", "hardware=gb200_nvl72")
    refused = [e for e in _errors(*model, *k8s, "hardware.nodes=2") if "IMEX" in e]
    assert len(refused) == 1 and "use cluster=slurm" in refused[0] and "hardware.nvlink_domain=null" in refused[0]
    assert not [e for e in _errors(*model, *k8s, "hardware.nodes=1") if "IMEX" in e]  # one host: no multi-node NVLink


def test_serving_tp_beyond_the_rack_domain_it_fills_is_warned_naming_the_domain() -> None:
    """20 hosts of a rack of 18 fill domains of 10 hosts (40 GPUs): TP32 stays on NVLink, TP64 does not."""
    serve = ("model=llama3_70b", *RACK, "hardware.nodes=20", "train=null", "parallel=null", "serve.max_model_len=4096")
    engine = ("serve.multi_node=mp", "serve.host=0.0.0.0")

    def tp_warnings(tp: int) -> list[str]:
        derived = derive_despite_rules([*serve, *engine, f"serve.tp={tp}"])
        return [p.message for p in derived.problems if p.key == "serve.tp" and "exceeds" in p.message]

    warned = tp_warnings(64)
    assert len(warned) == 1 and "the 40 GPUs of the NVLink domain it fills (hardware.nvlink_domain=72" in warned[0]
    assert "use serve.tp=32 with serve.pp across domains" in warned[0]  # the widest TP the heads divide into
    assert tp_warnings(32) == []
