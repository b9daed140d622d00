"""What the chart's monitoring objects query (issue 43): the PromQL of the PrometheusRule's alerts and of the Grafana
dashboard's panels, the metric names an expression reads, and the names that exist (the operator's registry, Triton's).

Pure: the tests render the chart with helm and pass the documents in. Triton's names are listed here, and a test
against a real tritonserver (tests/test_monitoring_triton.py) reads them from its /metrics, so the list cannot drift.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

#: The Triton metric names the alerts and the dashboard read (the sample names of Triton's /metrics, port 8002).
TRITON_METRICS = frozenset({
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count", "nv_inference_exec_count",
    "nv_inference_request_duration_us", "nv_inference_queue_duration_us", "nv_inference_pending_request_count",
    "nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model",
})
#: Series Prometheus makes itself for every target (the replicas' and the operator's scrape health).
SCRAPE_SERIES = frozenset({"up"})

#: The dashboard's Grafana variables, replaced by values that select everything, so an expression is plain PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*", "$tritonmodel": ".*"}

_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                       "offset", "inf", "nan", "atan2"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, keywords, label names (in
    matchers, grouping lists) or durations. Enough for the expressions the chart ships, which a real Prometheus
    also parses and evaluates (tests/test_monitoring_prometheus.py)."""
    text = _STRING.sub('""', expr)
    text = _LABEL_LIST.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def operator_metric_names() -> frozenset[str]:
    """The sample names the operator's /metrics can serve: every family its three metrics modules register, with the
    suffixes of its type (a counter's `_total`, a histogram's `_bucket`, `_sum`, `_count`)."""
    from prometheus_client import REGISTRY

    from triton_operator.controller import metrics as _controller  # noqa: F401 - registers the families
    from triton_operator.platform import metrics as _platform  # noqa: F401
    from triton_operator.servers import metrics as _servers  # noqa: F401

    names: set[str] = set()
    for family in REGISTRY.collect():
        if not family.name.startswith("triton_operator_"):
            continue
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}[family.type]
        names.update(family.name + s for s in suffixes)
    return frozenset(names)


def alert_rules(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rule of the rendered PrometheusRule(s), each with its group's name under `group`."""
    return [{**rule, "group": group["name"]} for doc in docs if doc["kind"] == "PrometheusRule"
            for group in doc["spec"]["groups"] for rule in group["rules"]]


def rule_groups(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The rendered PrometheusRule's groups as a Prometheus rule file (`rule_files:`), what the Prometheus Operator
    hands its Prometheus."""
    return {"groups": [g for doc in docs if doc["kind"] == "PrometheusRule" for g in doc["spec"]["groups"]]}


def dashboard(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The Grafana dashboard the chart's ConfigMap carries."""
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "triton-operator.json" in d.get("data", {})]
    return dict(json.loads(cm["data"]["triton-operator.json"]))


def panel_queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL with the Grafana variables replaced) of every query of every panel."""
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], plain(target["expr"])


def plain(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr
