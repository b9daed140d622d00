"""Defects of issue 12 a user would hit, each reproduced against the API server and the real nodes.

Same session operator (the chart) and per-test namespaces as `test_operator.py`. Tests that need only
the API server (no operator, no node) take `kube`/`kubeconfig`/`namespace` alone, so they also run on
a control-plane-only cluster (`KUBECONFIG=<root>/.cluster/kubeconfig` of a `LocalCluster(root, nodes=())`).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest

from e2e.kube import RESOURCES, ApiError, Kube, condition, wait_for
from e2e.operator_fixtures import (
    CRD,
    GROUP,
    LABEL_MODEL,
    OperatorHandle,
    add_sub,
    apply,
    digest_of,
    gate,
    is_model_ready,
    kubectl,
    live_pods,
    load_examples,
    model_condition,
    wait_model,
)
from e2e.testing import consistently, endpoint_ready, is_ready, ready_endpoints
from e2e.traffic import infer_add_sub, model_ready_over_http
from triton_operator.api.pod import repository_of
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.controller.cache import Cache
from triton_operator.controller.reconcile import Reconciler
from triton_operator.platform.errors import ApiCallError
from triton_operator.platform.kube import Kube as OperatorKube
from triton_operator.platform.kubeconfig import load as load_credentials
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
    """A ResourceQuota of 0 pods in a namespace enforcing Pod Security "restricted": the rendered pod passes Pod
    Security and is refused by the quota admission; the ReplicaSet's FailedCreate shows on the TritonModel as
    Degraded with the API server's message, and clears once pods can be created again."""
    _restrict(kube, namespace)
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
    # The operator posts a status's Events once that status is stored, so they can come a moment after it.
    wait_for("a Warning Event FailedCreate on the TritonModel", lambda: any(
        e["involvedObject"].get("kind") == "TritonModel" and e["reason"] == "FailedCreate" and e["type"] == "Warning"
        for e in kube.items("Event", namespace)), 30)

    kube.delete("ResourceQuota", "no-pods", namespace)
    wait_model(kube, namespace, "add-sub", lambda tm: model_condition(tm, "Degraded").get("status") == "False",
               "no longer Degraded once pods can be created", 120)
    assert live_pods(kube, namespace, "add-sub")


# -- #2: repository ConfigMaps, immutable and named by content --------------------------------------


def _apply_crd(kube: Kube, kubeconfig: Path) -> None:
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_for("CRD tritonmodels Established", lambda: (condition(kube.request(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/tritonmodels.{GROUP}"), "Established")
        or {}).get("status") == "True", 30)
    wait_for("TritonModels served", lambda: _served(kube), 30)


def _served(kube: Kube) -> bool:
    try:
        return any(r["name"] == "tritonmodels" for r in kube.request("GET", f"/apis/{GROUP}/v1alpha1")["resources"])
    except ApiError:
        return False


class InProcessOperator:
    """The operator's own Reconciler in this process, against the test's API server, its cache fed from LISTs
    (as the watches would feed it): a reconcile on demand, no kopf, no webhook, no gate."""

    def __init__(self, kube: Kube, kubeconfig: Path, impersonate: str | None = None) -> None:
        headers = {"Impersonate-User": impersonate} if impersonate else None
        self.kube = kube
        self.cache = Cache()
        self.reconciler = Reconciler(OperatorKube(load_credentials(str(kubeconfig)), headers), self.cache)

    def reconcile(self, namespace: str, name: str) -> None:
        self.cache.put_model(self.kube.get("TritonModel", name, namespace))
        for kind in ("ConfigMap", "Deployment", "Service", "PodDisruptionBudget"):
            listed = {o["metadata"]["name"]: {**o, "kind": kind}
                      for o in self.kube.items(kind, namespace, label_selector={LABEL_MODEL: name})}
            for key in [k for k in self.cache.children if k[0] == kind and k[1] == namespace and k[2] not in listed]:
                del self.cache.children[key]
            for body in listed.values():
                self.cache.put_child(body)
        asyncio.run(self.reconciler.reconcile(namespace, name))


def _repositories(kube: Kube, namespace: str) -> list[str]:
    return sorted(cm["metadata"]["name"] for cm in kube.items("ConfigMap", namespace, label_selector={LABEL_MODEL: "add-sub"}))


def _replicaset(kube: Kube, namespace: str, repository: str) -> dict | None:
    return next((rs for rs in kube.items("ReplicaSet", namespace, label_selector={LABEL_MODEL: "add-sub"})
                 if repository_of(rs["spec"]["template"]) == repository), None)


def test_repository_configmaps_are_immutable_by_content_and_collected_when_no_replicaset_uses_them(
        kube: Kube, kubeconfig: Path, namespace: str) -> None:
    """The operator's reconcile against the API server and its controller-manager (no operator, no node
    needed: the pods never become Ready, so an update stalls as a bad one would)."""
    _apply_crd(kube, kubeconfig)
    op = InProcessOperator(kube, kubeconfig)
    doc = add_sub()
    kube.create({**doc, "metadata": {**doc["metadata"], "namespace": namespace}})
    op.reconcile(namespace, "add-sub")
    [first] = _repositories(kube, namespace)
    assert re.fullmatch(r"add-sub-repository-[0-9a-f]{10}", first), first
    cm = kube.get("ConfigMap", first, namespace)
    assert cm["immutable"] is True and cm["metadata"]["ownerReferences"][0]["kind"] == "TritonModel"
    with pytest.raises(ApiError) as refused:  # the API server keeps it as it is
        kube.patch("ConfigMap", first, {"data": {"x": "y"}}, namespace, type="merge")
    assert refused.value.status == 422, refused.value
    wait_for("the first ReplicaSet, with a pod", lambda: (_replicaset(kube, namespace, first) or {}).get(
        "status", {}).get("replicas") == 1, 60)

    # An update: a new ConfigMap beside the old one, which the old ReplicaSet (still at 1) keeps using.
    good = doc["spec"]["source"]["inline"]["model.py"]
    kube.patch("TritonModel", "add-sub", {"spec": {"source": {"inline": {"model.py": good + "\n# v2\n"}}}}, namespace,
               type="merge")
    op.reconcile(namespace, "add-sub")
    second = repository_of(kube.get("Deployment", "add-sub", namespace)["spec"]["template"])
    assert second != first and _repositories(kube, namespace) == sorted([first, second])
    wait_for("the surge ReplicaSet, with a pod", lambda: (_replicaset(kube, namespace, second) or {}).get(
        "status", {}).get("replicas") == 1, 60)
    op.reconcile(namespace, "add-sub")
    assert _repositories(kube, namespace) == sorted([first, second]), "a ConfigMap in use was deleted"
    assert _replicaset(kube, namespace, first)["spec"]["replicas"] == 1

    # Scaled to zero, neither ReplicaSet can create a pod any more: the old one's ConfigMap goes, the
    # desired one stays (the Deployment's template names it). Collected by the reconcile that sees it.
    kube.patch("TritonModel", "add-sub", {"spec": {"replicas": 0}}, namespace, type="merge")
    op.reconcile(namespace, "add-sub")
    wait_for("both ReplicaSets scaled to zero", lambda: all(
        (rs["spec"]["replicas"], rs["status"].get("replicas", 0)) == (0, 0)
        for rs in kube.items("ReplicaSet", namespace, label_selector={LABEL_MODEL: "add-sub"})), 60)
    op.reconcile(namespace, "add-sub")
    assert _repositories(kube, namespace) == [second]
    assert repository_of(kube.get("Deployment", "add-sub", namespace)["spec"]["template"]) == second

    # Deleting the model deletes its ConfigMaps (owner references: the garbage collector).
    kube.delete("TritonModel", "add-sub", namespace)
    wait_for("the repository ConfigMap garbage-collected", lambda: not _repositories(kube, namespace), 60)


BROKEN = "e2e-defects: cannot open /weights/v2.bin"


def test_a_replica_re_created_during_a_stalled_update_serves_the_old_config(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    """Issue 12 #2: a bad update stalls on its surge pod; an old replica is then deleted (an eviction, a node
    loss). The old ReplicaSet's replacement must fetch the old files (its template's own ConfigMap) and serve
    the old config, while the new ReplicaSet stays stalled."""
    doc = add_sub()
    doc["spec"]["replicas"] = 2
    apply(kubeconfig, namespace, doc)
    tm = wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 2,
                    "Ready with 2 warmed replicas", 180)
    old_digest = tm["status"]["configDigest"]
    old_repository = repository_of(kube.get("Deployment", "add-sub", namespace)["spec"]["template"])
    old = {p["metadata"]["name"] for p in live_pods(kube, namespace, "add-sub")}
    assert len(old) == 2

    good = doc["spec"]["source"]["inline"]["model.py"]
    bad = good.replace("class TritonPythonModel:\n",
                       f"class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError({BROKEN!r})\n\n",
                       1)
    assert bad != good
    kube.patch("TritonModel", "add-sub", {"spec": {"source": {"inline": {"model.py": bad}}}}, namespace, type="merge")
    tm = wait_model(kube, namespace, "add-sub", lambda tm: (
        tm["status"].get("observedGeneration") == tm["metadata"]["generation"]
        and model_condition(tm, "Degraded").get("reason") == "ModelLoadFailed"), "Degraded by the bad update", 180)
    bad_digest = tm["status"]["configDigest"]
    new_repository = repository_of(kube.get("Deployment", "add-sub", namespace)["spec"]["template"])
    assert bad_digest != old_digest and new_repository != old_repository
    assert set(_repositories(kube, namespace)) == {old_repository, new_repository}

    victim = sorted(old)[0]
    kube.delete("Pod", victim, namespace)

    def replacement() -> dict | None:
        return next((p for p in live_pods(kube, namespace, "add-sub")
                     if p["metadata"]["name"] not in old and digest_of(p) == old_digest
                     and gate(p).get("status") == "True" and is_ready(p)), None)

    pod = wait_for("the old ReplicaSet's replacement warmed at the old digest", replacement, 180)
    assert repository_of(pod) == old_repository, "the replacement mounts its template's own ConfigMap"
    assert gate(pod)["reason"] == "ModelWarmed", gate(pod)
    ip = pod["status"]["podIP"]
    assert model_ready_over_http(ip, "add-sub") is True
    wait_for("the replacement ready in the Service's EndpointSlice", lambda: endpoint_ready(kube, namespace, "add-sub", ip),
             30)
    np.testing.assert_allclose(infer_add_sub(ip), [[11, 22, 33, 44]])

    # The new ReplicaSet stays stalled: its one surge pod failed, nothing else of it exists.
    def stalled() -> bool:
        pods = live_pods(kube, namespace, "add-sub")
        new = [p for p in pods if digest_of(p) == bad_digest]
        tm = kube.get("TritonModel", "add-sub", namespace)
        seen = {
            "new pods": [(p["metadata"]["name"], is_ready(p), gate(p).get("reason"), gate(p).get("message"))
                         for p in new],
            "old ready pods": len([p for p in pods if digest_of(p) == old_digest and is_ready(p)]),
            "Degraded": model_condition(tm, "Degraded").get("reason"),
            "ready endpoints": len(ready_endpoints(kube, namespace, "add-sub")),
        }
        assert (len(new) == 1 and not is_ready(new[0]) and gate(new[0]).get("reason") == "ModelLoadFailed"
                and seen["old ready pods"] == 2 and seen["Degraded"] == "ModelLoadFailed"
                and seen["ready endpoints"] == 2), f"the stall stopped holding: {seen}"
        return True

    consistently("the bad update to stay stalled behind two serving old replicas", stalled, 10)

    # The revert: back to the old ReplicaSet; the bad update's ConfigMap goes once its ReplicaSet is at zero.
    kube.patch("TritonModel", "add-sub", {"spec": {"source": {"inline": {"model.py": good}}}}, namespace, type="merge")
    wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm) and tm["status"]["configDigest"] == old_digest
               and model_condition(tm, "Degraded").get("status") == "False", "Ready again after the revert", 120)
    wait_for("the bad update's ConfigMap collected", lambda: _repositories(kube, namespace) == [old_repository],
             operator.drift_interval * 4 + 60)


# -- #9: persistent API errors: reported on the status ---------------------------------------------


def _reconcile_refused(op: InProcessOperator, namespace: str) -> str:
    """Reconciles once, expecting the API server to refuse a call; returns the refusal as the reconcile raised it."""
    with pytest.raises(ApiCallError) as refused:
        op.reconcile(namespace, "add-sub")
    return str(refused.value)


def test_a_persistent_api_error_is_degraded_with_the_verb_and_the_kind(
        kube: Kube, kubeconfig: Path, namespace: str) -> None:
    """A 422 (a Deployment the API server finds invalid) and a 403 (RBAC without Deployments), each on the
    TritonModel's status as Degraded=True ApiError naming the verb and the kind, cleared once it is fixed."""
    _apply_crd(kube, kubeconfig)
    doc = add_sub()
    doc["spec"]["server"] = {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}
    kube.create({**doc, "metadata": {**doc["metadata"], "namespace": namespace}})
    op = InProcessOperator(kube, kubeconfig)
    refusal = _reconcile_refused(op, namespace)
    assert refusal.startswith(f"apply Deployment {namespace}/add-sub: 422"), refusal
    degraded = model_condition(kube.get("TritonModel", "add-sub", namespace), "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ApiError"), degraded
    assert degraded["message"].startswith(f"apply Deployment {namespace}/add-sub: 422 Unprocessable Entity: "), degraded
    assert "must be less than or equal to cpu limit" in degraded["message"], degraded

    kube.patch("TritonModel", "add-sub", {"spec": {"server": {"resources": None}}}, namespace, type="merge")
    op.reconcile(namespace, "add-sub")
    tm = kube.get("TritonModel", "add-sub", namespace)
    assert model_condition(tm, "Degraded")["status"] == "False", model_condition(tm, "Degraded")
    assert kube.get_or_none("Deployment", "add-sub", namespace) is not None

    # An identity whose RBAC lacks Deployments (a chart's rules older than the operator, say).
    user = f"e2e-no-deployments-{namespace}"
    rules = [{"apiGroups": [GROUP], "resources": ["tritonmodels"], "verbs": ["get", "list", "watch"]},
             {"apiGroups": [GROUP], "resources": ["tritonmodels/status"], "verbs": ["patch"]},
             {"apiGroups": [""], "resources": ["configmaps", "services"],
              "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
             {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["list"]},
             {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
             {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
                 {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                  "metadata": {"name": "no-deployments"}, "rules": rules})
    kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
                 {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                  "metadata": {"name": "no-deployments"},
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-deployments"},
                  "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    limited = InProcessOperator(kube, kubeconfig, impersonate=user)
    kube.patch("TritonModel", "add-sub", {"spec": {"replicas": 2}}, namespace, type="merge")

    def refused_with_403() -> str | None:
        try:
            limited.reconcile(namespace, "add-sub")
        except ApiCallError as e:  # RBAC is cached by the API server for a moment
            return str(e) if e.status == 403 else None
        return None

    refusal = wait_for("the reconcile refused by RBAC", refused_with_403, 30)
    assert refusal.startswith(f"get Deployment {namespace}/add-sub: 403") or refusal.startswith(
        f"apply Deployment {namespace}/add-sub: 403"), refusal
    tm = kube.get("TritonModel", "add-sub", namespace)
    degraded = model_condition(tm, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ApiError"), degraded
    assert f"Deployment {namespace}/add-sub: 403 Forbidden: " in degraded["message"], degraded
    assert f'User "{user}" cannot' in degraded["message"], degraded
    assert degraded["observedGeneration"] == tm["metadata"]["generation"]


# -- kubectl: the columns and the explain text the docs promise ---------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _docs_get_example() -> tuple[list[str], list[str]]:
    """The header and the row of the `kubectl get tritonmodels` example in the docs (Getting started)."""
    text = (DOCS / "getting-started.md").read_text()
    block = text[text.index("$ kubectl get tritonmodels"):]
    block = block[:block.index("```")]
    lines = [ln for ln in block.splitlines() if ln and not ln.startswith("$")]
    return lines[0].split(), lines[1].split()


def _reference_rows(prefix: str) -> dict[str, str]:
    """The TritonModel reference's rows (docs/reference/tritonmodel.md) of the direct children of `prefix`: field ->
    description."""
    out = {}
    for line in (DOCS / "reference" / "tritonmodel.md").read_text().splitlines():
        m = re.match(rf"^\| `{re.escape(prefix)}\.([A-Za-z0-9]+)` \|.*\| (.*) \|$", line)
        if m:
            out[m.group(1)] = m.group(2).replace("\\|", "|")
    return out


def _words(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def test_kubectl_get_and_explain_show_what_the_readme_promises(kube: Kube, kubeconfig: Path, namespace: str) -> None:
    """Against the API server, with the CRD from crds/: the printer columns (and the short name) of
    `kubectl get`, filled from the status the operator writes, and `kubectl explain` of spec.batcher."""
    _apply_crd(kube, kubeconfig)
    doc = add_sub()
    doc["spec"]["replicas"] = 2
    kube.create({**doc, "metadata": {**doc["metadata"], "namespace": namespace}})
    status = {"observedGeneration": 1, "replicas": 2, "readyReplicas": 2, "warmedReplicas": 2,
              "configDigest": "0123456789abcdef", "selector": f"{LABEL_MODEL}=add-sub",
              "conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasWarmed", "message": "2/2",
                              "observedGeneration": 1, "lastTransitionTime": "2026-11-23T00:00:00Z"}]}
    kube.patch("TritonModel", "add-sub", {"status": status}, namespace, sub="status", type="merge")

    header, row = _docs_get_example()
    got = kubectl(kubeconfig, "get", "tritonmodels", "-n", namespace).stdout.splitlines()
    assert got[0].split() == header, got
    assert got[1].split()[:-1] == row[:-1], got  # all but AGE
    assert kubectl(kubeconfig, "get", "tm", "-n", namespace).stdout.splitlines()[0].split() == header
    wide = kubectl(kubeconfig, "get", "tm", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == [*header[:-1], "DIGEST", "AGE"] or wide[0].split() == [*header, "DIGEST"], wide
    assert "0123456789abcdef" in wide[1].split(), wide

    explained = kubectl(kubeconfig, "explain", "tritonmodel.spec.batcher").stdout
    words = _words(explained)
    assert "KIND: TritonModel" in words and "FIELD: batcher <Object>" in words, explained
    assert _words("Enables Triton's dynamic batcher.") in words, explained
    fields = _reference_rows("spec.batcher")
    assert set(fields) >= {"maxQueueDelayMicroseconds", "preferredBatchSize", "preserveOrdering", "priorityLevels",
                           "defaultPriorityLevel", "defaultQueuePolicy", "priorityQueuePolicy"}, fields
    for field, description in fields.items():
        assert re.search(rf"^\s+{field}\s+<", explained, re.MULTILINE), f"{field} not in:\n{explained}"
        assert _words(description) in words, f"{field}: {description!r} not in:\n{explained}"
