"""Benchmark `autoscale`: one load step on examples/autoscaling.yaml, the same model scaled three ways in one run:
by the HPA the operator renders (Triton's queue time through our custom metrics API), by KEDA's Prometheus scaler
on the same queue time through Prometheus (as users set it up: bench/promkeda.py), and by a CPU-utilisation HPA.

Its own cluster, as users run the product: control plane, one real node (containerd + kubelet), kube-proxy, and
the operator installed by its chart (two replicas, in-cluster; it serves custom.metrics.k8s.io through the
APIService the chart installs). Beside the control plane, as host processes, each built from its Go module
(e2e/toolchain/): metrics-server (metrics.k8s.io, for the CPU HPA; its APIService's Service's endpoint is the
node's address), Prometheus (kubernetes_sd pod discovery, scraping each replica's Triton metrics port), and KEDA's
operator and metrics adapter (external.metrics.k8s.io). All three metrics APIs are served at once for the whole
run: our custom metrics API coexists with what clusters already run; the result records each APIService.

Three phases, one model each, one after the other (two cores: side by side at once would measure each other):
1. `queue`: `examples/autoscaling.yaml` as is (1 to 3 replicas, a 20 ms queue-time target, the operator's HPA);
2. `keda`: the same model without spec.autoscaling, and a ScaledObject with a `prometheus` trigger on
   `rate(nv_inference_queue_duration_us)` over `rate(nv_inference_request_success)` in ms, over the same 30 s
   window, metricType Value, threshold 20: the same target compared the same way, with the same replicas and
   behavior;
3. `cpu`: the same model without spec.autoscaling, `server.resources.requests.cpu` 200m, and an autoscaling/v2
   HPA of the TritonModel with a Resource metric: CPU at 50 % of the request, with the same replicas and behavior.

Each phase: one warmed replica; then the step: 6 clients back to back through the Service's ClusterIP (a new HTTP
connection each request, `e2e.load.ServiceLoad`) for `STEP_SECONDS`. Measured: the time from the step's first
request to the HPA's first write of more replicas (the TritonModel's spec.replicas), and to the first request an
added replica answers (Triton's own statistics on the added pods, polled every 0.5 s); the p50 and p95 latency of
the step's answers; failures. A timeline each second (`data.<phase>.timeline`, from 20 s before
the step): replicas asked, warmed, pods Ready, the HPA's desired replicas and the metric it read, the queue time
Triton itself measured since the previous point (all pods), the Prometheus query's value, requests sent and failed
so far; and per second of the step, its answers, failures and latency (`load_series`, `ServiceLoad.series`).
"""

from __future__ import annotations

import copy
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from e2e.cluster import LocalCluster, free_port
from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad
from e2e.operator_fixtures import ChartOperator, is_model_ready, live_pods, load_examples, wait_model
from e2e.traffic import added_answers

from .common import CpuMeter, Result, Row, log, percentile, write_result
from .promkeda import (
    EXTERNAL_APISERVICE,
    Keda,
    Prometheus,
    keda_hpa_name,
    queue_time_query,
    scaled_object,
)

ROOT = Path(os.environ.get("BENCH_AUTOSCALE_ROOT", "/tmp/bench-autoscale"))
NODE = "bench-node-1"
NAMESPACE = "bench-autoscale"
MODEL = "autoscaled"
STEP_SECONDS = 90.0
CLIENTS = 6
CPU_REQUEST = "200m"
CPU_UTILISATION = 50
#: The operator's window (plan.autoscaling.WINDOW_SECONDS); the Prometheus query's rate() window is the same.
WINDOW_SECONDS = 30
#: Prometheus's scrape interval (the operator samples each replica every 2 s; kube-prometheus-stack's default is
#: 30 s, Prometheus's own 1 min: 5 s gives the peer a fine view without a 2 s scrape few would run).
SCRAPE_SECONDS = 5.0
METRICS_SERVER_SCRIPT = Path(__file__).resolve().parent.parent / "e2e" / "toolchain" / "metrics-server" / "build.sh"
#: The phases, in run order, and how the summary names them.
PHASES = ("queue", "keda", "cpu")
LABELS = {
    "queue": "ours: HPA on Triton's queue time (operator's custom metrics API)",
    "keda": "Triton's queue time through Prometheus + KEDA's Prometheus scaler",
    "cpu": "CPU-utilisation HPA (metrics-server)",
}
APISERVICES = ("v1beta2.custom.metrics.k8s.io", EXTERNAL_APISERVICE, "v1beta1.metrics.k8s.io")


class MetricsServer:
    """metrics-server as a host process, behind kube-system/metrics-server (an Endpoints of the node's address)."""

    def __init__(self, cluster: LocalCluster, kube: Kube) -> None:
        self.cluster, self.kube = cluster, kube
        self.port = free_port()
        self.log = cluster.logs / "metrics-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MetricsServer:
        binary = subprocess.run(["bash", str(METRICS_SERVER_SCRIPT)], check=True, capture_output=True,
                                text=True).stdout.strip().splitlines()[-1]
        kc = str(self.cluster.kubeconfig)
        node = self.kube.get("Node", NODE)
        address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        certs = self.cluster.dir / "metrics-server-certs"
        certs.mkdir(exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [binary, f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                 f"--bind-address={address}", f"--secure-port={self.port}", f"--cert-dir={certs}",
                 "--kubelet-insecure-tls", "--kubelet-preferred-address-types=InternalIP",
                 "--kubelet-use-node-status-port", "--metric-resolution=10s", "--kubelet-request-timeout=5s", "--v=1"],
                stdout=out, stderr=subprocess.STDOUT)
        meta = {"name": "metrics-server", "namespace": "kube-system"}
        self.kube.create({"apiVersion": "v1", "kind": "Service", "metadata": meta,
                          "spec": {"ports": [{"name": "https", "port": 443, "targetPort": self.port}]}})
        self.kube.create({"apiVersion": "v1", "kind": "Endpoints", "metadata": meta, "subsets": [
            {"addresses": [{"ip": address}], "ports": [{"name": "https", "port": self.port}]}]})
        self.kube.request("POST", "/apis/apiregistration.k8s.io/v1/apiservices", {
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1beta1.metrics.k8s.io"},
            "spec": {"group": "metrics.k8s.io", "version": "v1beta1", "insecureSkipTLSVerify": True,
                     "groupPriorityMinimum": 100, "versionPriority": 100,
                     "service": {"namespace": "kube-system", "name": "metrics-server", "port": 443}}})
        wait_for("node metrics from metrics-server", lambda: self.kube.request(
            "GET", "/apis/metrics.k8s.io/v1beta1/nodes").get("items"), 120, 2)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _base_model() -> tuple[dict[str, Any], dict[str, Any]]:
    """The example's TritonModel without spec.autoscaling, and that spec.autoscaling."""
    doc = copy.deepcopy(load_examples("autoscaling")[0])
    return doc, doc["spec"].pop("autoscaling")


def _cpu_model() -> dict[str, Any]:
    """The same model without spec.autoscaling, a CPU request, and the usual HPA: CPU utilisation."""
    doc, autoscaling = _base_model()
    doc["spec"]["server"] = {"resources": {"requests": {"cpu": CPU_REQUEST}}}
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": MODEL},
           "spec": {"scaleTargetRef": {"apiVersion": doc["apiVersion"], "kind": "TritonModel", "name": MODEL},
                    "minReplicas": autoscaling["minReplicas"], "maxReplicas": autoscaling["maxReplicas"],
                    "behavior": autoscaling["behavior"],
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                        "type": "Utilization", "averageUtilization": CPU_UTILISATION}}}]}}
    return {"model": doc, "hpa": hpa}


def _keda_model(namespace: str, prometheus_url: str) -> dict[str, Any]:
    """The same model without spec.autoscaling, and a ScaledObject on its queue time through Prometheus with the
    example's target, replicas and behavior."""
    doc, autoscaling = _base_model()
    so = scaled_object(
        MODEL, namespace, {"apiVersion": doc["apiVersion"], "kind": "TritonModel", "name": MODEL},
        server=prometheus_url, query=queue_time_query(namespace, MODEL, WINDOW_SECONDS),
        threshold=float(autoscaling["target"]["queueTimeMilliseconds"]),
        min_replicas=autoscaling["minReplicas"], max_replicas=autoscaling["maxReplicas"],
        behavior=autoscaling["behavior"])
    return {"model": doc, "scaled_object": so}


def _quantity(q: Any) -> float | None:
    from kubernetes.utils.quantity import parse_quantity

    try:
        return float(parse_quantity(q)) if q is not None else None
    except ValueError:
        return None


def _hpa_reading(status: dict[str, Any]) -> float | None:
    """The value the HPA last read of its one metric: the queue time (ms) or the CPU utilisation (%)."""
    for m in status.get("currentMetrics") or ():
        cur = (m.get(m.get("type", "").lower()) or {}).get("current") or {}
        if "averageUtilization" in cur:
            return float(cur["averageUtilization"])
        for key in ("value", "averageValue"):
            if key in cur:
                return _quantity(cur[key])
    return None


class TritonQueue:
    """The queue time Triton itself measured between two reads, over all of the model's pods (gRPC statistics)."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[int, int]] = {}  # pod uid -> (requests queued, ns queued), cumulative

    def read(self, pods: list[dict[str, Any]]) -> float | None:
        count = ns = 0
        seen: dict[str, tuple[int, int]] = {}
        for pod in pods:
            ip = pod["status"].get("podIP")
            if not ip:
                continue
            client = grpcclient.InferenceServerClient(f"{ip}:8001")
            try:
                stats = client.get_inference_statistics(MODEL, client_timeout=1)
                c = sum(s.inference_stats.queue.count for s in stats.model_stats)
                n = sum(s.inference_stats.queue.ns for s in stats.model_stats)
            except InferenceServerException:
                continue
            finally:
                client.close()
            uid = pod["metadata"]["uid"]
            seen[uid] = (c, n)
            if uid in self.last:
                count += c - self.last[uid][0]
                ns += n - self.last[uid][1]
        self.last = seen
        return ns / count / 1e6 if count > 0 else None


def _ready_pods(pods: list[dict[str, Any]]) -> int:
    return sum(1 for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                      for c in (p.get("status") or {}).get("conditions") or ()))


class Sampler:
    """The phase's timeline, one point a second in a thread of its own (its own API client), so that the step's
    0.5 s polls keep their pace: see `timeline_fields` in the result for what each point holds."""

    def __init__(self, kubeconfig: Path, namespace: str, hpa: str, query: str, prometheus: Prometheus) -> None:
        self.kube, self.namespace, self.hpa, self.query, self.prometheus = Kube(kubeconfig, timeout=5), namespace, \
            hpa, query, prometheus
        self.queue = TritonQueue()
        self.load: ServiceLoad | None = None
        self.points: list[tuple[float, dict[str, Any]]] = []  # (monotonic time, point)
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="autoscale-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(30)

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._halt.is_set():
            try:
                self._sample()
            except Exception as e:  # noqa: BLE001 - a missed point must not end the timeline
                if len(self.errors) < 20:
                    self.errors.append(f"{type(e).__name__}: {e}")
            next_at += 1.0
            self._halt.wait(max(0.0, next_at - time.monotonic()))

    def _sample(self) -> None:
        at = time.monotonic()
        tm = self.kube.get("TritonModel", MODEL, self.namespace)
        pods = live_pods(self.kube, self.namespace, MODEL)
        st = (self.kube.get_or_none("HorizontalPodAutoscaler", self.hpa, self.namespace) or {}).get("status") or {}
        tally = self.load.tally() if self.load is not None else None
        self.points.append((at, {
            "replicas": int(tm["spec"].get("replicas") or 0),
            "warmed": (tm.get("status") or {}).get("warmedReplicas"),
            "pods_ready": _ready_pods(pods),
            "hpa_desired": st.get("desiredReplicas"),
            "hpa_metric": _hpa_reading(st),
            "queue_ms": _round(self.queue.read(pods)),
            "prometheus_queue_ms": _round(self.prometheus.query(self.query)),
            "sent": tally.sent if tally else 0, "failed": tally.failed if tally else 0,
        }))


def _phase(kube: Kube, kubeconfig: Path, name: str, model: dict[str, Any], extra: list[dict[str, Any]],
           hpa_name: str, prometheus: Prometheus) -> dict[str, Any]:
    ns = f"{NAMESPACE}-{name}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_for(f"default ServiceAccount in {ns}", lambda: kube.get_or_none("ServiceAccount", "default", ns), 30)
    model = copy.deepcopy(model)
    model["metadata"] = {"name": MODEL, "namespace": ns}
    kube.create(model)
    for obj in extra:
        group_version, kind = obj["apiVersion"], obj["kind"]
        plural = {"HorizontalPodAutoscaler": "horizontalpodautoscalers", "ScaledObject": "scaledobjects"}[kind]
        kube.request("POST", f"/apis/{group_version}/namespaces/{ns}/{plural}",
                     {**obj, "metadata": {**obj["metadata"], "namespace": ns}})
    wait_model(kube, ns, MODEL, lambda tm: is_model_ready(tm) and tm["status"].get("warmedReplicas") == 1,
               "Ready with 1 warmed replica", 300, 0.5)

    def hpa_status() -> dict[str, Any]:
        return (kube.get_or_none("HorizontalPodAutoscaler", hpa_name, ns) or {}).get("status") or {}

    wait_for(f"{name}: the HPA {hpa_name} reading its metric", lambda: any(
        c["type"] == "ScalingActive" and c["status"] == "True" for c in hpa_status().get("conditions") or ()),
        180, 1)
    if name == "keda":
        wait_for(f"{name}: Prometheus scraping the replica", lambda: prometheus.targets_up(ns) >= 1, 60, 1)
    query = queue_time_query(ns, MODEL, WINDOW_SECONDS)
    sampler = Sampler(kubeconfig, ns, hpa_name, query, prometheus).start()
    load: ServiceLoad | None = None
    try:
        time.sleep(20)  # the idle baseline (start-up CPU, the queue-time windows settle), sampled
        (first,) = (p["metadata"]["name"] for p in live_pods(kube, ns, MODEL))
        log(f"{name}: step of {CLIENTS} clients for {STEP_SECONDS:.0f}s")
        load = ServiceLoad(kubeconfig, ns, MODEL, model=MODEL, threads=CLIENTS, rate=1000).start()
        sampler.load = load
        t0 = time.monotonic()
        first_added: float | None = None
        asked: float | None = None
        replicas_seen = [1]
        while time.monotonic() - t0 < STEP_SECONDS:
            replicas = int(kube.get("TritonModel", MODEL, ns)["spec"]["replicas"])
            replicas_seen.append(replicas)
            if asked is None and replicas > 1:
                asked = time.monotonic() - t0
                log(f"{name}: the HPA asked for {replicas} replicas {asked:.1f}s into the step")
            if first_added is None and added_answers(kube, ns, first, MODEL):
                first_added = time.monotonic() - t0
                log(f"{name}: an added replica answered {first_added:.1f}s into the step")
            time.sleep(0.5)
    finally:
        sampler.stop()
        tally = load.stop() if load is not None else None
    assert load is not None and tally is not None
    latencies = [s for at, s in load.latencies if at >= t0]
    st = hpa_status()
    out = {
        "label": LABELS[name], "namespace": ns, "hpa": hpa_name,
        "hpa_asked_seconds": asked, "first_added_answer_seconds": first_added,
        "p50_ms": percentile(latencies, 50) * 1000 if latencies else None,
        "p95_ms": percentile(latencies, 95) * 1000 if latencies else None,
        "p99_ms": percentile(latencies, 99) * 1000 if latencies else None,
        "answers": len(latencies), "sent": tally.sent, "failed": tally.failed, "failures": load.samples,
        "replicas_max": max(replicas_seen), "replicas_end": replicas_seen[-1],
        "hpa_metrics_at_end": st.get("currentMetrics"),
        "timeline": [{"t": round(at - t0, 2), **point} for at, point in sampler.points],
        "load_series": load.series(t0, t0 + STEP_SECONDS),
    }
    if name == "keda":
        out["query"] = query
    if sampler.errors:
        out["timeline_errors"] = sampler.errors
    log(f"{name}: " + str({k: v for k, v in out.items() if k not in ("timeline", "load_series")}))
    kube.delete("Namespace", ns)
    wait_for(f"pods in {ns} gone", lambda: not kube.items("Pod", ns), 180, 1)
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _apiservices(kube: Kube) -> dict[str, Any]:
    """Each metrics APIService: who serves it and whether the API server finds it Available."""
    out = {}
    for name in APISERVICES:
        svc = kube.get_or_none("APIService", name) or {}
        ref = (svc.get("spec") or {}).get("service") or {}
        available = next((c["status"] for c in (svc.get("status") or {}).get("conditions") or ()
                          if c["type"] == "Available"), None)
        out[name] = {"service": f"{ref.get('namespace')}/{ref.get('name')}" if ref else None, "available": available}
    return out


def run() -> Path:
    started, meter = time.monotonic(), CpuMeter()
    cluster = LocalCluster(ROOT, nodes=(NODE,), gpus=16, kube_proxy=True)
    cluster.down(quiet=True)
    kubeconfig = cluster.up()
    kube = Kube(kubeconfig)
    ms: MetricsServer | None = None
    op: ChartOperator | None = None
    prom: Prometheus | None = None
    keda: Keda | None = None
    phases: dict[str, dict[str, Any]] = {}
    try:
        ms = MetricsServer(cluster, kube).start()
        # The chart's custom metrics API is off by default; this cluster has no other server of the group.
        op = ChartOperator(kubeconfig, kube, cluster.logs, lambda pod: 0, ["--set", "customMetrics.enabled=true"])
        op.install()
        wait_for("the custom metrics APIService Available", lambda: _apiservices(kube)[APISERVICES[0]]["available"]
                 == "True", 120, 1)
        prom = Prometheus(cluster.dir, cluster.logs, kubeconfig, SCRAPE_SECONDS).start()
        node = kube.get("Node", NODE)
        address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        keda = Keda(cluster.dir, cluster.logs, kubeconfig, kube, address).start()
        apiservices_before = _apiservices(kube)
        log(f"Metrics APIServices: {apiservices_before}")
        phases["queue"] = _phase(kube, kubeconfig, "queue", load_examples("autoscaling")[0], [], MODEL, prom)
        keda_parts = _keda_model(f"{NAMESPACE}-keda", prom.url)
        phases["keda"] = _phase(kube, kubeconfig, "keda", keda_parts["model"], [keda_parts["scaled_object"]],
                                keda_hpa_name(MODEL), prom)
        cpu_parts = _cpu_model()
        phases["cpu"] = _phase(kube, kubeconfig, "cpu", cpu_parts["model"], [cpu_parts["hpa"]], MODEL, prom)
        apiservices_after = _apiservices(kube)
        setup = {"apiservices_before": apiservices_before, "apiservices_after": apiservices_after,
                 "prometheus_config": prom.config, "keda_operator_starts": keda.operator_starts,
                 "keda_crds": keda.crds, "scaled_object": keda_parts["scaled_object"]}
    finally:
        for part in (keda, prom, op, ms):
            if part is not None:
                part.stop()
        cluster.down(quiet=True)
    return write_result(_result(phases, setup), started, meter)


def _s(x: float | None) -> str:
    return "never (no added replica in the step)" if x is None else f"{x:.1f} s"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} ms"


def _result(phases: dict[str, dict[str, Any]], setup: dict[str, Any]) -> Result:
    queue, keda, cpu = (phases[p] for p in PHASES)
    result = Result(
        name="autoscale",
        title="A load step: HPA on Triton's queue time (ours) vs the same through Prometheus + KEDA, and a CPU HPA",
        method=(
            "Our own cluster: control plane, one real node (containerd + kubelet), kube-proxy, the operator installed "
            "by its chart (in-cluster, two replicas, serving custom.metrics.k8s.io); beside it, as host processes "
            "built from their Go modules: metrics-server (metrics.k8s.io), Prometheus 3.16.0 (module v0.316.0; "
            f"kubernetes_sd pod discovery, scraping each replica's Triton metrics port every {SCRAPE_SECONDS:g} s) "
            "and KEDA 2.21.0's operator and metrics adapter (external.metrics.k8s.io), all three metrics APIs served "
            "at once for the whole run. The model is examples/autoscaling.yaml (20 ms per request on one instance), "
            "1 to 3 replicas, scale-down stabilisation 20 s. Ours: its spec.autoscaling (target 20 ms; the "
            f"operator's HPA, Object metric triton_queue_time_ms over the warmed replicas, {WINDOW_SECONDS} s window, "
            "each replica sampled every 2 s). Prometheus + KEDA: the same model without spec.autoscaling and a "
            "ScaledObject, prometheus trigger, metricType Value, threshold 20, query "
            f"sum(rate(nv_inference_queue_duration_us[{WINDOW_SECONDS}s])) / "
            f"sum(rate(nv_inference_request_success[{WINDOW_SECONDS}s])) / 1000 over the model's pods, same "
            f"replicas and behavior. CPU HPA: the same model, requests.cpu {CPU_REQUEST}, an autoscaling/v2 HPA on "
            f"CPU at {CPU_UTILISATION} % of the request (metrics-server, 10 s resolution). The HPA controller syncs "
            f"every 5 s in all. One phase after the other, from one warmed replica: {CLIENTS} clients back to back "
            f"through the Service's ClusterIP (a new connection per request) for {STEP_SECONDS:.0f} s. First added "
            "replica answering: Triton's own statistics on the added pods, polled every 0.5 s."
        ),
    )
    figures = [
        ("step -> the HPA asks for more replicas", lambda p: _s(p["hpa_asked_seconds"])),
        ("step -> first request answered by an added replica", lambda p: _s(p["first_added_answer_seconds"])),
        ("p50 latency during the step", lambda p: _ms(p["p50_ms"])),
        ("p95 latency during the step", lambda p: _ms(p["p95_ms"])),
        ("replicas: most during the step / at its end", lambda p: f"{p['replicas_max']} / {p['replicas_end']}"),
        ("requests answered / failed", lambda p: f"{p['answers']} / {p['failed']}"),
    ]
    result.rows = [Row(f"{figure} (usual: {who})", fmt(queue), fmt(other))
                   for figure, fmt in figures
                   for who, other in (("Prometheus + KEDA", keda), ("CPU HPA", cpu))]
    result.notes = [
        "Three columns in one run: ours, then the usual approach in two rows per figure: queue time through "
        "Prometheus and KEDA's Prometheus scaler (how NVIDIA's k8s-onprem chart and KServe users scale on Triton's "
        "queue, with KEDA in place of an adapter), and a CPU-utilisation HPA on the same model.",
        "The CPU HPA: this model waits rather than computes (as a GPU model does from the pod's CPU's point of "
        "view), so its CPU barely moves with its queue.",
        "Metrics APIs at the end of the run: " + "; ".join(
            f"{n} served by {v['service']}, Available {v['available']}" for n, v in setup["apiservices_after"].items()),
        "HPA metrics at the end of the step: " + "; ".join(
            f"{p}: {phases[p]['hpa_metrics_at_end']}" for p in PHASES),
    ]
    result.data = {**phases, "labels": LABELS, "setup": setup,
                   "timeline_fields": {
                       "t": "seconds from the step's start (negative: the idle baseline before it)",
                       "replicas": "the TritonModel's spec.replicas (what the HPA asked)",
                       "warmed": "the TritonModel's status.warmedReplicas",
                       "pods_ready": "the model's pods with condition Ready",
                       "hpa_desired": "the HPA's status.desiredReplicas",
                       "hpa_metric": "what the HPA last read: queue time in ms (queue, keda), CPU % of request (cpu)",
                       "queue_ms": "mean queue time Triton measured since the previous point, over all pods",
                       "prometheus_queue_ms": "the KEDA trigger's query at that moment (Prometheus, every phase)",
                       "sent": "requests sent so far in the step", "failed": "requests failed so far in the step",
                   },
                   "load_series_fields": "per second of the step, by send time: answered, failed, p50_ms, p95_ms"}
    return result
