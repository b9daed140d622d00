"""The chart's monitoring objects (issue 43), rendered by `helm template` and checked without a cluster: each off by
default and on with one value; the PodMonitor selects the replicas the operator renders and scrapes their Triton port;
every alert and every dashboard query names only metrics that exist (the operator's registry, Triton's names); the
values they take are in values.schema.json. A real Prometheus loads and evaluates them in
tests/test_monitoring_prometheus.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.chart_render import CHART, RELEASE, RELEASE_NS, kinds, one, render, render_error, run, sets
from tests.monitoring import (
    SCRAPE_SERIES,
    TRITON_METRICS,
    alert_rules,
    dashboard,
    metric_names,
    operator_metric_names,
    panel_queries,
)
from triton_operator.api.kinds import LABEL_MODEL
from triton_operator.api.pool import LABEL_POOL
from triton_operator.files import load_paths
from triton_operator.render.kubernetes import render_children
from triton_operator.render.modelconfig import render_repository
from triton_operator.render.pool import render_pool_deployment
from triton_operator.validate import check_documents

ALL_ON = {"monitoring.podMonitor.enabled": True, "monitoring.prometheusRule.enabled": True,
          "monitoring.dashboard.enabled": True, "metrics.serviceMonitor.enabled": True}
OPERATOR_JOB = f"{RELEASE}-triton-operator-metrics"
EXAMPLES = CHART.parent.parent / "examples"


def _example(name: str) -> Any:
    loaded = check_documents(load_paths([EXAMPLES / name]))
    assert not loaded.errors, [str(e) for e in loaded.errors]
    return loaded


def _known() -> frozenset[str]:
    return operator_metric_names() | TRITON_METRICS | SCRAPE_SERIES


def _meta_label(label: str) -> str:
    """The name Prometheus's Kubernetes discovery gives a pod label (`__meta_kubernetes_pod_label_<sanitized>`)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def test_nothing_is_rendered_by_default(helm: str) -> None:
    docs = render(helm)
    assert not kinds(docs, "PodMonitor") and not kinds(docs, "PrometheusRule")
    assert not [d for d in kinds(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"].get("labels", {})]


def test_helm_lint_is_clean_with_all_of_it_on(helm: str) -> None:
    proc = run([helm, "lint", "--strict", str(CHART), *sets(ALL_ON)])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "[WARNING]" not in out and "[ERROR]" not in out, out


def test_the_pod_monitor_selects_the_replicas_the_operator_renders_and_their_triton_port(helm: str) -> None:
    monitor = one(render(helm, **{"monitoring.podMonitor.enabled": True}), "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == RELEASE_NS
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    selector = monitor["spec"]["selector"]["matchLabels"]
    ((_, model),) = _example("response-cache.yaml").models
    deployment = next(c for c in render_children(model, render_repository([model]), "uid", "team-a")
                      if c["kind"] == "Deployment")
    template = deployment["spec"]["template"]
    assert selector.items() <= template["metadata"]["labels"].items()
    triton = next(c for c in template["spec"]["containers"] if c["name"] == "tritonserver")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    assert ports[endpoint["port"]] == 8002 and endpoint["path"] == "/metrics"
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert relabel == {"tritonmodel": [_meta_label(LABEL_MODEL)], "tritonpool": [_meta_label(LABEL_POOL)]}
    assert template["metadata"]["labels"][LABEL_MODEL] == model.name


def test_the_pod_monitor_selects_pool_replicas_too(helm: str) -> None:
    monitor = one(render(helm, **{"monitoring.podMonitor.enabled": True}), "PodMonitor")
    ((_, pool),) = _example("pool.yaml").pools
    labels = render_pool_deployment(pool, "uid", "team-a")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels[LABEL_POOL] == pool.name


def test_the_pod_monitor_watches_only_the_watched_namespaces(helm: str) -> None:
    monitor = one(render(helm, **{"monitoring.podMonitor.enabled": True, "watch.namespaces": ["team-b", "team-a"]}),
                  "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_every_alert_names_only_metrics_that_exist(helm: str) -> None:
    rules = alert_rules(render(helm, **ALL_ON))
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) >= 11, names
    known = _known()
    for rule in rules:
        used = metric_names(rule["expr"])
        assert used, rule["expr"]
        assert used <= known, f"{rule['alert']}: no such metric {sorted(used - known)} in {rule['expr']}"
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_operator_alerts_select_the_service_monitors_job_or_the_one_given(helm: str) -> None:
    docs = render(helm, **ALL_ON)
    service = next(d for d in kinds(docs, "Service") if d["metadata"]["name"].endswith("-metrics"))
    assert service["metadata"]["name"] == OPERATOR_JOB  # a ServiceMonitor's job label is its Service's name
    operator_rules = [r for r in alert_rules(docs) if "triton_operator_" in r["expr"] or "up{" in r["expr"]]
    assert operator_rules
    for rule in operator_rules:
        assert f'job="{OPERATOR_JOB}", namespace="{RELEASE_NS}"' in rule["expr"], rule["expr"]
    custom = alert_rules(render(helm, **{**ALL_ON, "monitoring.prometheusRule.operatorJob": "ops/triton"}))
    assert all('job="ops/triton"' in r["expr"] for r in custom if "triton_operator_" in r["expr"])


def test_the_thresholds_are_values(helm: str) -> None:
    rules = {r["alert"]: r for r in alert_rules(render(helm, **{
        **ALL_ON, "monitoring.prometheusRule.queueTimeMilliseconds": 250, "monitoring.prometheusRule.healsPerHour": 7,
        "monitoring.prometheusRule.for.queueTime": "3m", "monitoring.prometheusRule.for.modelNotReady": "4m",
        "monitoring.prometheusRule.for.poolShortOfCapacity": "6m"}))}
    assert "/ 1000 > 250) unless on (namespace, tritonmodel)" in rules["TritonQueueTimeHigh"]["expr"]
    assert rules["TritonQueueTimeHigh"]["for"] == "3m"
    assert rules["TritonReplicaHealsRepeating"]["expr"].rstrip().endswith("> 7")
    assert rules["TritonModelNotReady"]["for"] == "4m" and rules["TritonPoolShortOfCapacity"]["for"] == "6m"


@pytest.mark.parametrize(("alert", "gauge", "by"), [
    ("TritonModelNotReady", "triton_operator_model_ready", "tritonmodel"),
    ("TritonPoolShortOfCapacity", "triton_operator_pool_unplaced_bytes", "tritonpool"),
    ("TritonQueueTimeHigh", "triton_operator_model_queue_time_target_seconds", "tritonmodel"),
])
def test_the_alerts_on_the_operators_object_gauges_name_the_objects_namespace_namespace(
        helm: str, alert: str, gauge: str, by: str) -> None:
    """The gauges label an object's namespace `object_namespace` (a scrape sets `namespace`: the operator's own); the
    alert relabels it `namespace`, as the replicas' series have it, and keeps one series per object (`max by`)."""
    (rule,) = [r for r in alert_rules(render(helm, **ALL_ON)) if r["alert"] == alert]
    selected = f'{gauge}{{job="{OPERATOR_JOB}", namespace="{RELEASE_NS}"}}'
    assert f'max by (namespace, {by}) (label_replace({selected}, "namespace", "$1", "object_namespace", "(.+)"))' \
        in rule["expr"], rule["expr"]
    from triton_operator.controller import metrics
    labels = {g._name: g._labelnames for g in (metrics.MODEL_READY, metrics.MODEL_QUEUE_TARGET, metrics.POOL_UNPLACED)}
    assert labels[gauge] == ("object_namespace", by)


@pytest.mark.parametrize(("values", "absent"), [
    ({"leaderElection.enabled": False}, {"TritonOperatorNoLeader"}),
    ({"replicaCount": 0}, {"TritonOperatorNoLeader", "TritonOperatorDown"}),  # paused: nothing is meant to run
])
def test_alerts_about_what_is_not_deployed_are_left_out(helm: str, values: dict[str, Any], absent: set[str]) -> None:
    everything = {r["alert"] for r in alert_rules(render(helm, **ALL_ON))}
    rendered = {r["alert"] for r in alert_rules(render(helm, **ALL_ON, **values))}
    assert absent <= everything and rendered == everything - absent


def test_the_dashboard_is_a_sidecar_configmap_whose_queries_name_only_metrics_that_exist(helm: str) -> None:
    docs = render(helm, **{"monitoring.dashboard.enabled": True})
    (cm,) = [d for d in kinds(docs, "ConfigMap") if "triton-operator.json" in d.get("data", {})]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == RELEASE_NS
    board = dashboard(docs)
    assert board["uid"] == "triton-operator"
    queries = list(panel_queries(board))
    assert len(queries) >= 20
    known = _known()
    used: set[str] = set()
    for title, expr in queries:
        names = metric_names(expr)
        assert names, (title, expr)
        assert names <= known, f"panel {title!r}: no such metric {sorted(names - known)} in {expr}"
        assert "$" not in expr, f"panel {title!r}: a Grafana variable left in {expr}"
        used |= names
    # What issue 43 asks the dashboard to show, by the metric that shows it.
    for metric in ("nv_inference_request_success", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                   "nv_inference_exec_count", "nv_cache_num_hits_per_model", "triton_operator_reconciles_total",
                   "triton_operator_api_writes_total", "triton_operator_heals_total",
                   "triton_operator_ready_to_gate_seconds_bucket", "triton_operator_pool_loads_total",
                   "triton_operator_model_ready", "triton_operator_pool_unplaced_bytes"):
        assert metric in used, metric
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def test_the_dashboard_goes_where_the_sidecar_looks(helm: str) -> None:
    docs = render(helm, **{"monitoring.dashboard.enabled": True, "monitoring.dashboard.namespace": "monitoring",
                           # Helm merges maps: a null drops the default label
                           "monitoring.dashboard.labels": {"dashboards": "triton", "grafana_dashboard": None},
                           "monitoring.dashboard.annotations": {"grafana_folder": "Triton"}})
    (cm,) = [d for d in kinds(docs, "ConfigMap") if "triton-operator.json" in d.get("data", {})]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["dashboards"] == "triton" and "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Triton"}


def test_the_metric_name_reader_skips_functions_labels_and_durations() -> None:
    expr = ('(sum by (reason) (increase(triton_operator_heals_total{job="a", reason=~"x|y"}[10m])) or vector(0)) == 0 '
            'and on() sum(up{job="a"}) > 0 or label_replace(histogram_quantile(0.9, rate(b_bucket[1m])), "v", "w", "", "")'
            ' / ignoring(pod) group_left c:recorded offset 5m > 1e3')
    assert metric_names(expr) == {"triton_operator_heals_total", "up", "b_bucket", "c:recorded"}


@pytest.mark.parametrize(("values", "message"), [
    ({"monitoring.podMonitor.enabled": "yes"}, "/monitoring/podMonitor/enabled"),
    ({"monitoring.prometheusRule.for.queueTime": "1.5m"}, "/monitoring/prometheusRule/for/queueTime"),
    ({"monitoring.prometheusRule.for.modelNotReady": "soon"}, "/monitoring/prometheusRule/for/modelNotReady"),
    ({"monitoring.prometheusRule.for.poolShortOfCapacity": 5}, "/monitoring/prometheusRule/for/poolShortOfCapacity"),
    ({"monitoring.prometheusRule.queueTimeMilliseconds": 0}, "/monitoring/prometheusRule/queueTimeMilliseconds"),
    ({"monitoring.prometheusRule.healsPerHour": -1}, "/monitoring/prometheusRule/healsPerHour"),
    ({"monitoring.prometheusRule.operatorJob": 'a"b'}, "/monitoring/prometheusRule/operatorJob"),
    ({"monitoring.dashboard.namespace": "Monitoring"}, "/monitoring/dashboard/namespace"),
    ({"monitoring.dashboard.labels": {"grafana_dashboard": 1}}, "/monitoring/dashboard/labels/grafana_dashboard"),
    ({"monitoring.serviceMonitor": {}}, "additional properties"),
])
def test_values_schema_rejects_bad_monitoring_values(helm: str, values: dict[str, Any], message: str) -> None:
    err = render_error(helm, **values)
    assert "values don't meet the specifications of the schema" in err and message in err, err
