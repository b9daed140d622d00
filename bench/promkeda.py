"""The autoscale benchmark's peer: Triton's queue time through Prometheus and KEDA's Prometheus scaler, as users set
it up, both built from their Go modules (e2e/toolchain/prometheus, e2e/toolchain/keda) and run as host processes
beside the control plane, as metrics-server is (bench/autoscale.py).

- Prometheus discovers the pods with kubernetes_sd (role pod, through the cluster's kubeconfig) and scrapes the
  container port named `metrics` (Triton's 8002 /metrics): what a PodMonitor of the Prometheus operator, or a
  plain kubernetes_sd job, does. Not file_sd written by the bench: then the bench, not Prometheus, would decide when
  an added replica is scraped, and discovery's delay is part of what this setup pays.
- KEDA: its CRDs from the module (config/crd/bases), its operator and its metrics adapter, deployed the way its own
  manifests (config/manager, config/metrics-server) do: namespace `keda`, the operator with
  `--enable-cert-rotation` (it makes the Secret `kedaorg-certs` and patches the APIService's caBundle), the
  adapter serving external.metrics.k8s.io behind the Service `keda-metrics-apiserver` with the Secret's files.
  The kubelet's part of that, for host processes: the Secret is written to the certificates directory (its
  volume), and the operator is started again after it exits on making the certificates (its restartPolicy).
  The admission webhooks are not run (`--enable-webhook-patching=false`).
- A ScaledObject per model: a `prometheus` trigger on `rate(nv_inference_queue_duration_us)` over
  `rate(nv_inference_request_success)` (milliseconds), metricType Value, so that its HPA compares the mean as the
  operator's HPA does (desired = ready replicas x measured / target).

The renderers (`prometheus_config`, `queue_time_query`, `scaled_object`) are pure, tested in tests/.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import free_port
from e2e.kube import ApiError, Kube, wait_for
from triton_operator.api.kinds import LABEL_MODEL

TOOLCHAIN = Path(__file__).resolve().parent.parent / "e2e" / "toolchain"
PROMETHEUS_SCRIPT = TOOLCHAIN / "prometheus" / "build.sh"
KEDA_SCRIPT = TOOLCHAIN / "keda" / "build.sh"

#: Where KEDA's manifests put it, and the names its certificates are made for.
KEDA_NAMESPACE = "keda"
KEDA_SECRET = "kedaorg-certs"  # noqa: S105 - a Secret's name
KEDA_OPERATOR_SERVICE = "keda-operator"
KEDA_ADAPTER_SERVICE = "keda-metrics-apiserver"
EXTERNAL_APISERVICE = "v1beta1.external.metrics.k8s.io"
SCALED_OBJECT_API = "keda.sh/v1alpha1"
#: The container port of Triton's metrics in the pods the operator renders (render/pod.py).
METRICS_PORT_NAME = "metrics"
#: The label the operator puts on a model's pods, as Prometheus's pod discovery names it (unsupported characters
#: become underscores).
MODEL_LABEL_META = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", LABEL_MODEL)


def build_prometheus() -> Path:
    """The Prometheus binary (built once, cached by the pins)."""
    out = subprocess.run(["bash", str(PROMETHEUS_SCRIPT)], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def build_keda() -> Path:
    """The directory of keda-operator, keda-adapter and crds/ (built once, cached by the pins)."""
    out = subprocess.run(["bash", str(KEDA_SCRIPT)], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


# -- pure renderers ------------------------------------------------------------------------------


def prometheus_config(kubeconfig: str, scrape_seconds: float, namespaces: list[str] | None = None) -> dict[str, Any]:
    """Prometheus's configuration: one job discovering pods through the API server and scraping each one's
    container port named `metrics` (Triton's), with the namespace and pod as labels (what a PodMonitor adds)."""
    sd: dict[str, Any] = {"role": "pod", "kubeconfig_file": kubeconfig}
    if namespaces:
        sd["namespaces"] = {"names": list(namespaces)}
    interval = f"{scrape_seconds:g}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [{
            "job_name": "triton",
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "metrics_path": "/metrics",
            "kubernetes_sd_configs": [sd],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": METRICS_PORT_NAME,
                 "action": "keep"},
                {"source_labels": [MODEL_LABEL_META], "regex": ".+", "action": "keep"},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            ],
        }],
    }


def queue_time_query(namespace: str, model: str, window_seconds: float) -> str:
    """Mean queue time per request over the window, in milliseconds, over every scraped replica of the model."""
    sel = f'{{namespace="{namespace}",model="{model}"}}'
    w = f"{window_seconds:g}s"
    return (f"sum(rate(nv_inference_queue_duration_us{sel}[{w}])) / sum(rate(nv_inference_request_success{sel}[{w}]))"
            " / 1000")


def scaled_object(name: str, namespace: str, target: dict[str, str], *, server: str, query: str, threshold: float,
                  min_replicas: int, max_replicas: int, behavior: dict[str, Any] | None = None,
                  polling_seconds: int | None = None) -> dict[str, Any]:
    """A ScaledObject scaling `target` (apiVersion, kind, name: anything with a scale subresource) on one Prometheus
    query, compared as a Value (the HPA's desired = ready replicas x value / threshold)."""
    spec: dict[str, Any] = {
        "scaleTargetRef": dict(target),
        "minReplicaCount": min_replicas,
        "maxReplicaCount": max_replicas,
        "triggers": [{"type": "prometheus", "metricType": "Value", "metadata": {
            "serverAddress": server, "query": query, "threshold": f"{threshold:g}"}}],
    }
    if polling_seconds is not None:
        spec["pollingInterval"] = polling_seconds
    if behavior is not None:
        spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": copy.deepcopy(behavior)}}
    return {"apiVersion": SCALED_OBJECT_API, "kind": "ScaledObject",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def keda_hpa_name(scaled_object_name: str) -> str:
    """The HPA KEDA creates for a ScaledObject without horizontalPodAutoscalerConfig.name."""
    return f"keda-hpa-{scaled_object_name}"


# -- host processes ------------------------------------------------------------------------------


class HostProcess:
    """One binary run on the host, its output appended to a log file."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv, self.log_path, self.env = argv, log_path, env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> HostProcess:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(self.env or {})})
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Prometheus:
    """Prometheus on 127.0.0.1, scraping the cluster's Triton pods (see `prometheus_config`)."""

    def __init__(self, state: Path, logs: Path, kubeconfig: Path, scrape_seconds: float) -> None:
        self.dir = state / "prometheus"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = prometheus_config(str(kubeconfig), scrape_seconds)
        self.proc = HostProcess([], logs / "prometheus.log")

    def start(self) -> Prometheus:
        binary = build_prometheus()
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        config = self.dir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.proc.argv = [str(binary), f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
                          "--storage.tsdb.retention.time=2h", f"--web.listen-address=127.0.0.1:{self.port}",
                          "--log.level=info"]
        self.proc.start()
        wait_for("Prometheus ready", self._ready, 60, 0.5)
        return self

    def _ready(self) -> bool:
        if not self.proc.running():
            raise RuntimeError(f"Prometheus exited:\n{self.proc.tail()}")
        return self.get("/-/ready") is not None

    def get(self, path: str, **params: str) -> Any:
        import urllib.error
        import urllib.parse
        import urllib.request

        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - our own Prometheus on loopback
                body = r.read()
        except (urllib.error.URLError, OSError):
            return None
        try:
            return json.loads(body)
        except ValueError:
            return body.decode(errors="replace")

    def query(self, promql: str) -> float | None:
        """An instant query's one value (None: no sample, or not a number)."""
        doc = self.get("/api/v1/query", query=promql)
        try:
            value = float(doc["data"]["result"][0]["value"][1])
        except (TypeError, KeyError, IndexError, ValueError):
            return None
        return None if math.isnan(value) else value  # NaN: no request in the window

    def targets_up(self, namespace: str) -> int:
        doc = self.get("/api/v1/targets", state="active") or {}
        return sum(1 for t in (doc.get("data") or {}).get("activeTargets") or ()
                   if t.get("labels", {}).get("namespace") == namespace and t.get("health") == "up")

    def stop(self) -> None:
        self.proc.stop()


class Keda:
    """KEDA's operator and metrics adapter as host processes, deployed as its manifests deploy them (see the module
    docstring), the adapter reached by the API server through the Service keda-metrics-apiserver, whose endpoint is
    the node's address (as metrics-server's is)."""

    def __init__(self, state: Path, logs: Path, kubeconfig: Path, kube: Kube, node_address: str) -> None:
        self.kube, self.kubeconfig, self.address = kube, kubeconfig, node_address
        self.certs = state / "keda-certs"
        self.grpc_port, self.adapter_port = free_port(), free_port()
        self.env = {"KUBECONFIG": str(kubeconfig), "WATCH_NAMESPACE": "", "POD_NAMESPACE": KEDA_NAMESPACE,
                    "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE}
        self.operator = HostProcess([], logs / "keda-operator.log", self.env)
        self.adapter = HostProcess([], logs / "keda-adapter.log", self.env)
        self.operator_starts = 0
        self.crds: list[str] = []

    def start(self) -> Keda:
        home = build_keda()
        self._install_crds(home / "crds")
        self._install_api_objects()
        self.certs.mkdir(parents=True, exist_ok=True)
        self.operator.argv = [
            str(home / "keda-operator"), "--leader-elect", "--zap-log-level=info", "--zap-encoder=console",
            "--enable-cert-rotation=true", "--enable-webhook-patching=false", f"--cert-dir={self.certs}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}", f"--health-probe-bind-address=127.0.0.1:{free_port()}",
            f"--metrics-service-bind-address=127.0.0.1:{self.grpc_port}"]
        self.operator.start()
        self.operator_starts = 1
        # The operator makes the Secret, then exits so that its pod restarts with the Secret mounted: mount it
        # (write its files), and start it again once it has exited (or at once if it did not need to).
        secret = wait_for("KEDA's certificates Secret", self._secret_data, 180, 0.5)
        for key, value in secret.items():
            (self.certs / key).write_bytes(base64.b64decode(value))
        wait_for("KEDA's operator to exit after making its certificates, or to keep running",
                 lambda: not self.operator.running() or self._serving(), 60, 0.5)
        if not self.operator.running():
            self.operator.start()
            self.operator_starts += 1
        wait_for("KEDA's operator serving its metrics service", self._serving, 120, 0.5)
        self.adapter.argv = [
            str(home / "keda-adapter"), f"--secure-port={self.adapter_port}", f"--bind-address={self.address}",
            f"--cert-dir={self.certs}", f"--tls-cert-file={self.certs / 'tls.crt'}",
            f"--tls-private-key-file={self.certs / 'tls.key'}", f"--client-ca-file={self.certs / 'ca.crt'}",
            f"--lister-kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}", f"--port={free_port()}",
            f"--metrics-service-address=127.0.0.1:{self.grpc_port}",
            f"--metrics-service-grpc-authority={KEDA_OPERATOR_SERVICE}.{KEDA_NAMESPACE}.svc.cluster.local",
            "--zap-log-level=info", "--zap-encoder=console"]
        self.adapter.start()
        wait_for(f"APIService {EXTERNAL_APISERVICE} Available", self._available, 180, 1)
        return self

    def _install_crds(self, crds: Path) -> None:
        for f in sorted(crds.glob("*.yaml")):
            for doc in yaml.safe_load_all(f.read_text()):
                if not doc:
                    continue
                self.kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
                self.crds.append(doc["metadata"]["name"])

        def established() -> bool:
            for name in self.crds:
                crd = self.kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                if not any(c["type"] == "Established" and c["status"] == "True"
                           for c in (crd.get("status") or {}).get("conditions") or ()):
                    return False
            return True

        wait_for("KEDA's CRDs Established", established, 60, 0.5)

    def _install_api_objects(self) -> None:
        self.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEDA_NAMESPACE}})
        meta = {"name": KEDA_ADAPTER_SERVICE, "namespace": KEDA_NAMESPACE}
        self.kube.create({"apiVersion": "v1", "kind": "Service", "metadata": meta,
                          "spec": {"ports": [{"name": "https", "port": 443, "targetPort": self.adapter_port}]}})
        self.kube.create({"apiVersion": "v1", "kind": "Endpoints", "metadata": meta, "subsets": [
            {"addresses": [{"ip": self.address}], "ports": [{"name": "https", "port": self.adapter_port}]}]})
        # KEDA's config/metrics-server/api_service.yaml; the operator's certificate rotation fills in caBundle.
        self.kube.create({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": EXTERNAL_APISERVICE, "labels": {"app.kubernetes.io/part-of": "keda-operator"}},
            "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                     "versionPriority": 100, "service": {"namespace": KEDA_NAMESPACE, "name": KEDA_ADAPTER_SERVICE}}})

    def _secret_data(self) -> dict[str, str] | None:
        if not self.operator.running() and self.operator.proc is not None and self.operator.proc.returncode:
            raise RuntimeError(f"KEDA's operator exited {self.operator.proc.returncode}:\n{self.operator.tail()}")
        try:
            data = self.kube.get("Secret", KEDA_SECRET, KEDA_NAMESPACE).get("data") or {}
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return data if {"ca.crt", "tls.crt", "tls.key"} <= set(data) else None

    def _serving(self) -> bool:
        if not self.operator.running():
            return False
        import socket

        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.grpc_port)) == 0

    def _available(self) -> bool:
        for p in (self.operator, self.adapter):
            if not p.running():
                raise RuntimeError(f"{p.argv[0]} exited:\n{p.tail()}")
        svc = self.kube.get("APIService", EXTERNAL_APISERVICE)
        return any(c["type"] == "Available" and c["status"] == "True"
                   for c in (svc.get("status") or {}).get("conditions") or ())

    def stop(self) -> None:
        self.adapter.stop()
        self.operator.stop()
