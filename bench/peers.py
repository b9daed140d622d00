"""The peers' own settings that the benchmarks run as baselines, copied with their values and named with their source.

Each entry is what a user of that peer gets by default for a tritonserver container: the probes of Triton's own
Helm charts, and the readiness probe KServe adds to a predictor that sets none. The port names are the charts'
own (`http` is tritonserver's HTTP port, 8000); KServe's probe goes to the container's first port, which is
tritonserver's HTTP port in KServe's runtime (`--http-port=8080`), 8000 here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Peer:
    """A baseline: a short label, where its values come from, and the probes it puts on the tritonserver container."""

    label: str
    source: str
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)


def _http(path: str, **values: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, **values}


# deploy/gcp, deploy/aws and deploy/fleetcommand carry the same two probes (the Kubernetes defaults fill the rest).
TRITON_CHART = Peer(
    label="Triton's Helm charts (deploy/gcp, deploy/aws, deploy/fleetcommand)",
    source="triton-inference-server/server deploy/gcp/templates/deployment.yaml (3adf4a4e), "
           "deploy/aws/templates/deployment.yaml (332b9310), deploy/fleetcommand/templates/deployment.yaml (0ce92537)",
    probes={
        "livenessProbe": _http("/v2/health/live"),
        "readinessProbe": _http("/v2/health/ready", initialDelaySeconds=5, periodSeconds=5),
    },
)

# deploy/k8s-onprem, the chart with the queue-time autoscaling: its startup probe holds the readiness probe back.
TRITON_ONPREM_CHART = Peer(
    label="Triton's k8s-onprem Helm chart",
    source="triton-inference-server/server deploy/k8s-onprem/templates/deployment.yaml (0b470719)",
    probes={
        "livenessProbe": _http("/v2/health/live", initialDelaySeconds=15, failureThreshold=3, periodSeconds=10),
        "readinessProbe": _http("/v2/health/ready", initialDelaySeconds=5, periodSeconds=5, failureThreshold=3),
        "startupProbe": _http("/v2/health/ready", periodSeconds=10, failureThreshold=30),
    },
)

# KServe's raw-deployment reconciler gives the predictor container this probe when it has none
# (kserve-tritonserver's ClusterServingRuntime sets none).
KSERVE_DEFAULT = Peer(
    label="KServe's default readiness probe (raw deployment)",
    source="kserve/kserve pkg/controller/v1beta1/inferenceservice/reconcilers/deployment/deployment_reconciler.go "
           "(aaac4e29), config/runtimes/kserve-tritonserver.yaml",
    probes={
        "readinessProbe": {"tcpSocket": {"port": "http"}, "timeoutSeconds": 1, "periodSeconds": 10,
                           "successThreshold": 1, "failureThreshold": 3},
    },
)


def describe(probe: dict[str, Any] | None) -> str:
    """A probe in one line: what it asks and its timing values, e.g. `httpGet /v2/health/ready, initialDelaySeconds
    5, periodSeconds 5`."""
    if not probe:
        return "none"
    if "httpGet" in probe:
        what = f"httpGet {probe['httpGet'].get('path', '/')}"
    elif "tcpSocket" in probe:
        what = f"tcpSocket {probe['tcpSocket'].get('port')}"
    else:
        what = next((k for k in probe if k in ("grpc", "exec")), "?")
    timing = ", ".join(f"{k} {v}" for k, v in probe.items() if isinstance(v, int))
    return f"{what}, {timing}" if timing else what


def describe_all(peer: Peer) -> str:
    return "; ".join(f"{kind} {describe(p)}" for kind, p in peer.probes.items())
