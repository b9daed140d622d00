"""The autoscale benchmark's peer configuration (bench/promkeda.py) and its readings (bench/autoscale.py): what
Prometheus scrapes, the query KEDA's scaler runs, the ScaledObject, and what the timeline reads of an HPA's
status."""

from __future__ import annotations

import pytest

from bench.autoscale import _hpa_reading, _keda_model
from bench.promkeda import keda_hpa_name, prometheus_config, queue_time_query, scaled_object


def test_prometheus_discovers_pods_through_the_kubeconfig_and_keeps_tritons_metrics_port() -> None:
    cfg = prometheus_config("/tmp/kc", 5.0)
    (job,) = cfg["scrape_configs"]
    assert job["scrape_interval"] == "5s" and cfg["global"]["scrape_interval"] == "5s"
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "kubeconfig_file": "/tmp/kc"}]
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics",
            "action": "keep"} in keep
    # Only the operator's model pods (they carry its model label), with namespace and pod as labels.
    assert any(r["source_labels"] == ["__meta_kubernetes_pod_label_serving_triton_operator_dev_model"] for r in keep)
    targets = {r["target_label"]: r["source_labels"] for r in job["relabel_configs"] if "target_label" in r}
    assert targets == {"namespace": ["__meta_kubernetes_namespace"], "pod": ["__meta_kubernetes_pod_name"]}


def test_prometheus_namespaces_are_optional() -> None:
    cfg = prometheus_config("/kc", 2.5, ["a", "b"])
    assert cfg["scrape_configs"][0]["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["a", "b"]}
    assert cfg["scrape_configs"][0]["scrape_interval"] == "2.5s"


def test_the_query_is_queue_time_over_successes_in_milliseconds() -> None:
    assert queue_time_query("ns", "m", 30) == (
        'sum(rate(nv_inference_queue_duration_us{namespace="ns",model="m"}[30s])) / '
        'sum(rate(nv_inference_request_success{namespace="ns",model="m"}[30s])) / 1000')


def test_the_scaled_object_compares_a_value_with_the_same_target_replicas_and_behavior() -> None:
    behavior = {"scaleDown": {"stabilizationWindowSeconds": 20}}
    so = scaled_object("m", "ns", {"apiVersion": "g/v1", "kind": "TritonModel", "name": "m"},
                       server="http://127.0.0.1:9090", query="q", threshold=20.0, min_replicas=1, max_replicas=3,
                       behavior=behavior)
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    assert so["metadata"] == {"name": "m", "namespace": "ns"}
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "g/v1", "kind": "TritonModel", "name": "m"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 3)
    assert spec["triggers"] == [{"type": "prometheus", "metricType": "Value", "metadata": {
        "serverAddress": "http://127.0.0.1:9090", "query": "q", "threshold": "20"}}]
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == behavior
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] is not behavior
    assert "pollingInterval" not in spec  # KEDA's default unless asked
    assert keda_hpa_name("m") == "keda-hpa-m"


def test_the_benchs_scaled_object_takes_the_examples_autoscaling() -> None:
    parts = _keda_model("bench-autoscale-keda", "http://127.0.0.1:1")
    assert "autoscaling" not in parts["model"]["spec"]
    spec = parts["scaled_object"]["spec"]
    assert spec["triggers"][0]["metadata"]["threshold"] == "20"  # examples/autoscaling.yaml's queueTimeMilliseconds
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 3)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
        "scaleDown": {"stabilizationWindowSeconds": 20}}
    assert 'namespace="bench-autoscale-keda",model="autoscaled"' in spec["triggers"][0]["metadata"]["query"]


@pytest.mark.parametrize(("status", "reading"), [
    ({"currentMetrics": [{"type": "Object", "object": {"current": {"value": "27821m"}}}]}, 27.821),
    ({"currentMetrics": [{"type": "External", "external": {"current": {"value": "31"}}}]}, 31.0),
    ({"currentMetrics": [{"type": "External", "external": {"current": {"averageValue": "1500m"}}}]}, 1.5),
    ({"currentMetrics": [{"type": "Resource", "resource": {"current": {"averageValue": "46m",
                                                                       "averageUtilization": 23}}}]}, 23.0),
    ({}, None),
    ({"currentMetrics": [{"type": "Object", "object": {}}]}, None),
])
def test_hpa_reading(status: dict, reading: float | None) -> None:
    assert _hpa_reading(status) == reading
