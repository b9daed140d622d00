"""The real nodes themselves: losing one, and what tearing one down leaves behind.

- Node loss: one node's kubelet is SIGKILLed (the machine vanished, its containers do not know). The
  node turns NotReady, its replica leaves the Service's ready endpoints, the taint-based eviction
  deletes it, and the operator's Deployment replaces it on the other node, where it joins only
  through the warm-up gate. The kubelet is started again afterwards and cleans up.
- A pod deleted on a node leaves the node's other pods reachable at once, and the node's bridge keeps its
  MAC (a bridge without one of its own takes its lowest port's, and changes it when that pod's veth goes).
- Teardown: a cluster of the test's own with one node runs a pod with ConfigMap, projected-token and
  emptyDir volumes; after `down` nothing of it is left: no process, mount, bridge or cgroup.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster, session_root
from e2e.images import OPERATOR_ALIAS
from e2e.kube import Kube, condition, wait_for
from e2e.node import leftovers
from e2e.operator_fixtures import LABEL_MODEL, OperatorHandle, add_sub, apply, gate, is_model_ready, live_pods, record, wait_model
from e2e.testing import container_status, is_ready, ready_addresses, ready_endpoints, wait_pod
from triton_operator import DEFAULT_OPERATOR_IMAGE

pytestmark = pytest.mark.cluster


def _node_ready(kube: Kube, name: str) -> str:
    return (condition(kube.get("Node", name), "Ready") or {}).get("status", "")


def test_lost_node_replica_leaves_the_service_and_is_replaced_on_the_other_node(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any) -> None:
    if len(nodes.names) < 2:
        pytest.skip("needs two nodes")
    doc = add_sub()
    doc["spec"]["replicas"] = 2
    # Spread the replicas (soft): one of them sits on the node that is not the operator's.
    doc["spec"]["server"] = {**doc["spec"].get("server", {}), "affinity": {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {LABEL_MODEL: "add-sub"}}}}]}}}
    apply(kubeconfig, namespace, doc)
    wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 2,
               "Ready with 2 warmed replicas", 180)
    operator_node = operator.pod()["spec"]["nodeName"] if hasattr(operator, "pod") else None
    pods = live_pods(kube, namespace, "add-sub")
    victims = [p for p in pods if p["spec"]["nodeName"] != operator_node]
    if not victims:
        pytest.skip(f"both replicas landed on the operator's node {operator_node}")
    victim = victims[0]
    lost, ip = victim["spec"]["nodeName"], victim["status"]["podIP"]
    survivor = next(n for n in nodes.names if n != lost)

    t0 = time.monotonic()
    nodes.local.stop_kubelet(lost)
    try:
        wait_for(f"node {lost} NotReady", lambda: _node_ready(kube, lost) in ("False", "Unknown"), 60)
        not_ready = time.monotonic() - t0
        wait_for(f"the lost replica {ip} out of the Service's ready endpoints",
                 lambda: ip not in ready_addresses(kube, namespace, "add-sub"), 60)
        out_of_service = time.monotonic() - t0

        def replaced() -> list[dict] | None:
            fresh = [p for p in live_pods(kube, namespace, "add-sub")
                     if p["metadata"]["uid"] != victim["metadata"]["uid"] and p["spec"].get("nodeName") == survivor]
            return fresh if len(fresh) == 2 and all(is_ready(p) for p in fresh) else None

        fresh = wait_for(f"two ready replicas on {survivor}", replaced, 180)
        back = time.monotonic() - t0
        for p in fresh:
            assert gate(p).get("status") == "True", gate(p)  # joined through the warm-up gate
        # Ready pods reach the EndpointSlice through its controller, a moment later (CI once read it in between).
        wait_for("both fresh replicas as ready endpoints",
                 lambda: len(ready_endpoints(kube, namespace, "add-sub")) == 2, 30)
        wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 2,
                   "Ready with 2 warmed replicas again", 60)
        record("node loss: kubelet killed -> node NotReady", f"{not_ready:.1f}s")
        record("node loss: kubelet killed -> replica out of the endpoints", f"{out_of_service:.1f}s")
        record("node loss: kubelet killed -> 2 warmed replicas on the other node", f"{back:.1f}s")
    finally:
        nodes.local.start_kubelet(lost)
    # The restarted kubelet stops what the evicted pod left running.
    wait_for("the evicted replica gone", lambda: kube.get_or_none("Pod", victim["metadata"]["name"], namespace) is None,
             120)


def _port_of(bridge: str, pod_ip: str) -> str:
    """The bridge port (host-side veth) behind a pod: the pod's MAC from the host's neighbour entry, then the
    bridge's forwarding entry that learned it."""
    neigh = subprocess.run(["ip", "neigh", "show", pod_ip], capture_output=True, text=True, check=True).stdout.split()
    mac = neigh[neigh.index("lladdr") + 1]
    for line in subprocess.run(["bridge", "fdb", "show", "br", bridge], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        f = line.split()
        if f[0] == mac and "dev" in f:
            return f[f.index("dev") + 1]
    raise AssertionError(f"no forwarding entry on {bridge} for {pod_ip} ({mac})")


def _link_mac(name: str) -> str | None:
    """A link's MAC, None when the link is gone. From `ip`, not /sys/class/net: sysfs shows the network namespace it
    was mounted in (the host's), and `make test` runs each worker and its cluster in a namespace of its own."""
    out = subprocess.run(["ip", "-o", "link", "show", "dev", name], capture_output=True, text=True).stdout.split()
    return out[out.index("link/ether") + 1] if "link/ether" in out else None


class _Traffic(threading.Thread):
    """HTTP requests from this host to each address in turn, each on a new connection (1 s timeout), as a load
    or the kubelet's probes send them, until stopped. Failures are kept with their time."""

    def __init__(self, addresses: list[str]) -> None:
        super().__init__(daemon=True)
        self.addresses, self.sent, self.failures = addresses, 0, []
        self._halt = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self._halt.is_set():
            for ip in self.addresses:
                try:
                    with urllib.request.urlopen(f"http://{ip}:8080/", timeout=1) as resp:
                        resp.read()
                except OSError as e:
                    self.failures.append(f"+{time.monotonic() - self._t0:.1f}s {ip}: {e}")
                self.sent += 1
            self._halt.wait(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def test_a_deleted_pod_leaves_the_other_pods_on_its_node_reachable(
        kube: Kube, namespace: str, nodes: Any) -> None:
    """Three pods serving HTTP on one node, under steady traffic from the host; the one whose veth has the lowest
    MAC (the one a bridge without an address of its own takes its MAC from) is deleted. The other two must keep
    answering, and the bridge its MAC. Why: twice in CI a replica stopped answering its probes and requests
    (timeouts, not refusals) for 30-40 s, starting about 2 s after a sibling pod on its node was torn down. A
    gateway MAC that changes under the pods' neighbour entries is one way to get exactly that; on this machine
    the pods re-learn it at once (this test's traffic saw no failure before the fix either), so it pins the MAC."""
    node = nodes.names[0]
    bridge = nodes.local.node(node).network.bridge
    names = [f"p{i}" for i in range(3)]
    for name in names:
        kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": OPERATOR_ALIAS, "imagePullPolicy": "Never",
                            "command": ["python", "-m", "http.server", "8080", "--directory", "/tmp"]}]}})
    ips = {n: wait_pod(kube, namespace, n, lambda p: is_ready(p) and p["status"].get("podIP"), "Ready", 90)
           ["status"]["podIP"] for n in names}

    def answers(ip: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{ip}:8080/", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    for name, ip in ips.items():
        wait_for(f"pod {name} ({ip}) to answer HTTP", lambda ip=ip: answers(ip), 30)
    ports = {n: _port_of(bridge, ip) for n, ip in ips.items()}
    macs = {n: _link_mac(port) or "" for n, port in ports.items()}
    bridge_mac = _link_mac(bridge)
    victim = min(macs, key=lambda n: macs[n])
    survivors = [ips[n] for n in names if n != victim]
    traffic = _Traffic(survivors)
    traffic.start()
    try:
        wait_for("traffic to the other pods", lambda: traffic.sent >= 20, 30)
        kube.delete("Pod", victim, namespace)
        wait_for(f"pod {victim} gone", lambda: kube.get_or_none("Pod", victim, namespace) is None, 60)
        wait_for(f"{victim}'s veth {ports[victim]} removed",
                 lambda: _link_mac(ports[victim]) is None, 30)
        gone_at = traffic.sent
        # Long enough for a cut-off pod to show (its neighbour entry would take 15-45 s to expire).
        wait_for("200 more requests after the veth went", lambda: traffic.sent >= gone_at + 200, 60)
    finally:
        traffic.stop()
    after = _link_mac(bridge)
    assert not traffic.failures, (
        f"{len(traffic.failures)} of {traffic.sent} requests to {survivors} failed after {victim} (veth MAC "
        f"{macs[victim]}) was deleted; bridge {bridge} MAC {bridge_mac} -> {after}; first: {traffic.failures[:5]}")
    assert after == bridge_mac, f"bridge {bridge} changed its MAC from {bridge_mac} to {after}"
    record("node: requests to a deleted pod's neighbours", f"{traffic.sent} sent, 0 failed")


@pytest.fixture
def own_cluster() -> Iterator[LocalCluster]:
    local = LocalCluster(session_root() / ".cluster" / "teardown", nodes=("gpu-node-1",), kube_proxy=False)
    with local.running_fresh():
        yield local


def test_down_leaves_no_process_mount_bridge_or_cgroup(own_cluster: LocalCluster) -> None:
    kube = Kube(own_cluster.kubeconfig)
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default"},
                 "data": {"a": "b"}})
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "namespace": "default"}, "spec": {
        "containers": [{"name": "c", "image": DEFAULT_OPERATOR_IMAGE,
                        "command": ["python", "-c", "import time; time.sleep(3600)"],
                        "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}, {"name": "scratch", "mountPath": "/s"}]}],
        "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}, {"name": "scratch", "emptyDir": {}}]}})
    wait_pod(kube, "default", "busy", lambda p: container_status(p, "c").get("started"), "running", 120)
    during = leftovers(own_cluster.dir)
    assert any(x.startswith("mount:") for x in during) and any(x.startswith("cgroup:") for x in during), during
    assert any(x.startswith("link:") for x in during), during
    own_cluster.down()
    assert leftovers(own_cluster.dir) == []
