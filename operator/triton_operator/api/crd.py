"""Generates the TritonModel and TritonPool CustomResourceDefinitions from the pydantic models.

Pydantic's JSON Schema is turned into a Kubernetes structural schema: `$ref`s
are inlined, `Optional` unions collapse to their one type, titles go, and
descriptions, defaults, enums, bounds and CEL `x-kubernetes-validations` stay.
The output is deterministic, so `crds/` can be diffed in CI.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml
from pydantic import BaseModel

from . import pool as pool_api
from . import v1alpha1 as api

_DROP = {"title", "propertyNames", "$defs", "discriminator"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").rsplit("/", 1)[-1]])
        target.update(node)  # a field's own description/default win over the type's
        node = target
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {options}")
        merged = dict(options[0])
        merged.update(node)
        if merged.get("default", 0) is None:
            del merged["default"]
        return _resolve(merged, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties" or key == "patternProperties":
            out[key] = {k: _resolve(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _resolve(value, defs) if isinstance(value, dict) else value
        else:
            out[key] = _resolve(value, defs)
    return out


def _structural(node: Any) -> Any:
    """Finish a resolved schema: object rules Kubernetes requires, no empty defaults."""
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _structural(v) for k, v in node.items()}
    if node.pop(api.OPERATOR_DEFAULT, False) and "default" in node:  # the operator's default, not the CRD's
        said = f"Unset: {json.dumps(node.pop('default'))}, the operator's default (the object keeps no value)."
        node["description"] = f"{node['description']} {said}" if node.get("description") else said
    if "patternProperties" in node:  # dict keys with a pattern: the key rule lives in CEL or the validator
        (value,) = node.pop("patternProperties").values()
        node["additionalProperties"] = value
    if node.get("x-kubernetes-preserve-unknown-fields"):
        node.pop("additionalProperties", None)
        node["type"] = "object"
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]  # pruning already drops unknown fields
    if node.get("additionalProperties") is True or node.get("additionalProperties") == {}:
        node.pop("additionalProperties")
        node["x-kubernetes-preserve-unknown-fields"] = True
    if "maxLength" in node and node.get("type") == "object":
        node["maxProperties"] = node.pop("maxLength")
    if "minLength" in node and node.get("type") == "object":
        node["minProperties"] = node.pop("minLength")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = node.get(bound)
        if isinstance(value, int | float) and not isinstance(value, bool):  # JSON Schema 2020's form (pydantic gt/lt)
            node[limit], node[bound] = value, True  # OpenAPI v3's, which Kubernetes takes
    if node.get("type") == "array" and "items" not in node:
        node["items"] = {"type": "string"}
    return node


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema: dict[str, Any] = _structural(_resolve(raw, defs))
    return schema


def _object_schema(spec: dict[str, Any], status: dict[str, Any], description: str, name_rule: str) -> dict[str, Any]:
    """A kind's root schema: its spec and status, and the rule its metadata.name meets."""
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        # metadata.name twice: its schema (the one restriction of metadata a CRD may have) names the field and the
        # pattern when it refuses, the rule says why.
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.matches('{api.MODEL_NAME_PATTERN}') && "
                f"size(self.metadata.name) <= {api.MAX_MODEL_NAME}",
                "message": f"metadata.name {name_rule}",
            }
        ],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object", "properties": {"name": {
                "type": "string", "maxLength": api.MAX_MODEL_NAME, "pattern": api.MODEL_NAME_PATTERN}}},
            "spec": spec,
            "status": status,
        },
    }


def openapi_schema() -> dict[str, Any]:
    spec = schema_of(api.TritonModelSpec)
    status = schema_of(api.TritonModelStatus)
    spec["description"] = "Desired state of a Triton model and the replicas that serve it."
    status["description"] = "Observed state, written by the operator."
    return _object_schema(spec, status, (
        "A Triton Inference Server model, declared: how it batches, caches, streams and warms up, and "
        "the GPU replicas that serve it. Traffic reaches a replica only once it has loaded exactly this "
        "config and finished warm-up."), api.MODEL_NAME_RULE)


def pool_openapi_schema() -> dict[str, Any]:
    spec = schema_of(pool_api.TritonPoolSpec)
    status = schema_of(pool_api.TritonPoolStatus)
    spec["description"] = "Desired state of a pool of tritonservers that pooled TritonModels share."
    status["description"] = "Observed state, written by the operator."
    return _object_schema(spec, status, (
        "A pool of tritonserver replicas that many TritonModels share (spec.pool): each model is loaded into as "
        "many replicas as it asks, placed against the pool's capacity, and reached through a Service of its own "
        "that lists a replica only once that model is loaded there at the desired config and warm."),
        pool_api.POOL_NAME_RULE)


def _crd(kind: str, plural: str, singular: str, short_names: list[str], schema: dict[str, Any],
         columns: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "triton-operator", "app.kubernetes.io/part-of": "triton-operator"},
        },
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": ["triton", "all"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def crd() -> dict[str, Any]:
    """The TritonModel CRD."""
    return _crd(api.KIND, api.PLURAL, api.SINGULAR, api.SHORT_NAMES, openapi_schema(), [
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Available", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Warmed", "type": "integer", "jsonPath": ".status.warmedReplicas"},
        {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
        {"name": "Digest", "type": "string", "jsonPath": ".status.configDigest", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ])


def pool_crd() -> dict[str, Any]:
    """The TritonPool CRD."""
    return _crd(pool_api.POOL_KIND, pool_api.POOL_PLURAL, pool_api.POOL_SINGULAR, pool_api.POOL_SHORT_NAMES,
                pool_openapi_schema(), [
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Available", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Models", "type": "integer", "jsonPath": ".status.models"},
        {"name": "Free", "type": "string", "jsonPath": ".status.free"},
        {"name": "Placement", "type": "string", "jsonPath": ".status.placementStrategy", "priority": 1},
        {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ])


def crd_yaml(doc: dict[str, Any] | None = None) -> str:
    """A CRD as crds/ holds it (default: the TritonModel's)."""
    kind = "" if doc is None else f" --kind {doc['spec']['names']['kind']}"
    header = f"# Generated by `triton-operator crd{kind}` from operator/triton_operator/api; do not edit.\n"
    return header + yaml.safe_dump(crd() if doc is None else doc, sort_keys=True, width=120)


#: Labels of the CRD that the chart's own labels (`triton-operator.labels` in templates/_helpers.tpl) give it.
CHART_LABELS = frozenset({"helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance",
                          "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "app.kubernetes.io/component"})


def chart_template(doc: dict[str, Any] | None = None) -> str:
    """The CRD as a template of the Helm chart (charts/triton-operator/templates/crds.yaml), not a file of its
    `crds/`: Helm installs `crds/` once and never upgrades it, so a new schema would never reach a plain
    `helm upgrade`, and new fields would be pruned. As a template it is rendered with the release, unless
    `crds.enabled` is false, and kept on uninstall while `crds.keep` is true (helm.sh/resource-policy: keep).

    `doc` is the CRD (default: `crd()`); its spec is written as is, with any `{{` escaped for Helm's templating."""
    doc = crd() if doc is None else doc
    name = doc["metadata"]["name"]
    kind = doc["spec"]["names"]["kind"]
    flag = "" if kind == api.KIND else f" --kind {kind}"
    extra = {k: v for k, v in sorted((doc["metadata"].get("labels") or {}).items()) if k not in CHART_LABELS}
    spec = yaml.safe_dump({"spec": doc["spec"]}, sort_keys=True, width=120).replace("{{", '{{ "{{" }}')
    lines = [
        f"{{{{- /* Generated by `triton-operator crd{flag} --chart-template` from operator/triton_operator/api; do not edit.",
        f"The {kind} CRD as a template, so that a plain `helm upgrade` brings its new schema (Helm never upgrades",
        "a chart's crds/). crds.enabled=false leaves it to you; crds.keep leaves it in place when the release goes. */}}",
        "{{- if .Values.crds.enabled }}",
        f"apiVersion: {doc['apiVersion']}",
        f"kind: {doc['kind']}",
        "metadata:",
        f"  name: {name}",
        "  labels:",
        '    {{- include "triton-operator.labels" . | nindent 4 }}',
        *(f"    {k}: {v}" for k, v in extra.items()),
        "  {{- if .Values.crds.keep }}",
        "  annotations:",
        f"    # Not deleted by `helm uninstall`, nor when crds.enabled turns false: that would delete every {kind}.",
        "    helm.sh/resource-policy: keep",
        "  {{- end }}",
    ]
    return "\n".join(lines) + "\n" + spec + "{{- end }}\n"
