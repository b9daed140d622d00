"""Autoscaling on Triton's own queue time, on the real node (issue 16): the HPA controller in the real
kube-controller-manager scales a TritonModel through its scale subresource, on a metric the operator (the chart,
in-cluster, two replicas) serves through the aggregated custom metrics API. The chart serves that API only when
asked (`customMetrics.enabled`, off by default: chart README, "Autoscaling"), so this file turns it on for its tests
and off again after them.

`examples/autoscaling.yaml`: 20 ms per request on one model instance, 1 to 3 replicas, a 20 ms queue-time
target. Clients load its Service's ClusterIP through kube-proxy (`e2e.load.ServiceLoad`); `GateAudit` checks that
every ready endpoint serves a config its gate approved, so a replica the HPA adds takes traffic only through its
gate; an added replica's own Triton statistics say it answered part of the step.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.inplace import GateAudit
from e2e.kube import ApiError, Kube, wait_for
from e2e.load import ServiceLoad
from e2e.operator_fixtures import (
    ChartOperator,
    OperatorHandle,
    apply,
    gate,
    is_model_ready,
    kubectl,
    live_pods,
    load_examples,
    model_condition,
    record,
    wait_model,
)
from e2e.testing import ready_endpoints
from e2e.traffic import added_answers
from triton_operator.api.kinds import LABEL_MODEL
from triton_operator.api.v1alpha1 import API_VERSION, GROUP, PLURAL

pytestmark = pytest.mark.cluster

MODEL = "autoscaled"
METRICS_API = "/apis/custom.metrics.k8s.io/v1beta2"
QUEUE_TIME = "triton_queue_time_ms"


def model_metric_path(namespace: str, metric: str = QUEUE_TIME, name: str = MODEL) -> str:
    return f"{METRICS_API}/namespaces/{namespace}/{PLURAL}.{GROUP}/{name}/{metric}"


def pods_metric_path(namespace: str, metric: str = QUEUE_TIME) -> str:
    return f"{METRICS_API}/namespaces/{namespace}/pods/*/{metric}?labelSelector={LABEL_MODEL}%3D{MODEL}"


def api_service_available(kube: Kube) -> bool:
    svc = kube.get_or_none("APIService", "v1beta2.custom.metrics.k8s.io")
    return any(c["type"] == "Available" and c["status"] == "True"
               for c in ((svc or {}).get("status") or {}).get("conditions") or ())


@pytest.fixture(scope="module", autouse=True)
def metrics_api(operator: OperatorHandle, kube: Kube) -> Iterator[None]:
    """The session's chart release with `customMetrics.enabled=true` for this file's tests (no other server of
    custom.metrics.k8s.io runs in the local cluster), and back to the chart's default (off) after them, so that no
    other test file meets an APIService it did not ask for."""
    assert isinstance(operator, ChartOperator), "the custom metrics API is the chart's: run with the chart's operator"
    try:  # a reconfigure that fails half-way (helm done, replicas late) is undone too
        operator.reconfigure("--set", "customMetrics.enabled=true")
        yield
    finally:
        operator.reconfigure("--set", "customMetrics.enabled=false")
        wait_for("the APIService v1beta2.custom.metrics.k8s.io gone",
                 lambda: kube.get_or_none("APIService", "v1beta2.custom.metrics.k8s.io") is None, 60)


def hpa_says(kube: Kube, namespace: str) -> str:
    hpa = kube.get_or_none("HorizontalPodAutoscaler", MODEL, namespace) or {}
    st = hpa.get("status") or {}
    metric = next(iter(st.get("currentMetrics") or ()), {}).get("object", {}).get("current", {})
    conds = ", ".join(f"{c['type']}={c['status']} {c.get('reason')}" for c in st.get("conditions") or ())
    return f"replicas {st.get('currentReplicas')} -> {st.get('desiredReplicas')}, metric {metric}, {conds}"


class PodMetricAudit:
    """Until stopped, five times a second: whenever a replica of the model is not warmed (its gate not True) before
    and after a read of the pods' metric, that read must not list it. Counts the reads that had such a replica."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.checked: list[str] = []  # "pod: listed [...]" for each read that had an unwarmed replica
        self.violations: list[str] = []
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-metric-audit", daemon=True)

    def __enter__(self) -> PodMetricAudit:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self._thread.join(15)

    def _unwarmed(self) -> set[str]:
        return {p["metadata"]["name"] for p in live_pods(self.kube, self.namespace, MODEL)
                if gate(p).get("status") != "True"}

    def _run(self) -> None:
        while not self._halt.wait(0.2):
            try:
                before = self._unwarmed()
                if not before:
                    continue
                listed = {i["describedObject"]["name"] for i in
                          self.kube.request("GET", pods_metric_path(self.namespace)).get("items", [])}
                unwarmed = before & self._unwarmed()
                for pod in sorted(unwarmed):
                    self.checked.append(f"{pod}: listed {sorted(listed)}")
                    if pod in listed:
                        self.violations.append(f"{pod} is not warmed and has a metric: {sorted(listed)}")
            except Exception as e:  # noqa: BLE001 - an API hiccup mid-read: counted, not fatal
                self.errors.append(repr(e))


def _https(url: str, token: str | None = None, cert: tuple[Path, Path] | None = None) -> tuple[int, str]:
    """GET `url` on the operator's TLS port, not verifying its certificate (its CA is the chart's), with a bearer
    `token`, or with a client certificate `cert` (and headers naming a user, as the front proxy's would)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if cert is not None:
        ctx.load_cert_chain(*cert)
        headers = {"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"}
    req = urllib.request.Request(url, headers=headers)  # noqa: S310 - https to a pod address of ours
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:  # noqa: S310
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_custom_metrics_api_serves_the_model_metric_and_refuses_callers_the_api_server_does_not_vouch_for(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes, cluster) -> None:
    apply(kubeconfig, namespace, load_examples("autoscaling")[0])
    wait_model(kube, namespace, MODEL, lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 1,
               "Ready with 1 warmed replica", 180)
    hpa = wait_for("the operator's HPA", lambda: kube.get_or_none("HorizontalPodAutoscaler", MODEL, namespace), 30)
    assert hpa["metadata"]["ownerReferences"][0]["kind"] == "TritonModel"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": API_VERSION, "kind": "TritonModel", "name": MODEL}
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 20, "behavior is the user's"
    wait_for("the APIService v1beta2.custom.metrics.k8s.io Available", lambda: api_service_available(kube), 90)

    # Through the API server, as users and the HPA controller read it.
    discovery = json.loads(kubectl(kubeconfig, "get", "--raw", METRICS_API).stdout)
    assert f"{PLURAL}.{GROUP}/{QUEUE_TIME}" in {r["name"] for r in discovery["resources"]}
    value = wait_for("the model's queue time through kubectl get --raw", lambda: json.loads(
        kubectl(kubeconfig, "get", "--raw", model_metric_path(namespace), check=False).stdout or "null"), 60)
    (item,) = value["items"]
    assert item["describedObject"] == {"kind": "TritonModel", "namespace": namespace, "name": MODEL,
                                       "apiVersion": API_VERSION}
    assert item["metric"]["name"] == QUEUE_TIME and item["value"] == "0", "idle: nothing queued"
    (pod,) = live_pods(kube, namespace, MODEL)
    # Waited for, not read once: each operator replica samples on its own from the first question it gets, and the
    # API server's proxy may send this one to the replica that did not answer the model's (a CI run under load read
    # no item once); it lists the pod once it holds two samples of it.
    listed = wait_for("the pod's own queue time", lambda: kube.request("GET", pods_metric_path(namespace))["items"]
                      or None, 60)
    assert [i["describedObject"]["name"] for i in listed] == [pod["metadata"]["name"]]
    with pytest.raises(ApiError) as missing:
        kube.request("GET", model_metric_path(namespace, name="no-such-model"))
    assert missing.value.status == 404, missing.value
    with pytest.raises(ApiError) as unknown:
        kube.request("GET", model_metric_path(namespace, metric="gpu_temperature"))
    assert unknown.value.status == 404 and "serves triton_queue_time_ms" in str(unknown.value), unknown.value

    # Straight at an operator replica, past the API server: no credentials, a made-up token, a real token of a
    # ServiceAccount with no grant, and a client certificate of the cluster CA that is not the front proxy's.
    ip = operator.pods()[0]["status"]["podIP"]
    url = f"https://{ip}:9443{model_metric_path(namespace)}"
    status, body = _https(url)
    assert status == 401 and "Unauthorized" in body, (status, body)
    status, body = _https(url, token="not-a-token")  # noqa: S106 - a made-up token, refused
    assert status == 401, (status, body)
    token = kubectl(kubeconfig, "create", "token", "default", "-n", namespace).stdout.strip()
    status, body = _https(url, token=token)
    assert status == 403 and f"system:serviceaccount:{namespace}:default" in body, (status, body)
    if cluster.local is not None:  # our own cluster: its admin certificate, of the CA the front proxy's is from
        pki = cluster.local.certs
        status, body = _https(url, cert=(pki.p("admin.crt"), pki.p("admin.key")))
        assert status == 401, f"a certificate not named front-proxy-client vouched for headers: {status} {body}"


def test_the_hpa_scales_on_queue_time_new_replicas_join_through_the_gate_and_scaling_back_fails_no_request(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes) -> None:
    apply(kubeconfig, namespace, load_examples("autoscaling")[0])
    wait_model(kube, namespace, MODEL, lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 1,
               "Ready with 1 warmed replica", 180)
    wait_for("1 ready endpoint", lambda: len(ready_endpoints(kube, namespace, MODEL)) == 1, 30)
    wait_for("the HPA reading the metric", lambda: "ValidMetricFound" in hpa_says(kube, namespace), 120,
             interval=1)
    # The model's status restates it (e2e/test_metrics_api.py: False, where no server answers the metric).
    wait_model(kube, namespace, MODEL, lambda tm: (c := model_condition(tm, "ScalingActive")).get("status")
               == "True" and c.get("reason") == "ValidMetricFound", "ScalingActive=True", 60)

    (first,) = (p["metadata"]["name"] for p in live_pods(kube, namespace, MODEL))
    # Each operator replica samples a model from the first time it is asked (and that first answer waits for two
    # samples): ask a few times, so that both sample it before the step and the audit's reads answer at once.
    for _ in range(8):
        kube.request("GET", pods_metric_path(namespace))
    # A load step: 6 clients back to back on one instance of 20 ms each, about 100 ms in the queue.
    with GateAudit(kube, namespace, MODEL, min_samples=20) as audit, PodMetricAudit(kube, namespace) as metric_audit:
        heavy = ServiceLoad(kubeconfig, namespace, MODEL, model=MODEL, threads=6, rate=1000).start()
        t0 = time.monotonic()
        wait_for(f"the HPA to ask for 2 or more replicas ({hpa_says(kube, namespace)})",
                 lambda: kube.get("TritonModel", MODEL, namespace)["spec"]["replicas"] >= 2, 150, interval=1)
        asked = time.monotonic() - t0
        wait_for("2 or more ready endpoints", lambda: len(ready_endpoints(kube, namespace, MODEL)) >= 2, 120)
        ready = time.monotonic() - t0
        answered = wait_for("an added replica answering the step (Triton's own count of its requests)",
                            lambda: added_answers(kube, namespace, first, MODEL), 60)
        serving = time.monotonic() - t0
        peak = kube.get("TritonModel", MODEL, namespace)["spec"]["replicas"]
        up = heavy.stop()
        during = hpa_says(kube, namespace)

        # The step ends; a trickle (one client, 5 per second: no queue) runs on while the HPA scales back to 1.
        light = ServiceLoad(kubeconfig, namespace, MODEL, model=MODEL, threads=1, rate=5).start()
        t1 = time.monotonic()
        wait_for(f"the HPA to scale back to 1 ({hpa_says(kube, namespace)})",
                 lambda: kube.get("TritonModel", MODEL, namespace)["spec"]["replicas"] == 1
                 and len(live_pods(kube, namespace, MODEL)) == 1, 300, interval=1)
        down_took = time.monotonic() - t1
        wait_for("the trickle answered by the last replica", lambda: light.tally().sent > 20, 30)
        down = light.stop()
    record("autoscaling on queue time (1 -> 3, 20 ms target)",
           f"HPA asked for more after {asked:.1f}s, a second ready endpoint after {ready:.1f}s, an added replica "
           f"answering after {serving:.1f}s ({answered}), peak {peak}; "
           f"back to 1 {down_took:.1f}s after the step; step: {up.summary()}; after: {down.summary()}; HPA at the "
           f"peak: {during}; {len(metric_audit.checked)} reads of the pods' metric with an unwarmed replica")
    assert up.failed == 0 and down.failed == 0, f"{up.summary()} {heavy.samples}; {down.summary()} {light.samples}"
    assert up.sent > 100 and down.sent > 20, (up.summary(), down.summary())
    assert not audit.violations, audit.violations[:10]
    assert not metric_audit.violations, metric_audit.violations[:5]
    assert metric_audit.checked, (f"no read of the pods' metric saw a replica before it was warmed "
                                  f"(errors: {metric_audit.errors[:5]})")
    assert answered, "no added replica served"
