"""The chart's ValidatingAdmissionPolicies and NetworkPolicy on the real API server (issue 32).

With a token of the chart-installed operator's own ServiceAccount (TokenRequest API), whose cluster-wide RBAC allows
each of these calls: patching a kube-system ConfigMap, changing a replica pod's image, writing another pod condition
or the pod's address, adopting a ConfigMap of someone else's, running a Deployment with a hostPath volume, are all
refused by the operator-writes policy; meanwhile the same operator reconciles a model to Ready, end to end.

The TritonModel policy refuses at `kubectl apply`, with its message, a model that tolerates the control plane (or
every taint), and, once the release names allowed registries, an image from elsewhere.

NetworkPolicy: the local cluster's network plugin (the bridge CNI) enforces none. So this checks only that the
objects are what they should be: the chart's policy names the API server's own addresses (found by Helm's lookup
of the `kubernetes` Service's endpoints) for the TLS port, and the API server accepts the example policy for model
pods (examples/policies/network-policy.yaml).
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.images import TRITON_REF
from e2e.kube import ApiError, Kube, wait_for
from e2e.operator_fixtures import (
    CHART,
    KUBECTL,
    RELEASE,
    RELEASE_NAMESPACE,
    ChartOperator,
    OperatorHandle,
    as_stream,
    helm,
    is_model_ready,
    kubectl,
    load_examples,
    model_pods,
    record,
    wait_model,
)
from triton_operator.api.pod import WARMED_CONDITION
from triton_operator.api.v1alpha1 import GROUP

pytestmark = pytest.mark.cluster

SERVICE_ACCOUNT = f"{RELEASE}-triton-operator"
USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{SERVICE_ACCOUNT}"
POLICY = "ValidatingAdmissionPolicy 'trop-triton-operator-operator-writes'"
MODEL_POLICY = "ValidatingAdmissionPolicy 'trop-triton-operator-tritonmodels'"
EXAMPLE_POLICY = Path(__file__).resolve().parent.parent / "examples" / "policies" / "network-policy.yaml"


def operator_token_kubeconfig(admin: Path, kube: Kube, path: Path) -> Path:
    """A kubeconfig holding a bound token of the chart-installed operator's ServiceAccount."""
    token = kube.service_account_token(RELEASE_NAMESPACE, SERVICE_ACCOUNT, seconds=600)
    cfg = yaml.safe_load(admin.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    if "certificate-authority" in cluster:
        cluster = {"server": cluster["server"], "certificate-authority-data":
                   base64.b64encode(Path(cluster["certificate-authority"]).read_bytes()).decode()}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "e2e", "cluster": {k: cluster[k] for k in ("server", "certificate-authority-data")}}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "e2e", "user": "operator"}}],
    }))
    path.chmod(0o600)
    return path


def refused(kube: Kube, method: str, path: str, body: Any, content_type: str) -> str:
    """The API server's refusal of one call (ApiError's message); fails if the call went through."""
    try:
        kube.request(method, path, body, content_type=content_type)
    except ApiError as exc:
        return f"{exc.status} {json.dumps(exc.body)}"
    raise AssertionError(f"{method} {path} went through with the operator's token")


def can_i(kubeconfig: Path, verb: str, resource: str, namespace: str, sub: str = "") -> bool:
    proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "auth", "can-i", verb, resource,
                           *([f"--subresource={sub}"] if sub else []), f"--as={USER}", "-n", namespace],
                          capture_output=True, text=True, timeout=30)
    return proc.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def own_writes_reviewed(operator: OperatorHandle) -> Iterator[OperatorHandle]:
    """The session's release, whose admissionPolicies.operator.reviewWrites is on (the default): the operator's webhook
    reviews its own Deployment and EndpointSlice writes."""
    assert isinstance(operator, ChartOperator)
    deployment = operator.kube.get("Deployment", operator.fullname, RELEASE_NAMESPACE)
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    assert "--webhook-reviews-own-writes" in container["args"], "the chart's default reviews them"
    yield operator


def test_the_operators_token_writes_only_its_own_objects_while_the_operator_serves_a_model(
        kube: Kube, kubeconfig: Path, namespace: str, own_writes_reviewed: OperatorHandle, tmp_path: Path) -> None:
    operator = own_writes_reviewed
    doc = load_examples("add-sub")[0]
    doc["spec"]["replicas"] = 1
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=as_stream([doc]))
    tm = wait_model(kube, namespace, "add-sub", lambda t: is_model_ready(t) and t["status"].get("readyReplicas") == 1,
                    "Ready under the admission policy", 240)
    (pod,) = [p for p in model_pods(kube, namespace, "add-sub") if not p["metadata"].get("deletionTimestamp")]
    name = pod["metadata"]["name"]
    assert not [ln for ln in operator.log_since().splitlines() if "ValidatingAdmissionPolicy" in ln
                or "operator-writes.serving.triton-operator.dev" in ln], (
        "the policy or the operator's webhook refused one of the operator's own writes")

    # Each of these, RBAC allows (cluster-wide): the policy is what stops them.
    for verb, resource, ns, sub in (("patch", "configmaps", "kube-system", ""), ("patch", "pods", namespace, ""),
                                    ("delete", "pods", namespace, ""),
                                    ("patch", "pods", namespace, "status"), ("create", "deployments", namespace, ""),
                                    ("patch", "configmaps", namespace, "")):
        assert can_i(kubeconfig, verb, resource, ns, sub), f"RBAC does not allow {verb} {resource} {sub} in {ns}"
    op = Kube(operator_token_kubeconfig(kubeconfig, kube, tmp_path / "operator.kubeconfig"))
    merge, strategic = "application/merge-patch+json", "application/strategic-merge-patch+json"
    answers = {
        "patch a kube-system ConfigMap": refused(
            op, "PATCH", "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt",
            {"metadata": {"labels": {"app.kubernetes.io/managed-by": "triton-operator"}}}, merge),
        "change the replica's image": refused(
            op, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"spec": {"containers": [{"name": "tritonserver", "image": "registry.example/evil:1"}]}}, strategic),
        "annotate the replica outside the operator's prefix": refused(
            op, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"metadata": {"annotations": {"sidecar.istio.io/inject": "true"}}}, merge),
        "set the replica's Ready condition": refused(
            op, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, strategic),
        "move the replica's address": refused(
            op, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"status": {"podIP": "198.18.255.254", "podIPs": [{"ip": "198.18.255.254"}]}}, merge),
        "adopt a ConfigMap of someone else's": refused(
            op, "PATCH", f"/api/v1/namespaces/{namespace}/configmaps/kube-root-ca.crt",
            {"metadata": {"labels": {"app.kubernetes.io/managed-by": "triton-operator"}}}, merge),
    }
    deployment = copy.deepcopy(kube.get("Deployment", "add-sub", namespace))
    host = {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "host-path", "namespace": namespace, "labels": deployment["metadata"]["labels"]},
            "spec": {"selector": {"matchLabels": {"e2e": "host-path"}}, "replicas": 0,
                     "template": {"metadata": {"labels": {"e2e": "host-path", **deployment["metadata"]["labels"]}},
                                  "spec": deployment["spec"]["template"]["spec"]}}}
    host["spec"]["template"]["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    answers["run a Deployment mounting the node's root"] = refused(
        op, "POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", host, "application/json")
    privileged = copy.deepcopy(host)
    privileged["metadata"]["name"] = "privileged"
    privileged["spec"]["template"]["spec"]["volumes"].pop()
    privileged["spec"]["template"]["spec"]["hostNetwork"] = True
    privileged["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(
        privileged=True, allowPrivilegeEscalation=True)
    answers["run a privileged Deployment on the host network"] = refused(
        op, "POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", privileged, "application/json")
    # Issue 39 (M6): a Deployment as the operator renders it but for its probe's image, which nothing names.
    foreign = copy.deepcopy(host)
    foreign["metadata"]["name"] = "foreign-image"
    foreign["spec"]["template"]["spec"]["volumes"].pop()
    (probe,) = [c for c in foreign["spec"]["template"]["spec"]["containers"] if c["name"] == "probe"]
    probe["image"] = "registry.example/evil:1"
    answers["run a Deployment whose probe container runs an image nothing names"] = refused(
        op, "POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", foreign, "application/json")
    labels = deployment["metadata"]["labels"]
    answers["open a NodePort"] = refused(
        op, "POST", f"/api/v1/namespaces/{namespace}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "node-port", "labels": labels},
            "spec": {"type": "NodePort", "selector": {"e2e": "x"}, "ports": [{"port": 8000}]}}, "application/json")
    answers["mint a ServiceAccount token Secret"] = refused(
        op, "POST", f"/api/v1/namespaces/{namespace}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
            "metadata": {"name": "minted", "labels": labels,
                         "annotations": {"kubernetes.io/service-account.name": "default"}}}, "application/json")
    # Issue 33: RBAC lets the operator delete pods (it replaces a replica that stopped serving); the policy limits
    # that to the pods it renders. A pod of someone else's, bound to no node so that it never runs:
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "someone-elses", "namespace": namespace},
                 "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "example.invalid/c:1"}]}},
                namespace)
    answers["delete a pod it does not manage"] = refused(
        op, "DELETE", f"/api/v1/namespaces/{namespace}/pods/someone-elses", None, "application/json")
    for what, answer in answers.items():
        assert answer.startswith("403 ") and POLICY in answer, f"{what}: {answer}"
    # Issue 39 (M6): what the policy cannot check (it needs the owner), the operator's webhook does. Each of these
    # passes the policy: the model's own Deployment (a dry run: admission decides all the same, nothing is stored),
    # changed in one thing its TritonModel does not say.
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/add-sub?dryRun=All"
    changes: dict[str, tuple[Any, str]] = {
        "run as another ServiceAccount": (
            {"spec": {"template": {"spec": {"serviceAccountName": "default-admin"}}}},
            "runs as ServiceAccount default-admin"),
        "mount a ServiceAccount token": (
            {"spec": {"template": {"spec": {"automountServiceAccountToken": True}}}},
            "mounts a ServiceAccount token"),
        "mount a Secret its TritonModel does not name": (
            {"spec": {"template": {"spec": {"volumes": [{"name": "loot", "secret": {"secretName": "db-password"}}]}}}},
            "uses Secrets its spec does not name: db-password"),
        "run tritonserver from an image nothing names": (
            {"spec": {"template": {"spec": {"containers": [
                {"name": "tritonserver", "image": deployment["spec"]["template"]["spec"]["containers"][0]["image"]
                 + "-not-this"}]}}}},
            "runs tritonserver image"),
    }
    webhook = "operator-writes.serving.triton-operator.dev"  # (the answer is JSON: its quotes escaped)
    for what, (patch, says) in changes.items():
        answer = refused(op, "PATCH", path, patch, strategic)
        assert answer.startswith("403 ") and webhook in answer and says in answer, f"{what}: {answer}"
    orphan = copy.deepcopy(foreign)
    orphan["metadata"]["name"] = "orphan"
    (probe,) = [c for c in orphan["spec"]["template"]["spec"]["containers"] if c["name"] == "probe"]
    probe["image"] = next(c["image"] for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "probe")
    orphan_answer = refused(op, "POST", f"/apis/apps/v1/namespaces/{namespace}/deployments?dryRun=All", orphan,
                            "application/json")
    assert webhook in orphan_answer and "has no TritonModel or TritonPool as its controller" in orphan_answer, orphan_answer
    assert op.request("PATCH", path, {"metadata": {"annotations": {f"{GROUP}/checked": "yes"}}},
                      content_type=strategic)["metadata"]["name"] == "add-sub", "the Deployment as it is was refused"
    answers.update(dict.fromkeys(changes, "(the operator's webhook)"))
    # Allowed: a replica's pod-deletion-cost (a pool's rounds set it on each of its replicas: issue 29).
    op.patch("Pod", name, {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "7"}}},
             namespace, type="merge")
    assert (kube.get("Pod", name, namespace)["metadata"].get("annotations") or {}).get(
        "controller.kubernetes.io/pod-deletion-cost") == "7", "the operator's token set a pod-deletion-cost"
    assert kube.get_or_none("Pod", "someone-elses", namespace) is not None, "the policy refused, the pod is there"
    # Bound to a node that does not exist, no kubelet confirms its deletion: without a grace of 0 it would stay until
    # the pod garbage collector removes it (~40 s into this test's namespace teardown).
    kube.delete("Pod", "someone-elses", namespace, grace_period_seconds=0)
    # And nothing moved: the pod as it was, its gate its own, the model still Ready.
    now = kube.get("Pod", name, namespace)
    assert now["spec"]["containers"][0]["image"] == pod["spec"]["containers"][0]["image"]
    assert next(c for c in now["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
    assert now["status"]["podIP"] == pod["status"]["podIP"]
    assert next(c for c in now["status"]["conditions"] if c["type"] == WARMED_CONDITION)["status"] == "True"
    assert is_model_ready(kube.get("TritonModel", "add-sub", namespace))
    for kind, gone in (("Deployment", "host-path"), ("Deployment", "privileged"), ("Deployment", "foreign-image"),
                       ("Service", "node-port"),
                       ("Secret", "minted")):
        assert kube.get_or_none(kind, gone, namespace) is None, f"{kind} {gone} exists"
    record("operator token under the admission policy",
           f"{len(answers)} writes RBAC allows refused (403); the model Ready in the meantime "
           f"(digest {tm['status']['configDigest']})")


def apply_model(kubeconfig: Path, namespace: str, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=as_stream([doc]), check=False)


def test_tritonmodels_may_not_tolerate_the_control_plane_nor_use_an_image_from_elsewhere(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    base = load_examples("add-sub")[0]
    base["spec"]["replicas"] = 0

    def model(name: str, **server: Any) -> dict[str, Any]:
        doc = copy.deepcopy(base)
        doc["metadata"]["name"] = name
        doc["spec"]["server"] = server
        return doc

    for name, tolerations in (("control-plane", [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                                                   "effect": "NoSchedule"}]),
                              ("master", [{"key": "node-role.kubernetes.io/master", "operator": "Exists"}]),
                              ("everything", [{"operator": "Exists"}])):
        proc = apply_model(kubeconfig, namespace, model(name, tolerations=tolerations))
        assert proc.returncode != 0 and MODEL_POLICY in proc.stderr, (name, proc.stdout, proc.stderr)
        assert "spec.server.tolerations: a TritonModel may not tolerate" in proc.stderr, proc.stderr
        assert kube.get_or_none("TritonModel", name, namespace) is None
    gpu = model("gpu-toleration", tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert apply_model(kubeconfig, namespace, gpu).returncode == 0, "a toleration of a worker taint is fine"
    elsewhere = model("elsewhere", image="registry.example/triton/tritonserver:24.10-py3")
    assert apply_model(kubeconfig, namespace, elsewhere).returncode == 0, "by default, any registry"
    kube.delete("TritonModel", "elsewhere", namespace)

    # The release narrows the registries: an image from elsewhere is refused at apply; a model without one runs the
    # release's tritonImage (here the local build's, from localhost/triton-operator), which is checked as its image.
    helm(kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--reuse-values",
         "--set-json", 'admissionPolicies.tritonModels.allowedImageRegistries=["localhost/triton-operator"]')
    try:
        def refusal() -> str | None:
            proc = apply_model(kubeconfig, namespace, elsewhere)
            if proc.returncode == 0:
                kube.delete("TritonModel", "elsewhere", namespace)
                return None
            return proc.stderr

        stderr = wait_for("the narrowed policy to refuse an image from elsewhere", refusal, 30, 0.5)
        assert MODEL_POLICY in stderr and "spec.server.image: registry.example/triton/tritonserver:24.10-py3 is " \
            "not from a registry this cluster allows for TritonModels and TritonPools (localhost/triton-operator" in \
            stderr, stderr
        assert apply_model(kubeconfig, namespace, model("default-image")).returncode == 0, "tritonImage is allowed"
        nvidia = apply_model(kubeconfig, namespace, model("nvidia", image="nvcr.io/nvidia/tritonserver:26.03-py3"))
        assert nvidia.returncode != 0 and MODEL_POLICY in nvidia.stderr, (nvidia.stdout, nvidia.stderr)
    finally:
        helm(kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--reuse-values",
             "--set-json", "admissionPolicies.tritonModels.allowedImageRegistries=[]")


def test_the_network_policies_are_what_the_api_server_takes_though_this_cluster_enforces_none(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    """The local cluster's bridge CNI enforces no NetworkPolicy: only the objects are checked. The chart's policy
    admits, on the TLS port, exactly the API server's own addresses, which Helm's lookup found in the `kubernetes`
    Service's endpoints at install."""
    policy = kube.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/networkpolicies/"
                                 f"{RELEASE}-triton-operator")
    apiserver = {a for s in kube.items("EndpointSlice", "default", label_selector={
        "kubernetes.io/service-name": "kubernetes"}) for e in s.get("endpoints") or () for a in e["addresses"]}
    assert apiserver, "the kubernetes Service has no endpoints"
    rules = {p["port"]: r.get("from") for r in policy["spec"]["ingress"] for p in r["ports"]}
    assert sorted(peer["ipBlock"]["cidr"] for peer in rules[9443] or ()) == sorted(f"{a}/32" for a in apiserver), rules
    assert rules[8081] == [{"namespaceSelector": {}}] and set(rules) == {9443, 8081}, rules
    (example,) = [d for d in yaml.safe_load_all(EXAMPLE_POLICY.read_text()) if d]
    kubectl(kubeconfig, "apply", "--server-side", "-n", namespace, "-f", str(EXAMPLE_POLICY))
    stored = kube.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/triton-models")
    assert stored["spec"]["ingress"] == [
        {**r, "ports": [{"protocol": "TCP", **p} for p in r["ports"]]} for r in example["spec"]["ingress"]]


def test_the_operators_token_writes_a_pools_children_and_its_pooled_models_endpointslices_and_no_other_slice(
        kube: Kube, kubeconfig: Path, own_writes_reviewed: OperatorHandle, tmp_path: Path) -> None:
    """Issue 29: what the pool's reconcile writes, as it renders it, written with the operator's own token: a
    TritonPool's Deployment, PodDisruptionBudget and key Secret, a pooled model's EndpointSlice (created, updated,
    deleted). A slice routes a Service's traffic, so the policy refuses one another controller manages (adopting it),
    one of ours naming another Service, and deleting the API server's own. In a namespace the session operator does
    not serve, so that its pool reconcile writes nothing there meanwhile."""
    from triton_operator.api.pool import TritonPool
    from triton_operator.api.v1alpha1 import TritonModel
    from triton_operator.render.kubernetes import Options
    from triton_operator.render.pool import (
        render_endpoint_slices,
        render_model_service,
        render_pool_children,
        render_pool_key_secret,
    )
    from triton_operator.render.repository_key import RepositoryKeys

    ns = f"policy-pool-{uuid.uuid4().hex[:5]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": {"e2e.triton-operator.io/test": "true"}}})
    try:
        pool_doc = next(d for d in load_examples("pool") if d["kind"] == "TritonPool")
        model_doc = next(d for d in load_examples("pool") if d["kind"] == "TritonModel"
                         and d["spec"].get("memory"))
        model_doc["spec"]["replicas"] = 0
        pool_body = kube.create(pool_doc, ns)
        model_body = kube.create(model_doc, ns)
        pool, model = TritonPool.model_validate(pool_body), TritonModel.model_validate(model_body)
        for verb, resource, sub in (("create", "endpointslices", ""), ("delete", "endpointslices", ""),
                                    ("patch", "tritonpools", "status"), ("create", "deployments", "")):
            assert can_i(kubeconfig, verb, resource, ns, sub), f"RBAC does not allow {verb} {resource} {sub}"
        op = Kube(operator_token_kubeconfig(kubeconfig, kube, tmp_path / "operator.kubeconfig"))
        # As the operator renders: its master key (the chart's Secret) names the key Secret, its default image runs.
        master = kube.get("Secret", f"{RELEASE}-triton-operator-repository-key", RELEASE_NAMESPACE)["data"]["key"]
        options = Options(repository_keys=RepositoryKeys(base64.b64decode(master).strip()),
                          default_triton_image=TRITON_REF)

        # Allowed: what the reconcile renders.
        written = []
        assert pool.spec.replicas > 1, "a PodDisruptionBudget is rendered for more than one replica"
        for child in [*render_pool_children(pool, pool_body["metadata"]["uid"], ns, options),
                      render_pool_key_secret(pool, pool_body["metadata"]["uid"], ns, options)]:
            assert child is not None
            if child["kind"] == "Deployment":
                child["spec"]["replicas"] = 0  # no pod: the writes are the point
            op.create(child, ns)
            written.append(f"{child['kind']} {child['metadata']['name']}")
        # The pooled model's Service first: its slices feed only a Service it controls (the operator's webhook).
        op.create(render_model_service(model, model_body["metadata"]["uid"], ns), ns)
        written.append(f"Service {model.name}")
        (ipv4,) = render_endpoint_slices(model, model_body["metadata"]["uid"], ns, [], {}, set())
        op.create(ipv4, ns)
        name = ipv4["metadata"]["name"]
        op.patch("EndpointSlice", name, {"metadata": {"annotations": {f"{GROUP}/checked": "yes"}}}, ns, type="merge")
        op.delete("EndpointSlice", name, ns)
        written.append(f"EndpointSlice {name} (created, updated, deleted)")
        assert sorted(written) == sorted([
            f"Deployment {pool.name}-pool", f"PodDisruptionBudget {pool.name}-pool",
            f"Secret {render_pool_key_secret(pool, pool_body['metadata']['uid'], ns, options)['metadata']['name']}",  # type: ignore[index]
            f"Service {model.name}", f"EndpointSlice {name} (created, updated, deleted)"]), written

        # Refused: a slice it does not manage (another controller's, labelled and owned as ours otherwise), one of
        # ours for another Service, and the API server's own.
        theirs = copy.deepcopy(ipv4)
        theirs["metadata"]["name"] = "theirs"
        theirs["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io"
        kube.create(theirs, ns)
        theirs_elsewhere = copy.deepcopy(theirs)
        theirs_elsewhere["metadata"]["name"] = "theirs-elsewhere"
        theirs_elsewhere["metadata"]["labels"]["kubernetes.io/service-name"] = "someone-elses"
        kube.create(theirs_elsewhere, ns)
        elsewhere = copy.deepcopy(ipv4)
        elsewhere["metadata"]["name"] = "elsewhere"
        elsewhere["metadata"]["labels"]["kubernetes.io/service-name"] = "someone-elses"
        base = f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
        kube.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "payments"},
                     "spec": {"selector": {"app": "payments"}, "ports": [{"port": 80}]}}, ns)
        payments = copy.deepcopy(ipv4)
        payments["metadata"]["name"] = "payments-x"
        payments["metadata"]["labels"].update({"kubernetes.io/service-name": "payments", f"{GROUP}/model": "payments"})
        payments["metadata"]["ownerReferences"][0].update(name="payments", uid=str(uuid.uuid4()))
        # Allowed, DELETE only (issue 41): a slice Kubernetes' EndpointSlice controller wrote for the model's Service
        # while it had a selector (its labels copied from the Service's), as a model moved onto a pool leaves it.
        left = copy.deepcopy(ipv4)
        left["metadata"]["name"] = "left"
        left["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io"
        left["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Service", "name": model.name,
                                               "uid": kube.get("Service", model.name, ns)["metadata"]["uid"],
                                               "controller": True, "blockOwnerDeletion": True}]
        kube.create(left, ns)
        left_patch = refused(op, "PATCH", f"{base}/left", {"endpoints": []}, "application/merge-patch+json")
        op.delete("EndpointSlice", "left", ns)
        assert kube.get_or_none("EndpointSlice", "left", ns) is None
        written.append("EndpointSlice left (Kubernetes', deleted)")
        # And the Endpoints Kubernetes' endpoints controller wrote from that selector (its labels the Service's).
        left_endpoints = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": model.name, "labels": {
            **ipv4["metadata"]["labels"], "endpoints.kubernetes.io/managed-by": "endpoint-controller"}}}
        for label in ("endpointslice.kubernetes.io/managed-by", "kubernetes.io/service-name"):
            left_endpoints["metadata"]["labels"].pop(label)
        kube.create(left_endpoints, ns)
        endpoints_patch = refused(op, "PATCH", f"/api/v1/namespaces/{ns}/endpoints/{model.name}",
                                  {"subsets": []}, "application/merge-patch+json")
        op.delete("Endpoints", model.name, ns)
        assert kube.get_or_none("Endpoints", model.name, ns) is None
        written.append("Endpoints (Kubernetes', deleted)")
        kube.create({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "someone-elses", "labels": {
            "endpoints.kubernetes.io/managed-by": "endpoint-controller"}}}, ns)
        answers = {
            "change a slice Kubernetes left for its Service": left_patch,
            "delete the Endpoints of a Service of someone else's": refused(
                op, "DELETE", f"/api/v1/namespaces/{ns}/endpoints/someone-elses?dryRun=All", None, "application/json"),
            "adopt a slice another controller manages": refused(
                op, "PATCH", f"{base}/theirs", {"metadata": {"labels": {
                    "endpointslice.kubernetes.io/managed-by": "triton-operator.serving.triton-operator.dev"}}},
                "application/merge-patch+json"),
            "change the endpoints of a slice another controller manages": refused(
                op, "PATCH", f"{base}/theirs", {"endpoints": []}, "application/merge-patch+json"),
            "write a slice for another Service": refused(op, "POST", base, elsewhere, "application/json"),
            # Labelled and owned as a pooled model's would be, for a Service of someone else's with a selector.
            "feed a Service of someone else's": refused(op, "POST", base, payments, "application/json"),
            # Dry runs: admission decides all the same, and nothing would be deleted were the policy wrong.
            # Kubernetes' own, labelled as ours, but for a Service named unlike its model.
            "delete a slice another controller manages for another Service": refused(
                op, "DELETE", f"{base}/theirs-elsewhere?dryRun=All", None, "application/json"),
            "delete the API server's own slice": refused(
                op, "DELETE", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes?dryRun=All",
                None, "application/json"),
        }
        # RBAC grants only get and delete on Endpoints: a write is refused before the policy is asked.
        assert endpoints_patch.startswith("403 ") and "cannot patch resource" in endpoints_patch, endpoints_patch
        webhook = answers.pop("feed a Service of someone else's")
        for what, answer in answers.items():
            assert answer.startswith("403 ") and POLICY in answer, f"{what}: {answer}"
        assert "may write only EndpointSlices of its pooled models" in answers["write a slice for another Service"]
        # Issue 39 (M6): that one the policy lets through (its labels and owner agree); the operator's webhook reads
        # the TritonModel it names (none) and the Service (not a pooled model's) and refuses.
        assert webhook.startswith("403 ") and "operator-writes.serving.triton-operator.dev denied" \
            in webhook.replace('\\"', "") and "TritonModel payments" in webhook and "is not there" in webhook, webhook
        assert kube.get_or_none("EndpointSlice", "payments-x", ns) is None
        assert kube.get("EndpointSlice", "theirs", ns)["metadata"]["labels"][
            "endpointslice.kubernetes.io/managed-by"] == "endpointslice-controller.k8s.io"
        assert kube.get_or_none("EndpointSlice", "elsewhere", ns) is None
        assert kube.get_or_none("EndpointSlice", "kubernetes", "default") is not None
        record("operator token and pools under the admission policy",
               f"{len(written)} writes of a pool's children and a pooled model's slice allowed; {len(answers)} slice "
               "writes refused (403)")
    finally:
        kube.delete("Namespace", ns)
