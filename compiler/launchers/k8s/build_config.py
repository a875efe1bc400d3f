"""The build ConfigMaps (k8s/build.yaml): every build file the pods read, carried into each pod.

A pod reads the build as every launcher does, as a directory (k8s/pod.sh copies it out of the mount): a
ConfigMap holds each file under a key, its path with / as -- (ConfigMap keys are [-._a-zA-Z0-9]+), and the
pods' projected volume mounts each key back at its path (`items`). Not carried: REPORT.md and its chart (for
people), and the job files k8s/train.yaml and k8s/serve.yaml (the objects themselves).

A ConfigMap holds at most 1 MiB (core/v1 validation: the bytes of every key and value of data and binaryData,
corev1.MaxSecretSize): the files go in path order into the current ConfigMap while they fit, else into the
next. manifest.json goes into the first, in room kept for it: the job files, which list every ConfigMap's
items, are among the files the manifest hashes, so the split must not depend on the manifest's own size.

`build_config_maps` is the launcher's `carries`, a pure function of the files the manifest lists (and the
manifest), so `lmspec run` makes it again from the build it verified and compares byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lmspec.compiler.build.files import K8S_BUILD, K8S_SERVE, K8S_TRAIN, MANIFEST, MEMORY_CHART, REPORT
from lmspec.compiler.errors import UsageError
from lmspec.compiler.launchers.k8s.names import config_map_name, labels, object_name
from lmspec.compiler.launchers.k8s.yaml_text import dump_objects

if TYPE_CHECKING:
    from lmspec.compiler.plan import Plan

CONFIG_MAP_BYTES = 1 << 20  # corev1.MaxSecretSize: a ConfigMap's keys and values together
MANIFEST_ROOM_BYTES = 64 << 10  # kept in the first ConfigMap for manifest.json (a few KB: one line per file)
NOT_CARRIED = frozenset((REPORT, MEMORY_CHART, K8S_TRAIN, K8S_SERVE, K8S_BUILD))
KEY_SEPARATOR = "--"  # a build path's / in its ConfigMap key (no build file's name holds it: `split` checks)


def pod_files(files: Mapping[str, str]) -> dict[str, str]:
    """The build files a pod reads."""
    return {rel: text for rel, text in files.items() if rel not in NOT_CARRIED}


def config_key(rel: str) -> str:
    return rel.replace("/", KEY_SEPARATOR)


def _size(rel: str, text: str) -> int:
    return len(config_key(rel)) + len(text.encode("utf-8"))


def split(files: Mapping[str, str]) -> list[list[str]]:
    """The carried paths of each ConfigMap, manifest.json first in the first (whether `files` holds it yet or
    not: its size is not counted, MANIFEST_ROOM_BYTES is kept for it). UsageError for a file no ConfigMap holds."""
    carried = pod_files(files)
    keys = {config_key(rel) for rel in carried}
    if len(keys) != len(carried):
        raise RuntimeError(f"build paths {sorted(carried)} do not map one to one onto ConfigMap keys")
    groups: list[list[str]] = [[MANIFEST]]
    room = CONFIG_MAP_BYTES - MANIFEST_ROOM_BYTES
    for rel in sorted(carried.keys() - {MANIFEST}):
        size = _size(rel, carried[rel])
        if size > CONFIG_MAP_BYTES:
            raise UsageError(
                f"the build file {rel} is {size:,} bytes, more than a ConfigMap holds ({CONFIG_MAP_BYTES:,}): "
                "cluster.launcher=kubernetes carries the build to its pods in ConfigMaps; compile it with "
                "cluster=local or cluster=slurm and copy the build to the pods' volume instead"
            )
        if size > room:
            groups.append([])
            room = CONFIG_MAP_BYTES
        groups[-1].append(rel)
        room -= size
    return groups


def volume_sources(name: str, files: Mapping[str, str]) -> list[dict[str, Any]]:
    """The projected volume's sources that mount every carried file at its path: one per ConfigMap."""
    return [
        {
            "configMap": {
                "name": config_map_name(name, index),
                "items": [{"key": config_key(rel), "path": rel} for rel in group],
            }
        }
        for index, group in enumerate(split(files))
    ]


def build_config_maps(plan: Plan, files: dict[str, str]) -> dict[str, str]:
    """k8s/build.yaml of the finished build `files` (manifest.json included)."""
    name, namespace = object_name(plan.spec), plan.spec.cluster.kubernetes.namespace
    documents = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": config_map_name(name, index), "namespace": namespace, "labels": labels(name)},
            "data": {config_key(rel): files[rel] for rel in group},
        }
        for index, group in enumerate(split(files))
    ]
    return {K8S_BUILD: dump_objects(documents)}
