"""Benchmark `autoscale`: one load step on examples/autoscaling.yaml, scaled on Triton's queue time by the HPA the
operator renders, against the same model scaled by a CPU-utilisation HPA, in one run.

Its own cluster, as users run the product: control plane, one real node (containerd + kubelet), kube-proxy, and
the operator installed by its chart (two replicas, in-cluster; it serves the custom metrics API through the
APIService the chart installs). A CPU-utilisation HPA needs the resource metrics API: metrics-server, built from
its Go module (e2e/toolchain/metrics-server), runs beside the control plane as a host process, registered with
an APIService whose Service's endpoint is the node's address (it reads the kubelet's /metrics/resource).

Two phases, one model each, one after the other (two cores: side by side at once would measure each other):
1. queue time: `examples/autoscaling.yaml` as is (1 to 3 replicas, a 20 ms queue-time target);
2. CPU: the same model without spec.autoscaling, `server.resources.requests.cpu` 200m, and an autoscaling/v2 HPA
   of the TritonModel with a Resource metric: CPU at 50 % of the request (a CPU-utilisation HPA; KServe's
   raw-deployment default HPA uses the same metric at 80 %; NVIDIA's k8s-onprem chart scales on queue time
   instead), with the same replicas and behavior.

Each phase: one warmed replica; then the step: 6 clients back to back through the Service's ClusterIP (a new HTTP
connection each request, `e2e.load.ServiceLoad`) for `STEP_SECONDS`. Measured: the time from the step's first
request to the first request an added replica answers (Triton's own statistics on the added pods, polled every
0.5 s), the p50 and p99 latency of the step's answers, the replicas at its end, and failures.
"""

from __future__ import annotations

import copy
import os
import subprocess
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

ROOT = Path(os.environ.get("BENCH_AUTOSCALE_ROOT", "/tmp/bench-autoscale"))
NODE = "bench-node-1"
NAMESPACE = "bench-autoscale"
MODEL = "autoscaled"
STEP_SECONDS = 90.0
CLIENTS = 6
CPU_REQUEST = "200m"
CPU_UTILISATION = 50
METRICS_SERVER_SCRIPT = Path(__file__).resolve().parent.parent / "e2e" / "toolchain" / "metrics-server" / "build.sh"


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


def _cpu_model() -> dict[str, Any]:
    """The same model without spec.autoscaling, a CPU request, and the usual HPA: CPU utilisation."""
    doc = copy.deepcopy(load_examples("autoscaling")[0])
    behavior = doc["spec"].pop("autoscaling")["behavior"]
    doc["spec"]["server"] = {"resources": {"requests": {"cpu": CPU_REQUEST}}}
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": MODEL},
           "spec": {"scaleTargetRef": {"apiVersion": doc["apiVersion"], "kind": "TritonModel", "name": MODEL},
                    "minReplicas": 1, "maxReplicas": 3, "behavior": behavior,
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                        "type": "Utilization", "averageUtilization": CPU_UTILISATION}}}]}}
    return {"model": doc, "hpa": hpa}


def _queue_totals(kube: Kube, ns: str) -> dict[str, tuple[int, int]]:
    """Each live replica's Triton queue statistics for the model, cumulative: (requests queued, nanoseconds)."""
    out = {}
    for pod in live_pods(kube, ns, MODEL):
        if not pod["status"].get("podIP"):
            continue
        client = grpcclient.InferenceServerClient(f"{pod['status']['podIP']}:8001")
        try:
            stats = client.get_inference_statistics(MODEL, client_timeout=2).model_stats
            out[pod["metadata"]["name"]] = (sum(s.inference_stats.queue.count for s in stats),
                                            sum(s.inference_stats.queue.ns for s in stats))
        except InferenceServerException:
            pass
        finally:
            client.close()
    return out


def _sample(kube: Kube, ns: str, t: float, before: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """One point of the phase's timeline (for its picture): the replicas asked for and warmed, and Triton's queue
    time per request since the previous point, over the replicas that answered both times (a new one from 0)."""
    tm = kube.get("TritonModel", MODEL, ns)
    now = _queue_totals(kube, ns)
    queued = sum(c - before.get(p, (0, 0))[0] for p, (c, _) in now.items())
    ns_queued = sum(n - before.get(p, (0, 0))[1] for p, (_, n) in now.items())
    before.clear()
    before.update(now)
    return {"t": round(t, 2), "replicas": tm["spec"].get("replicas"), "warmed": tm["status"].get("warmedReplicas"),
            "queued": queued, "queue_ms": round(ns_queued / queued / 1e6, 2) if queued > 0 else None}


def _phase(kube: Kube, kubeconfig: Path, name: str, model: dict[str, Any], hpa: dict[str, Any] | None
           ) -> dict[str, Any]:
    ns = f"{NAMESPACE}-{name}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_for(f"default ServiceAccount in {ns}", lambda: kube.get_or_none("ServiceAccount", "default", ns), 30)
    model = copy.deepcopy(model)
    model["metadata"] = {"name": MODEL, "namespace": ns}
    kube.create(model)
    if hpa is not None:
        kube.request("POST", f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers",
                     {**hpa, "metadata": {"name": MODEL, "namespace": ns}})
    wait_model(kube, ns, MODEL, lambda tm: is_model_ready(tm) and tm["status"].get("warmedReplicas") == 1,
               "Ready with 1 warmed replica", 300, 0.5)

    def hpa_status() -> dict[str, Any]:
        return (kube.get_or_none("HorizontalPodAutoscaler", MODEL, ns) or {}).get("status") or {}

    wait_for(f"{name}: the HPA reading its metric", lambda: any(
        c["type"] == "ScalingActive" and c["status"] == "True" for c in hpa_status().get("conditions") or ()),
        180, 1)
    time.sleep(20)  # the idle baseline: the CPU HPA's view of start-up CPU, the queue-time window, both settle
    (first,) = (p["metadata"]["name"] for p in live_pods(kube, ns, MODEL))
    log(f"{name}: step of {CLIENTS} clients for {STEP_SECONDS:.0f}s")
    queue_before = _queue_totals(kube, ns)
    timeline: list[dict[str, Any]] = []
    load = ServiceLoad(kubeconfig, ns, MODEL, model=MODEL, threads=CLIENTS, rate=1000).start()
    t0 = time.monotonic()
    first_added: float | None = None
    asked: float | None = None
    replicas_seen = [1]
    while time.monotonic() - t0 < STEP_SECONDS:
        replicas = int(kube.get("TritonModel", MODEL, ns)["spec"]["replicas"])
        replicas_seen.append(replicas)
        if asked is None and replicas > 1:
            asked = time.monotonic() - t0
        if first_added is None and added_answers(kube, ns, first, MODEL):
            first_added = time.monotonic() - t0
            log(f"{name}: an added replica answered {first_added:.1f}s into the step")
        timeline.append(_sample(kube, ns, time.monotonic() - t0, queue_before))
        time.sleep(0.5)
    tally = load.stop()
    latencies = [s for at, s in load.latencies if at >= t0]
    st = hpa_status()
    out = {
        "hpa_asked_seconds": asked, "first_added_answer_seconds": first_added,
        "p50_ms": percentile(latencies, 50) * 1000 if latencies else None,
        "p99_ms": percentile(latencies, 99) * 1000 if latencies else None,
        "answers": len(latencies), "sent": tally.sent, "failed": tally.failed, "failures": load.samples,
        "replicas_max": max(replicas_seen), "replicas_end": replicas_seen[-1],
        "hpa_metrics_at_end": st.get("currentMetrics"),
        # Over time, for the picture (bench/plots.py): the timeline every poll, the client's answers per second.
        "timeline": timeline, "load_series": load.series(t0, t0 + STEP_SECONDS),
    }
    log(f"{name}: {out}")
    kube.delete("Namespace", ns)
    wait_for(f"pods in {ns} gone", lambda: not kube.items("Pod", ns), 180, 1)
    return out


def run() -> Path:
    started, meter = time.monotonic(), CpuMeter()
    cluster = LocalCluster(ROOT, nodes=(NODE,), gpus=16, kube_proxy=True)
    cluster.down(quiet=True)
    kubeconfig = cluster.up()
    kube = Kube(kubeconfig)
    ms: MetricsServer | None = None
    op: ChartOperator | None = None
    try:
        ms = MetricsServer(cluster, kube).start()
        # The chart's custom metrics API is off by default; this cluster has no other server of the group.
        op = ChartOperator(kubeconfig, kube, cluster.logs, lambda pod: 0, ["--set", "customMetrics.enabled=true"])
        op.install()
        wait_for("the custom metrics APIService Available", lambda: any(
            c["type"] == "Available" and c["status"] == "True" for c in (
                (kube.get_or_none("APIService", "v1beta2.custom.metrics.k8s.io") or {}).get("status") or {}
            ).get("conditions") or ()), 120, 1)
        queue = _phase(kube, kubeconfig, "queue", load_examples("autoscaling")[0], None)
        cpu_parts = _cpu_model()
        cpu = _phase(kube, kubeconfig, "cpu", cpu_parts["model"], cpu_parts["hpa"])
    finally:
        if op is not None:
            op.stop()
        if ms is not None:
            ms.stop()
        cluster.down(quiet=True)
    return write_result(_result(queue, cpu), started, meter)


def _s(x: float | None) -> str:
    return "never (no added replica in the step)" if x is None else f"{x:.1f} s"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} ms"


def _result(queue: dict[str, Any], cpu: dict[str, Any]) -> Result:
    result = Result(
        name="autoscale",
        title="A load step: HPA on Triton's queue time vs HPA on CPU utilisation",
        method=(
            "Our own cluster: control plane, one real node (containerd + kubelet), kube-proxy, the operator installed "
            "by its chart (in-cluster, two replicas, serving custom.metrics.k8s.io), metrics-server built from its "
            "Go module as a host process (metrics.k8s.io, for the CPU HPA). The model is examples/autoscaling.yaml "
            "(20 ms per request on one instance), 1 to 3 replicas, scale-down stabilisation 20 s. Queue time: its "
            "spec.autoscaling (target 20 ms; the operator's HPA, Object metric triton_queue_time_ms, 30 s window). "
            f"CPU: the same model without spec.autoscaling, requests.cpu {CPU_REQUEST}, and an autoscaling/v2 HPA "
            f"on CPU at {CPU_UTILISATION} % of the request (metrics-server, 10 s resolution). The HPA controller "
            "syncs every 5 s in both. One phase after the other, from one warmed replica: "
            f"{CLIENTS} clients back to back through the Service's ClusterIP (a new connection per request) for "
            f"{STEP_SECONDS:.0f} s. First added replica answering: Triton's own statistics on the added pods, polled "
            "every 0.5 s."
        ),
    )
    result.rows = [
        Row("step -> the HPA asks for more replicas", _s(queue["hpa_asked_seconds"]), _s(cpu["hpa_asked_seconds"])),
        Row("step -> first request answered by an added replica", _s(queue["first_added_answer_seconds"]),
            _s(cpu["first_added_answer_seconds"])),
        Row("p99 latency during the step", _ms(queue["p99_ms"]), _ms(cpu["p99_ms"])),
        Row("p50 latency during the step", _ms(queue["p50_ms"]), _ms(cpu["p50_ms"])),
        Row("replicas: most during the step / at its end", f"{queue['replicas_max']} / {queue['replicas_end']}",
            f"{cpu['replicas_max']} / {cpu['replicas_end']}"),
        Row("requests answered / failed", f"{queue['answers']} / {queue['failed']}",
            f"{cpu['answers']} / {cpu['failed']}"),
    ]
    result.notes = [
        "The usual column is a CPU-utilisation HPA on the same model (not NVIDIA's k8s-onprem chart, which scales on "
        "queue time through Prometheus and prometheus-adapter). This model waits rather than computes (as a "
        "GPU model does from the pod's CPU's point of view), so its CPU barely moves with its queue.",
        f"HPA metrics at the end of the step: queue time {queue['hpa_metrics_at_end']}; CPU {cpu['hpa_metrics_at_end']}.",
    ]
    result.data = {"queue": queue, "cpu": cpu}
    return result
