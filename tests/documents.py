"""TritonModel and pod documents unit tests build: a Python model with a given `spec.server` (`body`) and what the
validator says of some (`validation_errors`), models and ensembles over `source.uri` (`_uri_model`, `_uri_ensemble`),
and TritonModels whose status is what the operator writes, with their pods (`_model`, `_pod`); a Python model with
any spec (`python_model`) and a TritonPool (`pool_document`), for the pool's tests."""

from __future__ import annotations

from typing import Any

from triton_operator.api.pod import ANNOTATION_DIGEST, WARMED_CONDITION
from triton_operator.plan.status import Observed, as_dict
from triton_operator.plan.status import compute_status as typed_status
from triton_operator.validate import Document, FieldError, check_documents


def body(name: str = "m", source: dict[str, Any] | None = None, **server: Any) -> dict[str, Any]:
    """A valid Python model (two CPU instances) with `server` as its spec.server."""
    return {
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": name},
        "spec": {"backend": "python", "maxBatchSize": 4,
                 "inputs": [{"name": "INPUT", "dataType": "FP32", "dims": [4]}],
                 "outputs": [{"name": "OUTPUT", "dataType": "FP32", "dims": [4]}],
                 "instanceGroups": [{"kind": "CPU", "count": 2}],
                 "source": source or {"inline": {"model.py": "pass\n"}}, "server": server},
    }


def python_model(name: str = "m", **spec: Any) -> dict[str, Any]:
    """A valid Python model (one CPU instance) with `spec` added to its spec (`pool`, `memory`, ...)."""
    return {
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": name},
        "spec": {"backend": "python", "maxBatchSize": 4,
                 "inputs": [{"name": "INPUT", "dataType": "FP32", "dims": [4]}],
                 "outputs": [{"name": "OUTPUT", "dataType": "FP32", "dims": [4]}],
                 "instanceGroups": [{"kind": "CPU", "count": 1}],
                 "source": {"inline": {"model.py": "# m"}}, **spec},
    }


def pool_document(name: str = "p", **spec: Any) -> dict[str, Any]:
    """A TritonPool of 2 CPU replicas holding 4Gi each, with `spec` over that."""
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonPool", "metadata": {"name": name},
            "spec": {"replicas": 2, "capacity": {"memoryPerReplica": "4Gi"}, **spec}}


def validation_errors(*bodies: dict[str, Any]) -> list[FieldError]:
    return check_documents([Document(f"t#{i}", b) for i, b in enumerate(bodies)]).errors


def _uri_model(name: str, **source: str) -> dict:
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": name},
            "spec": {"backend": "python", "maxBatchSize": 4, "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
                     "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
                     "instanceGroups": [{"kind": "CPU", "count": 1}], "source": dict(source)}}


def _uri_ensemble(*steps: str) -> dict:
    chain = []
    for i, step in enumerate(steps):
        chain.append({"model": step, "inputMap": {"IN": "x" if i == 0 else f"t{i}"},
                      "outputMap": {"OUT": "y" if i == len(steps) - 1 else f"t{i + 1}"}})
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": "ens"},
            "spec": {"platform": "ensemble", "maxBatchSize": 4,
                     "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
                     "outputs": [{"name": "y", "dataType": "FP32", "dims": [4]}], "ensemble": {"steps": chain}}}


def compute_status(obs: Observed, previous: dict | None) -> dict:
    """The status as the API server stores it (the planner's typed `TritonModelStatus`, dumped)."""
    return as_dict(typed_status(obs, previous))


def _pod(name: str, digest: str, gate: str, reason: str = "ModelWarmed", message: str = "", ready: str | None = None) -> dict:
    return {
        "metadata": {"name": name, "annotations": {ANNOTATION_DIGEST: digest}},
        "spec": {"readinessGates": [{"conditionType": WARMED_CONDITION}]},  # as the template renders it
        "status": {
            "conditions": [
                {"type": WARMED_CONDITION, "status": gate, "reason": reason, "message": message,
                 "lastTransitionTime": "2026-01-01T00:00:05Z"},
                {"type": "Ready", "status": ready or gate},
            ],
            "containerStatuses": [{"name": "tritonserver", "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}],
        },
    }


def _model(generation: int, obs: Observed | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "serving.triton-operator.dev/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": "add-sub", "namespace": "default", "generation": generation, "uid": "u1"},
        "spec": {"backend": "python", "replicas": 2},
    }
    if obs is not None:
        body["status"] = compute_status(obs, None)
    return body
