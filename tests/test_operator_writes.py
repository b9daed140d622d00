"""The review of the operator's own writes (issue 39, M6), pure: a Deployment as the operator renders it for its
TritonModel or TritonPool passes; the same with another ServiceAccount, a token, a Secret or a claim its spec does
not name, a volume kind it never renders, another tritonserver image, or another name is refused, naming what.
An EndpointSlice passes only for the Service of a pooled TritonModel that controls it.

The same through the real API server, with the operator's own token: e2e/test_operator_policies.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.documents import pool_document, python_model
from triton_operator.api.pool import TritonPool
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.render.kubernetes import Options, key_secret_name, render_deployment
from triton_operator.render.modelconfig import render_repository
from triton_operator.render.pool import (
    pool_deployment_name,
    pool_key,
    pool_key_secret_name,
    render_endpoint_slices,
    render_model_service,
    render_pool_deployment,
)
from triton_operator.render.repository_key import RepositoryKeys
from triton_operator.validate.operator_writes import model_grants, pool_grants, refusal, slice_refusal

NS, UID = "team-a", "uid-1"
OPTIONS = Options(repository_keys=RepositoryKeys(b"m" * 32), default_triton_image="registry.example/triton:26.03")


def _uri_model(name: str, uri: str, secret: str | None = None, **spec: Any) -> TritonModel:
    body = python_model(name, **spec)
    body["spec"]["source"] = {"uri": uri, **({"credentialsSecret": secret} if secret else {})}
    return TritonModel.model_validate(body)


def _ensemble(*steps: TritonModel) -> TritonModel:
    return TritonModel.model_validate({
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": "ens"},
        "spec": {"platform": "ensemble", "maxBatchSize": 4,
                 "inputs": [{"name": "INPUT", "dataType": "FP32", "dims": [4]}],
                 "outputs": [{"name": "OUTPUT", "dataType": "FP32", "dims": [4]}],
                 "ensemble": {"steps": [{"model": s.name, "inputMap": {"INPUT": "INPUT"},
                                         "outputMap": {"OUTPUT": "OUTPUT"}} for s in steps[:1]]}}})


def _deployment(model: TritonModel, *others: TritonModel) -> dict[str, Any]:
    return render_deployment(model, render_repository([model, *others]), UID, NS, OPTIONS)


def _grants(model: TritonModel, *steps: TritonModel) -> Any:
    return model_grants(model, steps, key_secret_name(model, UID, NS, OPTIONS), OPTIONS.default_triton_image)


def _pod(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def _triton(deployment: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in _pod(deployment)["containers"] if c["name"] == "tritonserver")


SERVER = {"serviceAccountName": "models", "automountServiceAccountToken": True, "imagePullSecrets": [{"name": "pull"}],
          "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api-token", "key": "t"}}}],
          "envFrom": [{"secretRef": {"name": "bundle"}}]}


def test_what_the_operator_renders_for_a_model_passes_with_every_secret_and_claim_its_spec_names() -> None:
    model = _uri_model("m", "s3://bucket/m", "s3-creds", server={"image": "registry.example/own:1", **SERVER})
    deployment = _deployment(model)
    refs = [v["valueFrom"]["secretKeyRef"]["name"] for v in _triton(deployment).get("env") or ()
            if "secretKeyRef" in (v.get("valueFrom") or {})]
    assert key_secret_name(model, UID, NS, OPTIONS) in refs and "api-token" in refs
    assert refusal(deployment, _grants(model)) is None
    claim = _uri_model("c", "pvc://weights/c")
    assert any("persistentVolumeClaim" in v for v in _pod(_deployment(claim))["volumes"])
    assert refusal(_deployment(claim), _grants(claim)) is None


def test_an_ensembles_deployment_may_use_its_steps_credentials_and_nothing_else() -> None:
    step = _uri_model("step", "gs://bucket/step", "gcs-key")
    ensemble = _ensemble(step)
    deployment = _deployment(ensemble, step)
    assert any((v.get("secret") or {}).get("secretName") == "gcs-key" for v in _pod(deployment)["volumes"])
    assert refusal(deployment, _grants(ensemble, step)) is None
    assert "gcs-key" in (refusal(deployment, _grants(ensemble)) or "")


def _changed(deployment: dict[str, Any], change: str) -> dict[str, Any]:
    out = copy.deepcopy(deployment)
    pod = _pod(out)
    if change == "service account":
        pod["serviceAccountName"] = "cluster-admin-ish"
    elif change == "legacy service account field":
        pod["serviceAccount"] = "cluster-admin-ish"
    elif change == "token":
        pod["automountServiceAccountToken"] = True
    elif change == "token by default":
        del pod["automountServiceAccountToken"]
    elif change == "secret volume":
        pod["volumes"].append({"name": "loot", "secret": {"secretName": "db-password"}})
    elif change == "secret env":
        _triton(out).setdefault("env", []).append(
            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "p"}}})
    elif change == "secret envFrom":
        _triton(out).setdefault("envFrom", []).append({"secretRef": {"name": "db-password"}})
    elif change == "pull secret":
        pod["imagePullSecrets"] = [{"name": "db-password"}]
    elif change == "projected token":
        pod["volumes"].append({"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}})
    elif change == "nfs":
        pod["volumes"].append({"name": "n", "nfs": {"server": "198.18.0.9", "path": "/"}})
    elif change == "claim":
        pod["volumes"].append({"name": "c", "persistentVolumeClaim": {"claimName": "someone-elses"}})
    elif change == "image":
        _triton(out)["image"] = "registry.example/evil:1"
    elif change == "name":
        out["metadata"]["name"] = "other"
    return out


@pytest.mark.parametrize(("change", "says"), [
    ("service account", "runs as ServiceAccount cluster-admin-ish"),
    ("legacy service account field", "runs as ServiceAccount cluster-admin-ish"),
    ("token", "mounts a ServiceAccount token"),
    ("token by default", "mounts a ServiceAccount token"),
    ("secret volume", "uses Secrets its spec does not name: db-password"),
    ("secret env", "uses Secrets its spec does not name: db-password"),
    ("secret envFrom", "uses Secrets its spec does not name: db-password"),
    ("pull secret", "uses Secrets its spec does not name: db-password"),
    ("projected token", "volumes of a kind the operator does not render: projected"),
    ("nfs", "volumes of a kind the operator does not render: nfs"),
    ("claim", "PersistentVolumeClaims its spec does not name: someone-elses"),
    ("image", "runs tritonserver image registry.example/evil:1"),
    ("name", "is named m, not other"),
])
def test_a_model_deployment_the_operator_would_not_render_is_refused_naming_what(change: str, says: str) -> None:
    model = TritonModel.model_validate(python_model("m"))
    deployment = _deployment(model)
    assert refusal(deployment, _grants(model)) is None
    why = refusal(_changed(deployment, change), _grants(model))
    assert why is not None and says in why, why


def test_the_default_image_is_the_operators_and_another_owners_key_is_not_this_ones() -> None:
    model = TritonModel.model_validate(python_model("m"))
    deployment = _deployment(model)
    assert _triton(deployment)["image"] == OPTIONS.default_triton_image
    other = model_grants(model, (), key_secret_name(TritonModel.model_validate(python_model("n")), UID, NS, OPTIONS),
                         OPTIONS.default_triton_image)
    assert "uses Secrets its spec does not name: m-repository-key-" in (refusal(deployment, other) or "")


def test_a_pools_deployment_passes_as_rendered_and_not_as_another_service_account() -> None:
    pool = TritonPool.model_validate(pool_document("p", server=SERVER))
    deployment = render_pool_deployment(pool, UID, NS, OPTIONS)
    key = pool_key_secret_name(pool, pool_key(pool, UID, NS, OPTIONS))
    grants = pool_grants(pool, pool_deployment_name(pool), key, OPTIONS.default_triton_image)
    assert refusal(deployment, grants) is None
    assert "runs as ServiceAccount cluster-admin-ish" in (refusal(_changed(deployment, "service account"), grants) or "")
    assert "db-password" in (refusal(_changed(deployment, "secret volume"), grants) or "")


def _pooled() -> tuple[TritonModel, dict[str, Any], dict[str, Any], dict[str, Any]]:
    body = python_model("m", pool="p", memory="1Gi")
    body["metadata"].update(namespace=NS, uid=UID)
    model = TritonModel.model_validate(body)
    (endpoint_slice,) = render_endpoint_slices(model, UID, NS, [], {}, set())
    service = render_model_service(model, UID, NS)
    return model, body, endpoint_slice, service


def test_a_pooled_models_slice_passes_for_the_service_it_controls_only() -> None:
    _, body, endpoint_slice, service = _pooled()
    assert slice_refusal(endpoint_slice, body, service) is None
    theirs = {"metadata": {"name": "m", "ownerReferences": []}, "spec": {"selector": {"app": "payments"}}}
    assert "which TritonModel m does not control" in (slice_refusal(endpoint_slice, body, theirs) or "")
    selected = copy.deepcopy(service)
    selected["spec"]["selector"] = {"app": "m"}
    assert "has a selector" in (slice_refusal(endpoint_slice, body, selected) or "")
    assert "which is not there" in (slice_refusal(endpoint_slice, body, None) or "")
    other_uid = copy.deepcopy(body)
    other_uid["metadata"]["uid"] = "uid-2"
    assert "is not there" in (slice_refusal(endpoint_slice, other_uid, service) or "")
    unpooled = copy.deepcopy(body)
    del unpooled["spec"]["pool"]
    assert "is on no pool" in (slice_refusal(endpoint_slice, unpooled, service) or "")
    orphan = copy.deepcopy(endpoint_slice)
    orphan["metadata"]["ownerReferences"] = []
    assert "has no TritonModel as its controller" in (slice_refusal(orphan, body, service) or "")
