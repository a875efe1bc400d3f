"""Rules of `serve.extra_args`: each name an option of the installed vLLM's `vllm serve`, each value one its
parser takes, and none an option lmspec writes from its own keys.

vLLM's parser (lmspec.compiler.vllm_args) is imported only when extra_args holds something, so a spec
without it compiles without vLLM; where vLLM is not installed the names are checked for their form and
lmspec's own options only, and a warning says vLLM could not judge the rest (serve.sh's vLLM still will).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.rules.context import ServingContext
from lmspec.compiler.vllm_args import judge, serve_parser

EXTRA = "serve.extra_args"
OPTION_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")  # a long option as vllm.yaml spells it, without the dashes
# vLLM's destination attribute -> the lmspec key lmspec writes it from, in serve/vllm.yaml (vllm_options) or a
# node script's flags (role_flags), or that the build holds otherwise.
OPTION_KEYS = {
    "model": "serve.model_path",
    "model_tag": "serve.model_path",
    "served_model_name": "serve.served_model_name",
    "host": "serve.host",
    "port": "serve.port",
    "dtype": "serve.dtype",
    "tensor_parallel_size": "serve.tp",
    "pipeline_parallel_size": "serve.pp",
    "data_parallel_size": "serve.dp",
    "enable_expert_parallel": "serve.expert_parallel",
    "enable_eplb": "serve.eplb",
    "eplb_config": "serve.eplb",
    "all2all_backend": "serve.all2all_backend",
    "max_model_len": "serve.max_model_len",
    "gpu_memory_utilization": "serve.gpu_memory_utilization",
    "max_num_seqs": "serve.max_num_seqs",
    "max_num_batched_tokens": "serve.max_num_batched_tokens",
    "enable_prefix_caching": "serve.prefix_caching",
    "speculative_config": "serve.speculative",
    "kv_transfer_config": "serve.disaggregation",
    "kv_cache_dtype": "serve.kv_cache_dtype",
    "quantization": "serve.quantization",
    "enforce_eager": "serve.enforce_eager",
    "api_key": "serve.api_key_env",
    "distributed_executor_backend": "serve.multi_node",
    "data_parallel_backend": "serve.multi_node",
    "data_parallel_size_local": "serve.multi_node",
    "data_parallel_address": "serve.multi_node",
    "data_parallel_start_rank": "serve.multi_node",
    "headless": "serve.multi_node",
    "data_parallel_rpc_port": "serve.data_parallel_rpc_port",
    "nnodes": "serve.multi_node",
    "node_rank": "serve.multi_node",
    "master_addr": "serve.multi_node",
    "master_port": "serve.master_port",
}
# Destinations lmspec writes with no key of its own: the build decides them. (Keywords, not string keys:
# vLLM's `tokenizer` destination is no build file name, which tests/compiler/test_build_contract.py scans for.)
BUILD_DECIDES = dict(
    config="serve/serve.sh passes --config serve/vllm.yaml",
    attention_backend="lmspec names vLLM's CPU MLA backend on the cpu hardware (serve/vllm.yaml shows it)",
    tokenizer="the serve stage passes the training tokenizer to a model without one",
)


def _shown(ctx: ServingContext, key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)} ({ctx.origins.of(key)})"


def _owned(dest: str) -> str | None:
    """The fix for an option lmspec writes itself, or None."""
    if dest in OPTION_KEYS:
        return f"set {OPTION_KEYS[dest]} instead"
    if dest in BUILD_DECIDES:
        return f"{BUILD_DECIDES[dest]}; remove it"
    return None


def extra_args_are_vllms(ctx: ServingContext) -> Iterator[Problem]:
    extra = ctx.spec.serve.extra_args
    if not extra:
        return
    unchecked = []
    for name, value in extra.items():
        key = f"{EXTRA}.{name}"
        shown = _shown(ctx, key, value)
        if not OPTION_NAME.fullmatch(name):
            fix = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "an option name"
            yield error(key, f"{shown}: a vLLM option is written as in vllm.yaml, lower case with dashes ({fix})")
            continue
        if value is None:
            yield error(
                key, f"{shown}: vLLM reads a config file's null as the text None; remove {key} for vLLM's default"
            )
            continue
        parser = serve_parser()
        if parser is None:
            owned = _owned(name.replace("-", "_"))
            if owned:
                yield error(key, f"{shown}: lmspec writes --{name} itself: {owned}")
            else:
                unchecked.append(name)
            continue
        verdict = judge(parser, name, value)
        if verdict.dest is None:
            hint = f"; did you mean {' or '.join(verdict.near)}?" if verdict.near else ""
            yield error(key, f"{shown}: `vllm serve` has no option --{name}{hint}")
        elif (owned := _owned(verdict.dest)) is not None:
            yield error(key, f"{shown}: lmspec writes --{name} itself: {owned}")
        elif verdict.error is not None:
            yield error(key, f"{shown}: vLLM refuses it: {verdict.error}")
    if unchecked:
        yield warning(
            EXTRA,
            f"{EXTRA} holds {', '.join(unchecked)}, but vLLM is not installed here, so its parser could not check "
            "them; install vLLM (pip install '.[serve]') to check them at compile time (vLLM checks them again "
            "when serve.sh starts)",
        )


RULES = (extra_args_are_vllms,)
