"""What `gate` and `first_request` share: a cluster with our real node and operator, the plain
Deployment that stands for the usual approach, and a timeline of every pod seen on a watch.

The plain Deployment is the operator's own rendering of the same TritonModel (same image, args,
fetch init container and repository), with the operator's parts taken out: no readiness gate,
none of its probes or labels, and the probes of the peer it stands for (bench/peers.py) instead.
"""

from __future__ import annotations

import contextlib
import copy
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient

from e2e.kube import Kube, condition, wait_for
from triton_operator.api.pod import REPOSITORY_KEY_ENV, WARMED_CONDITION
from triton_operator.api.timestamps import parse_rfc3339
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.render.kubernetes import render_children
from triton_operator.render.repository_key import restriction_args

from .kubeenv import BackgroundWatch, BenchCluster, OperatorProcess, ensure_namespace
from .models import checked

GRPC_PORT, HTTP_PORT = 8001, 8000
POLL_SECONDS = 0.015
HTTP_POLL_SECONDS = 0.002


@dataclass
class Env:
    cluster: BenchCluster
    kube: Kube
    operator: OperatorProcess
    namespace: str


@contextlib.contextmanager
def pod_cluster(namespace: str) -> Iterator[Env]:
    """Our own control plane, real node (containerd + kubelet) and operator (never the shared .cluster); all stopped on exit."""
    cluster = BenchCluster()
    kubeconfig = cluster.fresh()
    op: OperatorProcess | None = None
    try:
        cluster.start_agent()
        kube = Kube(kubeconfig)
        ensure_namespace(kube, namespace)
        op = OperatorProcess.ours(kubeconfig, cluster.logs / f"operator-{namespace}.log").start()
        yield Env(cluster, kube, op, namespace)
    finally:
        if op is not None:
            op.stop()
        cluster.down(quiet=True)


def plain_children(model: TritonModel, name: str, namespace: str, probes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """ConfigMap + Deployment + Service serving `model` the usual way: exactly `probes` (readinessProbe,
    livenessProbe, startupProbe; a kind left out is none), no gate."""
    from triton_operator.render.modelconfig import render_repository

    rendered = render_repository([model])
    children = {c["kind"]: copy.deepcopy(c) for c in render_children(model, rendered, "0", namespace)}
    labels = {"app": name}
    for c in children.values():
        c["metadata"] = {"name": name if c["kind"] != "ConfigMap" else f"{name}-repository",
                         "namespace": namespace, "labels": labels}
    dep = children["Deployment"]
    spec = dep["spec"]
    spec["replicas"] = 0
    spec["selector"] = {"matchLabels": labels}
    spec["template"]["metadata"] = {"labels": labels}
    pod = spec["template"]["spec"]
    pod.pop("readinessGates", None)
    # The usual approach has no gate, so no `probe` container either: tritonserver alone, with the given probe.
    pod["containers"] = [c for c in pod["containers"] if c["name"] == "tritonserver"]
    for v in pod["volumes"]:
        if v["name"] == "repository":
            v["configMap"]["name"] = f"{name}-repository"
    triton = next(c for c in pod["containers"] if c["name"] == "tritonserver")
    # Nor the operator's repository key: the charts leave Triton's repository API open (and no Secret holds a key).
    triton["env"] = [e for e in triton.get("env") or () if e["name"] != REPOSITORY_KEY_ENV]
    triton["args"] = [a for a in triton["args"] if a not in restriction_args()]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        triton.pop(kind, None)
        if kind in probes:
            triton[kind] = copy.deepcopy(probes[kind])
    svc = children["Service"]
    svc["spec"]["selector"] = labels
    return [children["ConfigMap"], dep, svc]


def tritonmodel(doc: dict[str, Any], name: str, namespace: str, replicas: int = 0) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["replicas"] = replicas
    checked(doc)
    return doc


def scale_to(kube: Kube, kind: str, name: str, namespace: str, replicas: int) -> None:
    kube.patch(kind, name, {"spec": {"replicas": replicas}}, namespace, type="merge")


def wait_no_pods(kube: Kube, namespace: str, selector: dict[str, str], timeout: float = 180.0) -> None:
    wait_for(f"pods {selector} gone", lambda: not kube.items("Pod", namespace, label_selector=selector), timeout, 0.5)


def rfc3339(ts: str | None) -> float | None:
    """An API timestamp as a Unix time (None for none)."""
    parsed = parse_rfc3339(ts)
    return None if parsed is None else parsed.timestamp()


@dataclass
class PodTimeline:
    """Wall-clock times (time.time()) at which the bench first saw each fact about one pod."""

    name: str
    uid: str
    ip: str | None = None
    seen: float = 0.0
    ip_at: float | None = None
    tcp_open_at: float | None = None  # gRPC port accepted a connection (our poll)
    model_ready_at: float | None = None  # ModelReady first answered true (our poll)
    http_open_at: float | None = None  # then, the HTTP port accepted a connection (tritonserver opens it after gRPC)
    containers_ready_at: float | None = None  # watch
    warmed_at: float | None = None  # watch: the operator's gate condition True
    ready_at: float | None = None  # watch: pod Ready True
    ready_ltt: float | None = None  # Ready's lastTransitionTime (1 s resolution)
    warmed_ltt: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class PodWatch(BackgroundWatch):
    """Watches the namespace's pods; for every new pod with an IP, polls its Triton until the model is READY."""

    kind = "Pod"

    def __init__(self, kube: Kube, namespace: str, model_of: dict[str, str]) -> None:
        super().__init__(kube, namespace)
        self.kube, self.namespace = kube, namespace
        self.model_of = model_of  # pod label app/model value -> Triton model name
        self.pods: dict[str, PodTimeline] = {}
        self.lock = threading.Lock()

    def _triton_model(self, pod: dict[str, Any]) -> str | None:
        labels = pod["metadata"].get("labels") or {}
        for value in labels.values():
            if value in self.model_of:
                return self.model_of[value]
        return None

    def _on_event(self, typ: str, pod: dict[str, Any], t: float) -> None:
        md, st = pod["metadata"], pod.get("status") or {}
        if typ == "DELETED":
            return
        model = self._triton_model(pod)
        if model is None:
            return
        with self.lock:
            tl = self.pods.get(md["name"])
            if tl is None:
                tl = self.pods[md["name"]] = PodTimeline(md["name"], md["uid"], seen=t)
            ip = st.get("podIP")
            if ip and tl.ip is None:
                tl.ip, tl.ip_at = ip, t
                threading.Thread(target=self._poll_ready, args=(tl, model), daemon=True).start()
            for ctype, attr, ltt_attr in (("ContainersReady", "containers_ready_at", None),
                                          (WARMED_CONDITION, "warmed_at", "warmed_ltt"),
                                          ("Ready", "ready_at", "ready_ltt")):
                c = condition(pod, ctype)
                if c and c.get("status") == "True" and getattr(tl, attr) is None:
                    setattr(tl, attr, t)
                    if ltt_attr:
                        setattr(tl, ltt_attr, rfc3339(c.get("lastTransitionTime")))

    def _poll_ready(self, tl: PodTimeline, model: str) -> None:
        """TCP connect every 15 ms until the gRPC port opens (a gRPC channel would back off for a second or
        more between attempts), then ModelReady every 15 ms until it answers true, then a TCP connect every 2 ms
        until the HTTP port opens."""
        assert tl.ip is not None
        deadline = time.monotonic() + 300
        tl.tcp_open_at = self._port_opens(tl.ip, GRPC_PORT, POLL_SECONDS, deadline)
        if tl.tcp_open_at is None:
            return
        client = grpcclient.InferenceServerClient(f"{tl.ip}:{GRPC_PORT}")
        try:
            while time.monotonic() < deadline and not self._stop.is_set():
                try:
                    if client.is_model_ready(model, client_timeout=1.0):
                        tl.model_ready_at = time.time()
                        break
                except Exception:  # noqa: BLE001, S110 - not up yet: poll again
                    pass
                time.sleep(POLL_SECONDS)
        finally:
            client.close()
        if tl.model_ready_at is not None:
            tl.http_open_at = self._port_opens(tl.ip, HTTP_PORT, HTTP_POLL_SECONDS, deadline)

    def _port_opens(self, ip: str, port: int, interval: float, deadline: float) -> float | None:
        """The wall-clock time a TCP connect to ip:port first succeeded, trying every `interval` (None: never)."""
        while time.monotonic() < deadline and not self._stop.is_set():
            try:
                with socket.create_connection((ip, port), timeout=0.5):
                    return time.time()
            except OSError:
                time.sleep(interval)
        return None

    def wait(self, names_prefix: str, count: int, attr: str, timeout: float) -> list[PodTimeline]:
        """Waits until `count` pods whose names start with `names_prefix` have `attr` set."""
        def done() -> list[PodTimeline] | None:
            with self.lock:
                got = [tl for n, tl in self.pods.items() if n.startswith(names_prefix) and getattr(tl, attr)]
            return got if len(got) >= count else None

        return wait_for(f"{count} pods {names_prefix}* with {attr}", done, timeout, 0.1)


def tree_rss_kb(pid: int) -> int:
    """RSS of a process and all its descendants (tritonserver + its Python backend stubs), in kB."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(p.name))
    total, todo = 0, [pid]
    while todo:
        cur = todo.pop()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{cur}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        todo.extend(children.get(cur, ()))
    return total


def replica_rss_mb(cluster: BenchCluster, pods: list[PodTimeline], container: str = "tritonserver") -> list[float]:
    out = []
    kube = Kube(cluster.kubeconfig)
    for tl in pods:
        with contextlib.suppress(OSError, ValueError, LookupError):
            pod = next(p for p in kube.items("Pod") if p["metadata"]["uid"] == tl.uid)
            out.append(round(tree_rss_kb(cluster.container_pid(pod, container)) / 1024, 1))
    return out
