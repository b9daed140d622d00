"""Autoscaling on a pool, on the real node (issue 29, item 5): the HPA controller in the real kube-controller-manager
scales a pooled model's copies on its queue time, and a pool's replicas on the memory its models demand, each through
its scale subresource, on metrics the operator (the chart, in-cluster) serves through the aggregated custom metrics
API. As in e2e/test_autoscaling.py, this file turns the chart's `customMetrics.enabled` on for its tests and off
again after them.

- A pooled model (examples/autoscaling.yaml's model, 20 ms per request on one instance, on a pool of 2 replicas)
  under a load step through its Service: the HPA asks for a second copy, the operator places and loads it on the
  other replica, and the model's slice lists that replica ready; the added copy answers part of the step. Its
  metric is read from the pool replicas where a copy serves (no pod of its own). After the step, under a trickle,
  the HPA takes the copy away again: out of the slice, unloaded, no request failed. With `autoscaling` removed, the
  HPA is deleted.
- A pool of 1 replica holding 512Mi, kept a quarter free: a second model of 300Mi fits nowhere
  (InsufficientPoolCapacity), the pool's demand (600Mi, 384Mi a replica) asks for 2 replicas, and the model is
  placed, loaded and served on the new one. That model deleted, the pool goes back to 1 replica, the first model
  serving on it. With `autoscaling` removed, the pool's HPA is deleted.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad
from e2e.operator_fixtures import (
    ChartOperator,
    OperatorHandle,
    apply,
    kubectl,
    load_examples,
    model_condition,
    record,
    wait_model,
)
from e2e.testing import ready_addresses
from e2e.traffic import infer_add_sub, loaded_digest
from triton_operator.api.pool import LABEL_POOL
from triton_operator.api.v1alpha1 import API_VERSION, GROUP

pytestmark = pytest.mark.cluster

METRICS_API = "/apis/custom.metrics.k8s.io/v1beta2"
POOL_RESOURCE = f"tritonpools.{GROUP}"
MODEL_RESOURCE = f"tritonmodels.{GROUP}"


@pytest.fixture(scope="module", autouse=True)
def metrics_api(operator: OperatorHandle, kube: Kube) -> Iterator[None]:
    """The session's release with `customMetrics.enabled=true` for this file's tests, and off again after them
    (e2e/test_autoscaling.py's fixture: no other test file meets an APIService it did not ask for)."""
    assert isinstance(operator, ChartOperator), "the custom metrics API is the chart's: run with the chart's operator"
    try:
        operator.reconfigure("--set", "customMetrics.enabled=true")
        wait_for("the APIService v1beta2.custom.metrics.k8s.io Available", lambda: _api_service_available(kube), 90)
        yield
    finally:
        operator.reconfigure("--set", "customMetrics.enabled=false")
        wait_for("the APIService v1beta2.custom.metrics.k8s.io gone",
                 lambda: kube.get_or_none("APIService", "v1beta2.custom.metrics.k8s.io") is None, 60)


def _api_service_available(kube: Kube) -> bool:
    svc = kube.get_or_none("APIService", "v1beta2.custom.metrics.k8s.io")
    return any(c["type"] == "Available" and c["status"] == "True"
               for c in ((svc or {}).get("status") or {}).get("conditions") or ())


def _pool(name: str, replicas: int | None, memory: str, autoscaling: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"memoryPerReplica": memory},
                            "server": {"resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}}
    if replicas is not None:
        spec["replicas"] = replicas
    if autoscaling is not None:
        spec["autoscaling"] = autoscaling
    return {"apiVersion": API_VERSION, "kind": "TritonPool", "metadata": {"name": name}, "spec": spec}


def _pooled(name: str, pool: str, memory: str, autoscaling: dict[str, Any] | None = None) -> dict[str, Any]:
    """examples/autoscaling.yaml's model (add-sub's tensors, 20 ms a request on one instance) on `pool`."""
    doc = copy.deepcopy(load_examples("autoscaling")[0])
    doc["metadata"] = {"name": name}
    doc["spec"].pop("autoscaling")
    doc["spec"] |= {"pool": pool, "memory": memory}
    if autoscaling is not None:
        doc["spec"]["autoscaling"] = autoscaling
    return doc


def _warmed(copies: int) -> Any:
    def check(tm: dict[str, Any]) -> bool:
        ready = model_condition(tm, "Ready")
        st = tm.get("status") or {}
        return (ready.get("status") == "True" and ready.get("reason") == "AllCopiesWarmed"
                and len(st.get("placement") or ()) == copies and st.get("readyReplicas") == copies)
    return check


def _hpa_says(kube: Kube, namespace: str, name: str) -> str:
    hpa = kube.get_or_none("HorizontalPodAutoscaler", name, namespace) or {}
    st = hpa.get("status") or {}
    metric = next(iter(st.get("currentMetrics") or ()), {}).get("object", {}).get("current", {})
    conds = ", ".join(f"{c['type']}={c['status']} {c.get('reason')}" for c in st.get("conditions") or ())
    return f"replicas {st.get('currentReplicas')} -> {st.get('desiredReplicas')}, metric {metric}, {conds}"


def _pool_pods(kube: Kube, namespace: str, pool: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kube.items("Pod", namespace, label_selector={LABEL_POOL: pool})
            if not p["metadata"].get("deletionTimestamp")}


def _answered(ip: str, model: str) -> int:
    """Requests the Triton at `ip` has answered for `model`, by its own statistics (0 when it does not answer)."""
    from tritonclient import grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"{ip}:8001")
    try:
        stats = client.get_inference_statistics(model, client_timeout=2)
        return sum(s.inference_stats.success.count for s in stats.model_stats)
    except InferenceServerException:
        return 0
    finally:
        client.close()


def _infer(address: str, model: str) -> list[list[float]] | None:
    """add-sub's sum at `address`, or None while nothing answers there (connection refused)."""
    from tritonclient.utils import InferenceServerException

    try:
        return infer_add_sub(address, model).tolist()  # type: ignore[no-any-return]
    except InferenceServerException as e:
        if "UNAVAILABLE" not in str(e):
            raise
        return None


def _metric(kubeconfig: Path, namespace: str, resource: str, name: str, metric: str) -> dict[str, Any] | None:
    out = kubectl(kubeconfig, "get", "--raw", f"{METRICS_API}/namespaces/{namespace}/{resource}/{name}/{metric}",
                  check=False).stdout
    return json.loads(out) if out else None


def test_a_pooled_model_scales_its_copies_on_its_queue_time_and_the_new_copy_joins_its_slice(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any) -> None:
    model = "pooled-scaled"
    apply(kubeconfig, namespace, _pool("scaling", 2, "1Gi"), _pooled(model, "scaling", "256Mi", {
        "minReplicas": 1, "maxReplicas": 2, "target": {"queueTimeMilliseconds": 20},
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 20}}}))
    tm = wait_model(kube, namespace, model, _warmed(1), "Ready with 1 copy warmed", 300)
    (first,) = tm["status"]["placement"]
    assert tm["status"]["selector"] == f"{GROUP}/model={model}"
    hpa = wait_for("the pooled model's HPA", lambda: kube.get_or_none("HorizontalPodAutoscaler", model, namespace), 60)
    ref = {"apiVersion": API_VERSION, "kind": "TritonModel", "name": model}
    assert hpa["metadata"]["ownerReferences"][0]["kind"] == "TritonModel"
    assert hpa["spec"]["scaleTargetRef"] == ref
    assert hpa["spec"]["metrics"][0]["object"]["metric"]["name"] == "triton_copies_queue_time_ms"

    # The model's metric, through the API server: read on the pool replica where its copy serves.
    value = wait_for("the model's queue time through kubectl get --raw",
                     lambda: _metric(kubeconfig, namespace, MODEL_RESOURCE, model, "triton_queue_time_ms"), 60)
    assert value["items"][0]["value"] == "0", f"idle: nothing queued ({value})"
    wait_for(f"the HPA reading the metric ({_hpa_says(kube, namespace, model)})",
             lambda: "ValidMetricFound" in _hpa_says(kube, namespace, model), 120, interval=1)
    # ... and the model's status says so, as a model's own HPA does (ScalingActive restated)
    wait_for("the pooled model's ScalingActive True, ValidMetricFound", lambda: model_condition(
        kube.get("TritonModel", model, namespace), "ScalingActive").get("reason") == "ValidMetricFound", 60)

    pods = _pool_pods(kube, namespace, "scaling")
    (other,) = set(pods) - {first}
    other_ip = pods[other]["status"]["podIP"]
    assert _answered(other_ip, model) == 0, "the other replica has no copy yet"
    # A load step: 6 clients back to back on one instance of 20 ms each, about 100 ms in the queue.
    heavy = ServiceLoad(kubeconfig, namespace, model, model=model, threads=6, rate=1000).start()
    try:
        t0 = time.monotonic()
        wait_for(f"the HPA to ask for a second copy ({_hpa_says(kube, namespace, model)})",
                 lambda: kube.get("TritonModel", model, namespace)["spec"]["replicas"] >= 2, 150, interval=1)
        asked = time.monotonic() - t0
        tm = wait_model(kube, namespace, model, _warmed(2), "2 copies warmed", 180)
        assert set(tm["status"]["placement"]) == {first, other}
        wait_for("the model's slice listing both replicas ready",
                 lambda: ready_addresses(kube, namespace, model) == {pods[first]["status"]["podIP"], other_ip}, 60)
        ready = time.monotonic() - t0
        answered = wait_for("the added copy answering part of the step (its Triton's own count)",
                            lambda: (n := _answered(other_ip, model)) >= 50 and n, 60)
        during = _hpa_says(kube, namespace, model)
    finally:
        up = heavy.stop()
    assert up.failed == 0, f"{up.summary()} {heavy.samples}"
    assert up.sent > 100, up.summary()

    # The step ends; a trickle (one client, 5 a second: no queue) runs on while the HPA takes a copy away again.
    light = ServiceLoad(kubeconfig, namespace, model, model=model, threads=1, rate=5).start()
    try:
        t1 = time.monotonic()
        tm = wait_model(kube, namespace, model, lambda t: t["spec"]["replicas"] == 1 and _warmed(1)(t),
                        f"scaled back to 1 copy ({_hpa_says(kube, namespace, model)})", 300)
        (kept,) = tm["status"]["placement"]
        (dropped,) = {first, other} - {kept}
        dropped_ip = pods[dropped]["status"]["podIP"]
        wait_for("the slice listing the one copy left", lambda: ready_addresses(kube, namespace, model)
                 == {pods[kept]["status"]["podIP"]}, 60)
        wait_for(f"the copy no longer placed unloaded from {dropped}", lambda: loaded_digest(dropped_ip, model) is None,
                 60)
        down_took = time.monotonic() - t1
        sent = light.tally().sent
        wait_for("the trickle answered by the copy left", lambda: light.tally().sent > sent + 20, 30)
    finally:
        down = light.stop()
    record("pooled model autoscaling on queue time (1 -> 2 copies, 20 ms target)",
           f"HPA asked for a second copy after {asked:.1f}s, its endpoint ready after {ready:.1f}s, the added copy "
           f"answered {answered}; step: {up.summary()}; HPA at the peak: {during}; back to 1 copy (unloaded, out "
           f"of the slice) {down_took:.1f}s after the step; after: {down.summary()}")
    assert down.failed == 0, f"{down.summary()} {light.samples}"

    # autoscaling removed: its HPA goes, the copies stay where the HPA left them.
    kube.patch("TritonModel", model, {"spec": {"autoscaling": None}}, namespace, type="merge")
    wait_for("the pooled model's HPA deleted",
             lambda: kube.get_or_none("HorizontalPodAutoscaler", model, namespace) is None, 60)


def test_a_pool_whose_models_fill_it_scales_up_its_replicas_and_places_what_did_not_fit(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any) -> None:
    pool, hpa_name = "filling", "filling-pool"
    apply(kubeconfig, namespace, _pool("filling", None, "512Mi", {
        "minReplicas": 1, "maxReplicas": 3, "targetFreeFraction": 0.25,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}}}), _pooled("fill-a", pool, "300Mi"))
    wait_model(kube, namespace, "fill-a", _warmed(1), "Ready with 1 copy warmed", 300)
    hpa = wait_for("the pool's HPA", lambda: kube.get_or_none("HorizontalPodAutoscaler", hpa_name, namespace), 60)
    ref = {"apiVersion": API_VERSION, "kind": "TritonPool", "name": pool}
    assert hpa["metadata"]["ownerReferences"][0]["kind"] == "TritonPool"
    assert hpa["spec"]["scaleTargetRef"] == ref
    assert hpa["spec"]["metrics"][0]["object"]["target"] == {"type": "AverageValue", "averageValue": "402653184"}
    wait_for(f"the pool's HPA reading the metric ({_hpa_says(kube, namespace, hpa_name)})",
             lambda: "ValidMetricFound" in _hpa_says(kube, namespace, hpa_name), 120, interval=1)
    assert kube.get("TritonPool", pool, namespace)["spec"]["replicas"] == 1, "300Mi of 384Mi: one replica"

    # A second model of 300Mi: no room on the one replica.
    t0 = time.monotonic()
    apply(kubeconfig, namespace, _pooled("fill-b", pool, "300Mi"))
    demand = wait_for("the pool's demand with fill-b's copy (600Mi)", lambda: (
        v := _metric(kubeconfig, namespace, POOL_RESOURCE, pool, "triton_pool_demand_bytes")) and
        v["items"][0]["value"] == str(600 << 20) and v, 60)
    wait_for(f"the pool's HPA asking for 2 replicas ({_hpa_says(kube, namespace, hpa_name)})",
             lambda: kube.get("TritonPool", pool, namespace)["spec"]["replicas"] == 2, 120, interval=1)
    asked = time.monotonic() - t0
    tm = wait_model(kube, namespace, "fill-b", _warmed(1), "placed on the new replica and warmed", 300)
    served = time.monotonic() - t0
    a = kube.get("TritonModel", "fill-a", namespace)
    assert tm["status"]["placement"] != a["status"]["placement"], (tm["status"], a["status"])
    assert kube.get("Deployment", f"{pool}-pool", namespace)["spec"]["replicas"] == 2
    wait_for("the pool's PodDisruptionBudget, with 2 replicas",
             lambda: kube.get_or_none("PodDisruptionBudget", f"{pool}-pool", namespace), 60)
    # fill-b said it did not fit before the pool grew (an Event of its Ready transition).
    events = kube.items("Event", namespace)
    assert any(e.get("reason") == "InsufficientPoolCapacity" and e["involvedObject"]["name"] == "fill-b"
               for e in events), [(e["involvedObject"]["name"], e.get("reason")) for e in events]
    (ip,) = ready_addresses(kube, namespace, "fill-b")
    assert ip == _pool_pods(kube, namespace, pool)[tm["status"]["placement"][0]]["status"]["podIP"]
    svc = kube.get("Service", "fill-b", namespace)
    # Through its ClusterIP, once kube-proxy has the slice's new endpoint (it refuses connections until then).
    out = wait_for("fill-b answering through its ClusterIP", lambda: _infer(svc["spec"]["clusterIP"], "fill-b"), 30)
    assert out == [[11, 22, 33, 44]]
    settled = _hpa_says(kube, namespace, hpa_name)
    record("pool autoscaling on demand (512Mi replicas kept a quarter free, 1 -> 2)",
           f"demand {demand['items'][0]['value']}; the HPA set 2 replicas {asked:.1f}s after the second model's apply, "
           f"the model warmed on the new replica {served:.1f}s after it; HPA then: {settled}")

    # fill-b deleted: 300Mi demanded, one replica is enough again; fill-a serves on the one left.
    kube.delete("TritonModel", "fill-b", namespace)
    wait_for(f"the pool's HPA scaling back to 1 ({_hpa_says(kube, namespace, hpa_name)})",
             lambda: kube.get("TritonPool", pool, namespace)["spec"]["replicas"] == 1
             and len(_pool_pods(kube, namespace, pool)) == 1, 180, interval=1)
    a = wait_model(kube, namespace, "fill-a", _warmed(1), "Ready on the replica left", 180)
    assert a["status"]["placement"] == list(_pool_pods(kube, namespace, pool)), a["status"]
    wait_for("the pool's PodDisruptionBudget deleted at 1 replica (as a TritonModel's own)",
             lambda: kube.get_or_none("PodDisruptionBudget", f"{pool}-pool", namespace) is None, 60)

    # autoscaling removed: the pool's HPA goes, the replicas stay where it left them.
    kube.patch("TritonPool", pool, {"spec": {"autoscaling": None}}, namespace, type="merge")
    wait_for("the pool's HPA deleted",
             lambda: kube.get_or_none("HorizontalPodAutoscaler", hpa_name, namespace) is None, 60)
    assert kube.get("TritonPool", pool, namespace)["spec"]["replicas"] == 1
