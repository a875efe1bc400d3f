"""Rules of serving at scale: expert-parallel load balancing, the expert all-to-all, MTP speculative decoding
and disaggregated prefill/decode pools, each against what vLLM 0.32 accepts (vllm/config/parallel.py,
speculative.py, the fused-MoE layer) so a build does not start a server that refuses at load time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from lmspec.compiler.build.files import SERVE_POOLS
from lmspec.compiler.endpoint import loopback
from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.models.dims import device_kind, divisors
from lmspec.compiler.rules.context import ServingContext, listed
from lmspec.compiler.rules.serving import more_hardware_fix

EPLB = "serve.eplb"
ALL2ALL = "serve.all2all_backend"
SPECULATIVE = "serve.speculative"
DISAGGREGATION = "serve.disaggregation"
REDUNDANT_HINTS = 3  # redundant-expert counts a hint offers


@dataclass(frozen=True)
class _Engine:
    """One kind of vLLM engine the build starts: the one of serve/vllm.yaml, or a disaggregated pool's."""

    prefix: str  # the keys its tp and dp are read from: serve or serve.disaggregation.<pool>
    tp: int
    dp: int


def _engines(ctx: ServingContext) -> list[_Engine]:
    v = ctx.spec.serve
    engines = [_Engine("serve", v.tp, v.dp)]
    if v.disaggregation is not None:
        for pool in SERVE_POOLS:
            p = getattr(v.disaggregation, pool)
            engines.append(_Engine(f"{DISAGGREGATION}.{pool}", p.tp, p.dp))
    return engines


def eplb_applies(ctx: ServingContext) -> Iterator[Problem]:
    """vLLM balances experts over the expert-parallel group (tp x dp ranks) of a MoE model on GPUs, and
    places (experts + redundant) evenly over it."""
    v, moe = ctx.spec.serve, ctx.spec.model.moe
    if v.eplb is None:
        return
    if moe is None:
        yield error(
            EPLB, f"serve.eplb balances experts, but the model has none ({ctx.show('model.moe')}); set serve.eplb=null"
        )
        return
    if not v.expert_parallel:
        yield error(
            EPLB,
            f"serve.eplb balances the experts over expert-parallel ranks, but {ctx.show('serve.expert_parallel')}; "
            "set serve.expert_parallel=true, or serve.eplb=null",
        )
    if device_kind(ctx.spec) == "cpu":
        yield error(
            EPLB, "vLLM runs EPLB on CUDA, ROCm or XPU devices only, not on the cpu hardware; set serve.eplb=null"
        )
    redundant = v.eplb.num_redundant_experts
    for engine in _engines(ctx):
        ranks = engine.tp * engine.dp
        factors = f"{ctx.factor(f'{engine.prefix}.tp')} x {ctx.factor(f'{engine.prefix}.dp')} = {ranks}"
        if ranks == 1:
            yield error(
                EPLB,
                f"EPLB needs more than one expert-parallel rank, but {factors}; raise {engine.prefix}.dp or "
                f"{engine.prefix}.tp, or set serve.eplb=null",
            )
        elif (moe.num_experts + redundant) % ranks:
            first = -moe.num_experts % ranks
            valid = [first + k * ranks for k in range(REDUNDANT_HINTS)]
            yield error(
                f"{EPLB}.num_redundant_experts",
                f"vLLM places experts evenly: {ctx.factor('model.moe.num_experts')} + "
                f"{ctx.factor(f'{EPLB}.num_redundant_experts')} = {moe.num_experts + redundant} is not a multiple of "
                f"the {ranks} expert-parallel ranks ({factors}); valid: "
                + ", ".join(f"serve.eplb.num_redundant_experts={r}" for r in valid),
            )


def all2all_needs_expert_parallel(ctx: ServingContext) -> Iterator[Problem]:
    """The backend carries tokens to their experts' ranks: it exists only with expert parallel, and vLLM
    uses it only where attention is data parallel (dp > 1; ParallelConfig.use_all2all)."""
    v = ctx.spec.serve
    if v.all2all_backend is None:
        return
    if not v.expert_parallel:
        yield error(
            ALL2ALL,
            f"{ctx.show(ALL2ALL)} is the expert all-to-all, used only with expert parallel, but "
            f"{ctx.show('serve.expert_parallel')}; set serve.expert_parallel=true, or serve.all2all_backend=null",
        )
    elif all(engine.dp == 1 for engine in _engines(ctx)):
        yield warning(
            ALL2ALL,
            f"{ctx.show(ALL2ALL)} has no effect with {ctx.show('serve.dp')}: vLLM dispatches tokens to experts "
            "with the all-to-all only under data-parallel attention (serve.dp > 1, e.g. serve.tp=1 with "
            "serve.dp=<GPUs>); raise serve.dp, or set serve.all2all_backend=null",
        )


def speculative_has_mtp_modules(ctx: ServingContext) -> Iterator[Problem]:
    """method mtp drafts with the checkpoint's MTP modules; vLLM runs them in turn, so more drafts than
    modules must be a multiple of them (SpeculativeConfig: num_speculative_tokens % n_predict)."""
    s, layers = ctx.spec.serve.speculative, ctx.spec.model.mtp_layers
    if s is None:
        return
    if layers == 0:
        yield error(
            SPECULATIVE,
            f"serve.speculative.method=mtp drafts with the model's multi-token-prediction modules, but "
            f"{ctx.show('model.mtp_layers')}; set serve.speculative=null, or serve a model that has them "
            "(DeepSeek-V3: model.mtp_layers=1)",
        )
    elif s.num_tokens > layers and s.num_tokens % layers:
        valid = [*range(1, layers + 1), 2 * layers, 3 * layers]
        yield error(
            f"{SPECULATIVE}.num_tokens",
            f"{ctx.show(f'{SPECULATIVE}.num_tokens')} is more than {ctx.show('model.mtp_layers')} and not a "
            f"multiple of it: vLLM runs the MTP modules in turn; valid: {listed(valid)}",
        )


def disaggregation_fits(ctx: ServingContext) -> Iterator[Problem]:
    """Each pool engine splits the heads and fits a node; each engine takes a node of its own."""
    d, heads = ctx.spec.serve.disaggregation, ctx.spec.model.num_attention_heads
    if d is None:
        return
    if device_kind(ctx.spec) == "cpu":
        yield error(
            DISAGGREGATION,
            f"{ctx.show('serve.disaggregation.kv_connector')} moves KV caches between GPUs (NIXL/UCX, RDMA); "
            "vLLM's CPU backend has no such transfer: set serve.disaggregation=null on the cpu hardware",
        )
    if loopback(ctx.spec.serve.host):
        yield error(
            "serve.host",
            f"{ctx.show('serve.host')} is a loopback address, but the pools' engines run on their own nodes and a "
            "router on another reaches them there; use serve.host=0.0.0.0 (or each node's address)",
        )
    per_node = ctx.spec.hardware.gpus_per_node
    for pool in SERVE_POOLS:
        p, prefix = getattr(d, pool), f"{DISAGGREGATION}.{pool}"
        if heads % p.tp:
            yield error(
                f"{prefix}.tp",
                f"{ctx.show(f'{prefix}.tp')} does not divide {ctx.show('model.num_attention_heads')}; "
                f"valid: {listed(divisors(heads))}",
            )
        if p.tp * p.dp > per_node:
            yield error(
                f"{prefix}.tp",
                f"a {pool} engine's {ctx.factor(f'{prefix}.tp')} x {ctx.factor(f'{prefix}.dp')} = {p.tp * p.dp} "
                f"GPUs exceeds a node's {ctx.show('hardware.gpus_per_node')}: each engine of a pool runs on one "
                f"node; lower {prefix}.tp or {prefix}.dp",
            )
    nodes = d.prefill.engines + d.decode.engines
    if nodes > ctx.spec.hardware.nodes:
        yield error(
            DISAGGREGATION,
            f"the pools need {ctx.factor(f'{DISAGGREGATION}.prefill.engines')} + "
            f"{ctx.factor(f'{DISAGGREGATION}.decode.engines')} = {nodes} nodes (an engine per node), but "
            f"{ctx.show('hardware.nodes')}; use fewer engines, or {more_hardware_fix(ctx, nodes)}",
        )


RULES = (eplb_applies, all2all_needs_expert_parallel, speculative_has_mtp_modules, disaggregation_fits)
