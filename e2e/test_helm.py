"""The Helm chart installed into the local control plane, its operator running under its own ServiceAccount.

`helm install` (namespaced mode, the operator in its own namespace under the `restricted` Pod
Security Standard), then the chart's operator pod - run by a real kubelet from the image built from
our Dockerfile, as 65532 with a read-only root filesystem, under the chart's ServiceAccount with the
projected token - reconciles examples/add-sub.yaml to Ready=True: the RBAC is enough. `kubectl auth
can-i --as=system:serviceaccount:...` (and calls with a token from the TokenRequest API) show it is
no more than needed: no Secrets, no Node writes, nothing outside the watched namespaces. The
cluster-wide install is checked with `can-i` and then runs and reconciles a model too (tests run one
at a time, and the session's own operator serves only `op-*` namespaces).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import REPO_ROOT
from e2e.images import TRITON_REF
from e2e.kube import RESOURCES, ApiError, Kube, condition, wait_for
from e2e.operator_fixtures import ensure_crd
from e2e.testing import delete_namespace, ready_addresses, wait_gone
from triton_operator import DEFAULT_OPERATOR_IMAGE

pytestmark = pytest.mark.cluster

GROUP, VERSION = "serving.triton-operator.dev", "v1alpha1"
CHART = REPO_ROOT / "charts" / "triton-operator"
KUBECTL = REPO_ROOT / ".venv" / "bin" / "kubectl"
EXAMPLE = REPO_ROOT / "examples" / "add-sub.yaml"
ENSEMBLE_EXAMPLE = REPO_ROOT / "examples" / "sentiment-ensemble.yaml"
CHART_IMAGE = DEFAULT_OPERATOR_IMAGE  # what the chart renders by default (tests/test_version.py)
# What kopf may be refused without harm: run-time observation of CRDs and namespaces (it falls
# back to what it found at start-up and to the listed namespaces). Any other 403 is a missing rule.
OPTIONAL_FORBIDDEN = re.compile(
    r"/(apis/apiextensions\.k8s\.io/v1/customresourcedefinitions|api/v1/namespaces)(\?\S*)? -> APIForbiddenError"
)

RESOURCES.setdefault("TritonModel", (f"/apis/{GROUP}/{VERSION}", "tritonmodels", True))


@lru_cache(maxsize=1)
def helm_binary() -> str:
    proc = subprocess.run(["bash", str(REPO_ROOT / "e2e" / "toolchain" / "build.sh")],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=3600)
    assert proc.returncode == 0, f"e2e/toolchain/build.sh failed:\n{proc.stderr[-3000:]}"
    return str(Path(proc.stdout.strip().splitlines()[-1]) / "helm")


def run(argv: list[str], kubeconfig: Path, stdin: str | None = None, timeout: float = 180) -> str:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    return run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], kubeconfig, stdin)


def helm(kubeconfig: Path, *args: str) -> str:
    return run([helm_binary(), "--kubeconfig", str(kubeconfig), *args], kubeconfig, timeout=300)


def can_i(kubeconfig: Path, sa: str, verb: str, resource: str, namespace: str | None, name: str | None = None) -> bool:
    """`kubectl auth can-i` as `sa`; `resource` may name a subresource (`pods/status`), `name` one object."""
    scope = ["-n", namespace] if namespace else ["--all-namespaces"]
    resource, _, sub = resource.partition("/")  # can-i reads TYPE/NAME: a subresource is a flag
    subresource = [f"--subresource={sub}"] if sub else []
    target = f"{resource}/{name}" if name else resource
    proc = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(kubeconfig), "auth", "can-i", verb, target, *subresource,
         f"--as={sa}", *scope],
        capture_output=True, text=True, timeout=30,
    )
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {verb} {resource}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


@dataclass
class Release:
    name: str
    namespace: str
    service_account: str

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def fullname(self) -> str:
        """The chart's `triton-operator.fullname`: its Deployment, webhook configuration, ..."""
        return self.name if "triton-operator" in self.name else f"{self.name}-triton-operator"


@contextlib.contextmanager
def installed(kubeconfig: Path, kube: Kube, name: str, namespace: str, *sets: str) -> Iterator[Release]:
    """`helm install` into `namespace` (created, `restricted` Pod Security), uninstalled afterwards."""
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {
        "e2e.triton-operator.io/test": "true",
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}})
    try:
        # The CRD belongs to the session's release where it runs (or is applied here): this one leaves it alone.
        ensure_crd(kubeconfig, kube)
        helm(kubeconfig, "install", name, str(CHART), "--namespace", namespace, "--set", "crds.enabled=false",
             "--set", f"tritonImage={TRITON_REF}", *sets)
        yield Release(name, namespace, f"{name}-triton-operator")
    finally:
        with contextlib.suppress(AssertionError):
            helm(kubeconfig, "uninstall", name, "--namespace", namespace, "--wait", "--timeout", "90s")
        delete_namespace(kube, namespace, grace=1)  # no operator or replica outlives its test


def service_account_kubeconfig(admin: Path, release: Release, path: Path) -> Path:
    """A kubeconfig with a short-lived token of the chart's ServiceAccount (TokenRequest API)."""
    token = kubectl(admin, "create", "token", release.service_account, "-n", release.namespace,
                    "--duration=10m").strip()
    cfg = yaml.safe_load(admin.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    if "certificate-authority" in cluster:
        ca = Path(cluster["certificate-authority"])
        cluster = {"server": cluster["server"],
                   "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "e2e", "cluster": {k: cluster[k] for k in ("server", "certificate-authority-data")}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": "sa", "namespace": release.namespace}}],
    }))
    path.chmod(0o600)
    return path


def wait_crd(kube: Kube) -> None:
    def established() -> bool:
        try:
            crd = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/tritonmodels.{GROUP}")
        except ApiError:
            return False
        c = condition(crd, "Established")
        return bool(c and c["status"] == "True")

    wait_for("CRD tritonmodels Established", established, 30)


def metrics(url: str) -> dict[str, float]:
    """Samples by `name{k=v,...}`."""
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a pod address on the test bridge
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"] = s.value
    return out


def is_model_ready(tm: dict[str, Any]) -> bool:
    c = condition(tm, "Ready") or {}
    return c.get("status") == "True" and c.get("observedGeneration") == tm["metadata"]["generation"]


def test_namespaced_install_reconciles_add_sub_under_the_chart_service_account(
    kubeconfig: Path, kube: Kube, nodes: Any, namespace: str, tmp_path: Path,
) -> None:
    doc = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d)
    name = doc["metadata"]["name"]
    op_ns = f"{namespace}-op"
    with installed(kubeconfig, kube, "tro", op_ns, "--set", f"watch.namespaces={{{namespace}}}",
                   "--set", "replicaCount=0") as release:
        wait_crd(kube)
        # Is any other operator reconciling every namespace (a `make demo` one, the session's `operator`
        # fixture)? Then Ready=True would prove nothing about this chart's RBAC.
        kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(doc))
        if _status_appears(kube, namespace, name, seconds=5):
            kube.delete("TritonModel", name, namespace)
            pytest.skip("another triton-operator (a `make demo` one, or this session's `operator` fixture) "
                        "reconciles every namespace of this cluster, so Ready=True would not prove the chart's "
                        "RBAC: stop it, or run e2e/test_helm.py before the operator tests")

        helm(kubeconfig, "upgrade", release.name, str(CHART), "--namespace", op_ns, "--reuse-values",
             "--set", "replicaCount=1", "--wait", "--timeout", "120s")
        (pod,) = kube.items("Pod", op_ns, label_selector={"app.kubernetes.io/instance": release.name})
        assert pod["spec"]["serviceAccountName"] == release.service_account

        tm = wait_for(f"TritonModel {namespace}/{name} Ready=True",
                      lambda: (t := kube.get("TritonModel", name, namespace)) and is_model_ready(t) and t, 300, 0.5)
        assert tm["status"]["readyReplicas"] >= 1, tm["status"]

        # The chart's operator did the work: its own metrics count every kind of write.
        pod = kube.get("Pod", pod["metadata"]["name"], op_ns)
        seen = metrics(f"http://{pod['status']['podIP']}:8081/metrics")
        for kind, verb in (("ConfigMap", "apply"), ("Deployment", "apply"), ("Service", "apply"),
                           ("TritonModel", "patch-status"), ("Pod", "patch-status"), ("Event", "create")):
            assert seen.get(f"triton_operator_api_writes_total{{kind={kind},verb={verb}}}", 0) >= 1, (kind, verb)
        assert not [k for k, v in seen.items() if k.startswith("triton_operator_reconcile_errors_total") and v], seen
        # ... and was refused nothing it needs.
        log = nodes.container_log(pod, "operator")
        refused = [ln for ln in log.splitlines() if "Forbidden" in ln and not OPTIONAL_FORBIDDEN.search(ln)]
        assert not refused, "\n".join(refused[:10])
        # TRITON_OPERATOR_IMAGE: the replica's own containers from the operator's image (the `probe` beside
        # tritonserver; `fetch` too, for a model with a uri source) run the chart's image.
        deploy = kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
        ours = [c for c in (deploy["spec"]["template"]["spec"].get("initContainers") or [])
                + deploy["spec"]["template"]["spec"]["containers"] if c["name"] != "tritonserver"]
        assert [c["name"] for c in ours] == ["probe"] and ours[0]["image"] == CHART_IMAGE, ours

        _assert_least_privilege_namespaced(kubeconfig, release, watched=namespace, tmp_path=tmp_path)
        _assert_the_charts_webhook_refuses_a_cross_object_defect(kubeconfig, kube, release, namespace)

        kube.delete("TritonModel", name, namespace)  # while the operator still runs
        wait_gone(kube, "TritonModel", namespace, name)


def _assert_the_charts_webhook_refuses_a_cross_object_defect(kubeconfig: Path, kube: Kube, release: Release,
                                                            namespace: str) -> None:
    """The chart's webhook path: API server -> Service -> an operator pod's 198.18.x address, TLS with the
    certificate of the chart's Secret, whose CA the chart put into the ValidatingWebhookConfiguration."""
    vwc = kube.request("GET", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{release.fullname}")
    hook, own = vwc["webhooks"]
    assert own["clientConfig"]["service"]["path"] == "/validate-operator-writes"  # the operator's own writes (issue 39)
    assert hook["clientConfig"]["service"] == {"namespace": release.namespace, "name": f"{release.fullname}-webhook",
                                               "path": "/validate-tritonmodels", "port": 443}
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [namespace]
    ensemble = next(d for d in yaml.safe_load_all(ENSEMBLE_EXAMPLE.read_text()) if d and d["metadata"]["name"] ==
                    "sentiment")

    def refused() -> str | None:
        proc = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(kubeconfig), "apply", "-n", namespace, "-f", "-"],
            input=json.dumps(ensemble), capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0, f"an ensemble without its steps was admitted: {proc.stdout}"
        # Until the operator has published its CA the API server cannot call it (Fail: refused all the same).
        return proc.stderr if "spec.ensemble.steps[0].model" in proc.stderr else None

    stderr = wait_for("the chart's webhook to refuse an ensemble whose steps are missing", refused, 60, 1.0)
    assert "TritonModel 'tokenizer' is not defined" in stderr, stderr
    assert kube.get_or_none("TritonModel", "sentiment", namespace) is None


def _status_appears(kube: Kube, namespace: str, name: str, seconds: int) -> bool:
    """Whether anything writes the TritonModel's status within `seconds` (watch, no polling)."""
    tm = kube.get("TritonModel", name, namespace)
    if tm.get("status"):
        return True
    for event in kube.watch("TritonModel", namespace, resource_version=tm["metadata"]["resourceVersion"],
                            timeout_seconds=seconds, field_selector=f"metadata.name={name}"):
        if event["type"] == "MODIFIED" and event["object"].get("status"):
            return True
    return False


def _assert_least_privilege_namespaced(kubeconfig: Path, release: Release, watched: str, tmp_path: Path) -> None:
    sa, own = release.user, release.namespace
    # Enough, in the watched namespace.
    for verb, resource in (("list", "tritonmodels.serving.triton-operator.dev"),
                           ("watch", "tritonmodels.serving.triton-operator.dev"),
                           ("patch", "tritonmodels.serving.triton-operator.dev/status"),
                           ("create", "deployments.apps"), ("patch", "deployments.apps"),
                           ("delete", "poddisruptionbudgets.policy"), ("patch", "pods/status"),
                           ("create", "events"),
                           # Issue 29: TritonPools, their status, and pooled models' EndpointSlices.
                           ("watch", "tritonpools.serving.triton-operator.dev"),
                           ("patch", "tritonpools.serving.triton-operator.dev/status"),
                           ("create", "endpointslices.discovery.k8s.io"), ("delete", "endpointslices.discovery.k8s.io"),
                           # ... and a model moved onto a pool loses its own Deployment.
                           ("delete", "deployments.apps"),
                           # Issue 33: it replaces a replica that stopped serving and that a reload did not heal (its
                           # ReplicaSet makes the new pod); the admission policy limits this to the pods it renders.
                           ("delete", "pods")):
        assert can_i(kubeconfig, sa, verb, resource, watched), f"cannot {verb} {resource} in {watched}"
    # Leader election: its own Lease in its own namespace, and no other.
    for verb in ("get", "update"):
        assert can_i(kubeconfig, sa, verb, "leases.coordination.k8s.io", own, name=release.fullname), f"cannot {verb} its Lease"
        assert not can_i(kubeconfig, sa, verb, "leases.coordination.k8s.io", own, name="someone-elses"), f"can {verb} another Lease"
    assert can_i(kubeconfig, sa, "create", "leases.coordination.k8s.io", own)
    assert not can_i(kubeconfig, sa, "create", "leases.coordination.k8s.io", watched)
    # The chart writes the webhook configuration's caBundle (the certificate is its Secret): the operator cannot.
    assert not can_i(kubeconfig, sa, "patch", "validatingwebhookconfigurations.admissionregistration.k8s.io", None,
                     name=release.fullname), "can patch its own webhook configuration: nothing needs to"
    # Not more: no Secrets anywhere, no Nodes, no pods of its own, nothing outside the watched namespace.
    for verb, resource, ns in (
        ("get", "secrets", watched), ("list", "secrets", watched), ("watch", "secrets", watched),
        ("get", "secrets", own), ("list", "secrets", None),
        ("patch", "nodes", None), ("update", "nodes", None), ("delete", "nodes", None), ("list", "nodes", None),
        ("create", "pods", watched), ("delete", "pods", "default"), ("delete", "pods", own),
        ("create", "pods/exec", watched),
        ("update", "tritonmodels.serving.triton-operator.dev", watched),
        ("delete", "tritonmodels.serving.triton-operator.dev", watched),
        ("delete", "deployments.apps", "default"), ("create", "rolebindings.rbac.authorization.k8s.io", watched),
        ("create", "serviceaccounts/token", watched),
        ("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io", None),
        ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io", None),
        ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io", None),
        ("list", "tritonmodels.serving.triton-operator.dev", own),
        ("list", "tritonmodels.serving.triton-operator.dev", "default"),
        ("list", "tritonmodels.serving.triton-operator.dev", None),
        ("update", "tritonpools.serving.triton-operator.dev", watched),
        ("delete", "tritonpools.serving.triton-operator.dev", watched),
        ("list", "tritonpools.serving.triton-operator.dev", "default"),
        ("create", "endpointslices.discovery.k8s.io", "default"), ("delete", "endpointslices.discovery.k8s.io", own),
        ("patch", "configmaps", "default"), ("list", "configmaps", own), ("patch", "deployments.apps", "default"),
        ("list", "deployments.apps", None), ("list", "namespaces", None),
        ("list", "customresourcedefinitions.apiextensions.k8s.io", None),
    ):
        assert not can_i(kubeconfig, sa, verb, resource, ns), f"can {verb} {resource} in {ns or 'all namespaces'}"

    # The same, with a real token of the ServiceAccount (TokenRequest API).
    sa_config = service_account_kubeconfig(kubeconfig, release, tmp_path / "sa.kubeconfig")
    assert f"system:serviceaccount:{own}:" in kubectl(sa_config, "auth", "whoami", "-o", "json")
    kubectl(sa_config, "get", "tritonmodels", "-n", watched)
    for args in (("get", "secrets", "-n", watched), ("get", "tritonmodels", "-n", "default"),
                 ("get", "nodes")):
        proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(sa_config), *args],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode != 0 and "Forbidden" in proc.stderr, (args, proc.stdout, proc.stderr)


def test_cluster_wide_install_grants_no_secrets_and_no_node_writes_and_reconciles(
    kubeconfig: Path, kube: Kube, namespace: str,
) -> None:
    """Cluster-wide RBAC, checked with can-i before the operator runs, then the operator running cluster-wide."""
    release_name = f"tro-{uuid.uuid4().hex[:6]}"
    with installed(kubeconfig, kube, release_name, f"{namespace}-op", "--set", "replicaCount=0") as release:
        sa = release.user
        roles = kube.request("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                             params={"labelSelector": f"app.kubernetes.io/instance={release_name}"})["items"]
        assert [r["metadata"]["name"] for r in roles] == [f"{release_name}-triton-operator"]
        for verb, resource in (("list", "tritonmodels.serving.triton-operator.dev"),
                               ("watch", "pods"), ("patch", "deployments.apps"), ("patch", "pods/status")):
            assert can_i(kubeconfig, sa, verb, resource, None), f"cannot {verb} {resource} cluster-wide"
            assert can_i(kubeconfig, sa, verb, resource, namespace), f"cannot {verb} {resource} in {namespace}"
        for verb, resource, ns in (
            ("get", "secrets", namespace), ("list", "secrets", None), ("watch", "secrets", None),
            ("patch", "nodes", None), ("update", "nodes", None), ("create", "nodes", None),
            ("patch", "nodes/status", None), ("list", "namespaces", None), ("create", "pods", namespace),
            ("create", "clusterrolebindings.rbac.authorization.k8s.io", None),
            ("update", "tritonmodels.serving.triton-operator.dev", namespace),
        ):
            assert not can_i(kubeconfig, sa, verb, resource, ns), f"can {verb} {resource} in {ns or 'all namespaces'}"

        # It runs, cluster-wide, and reconciles a model in a namespace nobody named to it.
        helm(kubeconfig, "upgrade", release.name, str(CHART), "--namespace", release.namespace, "--reuse-values",
             "--set", "replicaCount=1", "--wait", "--timeout", "120s")
        (pod,) = kube.items("Pod", release.namespace, label_selector={"app.kubernetes.io/instance": release_name})
        assert pod["spec"]["serviceAccountName"] == release.service_account
        assert "--all-namespaces" in pod["spec"]["containers"][0]["args"]
        doc = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d)
        doc["spec"]["replicas"] = 1
        vwc = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{release.fullname}"
        wait_for("the cluster-wide operator's webhook CA published",
                 lambda: kube.request("GET", vwc)["webhooks"][0]["clientConfig"].get("caBundle"), 60)
        # `helm --wait` returns once the pod is Ready; its EndpointSlice entry follows a moment later, and until
        # then the API server finds no endpoint for the webhook and refuses the apply.
        wait_for(f"the operator pod {pod['status'].get('podIP')} a ready endpoint of its webhook Service",
                 lambda: pod["status"].get("podIP") in ready_addresses(kube, release.namespace,
                                                                        f"{release.fullname}-webhook"), 60)
        kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(doc))
        name = doc["metadata"]["name"]
        tm = wait_for(f"TritonModel {namespace}/{name} Ready=True under the cluster-wide install",
                      lambda: (t := kube.get("TritonModel", name, namespace)) and is_model_ready(t) and t, 300, 0.5)
        assert tm["status"]["readyReplicas"] == 1, tm["status"]
        kube.delete("TritonModel", name, namespace)  # while the operator still runs
        wait_gone(kube, "TritonModel", namespace, name)
    assert not kube.request("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                            params={"labelSelector": f"app.kubernetes.io/instance={release_name}"})["items"]
