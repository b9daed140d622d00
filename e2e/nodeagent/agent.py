"""The node agent: plays kubelet for fake GPU nodes so real Triton pods run on this machine.

Owns node registration (capacity with `nvidia.com/gpu`, labels, taints, a Ready condition),
heartbeats (the node's Lease in kube-node-lease, periodic status), the pod watch for pods bound
to its nodes, one `PodWorker` per pod, GPU index bookkeeping, the API-server relay for pods, and
an orderly shutdown that stops every container and removes every network namespace it created.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from e2e.kube import ApiError, Kube
from e2e.nodeagent import network
from e2e.nodeagent.pod import PodWorker, rfc3339

log = logging.getLogger("nodeagent")

LEASE_SECONDS = 40
LEASE_RENEW = 10.0
STATUS_REPORT = 60.0
AGENT_LABEL = "e2e.triton-operator.io/node-agent"


@dataclass
class NodeConfig:
    name: str
    gpus: int = 4
    cpu: str = "8"
    memory: str = "32Gi"
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)
    gpu_product: str = "NVIDIA-E2E-Fake-GPU"


def micro_time() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


class NodeAgent:
    """Registers `nodes` and runs the pods the scheduler binds to them."""

    def __init__(
        self,
        kubeconfig: str | Path,
        nodes: list[NodeConfig],
        state_dir: str | Path,
        use_netns: bool | None = None,
        crash_backoff: float = 10.0,
    ) -> None:
        self.kube = Kube(kubeconfig)
        self.nodes = {n.name: n for n in nodes}
        self.state_dir = Path(state_dir).resolve()
        self.crash_backoff = crash_backoff
        self.use_netns = network.netns_supported() if use_netns is None else use_netns
        self.host_ip = network.GATEWAY if self.use_netns else "127.0.0.1"
        self.agent_id = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:6]
        self.relay: network.TcpRelay | None = None
        self.workers: dict[str, PodWorker] = {}
        self._workers_lock = threading.Lock()
        self._gpu_lock = threading.Lock()
        self._gpus: dict[str, dict[str, list[int]]] = {n: {} for n in self.nodes}
        self._node_uids: dict[str, str] = {}
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.kubelet_version = "v1.35.0"

    # -- naming -------------------------------------------------------------------------------

    @property
    def netns_prefix(self) -> str:
        return f"{network.NETNS_PREFIX}{self.agent_id}-"

    def netns_name(self, uid: str) -> str:
        return self.netns_prefix + uid.replace("-", "")[:10]

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.use_netns:
            self._cleanup_stale()
            network.ensure_bridge()
            target = urlparse(self.kube.host)
            self.relay = network.TcpRelay(network.GATEWAY, (target.hostname or "127.0.0.1", target.port or 443))
            log.info("Started API server relay listen=%s:%d target=%s", network.GATEWAY, self.relay.port, self.kube.host)
        else:
            log.warning("Network namespaces unavailable: pods share the host network and get podIP=127.0.0.1, "
                        "which EndpointSlices refuse")
        with contextlib.suppress(ApiError, OSError):
            self.kubelet_version = self.kube.request("GET", "/version")["gitVersion"]
        for node in self.nodes.values():
            self._register(node)
        for target, name in ((self._heartbeat_loop, "heartbeat"), (self._watch_loop, "pod-watch")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("Started node agent nodes=%s gpusPerNode=%s netns=%s stateDir=%s", ",".join(self.nodes),
                 ",".join(str(n.gpus) for n in self.nodes.values()), self.use_netns, self.state_dir)

    def stop(self) -> None:
        """Stops every container (SIGTERM, then SIGKILL), removes namespaces; leaves API objects."""
        self.stopping.set()
        with self._workers_lock:
            workers = list(self.workers.values())
        for w in workers:
            w.shutdown()
        for w in workers:
            w.finished.wait(60)
        if self.use_netns:
            self._cleanup_stale()
            network.remove_bridge_if_unused()
        if self.relay:
            self.relay.close()
        log.info("Stopped node agent nodes=%s pods=%d", ",".join(self.nodes), len(workers))

    def _cleanup_stale(self) -> None:
        for ns in network.list_netns(self.netns_prefix):
            network.teardown_sandbox(ns)
        if network.IPAM_DIR.exists():
            for claim in network.IPAM_DIR.iterdir():
                with contextlib.suppress(OSError):
                    if claim.read_text().startswith(self.netns_prefix):
                        claim.unlink()

    # -- nodes --------------------------------------------------------------------------------

    def _node_status(self, node: NodeConfig) -> dict:
        now = rfc3339()
        resources = {
            "cpu": node.cpu,
            "memory": node.memory,
            "pods": str(node.pods),
            "ephemeral-storage": "100Gi",
            "nvidia.com/gpu": str(node.gpus),
        }

        def cond(type_: str, ok: bool, reason: str, message: str) -> dict:
            return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message,
                    "lastHeartbeatTime": now, "lastTransitionTime": now}

        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                cond("MemoryPressure", False, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", False, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", False, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", True, "KubeletReady", "e2e node agent is posting ready status"),
            ],
            "addresses": [{"type": "InternalIP", "address": self.host_ip}, {"type": "Hostname", "address": node.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": self.agent_id,
                "systemUUID": self.agent_id,
                "bootID": self.agent_id,
                "kernelVersion": os.uname().release,
                "osImage": "triton-operator e2e node agent",
                "containerRuntimeVersion": "e2e-nodeagent://0.1.0",
                "kubeletVersion": self.kubelet_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def _register(self, node: NodeConfig) -> None:
        labels = {
            "kubernetes.io/hostname": node.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true" if node.gpus else "false",
            "nvidia.com/gpu.count": str(node.gpus),
            "nvidia.com/gpu.product": node.gpu_product,
            AGENT_LABEL: "true",
            **node.labels,
        }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": labels},
            "spec": {"taints": node.taints} if node.taints else {},
            "status": self._node_status(node),
        }
        existing = self.kube.get_or_none("Node", node.name)
        if existing is None:
            created = self.kube.create(body)
            log.info("Registered node node=%s gpus=%d", node.name, node.gpus)
        else:
            created = self.kube.patch("Node", node.name, {"metadata": {"labels": labels},
                                                          "spec": {"taints": node.taints or None}}, type="merge")
            log.info("Updated existing node node=%s gpus=%d", node.name, node.gpus)
        self._node_uids[node.name] = created["metadata"]["uid"]
        self._report_status(node)
        self._renew_lease(node)

    def _report_status(self, node: NodeConfig) -> None:
        self.kube.patch("Node", node.name, {"status": self._node_status(node)}, sub="status")

    def _renew_lease(self, node: NodeConfig) -> None:
        ns = "kube-node-lease"
        spec = {"holderIdentity": node.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": micro_time()}
        try:
            self.kube.patch("Lease", node.name, {"spec": spec}, ns, type="merge")
        except ApiError as e:
            if e.status != 404:
                raise
            owner = {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": self._node_uids[node.name]}
            self.kube.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                              "metadata": {"name": node.name, "namespace": ns, "ownerReferences": [owner]},
                              "spec": spec})

    def _heartbeat_loop(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(LEASE_RENEW):
            for node in self.nodes.values():
                try:
                    self._renew_lease(node)
                    if time.monotonic() - last_status >= STATUS_REPORT:
                        self._report_status(node)
                except Exception as e:  # noqa: BLE001 - like the kubelet, outlive an API server that is away
                    log.warning("Failed to heartbeat node=%s err=%s", node.name, e)
            if time.monotonic() - last_status >= STATUS_REPORT:
                last_status = time.monotonic()

    # -- pods ---------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        selector = f"spec.nodeName={next(iter(self.nodes))}" if len(self.nodes) == 1 else None
        while not self.stopping.is_set():
            try:
                listing = self.kube.list("Pod", field_selector=selector)
                self._sync_all(listing["items"])
                rv = listing["metadata"]["resourceVersion"]
                for event in self.kube.watch("Pod", resource_version=rv, timeout_seconds=120, field_selector=selector):
                    if self.stopping.is_set():
                        return
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        break  # e.g. 410 Gone: relist
                    if kind == "BOOKMARK":
                        continue
                    self._handle(kind, obj)
            except Exception as e:  # noqa: BLE001 - the watch must survive API hiccups
                if not self.stopping.is_set():
                    log.warning("Pod watch failed; relisting err=%s", e)
                    self.stopping.wait(1.0)

    def _sync_all(self, pods: list[dict]) -> None:
        seen = set()
        for pod in pods:
            if pod["spec"].get("nodeName") in self.nodes:
                seen.add(pod["metadata"]["uid"])
                self._handle("MODIFIED", pod)
        with self._workers_lock:
            gone = [w for uid, w in self.workers.items() if uid not in seen]
        for w in gone:
            w.mark_deleted()

    def _handle(self, kind: str, pod: dict) -> None:
        if pod["spec"].get("nodeName") not in self.nodes:
            return
        uid = pod["metadata"]["uid"]
        with self._workers_lock:
            worker = self.workers.get(uid)
            if kind == "DELETED":
                if worker:
                    worker.mark_deleted()
                return
            if worker is None:
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
                    return  # finished before this agent started
                if self.stopping.is_set():
                    return
                worker = PodWorker(self, pod)
                self.workers[uid] = worker
                worker.start()
                log.info("Admitted pod pod=%s/%s uid=%s node=%s", pod["metadata"]["namespace"],
                         pod["metadata"]["name"], uid, pod["spec"]["nodeName"])
                return
        worker.update(pod)

    def forget(self, uid: str, worker: PodWorker) -> None:
        with self._workers_lock:
            if self.workers.get(uid) is worker:
                del self.workers[uid]

    def pod_dir(self, uid: str) -> Path:
        return self.state_dir / "pods" / uid

    # -- GPUs ---------------------------------------------------------------------------------

    def allocate_gpus(self, node: str, uid: str, count: int) -> list[str]:
        if count <= 0 or node not in self.nodes:
            return []
        with self._gpu_lock:
            used = {i for ids in self._gpus[node].values() for i in ids}
            free = [i for i in range(self.nodes[node].gpus) if i not in used]
            ids = free[:count]
            self._gpus[node][uid] = ids
        return [f"GPU-{node}-{i}" for i in ids]

    def release_gpus(self, uid: str) -> None:
        with self._gpu_lock:
            for allocations in self._gpus.values():
                allocations.pop(uid, None)

    # -- events -------------------------------------------------------------------------------

    def event(self, pod: dict, type_: str, reason: str, message: str, container: Any = None) -> None:
        """Best-effort core/v1 Event about the pod, like the kubelet's recorder."""
        md = pod["metadata"]
        involved = {"kind": "Pod", "apiVersion": "v1", "namespace": md["namespace"], "name": md["name"],
                    "uid": md["uid"]}
        if container is not None:
            kind = "initContainers" if container.init else "containers"
            involved["fieldPath"] = f"spec.{kind}{{{container.name}}}"
        now = rfc3339()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{md['name']}.", "namespace": md["namespace"]},
            "involvedObject": involved, "reason": reason, "message": message, "type": type_,
            "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": "kubelet", "reportingInstance": pod["spec"].get("nodeName", ""),
        }
        with contextlib.suppress(ApiError, OSError):
            self.kube.create(body, md["namespace"])
