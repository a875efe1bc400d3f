"""A KubeRay v1.7.0 RayService running Ray Serve's OpenAI-compatible vLLM app (ray.serve.llm
build_openai_app) with the compiled engine options.

serveConfigV2 holds one application whose LLMConfig serves serve.model_path (or the conversion output) from the
working directory's volume as serve.served_model_name, with vLLM's engine arguments: `vllm_options` of
lmspec.compiler.emit.serve, the options vllm.yaml holds, each as its engine argument (`max-model-len` as
max_model_len, `no-X: true` as X: false), less what the app owns (model, name, host, port); Ray Serve places each
replica's tensor x pipeline ranks on the worker pods' GPUs itself. serve.replicas engines, fixed (autoscaling
between equal bounds). The Ray cluster: a head without GPUs, and serve.replicas x the engine's nodes GPU
workers; KubeRay starts Ray in them (the image's `ray`), so these pods run no pod.sh and mount no build. The rules
refuse what the app cannot run (lmspec.compiler.launchers.kubernetes ray_serve_expressible).
"""

from __future__ import annotations

import posixpath
from typing import Any

from lmspec.compiler.emit.k8s.meta import metadata
from lmspec.compiler.emit.k8s.pod import container, pod_spec, serving_gpus, template
from lmspec.compiler.emit.serve import vllm_options
from lmspec.compiler.launchers.k8s.yaml_text import dump_objects
from lmspec.compiler.plan import Plan

RAY_API = "ray.io/v1"
APP_IMPORT = "ray.serve.llm:build_openai_app"
APP_NAME = "llm"
WORKER_GROUP = "gpu"
ALL_ADDRESSES = "0.0.0.0"
SERVE_PORT_NAME = "serve"
APP_OWNS = frozenset(("model", "served-model-name", "host", "port"))  # set by the app, not engine arguments
NEGATED = "no-"  # vllm.yaml's spelling of a false flag (lmspec.compiler.vllm_args.yaml_entry)


def engine_kwargs(plan: Plan) -> dict[str, Any]:
    """vllm.yaml's options as vLLM engine arguments."""
    kwargs = {}
    for option, value in vllm_options(plan):
        if option in APP_OWNS:
            continue
        negated = option.startswith(NEGATED) and value is True
        name = option.removeprefix(NEGATED) if negated else option
        kwargs[name.replace("-", "_")] = False if negated else value
    return kwargs


def serve_config(plan: Plan) -> str:
    """serveConfigV2: Ray Serve's config file as the string KubeRay passes on."""
    served, work_dir = plan.served(), plan.spec.cluster.kubernetes.work_dir
    replicas = served.spec.serve.replicas
    llm = {
        "model_loading_config": {
            "model_id": served.spec.serve.served_model_name,
            "model_source": posixpath.join(work_dir, served.model_dir),
        },
        "engine_kwargs": engine_kwargs(plan),
        "deployment_config": {"autoscaling_config": {"min_replicas": replicas, "max_replicas": replicas}},
    }
    app = {"name": APP_NAME, "import_path": APP_IMPORT, "route_prefix": "/", "args": {"llm_configs": [llm]}}
    http = {"host": ALL_ADDRESSES, "port": served.spec.serve.port}  # Serve's proxy answers serve.port on every node
    return dump_objects([{"http_options": http, "applications": [app]}]).removeprefix("---\n")


def ray_pod(plan: Plan, name: str, gpus: int, head: bool) -> dict[str, Any]:
    node = container(plan, name, None, gpus, own_address=False)
    node.setdefault("env", []).append({"name": "HF_HUB_OFFLINE", "value": "1"})  # the model is on the volume
    if head:  # KubeRay's <name>-serve-svc forwards to the head container's port named "serve"
        node["ports"] = [{"name": SERVE_PORT_NAME, "containerPort": plan.served().spec.serve.port, "protocol": "TCP"}]
    return template(plan, pod_spec(plan, None, [node]))


def ray_service(plan: Plan) -> dict[str, Any]:
    workers = plan.served().spec.serve.replicas * plan.served().layout.nodes
    return {
        "apiVersion": RAY_API,
        "kind": "RayService",
        "metadata": metadata(plan),
        "spec": {
            "serveConfigV2": serve_config(plan),
            "rayClusterConfig": {
                "headGroupSpec": {
                    "rayStartParams": {"num-gpus": "0"},
                    "template": ray_pod(plan, "ray-head", 0, head=True),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": WORKER_GROUP,
                        "replicas": workers,
                        "minReplicas": workers,
                        "maxReplicas": workers,
                        "rayStartParams": {},
                        "template": ray_pod(plan, "ray-worker", serving_gpus(plan), head=False),
                    }
                ],
            },
        },
    }
