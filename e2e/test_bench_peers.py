"""The benchmarks' baselines (bench/peers.py, bench/pods.plain_children) are the peers' settings and nothing of ours:
the plain Deployment carries exactly the peer's probes, no readiness gate, no `probe` container, and the model's own
config (its warm-up sample kept), so a figure against it measures the gate and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from bench.models import checked, example
from bench.peers import KSERVE_DEFAULT, TRITON_CHART, TRITON_ONPREM_CHART, Peer, describe
from bench.pods import plain_children, tritonmodel


def _deployment(peer: Peer, model: str = "add-sub") -> tuple[dict[str, Any], dict[str, Any]]:
    objs = plain_children(checked(tritonmodel(example(model), "plain", "bench")), "plain", "bench", peer.probes)
    by_kind = {o["kind"]: o for o in objs}
    assert sorted(by_kind) == ["ConfigMap", "Deployment", "Service"]
    return by_kind["Deployment"], by_kind["ConfigMap"]


@pytest.mark.parametrize("peer", [TRITON_CHART, TRITON_ONPREM_CHART, KSERVE_DEFAULT], ids=lambda p: p.label)
def test_the_plain_deployment_carries_exactly_the_peers_probes(peer: Peer) -> None:
    dep, _ = _deployment(peer)
    pod = dep["spec"]["template"]["spec"]
    assert "readinessGates" not in pod
    assert [c["name"] for c in pod["containers"]] == ["tritonserver"]
    triton = pod["containers"][0]
    got = {k: triton[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in triton}
    assert got == peer.probes
    # Nor the operator's repository key: its Secret does not exist for a plain Deployment (the pod would never start).
    assert not any("secretKeyRef" in (e.get("valueFrom") or {}) for e in triton.get("env") or ())
    assert not any("restricted" in a for a in triton["args"])
    # The charts' probes name the port `http`: tritonserver's HTTP port in the rendered container.
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in triton["ports"]


def test_the_baseline_keeps_the_models_warm_up() -> None:
    _, cm = _deployment(KSERVE_DEFAULT, "warmup")
    config = next(v for k, v in cm["data"].items() if "config.pbtxt" in k)
    assert "model_warmup {" in config


def test_probes_read_as_the_charts_write_them() -> None:
    assert describe(TRITON_CHART.probes["readinessProbe"]) == (
        "httpGet /v2/health/ready, initialDelaySeconds 5, periodSeconds 5")
    assert describe(KSERVE_DEFAULT.probes["readinessProbe"]).startswith("tcpSocket http, timeoutSeconds 1, periodSeconds 10")
    assert describe(None) == "none"
