"""Rules: the hardware says one thing about what the ranks run on and how they are joined.

Two keys say whether a job runs on CPU ranks: hardware.intra_node.link=shm (host shared memory between
processes) and hardware.gpu.generation=cpu. The compiler reads the first (models.dims.device_kind) and
the step-time model the second, so a spec where they disagree would be a GPU job to the launchers and
the capability table and a CPU to the cost model, or the other way round: it is refused, naming both.
NVLink joins NVIDIA's GPUs and Infinity Fabric (xgmi) AMD's: a link of the other vendor is refused. An
NVLink domain wider than a node is whole nodes of NVLink (an NVL72 rack's hosts): any other is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args, get_type_hints

from lmspec.compiler.errors import Problem, error
from lmspec.compiler.models.vendor import VENDOR_OF_GENERATION, vendor_of
from lmspec.compiler.rules.context import RuleContext
from lmspec.compiler.spec.sections import GpuSpec

LINK, GENERATION = "hardware.intra_node.link", "hardware.gpu.generation"
CPU_LINK, CPU_GENERATION = "shm", "cpu"
# the links only one vendor's GPUs have
VENDOR_LINKS = {"nvidia": ("nvlink", "nvlink5"), "amd": ("xgmi",)}
GPU_GENERATIONS = tuple(v for v in get_args(get_type_hints(GpuSpec)["generation"]) if v != CPU_GENERATION)


def _one_of(values: tuple[str, ...]) -> str:
    return f"{', '.join(values[:-1])} or {values[-1]}"


def link_matches_generation(ctx: RuleContext) -> Iterator[Problem]:
    hw = ctx.spec.hardware
    cpu_link, cpu_generation = hw.intra_node.link == CPU_LINK, hw.gpu.generation == CPU_GENERATION
    if cpu_link == cpu_generation:
        return
    if cpu_link:
        links = (*VENDOR_LINKS.get(vendor_of(hw), ()), "pcie")
        fix = f"set {GENERATION}={CPU_GENERATION} for CPU ranks, or {LINK}={_one_of(links)} for GPUs"
    else:
        fix = f"set {LINK}={CPU_LINK} for CPU ranks, or {GENERATION}={_one_of(GPU_GENERATIONS)} for GPUs"
    yield error(
        LINK,
        f"{ctx.show(LINK)} and {ctx.show(GENERATION)} disagree on whether the ranks are CPU processes "
        f"({LINK}={CPU_LINK} goes with {GENERATION}={CPU_GENERATION}, and only with it); {fix}",
    )


DOMAIN = "hardware.nvlink_domain"


def link_matches_vendor(ctx: RuleContext) -> Iterator[Problem]:
    hw = ctx.spec.hardware
    vendor = vendor_of(hw)
    for owner, links in VENDOR_LINKS.items():
        if hw.intra_node.link in links and vendor != owner:
            theirs = _one_of(tuple(g for g, v in VENDOR_OF_GENERATION.items() if v == owner))
            ours = VENDOR_LINKS.get(vendor, ())
            fix = f"{LINK}={_one_of((*ours, 'pcie'))}" if ours else f"{LINK}=pcie"
            yield error(
                LINK,
                f"{ctx.show(LINK)} joins only {owner.upper()} GPUs ({GENERATION}={theirs}), but "
                f"{ctx.show(GENERATION)} is {vendor.upper() if vendor != 'cpu' else 'a CPU'}'s; set {fix}, or "
                f"the generation of the GPUs the link joins",
            )


def nvlink_domain_is_whole_nodes(ctx: RuleContext) -> Iterator[Problem]:
    hw = ctx.spec.hardware
    domain, per_node = hw.nvlink_domain, hw.gpus_per_node
    if domain is None or domain == per_node:
        return
    if domain < per_node or domain % per_node:
        yield error(
            DOMAIN,
            f"{ctx.show(DOMAIN)} must be whole nodes of {ctx.show('hardware.gpus_per_node')} (a rack's NVLink "
            f"joins its hosts' GPUs all or none); set {DOMAIN}={max(per_node, domain // per_node * per_node)}, or "
            f"null for one node",
        )
    elif hw.intra_node.link not in VENDOR_LINKS["nvidia"]:
        yield error(
            DOMAIN,
            f"{ctx.show(DOMAIN)} joins {domain // per_node} hosts, which only NVLink does (GB200/GB300 NVL72), "
            f"but {ctx.show(LINK)}; set {DOMAIN}=null, or {LINK}=nvlink5 for a rack NVLink joins",
        )


RULES = (link_matches_generation, link_matches_vendor, nvlink_domain_is_whole_nodes)
