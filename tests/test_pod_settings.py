"""The pod settings of `spec.server` (serviceAccountName, automountServiceAccountToken, imagePullSecrets, podLabels,
podAnnotations, priorityClassName, topologySpreadConstraints, env, envFrom): rendered into every replica, validated
with the field named, and each a new-pods change (it changes the pod digest)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.documents import body, validation_errors
from triton_operator.api.pod import ANNOTATION_POD_DIGEST
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.render.kubernetes import labels, render_children
from triton_operator.render.modelconfig import render_repository


def _template(**server: Any) -> dict[str, Any]:
    model = TritonModel.model_validate(body(**server))
    kids = {c["kind"]: c for c in render_children(model, render_repository([model]), "uid", "ns")}
    return dict(kids["Deployment"]["spec"]["template"])


EVERYTHING: dict[str, Any] = {
    "serviceAccountName": "model-reader",
    "automountServiceAccountToken": True,
    "imagePullSecrets": [{"name": "ngc-mirror"}, {"name": "ghcr"}],
    "podLabels": {"team": "vision", "cost-center": "cc-42", "sidecar.istio.io/inject": "false"},
    "podAnnotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8002"},
    "priorityClassName": "inference-high",
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
        {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchLabels": {"team": "vision"}}, "matchLabelKeys": ["pod-template-hash"],
         "minDomains": 2, "nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Ignore"},
    ],
    "env": [{"name": "AWS_REGION", "value": "eu-west-1"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "token", "optional": True}}}],
    "envFrom": [{"secretRef": {"name": "aws-credentials"}}, {"prefix": "CFG_", "configMapRef": {"name": "settings"}}],
}


def test_every_pod_setting_reaches_the_replicas_pod() -> None:
    template = _template(**EVERYTHING)
    pod = template["spec"]
    assert pod["serviceAccountName"] == "model-reader"
    assert pod["automountServiceAccountToken"] is True
    assert pod["imagePullSecrets"] == [{"name": "ngc-mirror"}, {"name": "ghcr"}]
    assert pod["priorityClassName"] == "inference-high"
    zone, host = pod["topologySpreadConstraints"]
    # Without a labelSelector a constraint counts the model's own replicas (Kubernetes would count no pod at all).
    assert zone == {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {"serving.triton-operator.dev/model": "m"}}}
    assert host == EVERYTHING["topologySpreadConstraints"][1]
    meta = template["metadata"]
    assert meta["labels"] == {**EVERYTHING["podLabels"], **labels(TritonModel.model_validate(body()))}
    for k, v in EVERYTHING["podAnnotations"].items():
        assert meta["annotations"][k] == v
    assert meta["annotations"]["serving.triton-operator.dev/triton-model"] == "m", "the operator's stay"


def test_env_reaches_tritonserver_and_fetch_but_not_the_probe_which_gets_only_the_key() -> None:
    template = _template(**{k: EVERYTHING[k] for k in ("env", "envFrom")})
    triton, probe = template["spec"]["containers"]
    key = {"name": "TRITON_OPERATOR_REPOSITORY_KEY", "valueFrom": {"secretKeyRef": {"name": "m-repository-key",
                                                                                   "key": "key"}}}
    assert triton["env"] == [{"name": "HOME", "value": "/tmp"}, key, *EVERYTHING["env"]]
    assert triton["envFrom"] == EVERYTHING["envFrom"]
    assert probe["env"] == [key] and "envFrom" not in probe  # its /status and /gate need the key (issue 39)
    model = TritonModel.model_validate(body(source={"uri": "s3://bucket/m"}, env=EVERYTHING["env"],
                                            envFrom=EVERYTHING["envFrom"]))
    pod = render_children(model, render_repository([model]), "uid", "ns")[1]["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    assert fetch["env"] == EVERYTHING["env"], "no credentialsSecret: the fetch step takes its credentials from here"
    assert fetch["envFrom"] == EVERYTHING["envFrom"]
    assert fetch["env"] is not pod["containers"][0]["env"][2:], "the containers share no object"


def test_a_credentials_secret_and_env_both_reach_fetch() -> None:
    model = TritonModel.model_validate(body(source={"uri": "s3://bucket/m", "credentialsSecret": "s3"},
                                            env=[{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]))
    (fetch,) = render_children(model, render_repository([model]), "uid", "ns")[1]["spec"]["template"]["spec"][
        "initContainers"]
    names = [e["name"] for e in fetch["env"]]
    assert names == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                     "AWS_REGION", "HTTPS_PROXY"]


def test_unset_the_pod_has_no_api_token_and_kubernetes_defaults() -> None:
    pod = _template()["spec"]
    assert pod["automountServiceAccountToken"] is False
    for key in ("serviceAccountName", "imagePullSecrets", "priorityClassName", "topologySpreadConstraints"):
        assert key not in pod
    assert all("envFrom" not in c for c in pod["containers"])


def _pod_digest(**server: Any) -> str:
    return str(_template(**server)["metadata"]["annotations"][ANNOTATION_POD_DIGEST])


@pytest.mark.parametrize("field", sorted(EVERYTHING))
def test_each_pod_setting_changes_the_pod_digest_so_the_rollout_makes_new_pods(field: str) -> None:
    """A change Triton cannot load in place must make new pods (`plan.rollout`): podLabels, which live in the
    template's labels rather than its spec or annotations, too."""
    assert _pod_digest() != _pod_digest(**{field: EVERYTHING[field]})


def test_a_pod_labels_change_is_rolled_not_lost_under_in_place() -> None:
    from triton_operator.plan.rollout import in_place_deployment

    def deployment(**server: Any) -> dict[str, Any]:
        model = TritonModel.model_validate(body(**server))
        return dict(render_children(model, render_repository([model]), "uid", "ns")[1])

    live, desired = deployment(podLabels={"team": "a"}), deployment(podLabels={"team": "b"})
    applied = in_place_deployment(desired, live)
    assert applied["spec"]["template"]["metadata"]["labels"]["team"] == "b"
    assert applied == desired, "a new template: the Deployment rolls new pods"


# ---------------------------------------------------------------- validation


def test_every_label_the_operator_puts_on_a_replica_is_refused_in_pod_labels() -> None:
    for key in labels(TritonModel.model_validate(body())):
        errors = validation_errors(body(podLabels={key: "x"}))
        assert [(e.path, e.rule) for e in errors] == [(f"spec.server.podLabels[{key}]", "pod-metadata")], errors


def test_every_annotation_the_operator_puts_on_a_replica_is_refused_in_pod_annotations() -> None:
    """The operator's own annotations, rendered for a gated model (its default-container one too)."""
    rendered = _template()["metadata"]["annotations"]
    for key in rendered:
        errors = validation_errors(body(podAnnotations={key: "x"}))
        assert [(e.path, e.rule) for e in errors] == [(f"spec.server.podAnnotations[{key}]", "pod-metadata")], errors
    # ... and those written on pods later (the reload instruction, the gate's loaded digest), by their prefix.
    errors = validation_errors(body(podAnnotations={"serving.triton-operator.dev/reload": "Swap"}))
    assert [e.rule for e in errors] == ["pod-metadata"]


@pytest.mark.parametrize(("server", "path", "message"), [
    ({"podLabels": {"a" * 64: "x"}}, f"spec.server.podLabels[{'a' * 64}]", "is 64 characters, over 63"),
    ({"podAnnotations": {"x/" + "b" * 64: "y"}}, f"spec.server.podAnnotations[x/{'b' * 64}]", "over 63"),
    ({"podAnnotations": {f"k{i}": "v" * 60000 for i in range(5)}}, "spec.server.podAnnotations", "bytes in all"),
    ({"env": [{"name": "HOME", "value": "/root"}]}, "spec.server.env[0].name", "set by the operator"),
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "spec.server.env[1].name", "set twice"),
])
def test_pod_settings_are_refused_with_the_field_named(server: dict[str, Any], path: str, message: str) -> None:
    errors = validation_errors(body(**server))
    assert [e.path for e in errors] == [path], errors
    assert message in errors[0].message, errors[0].message


@pytest.mark.parametrize(("uri", "name"), [("s3://b/m", "AWS_SECRET_ACCESS_KEY"), ("gs://b/m",
                                                                                  "GOOGLE_APPLICATION_CREDENTIALS")])
def test_env_may_not_set_what_a_credentials_secret_sets_in_the_fetch_step(uri: str, name: str) -> None:
    env = [{"name": name, "value": "x"}]
    errors = validation_errors(body(source={"uri": uri, "credentialsSecret": "c"}, env=env))
    assert [(e.path, e.rule) for e in errors] == [("spec.server.env[0].name", "pod-env")], errors
    assert not validation_errors(body(source={"uri": uri}, env=env)), "without the Secret, env carries credentials"


def test_an_ensembles_env_may_not_set_what_a_steps_credentials_secret_sets() -> None:
    step = body(name="a", source={"uri": "s3://b/a", "credentialsSecret": "c"})
    ensemble = {
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": "e"},
        "spec": {"platform": "ensemble", "maxBatchSize": 4,
                 "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
                 "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
                 "server": {"env": [{"name": "AWS_REGION", "value": "x"}]},
                 "ensemble": {"steps": [{"model": "a", "inputMap": {"INPUT": "IN"}, "outputMap": {"OUTPUT": "OUT"}}]}}}
    errors = validation_errors(step, ensemble)
    assert [(e.model, e.path) for e in errors] == [("TritonModel/e", "spec.server.env[0].name")], errors


@pytest.mark.parametrize("server", [
    {"podLabels": {"bad key": "x"}},
    {"podLabels": {"team": "not a value"}},
    {"podLabels": {"team": "x" * 64}},
    {"serviceAccountName": "Not_A_Name"},
    {"imagePullSecrets": [{"name": "UPPER"}]},
    {"priorityClassName": "-high"},
    {"env": [{"name": "1ST", "value": "x"}]},
    {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
    {"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]},
    {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}]},
])
def test_malformed_pod_settings_are_refused_by_the_schema(server: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        TritonModel.model_validate(body(**server))
    errors = validation_errors(body(**server))
    assert errors and all(e.rule == "schema" and e.path.startswith("spec.server.") for e in errors), errors


def test_everything_together_is_valid() -> None:
    assert not validation_errors(body(**EVERYTHING))


def test_the_workload_identity_example_fetches_with_the_service_accounts_identity() -> None:
    """examples/sources/s3-workload-identity.yaml: no key reaches fetch from the operator; the ServiceAccount does."""
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parent.parent / "examples" / "sources" / "s3-workload-identity.yaml"
    sa, tm = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert not validation_errors(tm)
    model = TritonModel.model_validate(tm)
    pod = render_children(model, render_repository([model]), "uid", "ns")[1]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"] and pod["automountServiceAccountToken"] is False
    (fetch,) = pod["initContainers"]
    assert fetch["env"] == [{"name": "AWS_REGION", "value": "us-east-1"}]
    assert "eks.amazonaws.com/role-arn" in sa["metadata"]["annotations"]
