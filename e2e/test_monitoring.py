"""The chart's alerts and dashboard (issue 43) against the real Prometheus (built from its Go module, as the autoscale
benchmark's) scraping the session's real operator (the chart's, two pods) and a real Triton replica.

The rules are the chart's own render (`helm template` with monitoring.prometheusRule on, every `for` at 0s so a
condition fires at the next evaluation): Prometheus refuses to start on a rule it cannot parse, and reports each
rule's health after evaluating it. A TritonModel whose model cannot load makes TritonReplicaGateFailing fire (reason
ModelLoadFailed), while the operator's up and led alerts stay quiet; every dashboard query evaluates, and those about a
serving model and the operator return data. Waited on by condition, no sleeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.promkeda import Prometheus
from e2e.cluster import session_root
from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import (
    RELEASE_NAMESPACE,
    ChartOperator,
    add_sub,
    apply,
    gate,
    is_model_ready,
    model_pods,
    one_ready_pod,
    wait_model,
)
from e2e.traffic import infer_add_sub
from tests.chart_render import helm_or_reason, render
from tests.monitoring import dashboard, panel_queries, rule_groups

pytestmark = pytest.mark.cluster

OPERATOR_JOB = "triton-operator-e2e"
FAILS = "e2e-monitoring: this model cannot load"
#: The panels that must show data with one serving model and the operator (the others need a pool, the response cache
#: or heals, which this test does not make).
MUST_HAVE_DATA = {"Request rate", "Request latency (mean)", "Queue time (mean)", "Batch size (mean)",
                  "Replicas scraped", "Reconciles", "API writes", "Gate latency", "Gate transitions"}


def _chart_monitoring() -> list[dict[str, Any]]:
    helm, reason = helm_or_reason()
    assert helm is not None, reason
    fors = {f"monitoring.prometheusRule.for.{k}": "0s"
            for k in ("operatorDown", "noLeader", "reconcileErrors", "queueTime", "poolRoundErrors")}
    return render(helm, **{"monitoring.prometheusRule.enabled": True, "monitoring.dashboard.enabled": True,
                           "monitoring.prometheusRule.operatorJob": OPERATOR_JOB, **fors})


def _config(rules: Path, operator_pods: list[dict], triton: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Static targets labelled as the chart's ServiceMonitor and PodMonitor label theirs: the operator's pods under
    the rules' job in the release's namespace; Triton replicas (ip, namespace, TritonModel) under job `triton`."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": OPERATOR_JOB, "static_configs": [{
                "targets": [f"{p['status']['podIP']}:8081" for p in operator_pods],
                "labels": {"namespace": RELEASE_NAMESPACE}}]},
            {"job_name": "triton", "static_configs": [
                {"targets": [f"{ip}:8002"], "labels": {"namespace": ns, "tritonmodel": model}} for ip, ns, model in triton]},
        ],
    }


def _firing(prom: Prometheus) -> dict[str, list[dict[str, str]]]:
    doc = prom.get("/api/v1/alerts") or {}
    out: dict[str, list[dict[str, str]]] = {}
    for alert in (doc.get("data") or {}).get("alerts", []):
        if alert["state"] == "firing":
            out.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
    return out


def _result(prom: Prometheus, expr: str) -> list[Any] | str:
    """An instant query's series, or its error."""
    doc = prom.get("/api/v1/query", query=expr)
    if not isinstance(doc, dict) or doc.get("status") != "success":
        return f"error: {doc}"
    return list(doc["data"]["result"])


def test_alerts_fire_on_a_model_that_cannot_load_and_the_dashboard_reads_real_metrics(
        kube: Kube, kubeconfig: Path, namespace: str, operator: ChartOperator) -> None:
    docs = _chart_monitoring()
    good = add_sub()
    apply(kubeconfig, namespace, good)
    broken = add_sub("broken")
    model_py = broken["spec"]["source"]["inline"]["model.py"]
    broken["spec"]["source"]["inline"]["model.py"] = model_py.replace(
        "class TritonPythonModel:\n",
        f"class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError({FAILS!r})\n\n", 1)
    assert broken["spec"]["source"]["inline"]["model.py"] != model_py
    wait_model(kube, namespace, "add-sub", is_model_ready, "Ready", 180)
    ip = one_ready_pod(kube, namespace, "add-sub")["status"]["podIP"]

    state = session_root() / ".cluster" / "monitoring" / namespace
    state.mkdir(parents=True, exist_ok=True)
    rules = state / "rules.yml"
    rules.write_text(yaml.safe_dump(rule_groups(docs), sort_keys=False))
    prom = Prometheus(state, state, kubeconfig, 1.0)
    prom.config = _config(rules, operator.pods(), [(ip, namespace, "add-sub")])
    prom.start()
    try:
        # Every rule the chart ships loaded and evaluated without error.
        def evaluated() -> list[dict[str, Any]] | None:
            groups = ((prom.get("/api/v1/rules") or {}).get("data") or {}).get("groups", [])
            found = [r for g in groups for r in g["rules"]]
            never = [r for r in found if r.get("lastEvaluation", "0001").startswith("0001")]  # Go's zero time
            return found if found and not never else None
        loaded = wait_for("every rule evaluated once", evaluated, 60, 0.5)
        shipped = {r["alert"] for g in rule_groups(docs)["groups"] for r in g["rules"]}
        assert {r["name"] for r in loaded} == shipped
        assert all(r["health"] == "ok" for r in loaded), [(r["name"], r.get("lastError")) for r in loaded]

        # Traffic for the dashboard, before the broken model's replica fails its gate.
        for _ in range(8):
            infer_add_sub(ip)
        apply(kubeconfig, namespace, broken)
        wait_for("the broken model's replica gated False with ModelLoadFailed", lambda: any(
            gate(p).get("reason") == "ModelLoadFailed" for p in model_pods(kube, namespace, "broken")), 180)
        def gate_failing() -> dict[str, list[dict[str, str]]] | None:
            firing = _firing(prom)
            return firing if any(a.get("reason") == "ModelLoadFailed"
                                 for a in firing.get("TritonReplicaGateFailing", [])) else None
        firing = wait_for("TritonReplicaGateFailing firing", gate_failing, 120, 0.5)
        # The operator is scraped up and led (its leader renews the Lease every second): those stay quiet.
        assert "TritonOperatorDown" not in firing and "TritonOperatorNoLeader" not in firing, firing

        # Every dashboard query evaluates; those about a serving model and the operator return data.
        board = dashboard(docs)
        def data_for_all() -> dict[str, list[Any] | str] | None:
            results = {f"{title}: {expr}": _result(prom, expr) for title, expr in panel_queries(board)}
            errors = {k: v for k, v in results.items() if isinstance(v, str)}
            assert not errors, errors
            empty = {k.split(": ", 1)[0] for k, v in results.items() if not v}
            return results if not (MUST_HAVE_DATA & empty) else None
        wait_for("the dashboard's model and operator panels show data", data_for_all, 60, 1.0)
    finally:
        prom.stop()
