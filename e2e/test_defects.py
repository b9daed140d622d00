"""Defects of issue 12 a user would hit, each reproduced against the API server and the real nodes.

Same session operator (the chart) and per-test namespaces as `test_operator.py`. Tests that need only
the API server (no operator, no node) take `kube`/`kubeconfig`/`namespace` alone, so they also run on
a control-plane-only cluster (`KUBECONFIG=<root>/.cluster/kubeconfig` of a `LocalCluster(root, nodes=())`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from e2e.kube import RESOURCES, ApiError, Kube, condition, wait_for
from e2e.operator_fixtures import (
    LABEL_MODEL,
    OperatorHandle,
    gate,
    is_model_ready,
    load_examples,
    model_condition,
    wait_model,
)
from e2e.test_operator import add_sub, apply, digest_of, endpoint_ready, infer_add_sub, live_pods
from e2e.testing import consistently, is_ready
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.render.kubernetes import Options, render_children
from triton_operator.render.modelconfig import render_repository

pytestmark = pytest.mark.cluster


# -- #1: warmupGate.enabled: false ------------------------------------------------------------------


def test_without_the_warmup_gate_the_model_turns_ready_with_its_pods(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    """Nothing writes the warmed condition for pods without the gate: Ready must follow the pods' own readiness."""
    doc = add_sub()
    doc["spec"]["warmupGate"] = {"enabled": False}
    apply(kubeconfig, namespace, doc)
    tm = wait_model(kube, namespace, "add-sub", is_model_ready, "Ready with the warm-up gate disabled", 180)
    ready, progressing = model_condition(tm, "Ready"), model_condition(tm, "Progressing")
    assert ready["reason"] == "AllReplicasReady", ready
    assert (progressing["status"], progressing["reason"]) == ("False", "RolloutComplete"), progressing
    assert model_condition(tm, "Degraded")["status"] == "False"
    assert (tm["status"]["readyReplicas"], tm["status"]["warmedReplicas"]) == (1, 1), tm["status"]
    assert [s["state"] for s in tm["status"]["replicaStates"]] == ["Ready"], tm["status"]["replicaStates"]

    [pod] = live_pods(kube, namespace, "add-sub")
    assert not pod["spec"].get("readinessGates"), pod["spec"].get("readinessGates")
    assert is_ready(pod) and not gate(pod), (condition(pod, "Ready"), gate(pod))  # no warmed condition at all
    assert digest_of(pod) == tm["status"]["configDigest"]
    ip = pod["status"]["podIP"]
    wait_for("the replica ready in the Service's EndpointSlice", lambda: endpoint_ready(kube, namespace, "add-sub", ip),
             30)
    np.testing.assert_allclose(infer_add_sub(ip), [[11, 22, 33, 44]])


# -- #10: Pod Security "restricted" ---------------------------------------------------------------

RESOURCES.setdefault("ResourceQuota", ("/api/v1", "resourcequotas", True))
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}


def _restrict(kube: Kube, namespace: str) -> None:
    kube.patch("Namespace", namespace, {"metadata": {"labels": RESTRICTED}}, type="merge")


def _rendered_add_sub(namespace: str) -> list[dict]:
    """What the operator applies for examples/add-sub.yaml, without owner references (no TritonModel owns
    them here: the garbage collector would delete children of a missing owner)."""
    model = TritonModel.model_validate(load_examples("add-sub")[0])
    children = render_children(model, render_repository([model]), "0", namespace, Options())
    for c in children:
        c["metadata"].pop("ownerReferences", None)
    return children


def _replica_failure(kube: Kube, namespace: str) -> list[str]:
    """Every FailedCreate the ReplicaSets of `namespace` report (their ReplicaFailure condition)."""
    return [f"{rs['metadata']['name']}: {c.get('message')}" for rs in kube.items("ReplicaSet", namespace)
            for c in (rs.get("status") or {}).get("conditions") or () if c["type"] == "ReplicaFailure"
            and c["status"] == "True"]


def test_pods_rendered_for_add_sub_are_admitted_under_pod_security_restricted(kube: Kube, namespace: str) -> None:
    """The API server's own Pod Security admission, enforcing "restricted": the rendered pod template is
    admitted, and the Deployment's ReplicaSet creates its pod (no FailedCreate). Needs no node: an
    unscheduled pod is admitted all the same."""
    _restrict(kube, namespace)
    children = _rendered_add_sub(namespace)
    dep = next(c for c in children if c["kind"] == "Deployment")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "add-sub-dry-run", "namespace": namespace},
           "spec": dep["spec"]["template"]["spec"]}
    try:  # the exact verdict, at once: a dry run goes through admission and stores nothing
        kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod, params={"dryRun": "All"})
    except ApiError as e:
        pytest.fail(f"Pod Security admission refused the rendered pod: {e}")
    for child in children:
        if child["kind"] in ("ConfigMap", "Deployment"):
            kube.apply(child)
    wait_for("the Deployment's pod created", lambda: kube.items("Pod", namespace, label_selector={LABEL_MODEL: "add-sub"}),
             60)
    consistently("no FailedCreate on the ReplicaSet", lambda: not _replica_failure(kube, namespace), 3)


def test_add_sub_in_a_restricted_namespace_becomes_ready(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    """Pod Security "restricted" enforced: the replica is admitted, runs as 65532 on a read-only root
    filesystem with the local tritonserver image, warms up and serves."""
    _restrict(kube, namespace)
    apply(kubeconfig, namespace, add_sub())
    tm = wait_model(kube, namespace, "add-sub", is_model_ready, "Ready under Pod Security restricted", 180)
    assert model_condition(tm, "Degraded")["status"] == "False", model_condition(tm, "Degraded")
    assert not _replica_failure(kube, namespace)
    [pod] = live_pods(kube, namespace, "add-sub")
    assert pod["spec"]["securityContext"]["runAsUser"] == 65532 and gate(pod)["status"] == "True"
    ip = pod["status"]["podIP"]
    wait_for("the replica ready in the Service's EndpointSlice", lambda: endpoint_ready(kube, namespace, "add-sub", ip),
             30)
    np.testing.assert_allclose(infer_add_sub(ip), [[11, 22, 33, 44]])


def test_a_deployment_refused_by_admission_is_degraded_with_the_api_servers_message(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    """A ResourceQuota of 0 pods: the ReplicaSet's FailedCreate (here the quota admission's; Pod Security's
    alike) shows on the TritonModel as Degraded with the API server's message, and clears once pods can be
    created again."""
    kube.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods", "namespace": namespace},
                 "spec": {"hard": {"pods": "0"}}})
    # Until the quota controller has computed its usage the quota admission refuses anything it counts.
    wait_for("the quota's usage computed",
             lambda: ((kube.get("ResourceQuota", "no-pods", namespace).get("status") or {}).get("used")), 30)
    apply(kubeconfig, namespace, add_sub())
    tm = wait_model(kube, namespace, "add-sub", lambda tm: (
        tm.get("status", {}).get("observedGeneration") == tm["metadata"]["generation"]
        and model_condition(tm, "Degraded").get("status") == "True"), "Degraded by the quota", 90)
    degraded = model_condition(tm, "Degraded")
    assert degraded["reason"] == "FailedCreate", degraded
    assert "exceeded quota: no-pods" in degraded["message"], degraded
    ready, progressing = model_condition(tm, "Ready"), model_condition(tm, "Progressing")
    assert (ready["status"], ready["reason"]) == ("False", "FailedCreate"), ready
    assert (progressing["status"], progressing["reason"]) == ("False", "RolloutStalled"), progressing
    assert "exceeded quota: no-pods" in progressing["message"]
    events = [e for e in kube.items("Event", namespace) if e["involvedObject"].get("kind") == "TritonModel"]
    assert any(e["reason"] == "FailedCreate" and e["type"] == "Warning" for e in events), events

    kube.delete("ResourceQuota", "no-pods", namespace)
    wait_model(kube, namespace, "add-sub", lambda tm: model_condition(tm, "Degraded").get("status") == "False",
               "no longer Degraded once pods can be created", 120)
    assert live_pods(kube, namespace, "add-sub")
