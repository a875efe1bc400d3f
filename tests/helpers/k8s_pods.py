"""A pod of an emitted Kubernetes object, as its controller and the kubelet would start it, on this machine.

No API server can run here, so the tests do the controller's and the kubelet's part by hand, from the emitted
YAML alone: the container's command, args, working directory and plain env; the environment the controller
injects (Kubeflow Trainer's PET_*, the Indexed Job's JOB_COMPLETION_INDEX, LeaderWorkerSet's LWS_*), given by
the test; the build ConfigMap (k8s/build.yaml) mounted as the kubelet mounts one: the files in a timestamped
folder, `..data` linking to it and each top entry linking through `..data`. The pod's mounts go to folders
of the test's: every mount path in the command, args, env and working directory is replaced by its folder
(what a mount namespace would do; no path at / is touched).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.k8s_schema import documents as manifest_documents

CONFIG_MAP_DATA_DIR = "..2026_01_01_00_00_00.000000001"  # the kubelet's timestamped folder (atomic_writer.go)


def documents(path: Path) -> list[dict[str, Any]]:
    """The objects of an emitted YAML file (helpers.k8s_schema reads them the same way)."""
    return manifest_documents(path.read_text())


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every mapping inside `node`, `node` first, in document order."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod spec inside an object (a JobSet's replicated jobs, a runtime's template, LWS's leader and
    worker templates), in document order: the dicts holding `containers`."""
    return [node for node in walk(obj) if isinstance(node.get("containers"), list)]


def mount_config_maps(objects: list[dict[str, Any]], volume: dict[str, Any], target: Path) -> None:
    """The volume (a configMap or a projected one of configMaps) written as the kubelet writes it."""
    maps = {o["metadata"]["name"]: o["data"] for o in objects if o.get("kind") == "ConfigMap"}
    projected = volume["projected"]["sources"] if "projected" in volume else [volume]
    sources = [s["configMap"] for s in projected]
    data_dir = target / CONFIG_MAP_DATA_DIR
    tops: set[str] = set()
    for source in sources:
        data = maps[source["name"]]
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            file = data_dir / item["path"]
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(data[item["key"]])
            tops.add(item["path"].split("/")[0])
    os.symlink(CONFIG_MAP_DATA_DIR, target / "..data")
    for top in tops:
        os.symlink(f"..data/{top}", target / top)


@dataclass(frozen=True)
class Pod:
    """What the kubelet would exec: argv, environment (the controller's injected part added by the caller)
    and working directory, with the mounts replaced by local folders."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path


def prepare_pod(
    objects: list[dict[str, Any]], pod: dict[str, Any], mounts: dict[str, Path], injected: dict[str, str]
) -> Pod:
    """The pod spec's first container, its volumes at `mounts` (mount path -> local folder; a ConfigMap volume
    is written there, the others must exist), with `injected` added to its environment."""
    container = pod["containers"][0]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}

    def local(text: str) -> str:
        for mount_path, folder in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(mount_path, str(folder))
        return text

    for mount in container.get("volumeMounts", []):
        if mount["mountPath"] not in mounts:
            continue
        volume = volumes[mount["name"]]
        if "configMap" in volume or "projected" in volume:
            mount_config_maps(objects, volume, mounts[mount["mountPath"]])
    env = {e["name"]: local(e["value"]) for e in container.get("env", []) if "value" in e}
    return Pod(
        argv=[local(word) for word in [*container.get("command", []), *container.get("args", [])]],
        env={**env, **injected},
        cwd=Path(local(container.get("workingDir", str(Path.cwd())))),
    )
