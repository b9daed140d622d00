"""The chart never takes the custom metrics API over from a server already in the cluster (issue 28).

Another server of `custom.metrics.k8s.io` stands where prometheus-adapter would: a small HTTPS server (Python's
standard library, from a ConfigMap, in our operator image) registered as `v1beta1.custom.metrics.k8s.io` with
prometheus-adapter's priorities, serving one Object metric of Deployments at a value nothing else produces and
logging every request it gets. A real HorizontalPodAutoscaler in the real kube-controller-manager reads that metric.
Then the chart is installed with its default values: the HPA keeps reading the same value from the same server (its
request log keeps growing, the group's preferred version stays v1beta1, ScalingActive never flips). Installing or
upgrading with `customMetrics.enabled=true` is refused, with the message naming the other APIService, and changes
nothing: no release, no objects, the same APIServices.

Where the operator does not serve the API and the server that does knows nothing of TritonModels (an adapter
without rules for Triton's metrics), a TritonModel's spec.autoscaling cannot scale; its status says so
(`ScalingActive=False`, the HPA's reason and message), instead of only the HPA's.

The operator's own path (the API on, an HPA of spec.autoscaling scaling a TritonModel) is e2e/test_autoscaling.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import REPO_ROOT
from e2e.images import PAUSE_IMAGE, TRITON_REF, chart_operator_ref
from e2e.kube import ApiError, Kube, wait_for
from e2e.operator_fixtures import (
    OperatorHandle,
    ensure_crd,
    helm,
    helm_binary,
    load_examples,
    model_condition,
    wait_model,
)
from e2e.testing import delete_namespace, ready_addresses
from triton_operator.platform.certificates import issue_certificate

pytestmark = pytest.mark.cluster

CHART = REPO_ROOT / "charts" / "triton-operator"
GROUP = "custom.metrics.k8s.io"
OTHER_APISERVICE = f"v1beta1.{GROUP}"
ADAPTER = "other-adapter"
METRIC = "e2e_other_adapter_metric"
#: What only the other server answers: the HPA showing it read the metric there.
VALUE = "4242"
TARGET = "scaled-by-other-adapter"
REFUSAL = f"custom.metrics.k8s.io is already served by another server: APIService {OTHER_APISERVICE}"

#: The other server: custom.metrics.k8s.io/v1beta1 discovery and one Object metric of any Deployment, always VALUE;
#: one line on stdout per request.
ADAPTER_SCRIPT = r'''
import datetime, json, ssl, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX = "/apis/custom.metrics.k8s.io/v1beta1"
METRIC, VALUE = sys.argv[1], sys.argv[2]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        print("GET " + self.path, flush=True)
        path = self.path.split("?", 1)[0].rstrip("/")
        parts = path[len(PREFIX):].strip("/").split("/") if path.startswith(PREFIX + "/") else []
        if path == PREFIX:
            body = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "custom.metrics.k8s.io/v1beta1",
                    "resources": [{"name": "deployments.apps/" + METRIC, "singularName": "", "namespaced": True,
                                   "kind": "MetricValueList", "verbs": ["get"]}]}
        elif len(parts) == 5 and parts[0] == "namespaces" and parts[2] == "deployments.apps" and parts[4] == METRIC:
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            body = {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta1", "metadata": {},
                    "items": [{"describedObject": {"kind": "Deployment", "namespace": parts[1], "name": parts[3],
                                                   "apiVersion": "apps/v1"},
                               "metricName": METRIC, "timestamp": now, "value": VALUE}]}
        else:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("0.0.0.0", 8443), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/tls/tls.crt", "/tls/tls.key")
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("serving", flush=True)
server.serve_forever()
'''

RESTRICTED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _other_adapter(kube: Kube, namespace: str) -> None:
    """The server, its Service and its APIService (caBundle of a CA of its own); waits until the API server
    reports it Available."""
    service = f"{ADAPTER}.{namespace}.svc"
    issued = issue_certificate([service, f"{ADAPTER}.{namespace}", ADAPTER])
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": ADAPTER},
                 "data": {"adapter.py": ADAPTER_SCRIPT}}, namespace)
    kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{ADAPTER}-tls"},
                 "type": "kubernetes.io/tls",
                 "stringData": {"tls.crt": issued.cert_pem.decode(), "tls.key": issued.key_pem.decode()}}, namespace)
    labels = {"app": ADAPTER}
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": ADAPTER, "labels": labels},
                 "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                     "metadata": {"labels": labels},
                     "spec": {"containers": [{
                         "name": "adapter", "image": chart_operator_ref(),
                         "command": ["python", "/srv/adapter.py", METRIC, VALUE],
                         "ports": [{"name": "https", "containerPort": 8443}],
                         "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
                         "securityContext": RESTRICTED,
                         "volumeMounts": [{"name": "script", "mountPath": "/srv"},
                                          {"name": "tls", "mountPath": "/tls", "readOnly": True}]}],
                         "volumes": [{"name": "script", "configMap": {"name": ADAPTER}},
                                     {"name": "tls", "secret": {"secretName": f"{ADAPTER}-tls"}}]}}}}, namespace)
    kube.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": ADAPTER},
                 "spec": {"selector": labels, "ports": [{"name": "https", "port": 443, "targetPort": "https"}]}},
                namespace)
    # As prometheus-adapter's chart registers it: v1beta1, group priority 100, version priority 100.
    kube.create({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                 "metadata": {"name": OTHER_APISERVICE},
                 "spec": {"group": GROUP, "version": "v1beta1", "groupPriorityMinimum": 100, "versionPriority": 100,
                          "caBundle": _b64(issued.ca_pem), "service": {"namespace": namespace, "name": ADAPTER,
                                                                       "port": 443}}})
    wait_for(f"the APIService {OTHER_APISERVICE} Available", lambda: _available(kube, OTHER_APISERVICE), 120)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _available(kube: Kube, name: str) -> bool:
    svc = kube.get_or_none("APIService", name) or {}
    return any(c["type"] == "Available" and c["status"] == "True"
               for c in (svc.get("status") or {}).get("conditions") or ())


def _group_apiservices(kube: Kube) -> dict[str, Any]:
    """Every APIService of custom.metrics.k8s.io: name -> (version, priorities, service)."""
    return {a["metadata"]["name"]: (a["spec"]["version"], a["spec"].get("versionPriority"), a["spec"].get("service"))
            for a in kube.items("APIService") if a["spec"].get("group") == GROUP}


def _scaled_target(kube: Kube, namespace: str) -> None:
    """A Deployment (the pause image) and the HPA that reads the other server's metric of it. The target is far
    above the value, so the HPA keeps one replica: it only reads."""
    labels = {"app": TARGET}
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": TARGET},
                 "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                     "metadata": {"labels": labels},
                     "spec": {"containers": [{"name": "pause", "image": PAUSE_IMAGE,
                                              "securityContext": RESTRICTED}]}}}}, namespace)
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": TARGET}
    kube.create({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": TARGET},
                 "spec": {"scaleTargetRef": ref, "minReplicas": 1, "maxReplicas": 2, "metrics": [{
                     "type": "Object", "object": {"describedObject": ref, "metric": {"name": METRIC},
                                                  "target": {"type": "Value", "value": "1M"}}}]}}, namespace)


def _hpa(kube: Kube, namespace: str) -> tuple[str | None, dict[str, Any]]:
    """The metric value the HPA last read, and its ScalingActive condition."""
    st = (kube.get_or_none("HorizontalPodAutoscaler", TARGET, namespace) or {}).get("status") or {}
    value = next(iter(st.get("currentMetrics") or ()), {}).get("object", {}).get("current", {}).get("value")
    active = next((c for c in st.get("conditions") or () if c["type"] == "ScalingActive"), {})
    return value, active


def _reads(kube: Kube, namespace: str) -> int:
    """How many reads of the metric the other server has answered: the lines of its request log."""
    (pod,) = [p for p in kube.items("Pod", namespace, label_selector={"app": ADAPTER})
              if not p["metadata"].get("deletionTimestamp")]
    log = kube.request_text("GET", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/log", timeout=15)
    return sum(1 for line in log.splitlines() if line.startswith("GET ") and f"/{METRIC}" in line)


def _helm_refused(kubeconfig: Path, *args: str) -> str:
    proc = subprocess.run([helm_binary(), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT)
    assert proc.returncode != 0, f"helm {' '.join(args)} was not refused:\n{proc.stdout}"
    return proc.stderr


def _preferred_version(kube: Kube) -> str:
    return kube.request("GET", f"/apis/{GROUP}")["preferredVersion"]["version"]


@contextlib.contextmanager
def _release_namespace(kube: Kube, name: str) -> Iterator[str]:
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
        "e2e.triton-operator.io/test": "true", "pod-security.kubernetes.io/enforce": "restricted"}}})
    try:
        yield name
    finally:
        delete_namespace(kube, name, grace=1)  # no operator or replica outlives its test


def test_installing_the_chart_leaves_an_hpa_on_another_metrics_server_where_it_was(
    kubeconfig: Path, kube: Kube, nodes: Any, namespace: str,
) -> None:
    assert not _group_apiservices(kube), (
        f"custom.metrics.k8s.io is already served in this cluster before the test: {_group_apiservices(kube)}")
    release, release_ns = "tro-metrics", f"{namespace}-op"
    try:
        _other_adapter(kube, namespace)
        _scaled_target(kube, namespace)
        wait_for(f"the HPA reading {METRIC}={VALUE} from the other server ({_hpa(kube, namespace)})",
                 lambda: _hpa(kube, namespace)[0] == VALUE and _hpa(kube, namespace)[1].get("status") == "True",
                 120, 1)
        _, active_before = _hpa(kube, namespace)
        before = _group_apiservices(kube)
        assert _preferred_version(kube) == "v1beta1"

        with _release_namespace(kube, release_ns):
            # The chart with its default values, as `helm install` gives it to a new user; but for the CRD, which a
            # release of the session may own in this cluster: one release per cluster owns it (chart README, "CRDs").
            # The CRD is there all the same: without it the operator would serve nothing, and an APIService of ours
            # would stay unavailable, which the HPA controller passes over (this test could not see a takeover).
            ensure_crd(kubeconfig, kube)
            helm(kubeconfig, "install", release, str(CHART), "--namespace", release_ns, "--set", "crds.enabled=false",
                 "--set", f"tritonImage={TRITON_REF}", "--wait", "--timeout", "240s")
            try:
                # Every replica of the release serves (TLS: the webhook, and the custom metrics API had the chart
                # registered it): from here an APIService of ours would be available, and the HPA would move to it.
                service = f"{release}-triton-operator-webhook"
                wait_for("the release's operator replicas serving", lambda: len(ready_addresses(
                    kube, release_ns, service)) == 2, 180, 1)
                installed_at = _reads(kube, namespace)
                assert _group_apiservices(kube) == before, "the default install registered an APIService of the group"
                assert _preferred_version(kube) == "v1beta1"
                # The HPA controller syncs every 5 s here and re-reads the group's preferred version as often: three
                # more reads at the other server after the install are reads an APIService of ours did not divert.
                wait_for("the other server's request log growing after the install",
                         lambda: _reads(kube, namespace) >= installed_at + 3, 60, 1)
                value, active = _hpa(kube, namespace)
                assert value == VALUE and active.get("status") == "True", (value, active)
                assert active.get("lastTransitionTime") == active_before.get("lastTransitionTime"), (
                    f"ScalingActive flipped and back during the install: {active_before} -> {active}")

                # With the API on, the chart refuses: an upgrade of this release, and a new install.
                err = _helm_refused(kubeconfig, "upgrade", release, str(CHART), "--namespace", release_ns,
                                    "--reuse-values", "--set", "customMetrics.enabled=true")
                assert REFUSAL in err and f"(Service {namespace}/{ADAPTER})" in err, err
                history = json.loads(helm(kubeconfig, "history", release, "--namespace", release_ns, "-o", "json"))
                assert [(h["revision"], h["status"]) for h in history] == [(1, "deployed")], history
                with _release_namespace(kube, f"{namespace}-op2") as second_ns:
                    err = _helm_refused(kubeconfig, "install", "tro-metrics-on", str(CHART), "--namespace", second_ns,
                                        "--set", "crds.enabled=false", "--set", "customMetrics.enabled=true")
                    assert REFUSAL in err and "customMetrics.enabled=false" in err, err
                    assert not json.loads(helm(kubeconfig, "list", "--namespace", second_ns, "-a", "-o", "json"))
                    for kind in ("Deployment", "Service", "Secret", "ServiceAccount"):
                        made = [o["metadata"]["name"] for o in kube.items(kind, second_ns)
                                if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/instance")]
                        assert not made, f"the refused install made {kind}s {made}"
                assert _group_apiservices(kube) == before
                refused_at = _reads(kube, namespace)
                wait_for("the other server's request log growing after the refusals",
                         lambda: _reads(kube, namespace) >= refused_at + 2, 60, 1)
                assert _hpa(kube, namespace)[0] == VALUE
            finally:
                helm(kubeconfig, "uninstall", release, "--namespace", release_ns, "--wait", "--timeout", "120s")
    finally:
        # The APIService first: a group whose server is gone makes discovery fail, and namespace deletion waits on it.
        with contextlib.suppress(ApiError):
            kube.delete("APIService", OTHER_APISERVICE)
        wait_for(f"the APIService {OTHER_APISERVICE} gone",
                 lambda: kube.get_or_none("APIService", OTHER_APISERVICE) is None, 60)


def test_a_tritonmodel_whose_metric_no_server_answers_says_so_in_its_status(
    kubeconfig: Path, kube: Kube, nodes: Any, namespace: str, operator: OperatorHandle,
) -> None:
    """The session's release (custom metrics API off, the chart's default) and the other server, which answers
    nothing about TritonModels: the HPA of examples/autoscaling.yaml asks it, gets 404, and cannot scale."""
    assert not _group_apiservices(kube), f"custom.metrics.k8s.io is already served: {_group_apiservices(kube)}"
    try:
        _other_adapter(kube, namespace)
        model = load_examples("autoscaling")[0]
        kube.create(model, namespace)
        name = model["metadata"]["name"]
        tm = wait_model(kube, namespace, name, lambda t: (model_condition(t, "ScalingActive").get("status"),
                                                          model_condition(t, "ScalingActive").get("reason"))
                        == ("False", "FailedGetObjectMetric"), "ScalingActive=False FailedGetObjectMetric", 180, 1)
        c = model_condition(tm, "ScalingActive")
        assert c["reason"] == "FailedGetObjectMetric" and "triton_queue_time_ms" in c["message"], c
        assert c["message"].startswith(f"HorizontalPodAutoscaler {name}: "), c
        hpa = kube.get("HorizontalPodAutoscaler", name, namespace)
        (active,) = [h for h in hpa["status"]["conditions"] if h["type"] == "ScalingActive"]
        assert (active["status"], active["reason"]) == ("False", "FailedGetObjectMetric"), active
        # It was the other server the HPA asked (the group's only version), and it does not know the metric.
        (pod,) = kube.items("Pod", namespace, label_selector={"app": ADAPTER})
        log = kube.request_text("GET", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/log")
        assert f"tritonmodels.serving.triton-operator.dev/{name}/triton_queue_time_ms" in log, log[-2000:]
        warnings = [e for e in kube.items("Event", namespace) if e.get("reason") == "FailedGetObjectMetric"
                    and e["involvedObject"]["kind"] == "TritonModel" and e.get("type") == "Warning"]
        assert warnings, "no Warning Event on the TritonModel"
        kube.delete("TritonModel", name, namespace)
        wait_for(f"TritonModel {name} gone", lambda: kube.get_or_none("TritonModel", name, namespace) is None, 60)
    finally:
        with contextlib.suppress(ApiError):
            kube.delete("APIService", OTHER_APISERVICE)
        wait_for(f"the APIService {OTHER_APISERVICE} gone",
                 lambda: kube.get_or_none("APIService", OTHER_APISERVICE) is None, 60)
