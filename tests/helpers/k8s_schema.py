"""Strict, offline proof that the API server would accept a Kubernetes object (issue 43, item 3).

No API server can run on these machines, so this restates what `kubectl apply --server-side --validate=strict`
checks, from the same data the server uses:

- A custom resource: its CustomResourceDefinition from ../shared/k8s-crds (`paths.K8S_CRDS`; upstream data kept
  beside the project, never in it), the version its apiVersion names (a version the CRD does not serve is refused),
  the schema's defaults applied as the server applies them, then `openAPIV3Schema` made strict: a field the schema
  does not name is an error, because strict field validation reports every field that pruning would drop. Every
  error is listed at its JSON path. Then every `x-kubernetes-validations` CEL rule at its node with `self` bound
  (transition rules, the ones reading `oldSelf`, only run on update, as on the server), `x-kubernetes-list-type`
  map/set uniqueness, and kubernetes-validate's strict core schemas for the job and pod templates inside.
- A core kind (ConfigMap, Service): kubernetes-validate's strict schema for `KUBERNETES_VERSION`.
- Every object: the apimachinery rules no JSON Schema holds (object name, namespace, label and annotation keys,
  label values, ConfigMap keys and size).
- TrainJob, the training runtimes and JobSet: also round-tripped through kubeflow-trainer-api's models; they
  ignore unknown fields, so what comes back is compared with the input.

Not checked: the CEL functions of Kubernetes' own libraries that celpy lacks (quantity(), url(), isSorted(), ...):
a rule using one is reported as unevaluable, never passed (the pinned CRDs use none); CEL cost limits; admission
webhooks (LWS's size rules are lmspec rules instead); anything a controller decides after accepting the object.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from kubeflow_trainer_api.models.jobset_v1alpha2_job_set import JobsetV1alpha2JobSet
from kubeflow_trainer_api.models.trainer_v1alpha1_cluster_training_runtime import (
    TrainerV1alpha1ClusterTrainingRuntime,
)
from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob
from kubeflow_trainer_api.models.trainer_v1alpha1_training_runtime import TrainerV1alpha1TrainingRuntime
from referencing import Registry, Resource

from helpers.paths import K8S_CRDS

KUBERNETES_VERSION = "1.33"  # the oldest cluster the manifests promise to fit; kubernetes-validate ships 1.25-1.37

needs_crds = pytest.mark.skipif(
    not K8S_CRDS.is_dir(), reason=f"no CRDs at {K8S_CRDS} (upstream data kept beside the project: shared/k8s-crds)"
)

Json = Any  # a decoded JSON/YAML value

_CORE = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{KUBERNETES_VERSION}.0-local-strict"
_DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"  # the $id of kubernetes-validate's _definitions.json
_OBJECT_META = {"$ref": _DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
_JOB_TEMPLATE = "io.k8s.api.batch.v1.JobTemplateSpec"
_POD_TEMPLATE = "io.k8s.api.core.v1.PodTemplateSpec"
_REPLICATED_JOBS = ("replicatedJobs", "*", "template")
# Where each custom resource carries core templates: kubernetes-validate checks them for KUBERNETES_VERSION, which
# catches a field the CRD (generated against the controller's newer k8s.io/api) knows but that cluster would drop.
_TEMPLATES: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "JobSet": ((("spec", *_REPLICATED_JOBS), _JOB_TEMPLATE),),
    "TrainingRuntime": ((("spec", "template", "spec", *_REPLICATED_JOBS), _JOB_TEMPLATE),),
    "ClusterTrainingRuntime": ((("spec", "template", "spec", *_REPLICATED_JOBS), _JOB_TEMPLATE),),
    "LeaderWorkerSet": (
        (("spec", "leaderWorkerTemplate", "leaderTemplate"), _POD_TEMPLATE),
        (("spec", "leaderWorkerTemplate", "workerTemplate"), _POD_TEMPLATE),
    ),
    "RayService": (
        (("spec", "rayClusterConfig", "headGroupSpec", "template"), _POD_TEMPLATE),
        (("spec", "rayClusterConfig", "workerGroupSpecs", "*", "template"), _POD_TEMPLATE),
    ),
}
_MODELS: dict[tuple[str, str], Any] = {
    ("trainer.kubeflow.org", "TrainJob"): TrainerV1alpha1TrainJob,
    ("trainer.kubeflow.org", "TrainingRuntime"): TrainerV1alpha1TrainingRuntime,
    ("trainer.kubeflow.org", "ClusterTrainingRuntime"): TrainerV1alpha1ClusterTrainingRuntime,
    ("jobset.x-k8s.io", "JobSet"): JobsetV1alpha2JobSet,
}

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # RFC 1123 label
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # Service names
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")  # label/annotation key names, label values
_CONFIG_MAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_CONFIG_MAP_MAX_BYTES = 1024 * 1024  # the API server's limit on a ConfigMap's data and binaryData together
_OLD_SELF = re.compile(r"\boldSelf\b")

_FORMATS = jsonschema.FormatChecker(formats=())  # the formats the CRDs use; the server checks these ranges too


@_FORMATS.checks("int32")
def _int32(value: Json) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_FORMATS.checks("int64")
def _int64(value: Json) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


@_FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: Json) -> bool:
    return not isinstance(value, str) or bool(datetime.fromisoformat(value))


def documents(text: str) -> list[dict[str, Json]]:
    """The objects of a multi-document YAML manifest (empty documents dropped); libyaml's safe loader where
    PyYAML has it (the CRDs are 10 MB of YAML: 4 s with the pure-Python loader)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc is not None]


def problems(obj: dict[str, Json]) -> list[str]:
    """Every reason the API server, or the controller's own types, would refuse `obj`: `Kind/name: $.path: why`."""
    where = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
    return [f"{where}: {problem}" for problem in _problems(obj)]


def _problems(obj: dict[str, Json]) -> list[str]:
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return ["$: apiVersion and kind must be strings"]
    group = api_version.rpartition("/")[0]
    found = _metadata_problems(obj)
    if group and (group, kind) in _crds():
        return found + _custom_problems(obj)
    return found + _core_problems(obj)


# -- custom resources ---------------------------------------------------------------------------------------------


@cache
def _crds() -> dict[tuple[str, str], dict[str, Json]]:
    """(group, kind) -> CustomResourceDefinition, from every file in K8S_CRDS (none when the folder is absent)."""
    crds = {}
    for path in sorted(K8S_CRDS.glob("*.yaml")):
        for doc in documents(path.read_text()):
            if doc.get("kind") == "CustomResourceDefinition":
                crds[(doc["spec"]["group"], doc["spec"]["names"]["kind"])] = doc
    return crds


def _custom_problems(obj: dict[str, Json]) -> list[str]:
    group, _, version = obj["apiVersion"].rpartition("/")
    crd = _crds()[(group, obj["kind"])]
    versions = {entry["name"]: entry for entry in crd["spec"]["versions"]}
    if not versions.get(version, {}).get("served"):
        served = sorted(name for name, entry in versions.items() if entry.get("served"))
        return [f"$.apiVersion: {version} is not a served version of {crd['metadata']['name']} (served: {served})"]
    schema, validator = _crd_validator(group, obj["kind"], version)
    defaulted = _defaulted(schema, obj)
    found = _errors(validator, defaulted)
    if crd["spec"]["scope"] == "Cluster" and (obj.get("metadata") or {}).get("namespace"):
        found.append(f"$.metadata.namespace: not allowed: {crd['metadata']['name']} is cluster-scoped")
    # At the root, CEL sees only metadata.name and metadata.generateName (the rest of ObjectMeta is not exposed).
    meta = {key: value for key, value in (obj.get("metadata") or {}).items() if key in ("name", "generateName")}
    found += _rule_problems(schema, {**defaulted, "metadata": meta}, "$")
    found += _template_problems(obj)
    found += _round_trip_problems(defaulted, group)
    return found


@cache
def _crd_validator(group: str, kind: str, version: str) -> tuple[dict[str, Json], Any]:
    """The strict schema of one CRD version, and its validator (both are large: made once)."""
    entry = next(v for v in _crds()[(group, kind)]["spec"]["versions"] if v["name"] == version)
    schema = _strict(entry["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = _OBJECT_META  # the server validates a root's metadata as ObjectMeta
    return schema, jsonschema.Draft202012Validator(schema, registry=_core_registry(), format_checker=_FORMATS)


def _strict(node: dict[str, Json]) -> dict[str, Json]:
    """A structural schema node as JSON Schema that refuses what the server would prune.

    An object gets `additionalProperties: false` unless it declares its own additionalProperties (a map) or
    `x-kubernetes-preserve-unknown-fields`; `nullable` allows null; an int-or-string without `anyOf` gets one;
    an embedded resource (`x-kubernetes-embedded-resource`) requires apiVersion and kind and checks its metadata
    as ObjectMeta. Format and CEL keywords stay for the format checker and `_rule_problems`.
    """
    out = dict(node)
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    properties = {name: _strict(sub) for name, sub in node.get("properties", {}).items()}
    if node.get("x-kubernetes-embedded-resource"):
        properties |= {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": _OBJECT_META}
        out["required"] = sorted({*node.get("required", ()), "apiVersion", "kind"})
    if properties:
        out["properties"] = properties
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            out[key] = _strict(node[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            out[key] = [_strict(sub) for sub in node[key]]
    if node.get("type") == "object" and "additionalProperties" not in node:
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


def _sub_schema(schema: dict[str, Json], key: str) -> dict[str, Json] | None:
    """The schema of field `key` of an object node: a named property, else the map's value schema."""
    extra = schema.get("additionalProperties")
    return schema.get("properties", {}).get(key) or (extra if isinstance(extra, dict) else None)


def _defaulted(schema: dict[str, Json], value: Json) -> Json:
    """`value` with the schema's defaults filled in where absent, as the server does before validating."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            sub = _sub_schema(schema, key)
            out[key] = _defaulted(sub, item) if sub else item
        for key, sub in schema.get("properties", {}).items():
            if key not in out and "default" in sub:
                out[key] = _defaulted(sub, copy.deepcopy(sub["default"]))
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_defaulted(schema["items"], item) for item in value]
    return value


def _rule_problems(schema: dict[str, Json], value: Json, path: str) -> list[str]:
    """Every CEL rule and list-type constraint of the schema tree, evaluated where `value` has a node."""
    found = [problem for rule in schema.get("x-kubernetes-validations", ()) for problem in _rule(rule, value, path)]
    found += _list_problems(schema, value, path)
    if isinstance(value, dict):
        for key, item in value.items():
            sub = _sub_schema(schema, key)
            if sub:
                found += _rule_problems(sub, item, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += _rule_problems(schema["items"], item, f"{path}[{index}]")
    return found


@cache
def _program(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def _rule(rule: dict[str, Json], value: Json, path: str) -> list[str]:
    text = rule["rule"]
    if _OLD_SELF.search(text):
        if rule.get("optionalOldSelf"):  # runs on create with oldSelf absent: CEL optionals, which celpy lacks
            return [f"{path}: cannot evaluate {text!r} (optionalOldSelf is not supported here)"]
        return []  # a transition rule: the server evaluates it on update only
    try:
        result = _program(text).evaluate({"self": celpy.json_to_cel(value)})
    except (celpy.CELEvalError, celpy.CELParseError) as error:
        return [f"{path}: CEL rule {text!r} could not be evaluated: {error.args[0] if error.args else error}"]
    if isinstance(result, celpy.celtypes.BoolType) and bool(result):
        return []
    message = rule.get("message") or f"failed rule: {text}"
    return [f"{path}{rule.get('fieldPath', '')}: {message} (x-kubernetes-validations rule {text!r})"]


def _list_problems(schema: dict[str, Json], value: Json, path: str) -> list[str]:
    """A `map` list may hold one item per key tuple, a `set` list each value once (the server refuses repeats)."""
    list_type = schema.get("x-kubernetes-list-type")
    if not isinstance(value, list) or list_type not in ("map", "set"):
        return []
    keys = schema.get("x-kubernetes-list-map-keys", ())
    seen: set[str] = set()
    found = []
    for index, item in enumerate(value):
        identity = [item.get(key) for key in keys] if list_type == "map" and isinstance(item, dict) else item
        text = json.dumps(identity, sort_keys=True)
        if text in seen:
            found.append(f"{path}[{index}]: duplicate {text} in a list of type {list_type} (keys {list(keys)})")
        seen.add(text)
    return found


def _reach(value: Json, steps: tuple[str, ...], path: str) -> Iterator[tuple[str, Json]]:
    """The nodes at `steps` below `value` (`*`: every item of a list), with their paths."""
    if not steps:
        yield path, value
    elif steps[0] == "*" and isinstance(value, list):
        for index, item in enumerate(value):
            yield from _reach(item, steps[1:], f"{path}[{index}]")
    elif isinstance(value, dict) and steps[0] in value:
        yield from _reach(value[steps[0]], steps[1:], f"{path}.{steps[0]}")


def _template_problems(obj: dict[str, Json]) -> list[str]:
    found = []
    for steps, definition in _TEMPLATES.get(obj["kind"], ()):
        validator = _core_validator(json.dumps({"$ref": _DEFS + definition}))
        for path, template in _reach(obj, steps, "$"):
            found += [f"{path}{error[1:]} (Kubernetes {KUBERNETES_VERSION})" for error in _errors(validator, template)]
    return found


def _round_trip_problems(obj: dict[str, Json], group: str) -> list[str]:
    """What kubeflow-trainer-api's model of the (defaulted) object refuses, drops or changes.

    The generated models wrap Quantity and IntOrString in oneOf classes that `model_validate` refuses as plain
    scalars, so the round trip is the generated `from_dict`/`to_dict` pair (`to_dict` is
    `model_dump(by_alias=True, exclude_none=True)` with those wrappers unwrapped). The object goes in with the
    CRD's defaults applied, so a model default the server applies too (a port's protocol TCP) is no difference.
    """
    model = _MODELS.get((group, obj["kind"]))
    if model is None:
        return []
    name = f"kubeflow-trainer-api {model.__name__}"
    try:
        back = model.from_dict(obj).to_dict()
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        return [f"$: {name} refuses it: {' '.join(str(error).split())}"]
    return [f"{path}: {why} ({name} round trip)" for path, why in _differences(obj, back, "$")]


def _differences(sent: Json, back: Json, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(sent, dict) and isinstance(back, dict):
        for key in sorted(sent.keys() | back.keys()):
            if key not in back:
                yield f"{path}.{key}", "dropped: the model has no such field"
            elif key not in sent:
                yield f"{path}.{key}", f"added {back[key]!r}"
            else:
                yield from _differences(sent[key], back[key], f"{path}.{key}")
    elif isinstance(sent, list) and isinstance(back, list) and len(sent) == len(back):
        for index, (one, other) in enumerate(zip(sent, back)):
            yield from _differences(one, other, f"{path}[{index}]")
    elif not _same(sent, back):
        yield path, f"{sent!r} came back as {back!r}"


def _same(sent: Json, back: Json) -> bool:
    """Equal, and of the same type, except that a whole number may come back as a float (Quantity's model)."""
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (sent, back))
    return bool(sent == back and (type(sent) is type(back) or numbers))


# -- core kinds ---------------------------------------------------------------------------------------------------


@cache
def _core_registry() -> Registry:
    """kubernetes-validate's strict definitions for KUBERNETES_VERSION, where `$ref`s to core types resolve."""
    definitions = json.loads((_CORE / "_definitions.json").read_text())
    return Resource.from_contents(definitions) @ Registry()


@cache
def _core_validator(schema_text: str) -> Any:
    return jsonschema.Draft202012Validator(json.loads(schema_text), registry=_core_registry(), format_checker=_FORMATS)


def _core_problems(obj: dict[str, Json]) -> list[str]:
    """kubernetes-validate's strict schema (what its `validate(..., strict=True)` reads), listing every error."""
    group, _, version = obj["apiVersion"].rpartition("/")
    group_part = f"{group.split('.')[0]}-" if group else ""
    schema = _CORE / f"{obj['kind'].lower()}-{group_part}{version}.json"
    if not schema.is_file():
        return [f"$: no CRD in {K8S_CRDS} and no Kubernetes {KUBERNETES_VERSION} schema for {obj['apiVersion']}"]
    return _errors(_core_validator(schema.read_text()), obj)


def _errors(validator: Any, value: Json) -> list[str]:
    errors = sorted(validator.iter_errors(value), key=lambda error: error.json_path)
    return [f"{error.json_path}: {error.message}" for error in errors]


# -- apimachinery rules -------------------------------------------------------------------------------------------


def _metadata_problems(obj: dict[str, Json]) -> list[str]:
    """Object name and namespace, every label and annotation key and label value, ConfigMap keys and size."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    found = []
    if obj.get("kind") == "Service":
        if not (isinstance(name, str) and len(name) <= 63 and _DNS_1035_LABEL.fullmatch(name)):
            found.append(f"$.metadata.name: {name!r} is not a DNS-1035 label (a Service's name)")
    elif not (isinstance(name, str) and len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name)):
        found.append(f"$.metadata.name: {name!r} is not a DNS-1123 subdomain")
    namespace = meta.get("namespace")
    if namespace is not None and not (
        isinstance(namespace, str) and len(namespace) <= 63 and re.fullmatch(_DNS_LABEL, namespace)
    ):
        found.append(f"$.metadata.namespace: {namespace!r} is not a DNS-1123 label")
    for path, labels in _labelled(obj, "$"):
        for key, value in (labels.get("labels") or {}).items():
            found += _key_problems(f"{path}.labels", key)
            if not (isinstance(value, str) and len(value) <= 63 and (not value or _QUALIFIED_NAME.fullmatch(value))):
                found.append(f"{path}.labels.{key}: {value!r} is not a label value")
        for key in labels.get("annotations") or {}:
            found += _key_problems(f"{path}.annotations", key)
    if obj.get("kind") == "ConfigMap":
        size = 0
        for field in ("data", "binaryData"):
            for key, value in (obj.get(field) or {}).items():
                if not (len(key) <= 253 and _CONFIG_MAP_KEY.fullmatch(key)) or key in (".", ".."):
                    found.append(f"$.{field}: key {key!r} is not a ConfigMap key ([-._a-zA-Z0-9]+)")
                size += len(str(value).encode())
        if size > _CONFIG_MAP_MAX_BYTES:
            found.append(f"$: the ConfigMap holds {size} bytes, over the server's {_CONFIG_MAP_MAX_BYTES}")
    return found


def _labelled(value: Json, path: str) -> Iterator[tuple[str, dict[str, Json]]]:
    """Every `metadata` object in the tree (the object's own and its templates'), with its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "metadata" and isinstance(item, dict):
                yield f"{path}.metadata", item
            yield from _labelled(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _labelled(item, f"{path}[{index}]")


def _key_problems(path: str, key: str) -> list[str]:
    """A qualified name: an optional DNS subdomain prefix and `/`, then a name of at most 63 characters."""
    prefix, _, name = key.rpartition("/")
    if (prefix and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix))) or not (
        len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name)
    ):
        return [f"{path}: key {key!r} is not a qualified name ([prefix/]name)"]
    return []
