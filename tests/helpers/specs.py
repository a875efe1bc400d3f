"""Typed specs straight from a composition, for tests that probe layouts the semantic rules refuse."""

from __future__ import annotations

from helpers.netns import IFNAME
from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.typed import from_dict


def spec_of(*overrides: str) -> Spec:
    """The typed spec of the built-in spec plus `overrides`, without the semantic rules."""
    return from_dict(Spec, compose_spec(list(overrides)).spec)


# DeepSeek-V3's pre-training run as lmspec keys (tests/data/steptime/published_runs.yaml): 2048 H800, PP16,
# EP64, FP8 with 128x128 blocks, selective recompute, DualPipe's bubble as 4 interleaved chunks per stage.
DEEPSEEK_V3_PUBLISHED_RUN = (
    "model=deepseek_v3",
    "hardware=h800_80g",
    "hardware.nodes=256",
    "train.global_batch_size=15360",
    "parallel.pp=16",
    "parallel.pp_layout=auto",
    "parallel.ep=64",
    "parallel.virtual_stages=4",
    "parallel.distributed_optimizer=true",
    "train.precision=fp8",
    "train.fp8_recipe=blockwise",
    "train.moe.dispatcher=flex",  # DeepSeek's own all-to-all kernels, released as DeepEP
    "train.moe.flex_backend=deepep",
    "cluster=slurm",
    "serve=null",
)


# The built-in spec (which trains and serves) run under Kubernetes: its image, and a server that the leader
# Service and its readiness probe reach at the pod's address, with no API key (no Secret in these tests).
ON_KUBERNETES = (
    "cluster=kubernetes",
    "cluster.kubernetes.image=ghcr.io/my-team/lmspec:0.1",
    "serve.host=0.0.0.0",
    "serve.api_key_env=null",
)


# Serving only: the tiny model in one engine of tensor parallel 2 over two one-rank "hosts" (network namespaces,
# helpers.netns), vLLM's mp executor across them on the interface the namespaces share, no API key.
SERVED_TP2_ON_TWO_HOSTS = (
    "hardware=cpu",
    "hardware.gpus_per_node=1",
    "hardware.nodes=2",
    f"hardware.inter_node.socket_ifname={IFNAME}",
    "serve.tp=2",
    "serve.host=0.0.0.0",
    "train=null",
    "parallel=null",
    "convert=null",
    "serve.max_model_len=128",
    "serve.api_key_env=null",
)
