"""Smoke tests of the test platform itself: real control plane, real GPU nodes (kubelet + containerd), real Triton pods.

No operator is involved: plain Deployments, Pods and Services must behave as on a real cluster -
scheduled by GPU capacity, Ready through readiness probes and readiness gates, listed in
EndpointSlices with their 198.18.0.0/16 addresses, serving inference, stopped with their preStop
hooks and then SIGTERM.
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import subprocess
import tarfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from e2e import images
from e2e.cluster import REPO_ROOT, kube_module_dir, pinned_kubernetes
from e2e.kube import Kube, condition, wait_for
from e2e.node import LogFollower
from e2e.operator_fixtures import record
from e2e.testing import (
    ADD_ONE_CONFIG,
    TRITON_IMAGE,
    add_one_model,
    consistently,
    container_status,
    endpoints,
    is_ready,
    model_volume,
    ready_endpoints,
    service,
    triton_container,
    triton_pod,
    wait_gone,
    wait_pod,
)
from triton_operator import DEFAULT_OPERATOR_IMAGE
from triton_operator.api.timestamps import rfc3339

pytestmark = pytest.mark.cluster

POD_RANGE = ipaddress.ip_network("198.18.0.0/15")
GATE = "e2e.triton-operator.io/never-set"


def infer_add_one(address: str, values: list[float]) -> np.ndarray:
    client = grpcclient.InferenceServerClient(f"{address}:8001")
    try:
        inp = grpcclient.InferInput("INPUT0", [len(values)], "FP32")
        inp.set_data_from_numpy(np.array(values, dtype=np.float32))
        return client.infer("add_one", [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()


def test_kubectl_shows_real_gpu_nodes(kube: Kube, kubeconfig: Path, nodes) -> None:
    """`kubectl get nodes`: kubelets on containerd, GPUs advertised by the device plugin, GPU feature labels; on our
    own cluster, the API server and every kubelet are the release its toolchain module pins (`TROP_KUBE_MINOR=1.30`:
    e2e/toolchain/kube-1.30/go.mod, so that a run of `make test-k8s-oldest` cannot pass on 1.35)."""
    kubectl = str(REPO_ROOT / ".venv" / "bin" / "kubectl")
    out = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "json"],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    listed = {n["metadata"]["name"]: n for n in json.loads(out)["items"]}
    assert len(nodes.names) >= 2 or nodes.local is None, f"expected two GPU nodes, got {nodes.names}"
    pinned = pinned_kubernetes(kube_module_dir(nodes.local.kube_minor)) if nodes.local is not None else None
    if pinned is not None:
        assert kube.request("GET", "/version")["gitVersion"] == pinned
    for name in nodes.names:
        node = listed[name]
        info = node["status"]["nodeInfo"]
        assert info["containerRuntimeVersion"].startswith("containerd://"), info
        assert info["kubeletVersion"].startswith("v1."), info
        assert pinned is None or info["kubeletVersion"] == pinned, info
        assert node["status"]["capacity"]["nvidia.com/gpu"] == str(nodes.gpus[name])
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(nodes.gpus[name])
        labels = node["metadata"]["labels"]
        assert labels["nvidia.com/gpu.present"] == "true" and labels["nvidia.com/gpu.count"] == str(nodes.gpus[name])
        assert "nvidia.com/gpu.product" in labels
        assert condition(node, "Ready")["status"] == "True"
        [internal] = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert ipaddress.ip_address(internal) in POD_RANGE
    wide = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "wide"],
                          check=True, capture_output=True, text=True, timeout=60).stdout
    assert wide.count("containerd://") >= len(nodes.names), wide


def test_deployment_serves_inference_through_endpointslice(kube: Kube, namespace: str, nodes) -> None:
    kube.create(add_one_model(namespace))
    labels = {"app": "triton"}
    kube.create({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "triton", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [triton_container()], "volumes": [model_volume()]},
            },
        },
    })
    kube.create(service(namespace, "triton", labels))

    def ready_pod() -> dict | None:
        pods = kube.items("Pod", namespace, label_selector=labels)
        return next((p for p in pods if is_ready(p)), None)

    pod = wait_for("a Ready triton pod", ready_pod, 120)
    status = pod["status"]
    assert pod["spec"]["nodeName"] in nodes.names
    assert status["phase"] == "Running"
    assert ipaddress.ip_address(status["podIP"]) in POD_RANGE
    cs = container_status(pod, "tritonserver")
    assert cs["ready"] and cs["started"] and "running" in cs["state"]
    assert cs["image"] == TRITON_IMAGE, cs["image"]
    assert cs["imageID"].startswith("sha256:") or "@sha256:" in cs["imageID"], cs["imageID"]

    eps = wait_for("a ready endpoint for Service triton", lambda: ready_endpoints(kube, namespace, "triton"), 60)
    assert [ep["addresses"] for ep in eps] == [[status["podIP"]]]
    assert eps[0]["targetRef"]["name"] == pod["metadata"]["name"]

    out = infer_add_one(eps[0]["addresses"][0], [1.0, 2.5, -3.0, 41.0])
    np.testing.assert_allclose(out, [2.0, 3.5, -2.0, 42.0])
    # The same through the Service's ClusterIP: kube-proxy's DNAT on this machine, a test address throughout.
    # kube-proxy programs the endpoint after it turned ready (its rule sync runs at most once a second): until
    # then the ClusterIP rejects, as on any cluster. Where no rule of kube-proxy's matches the ClusterIP yet, nothing
    # answers ARP for it on the bridge and the connect fails with "No route to host" instead: seen once, with three
    # `make test` workers sharing the 2 cores.
    cluster_ip = kube.get("Service", "triton", namespace)["spec"]["clusterIP"]
    assert ipaddress.ip_address(cluster_ip) in ipaddress.ip_network("198.19.0.0/16")
    ready_at = time.monotonic()

    def through_cluster_ip() -> np.ndarray | None:
        try:
            return infer_add_one(cluster_ip, [7.0])
        except InferenceServerException as exc:
            if "Connection refused" in str(exc) or "No route to host" in str(exc):
                return None  # kube-proxy's rules do not have the endpoint yet
            raise

    np.testing.assert_allclose(wait_for("kube-proxy to send the ClusterIP to the endpoint", through_cluster_ip, 30,
                                        0.1), [8.0])
    record("ClusterIP answers after its endpoint turned ready (kube-proxy's sync)", f"{time.monotonic() - ready_at:.2f}s")

    deployment = wait_for("Deployment triton available", lambda: (
        d := kube.get("Deployment", "triton", namespace))["status"].get("availableReplicas") == 1 and d, 60)
    assert deployment["status"]["readyReplicas"] == 1


def test_unset_readiness_gate_keeps_pod_out_of_service(kube: Kube, namespace: str, nodes) -> None:
    kube.create(add_one_model(namespace))
    labels = {"app": "gated"}
    kube.create(triton_pod(namespace, "gated", labels, readinessGates=[{"conditionType": GATE}]))
    kube.create(service(namespace, "gated", labels))

    pod = wait_pod(kube, namespace, "gated", lambda p: container_status(p, "tritonserver").get("ready"),
                   "container ready", 120)
    assert condition(pod, "ContainersReady")["status"] == "True"
    ready = condition(pod, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ReadinessGatesNotReady"
    assert GATE in ready["message"]

    eps = wait_for("the gated pod listed in the EndpointSlice", lambda: endpoints(kube, namespace, "gated"), 60)
    assert eps[0]["addresses"] == [pod["status"]["podIP"]]
    assert eps[0]["conditions"]["ready"] is False

    # It stays out: the kubelet never flips Ready on its own while the gate is unset.
    consistently("the gated pod to stay unready and out of the Service", lambda: (
        not is_ready(kube.get("Pod", "gated", namespace)) and not ready_endpoints(kube, namespace, "gated")), 5)

    # A controller sets the gate (as the operator will): the kubelet keeps it and turns Ready.
    now = rfc3339()
    kube.patch("Pod", "gated", {"status": {"conditions": [
        {"type": GATE, "status": "True", "reason": "Test", "lastTransitionTime": now}]}}, namespace, sub="status")
    pod = wait_pod(kube, namespace, "gated", is_ready, "Ready after its gate was set", 30)
    assert condition(pod, GATE)["status"] == "True"
    wait_for("the gated pod ready in the EndpointSlice", lambda: ready_endpoints(kube, namespace, "gated"), 30)


def test_kubelet_allocates_gpus_through_the_device_plugin(kube: Kube, namespace: str, nodes) -> None:
    """The kubelet's own device manager hands out the plugin's devices: a container sees its IDs, and once every
    GPU of every node is taken the next GPU pod stays Pending."""
    per_node = nodes.gpus[nodes.node]
    total = sum(nodes.gpus.values())
    holders = []
    for i in range(total // per_node):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"holder-{i}", "namespace": namespace},
               "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                   "name": "hold", "image": OPERATOR_IMAGE, "command": ["python", "-c",
                                                                       "import time; time.sleep(3600)"],
                   "resources": {"limits": {"nvidia.com/gpu": str(per_node)}}}]}}
        kube.create(pod)
        holders.append(f"holder-{i}")
    running = [wait_pod(kube, namespace, n, lambda p: container_status(p, "hold").get("started"), "running", 120)
               for n in holders]
    seen: set[str] = set()
    for pod in running:
        environ = Path(f"/proc/{nodes.container_pid(pod, 'hold')}/environ").read_bytes().split(b"\0")
        [visible] = [e.decode().split("=", 1)[1] for e in environ if e.startswith(b"NVIDIA_VISIBLE_DEVICES=")]
        ids = visible.split(",")
        assert len(ids) == per_node and all(i.startswith(pod["spec"]["nodeName"] + "-gpu") for i in ids), ids
        seen.update(ids)
    assert len(seen) == total, seen
    assert {p["spec"]["nodeName"] for p in running} == set(nodes.names)
    kube.create({**triton_pod(namespace, "one-more")})
    pod = wait_pod(kube, namespace, "one-more", lambda p: condition(p, "PodScheduled"), "to get PodScheduled", 60)
    assert condition(pod, "PodScheduled")["status"] == "False"
    assert "nvidia.com/gpu" in condition(pod, "PodScheduled")["message"]


def test_pod_asking_for_too_many_gpus_stays_pending(kube: Kube, namespace: str, nodes) -> None:
    pod = triton_pod(namespace, "greedy")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(nodes.gpus[nodes.node] + 4)}}
    kube.create(pod)
    pod = wait_pod(kube, namespace, "greedy", lambda p: condition(p, "PodScheduled"), "to get PodScheduled", 60)
    scheduled = condition(pod, "PodScheduled")
    assert scheduled["status"] == "False" and scheduled["reason"] == "Unschedulable"
    assert "nvidia.com/gpu" in scheduled["message"]
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")


def test_image_missing_from_the_node_is_never_pulled_from_outside(kube: Kube, namespace: str, nodes) -> None:
    """No registry is reachable: an image that was not imported into the node's containerd fails at once."""
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busybox", "namespace": namespace},
                 "spec": {"containers": [{"name": "sh", "image": "busybox:1.36", "command": ["sleep", "3600"],
                                          "imagePullPolicy": "Never"}]}})
    pod = wait_pod(kube, namespace, "busybox",
                   lambda p: container_status(p, "sh").get("state", {}).get("waiting", {}).get("reason")
                   == "ErrImageNeverPull", "waiting with ErrImageNeverPull", 60)
    waiting = container_status(pod, "sh")["state"]["waiting"]
    assert "busybox:1.36" in waiting["message"] and "not present" in waiting["message"], waiting
    assert pod["status"]["phase"] == "Pending"
    assert not is_ready(pod)


def test_configmap_repository_in_none_mode_crash_loops(kube: Kube, namespace: str, nodes) -> None:
    """Real kubelet layout, real Triton: `..data` in a ConfigMap volume is a model Triton fails to load."""
    kube.create(add_one_model(namespace))
    pod = triton_pod(namespace, "none-mode")
    pod["spec"]["containers"][0]["args"] = ["--model-repository=/models", "--allow-gpu-metrics=false"]
    kube.create(pod)
    # restartCount and lastState are waited for together: a status with the count raised and no lastState yet was
    # seen once (a CI rehearsal at fe0a92c: KeyError 'terminated').
    pod = wait_pod(kube, namespace, "none-mode",
                   lambda p: container_status(p, "tritonserver").get("restartCount", 0) >= 1
                   and "terminated" in (container_status(p, "tritonserver").get("lastState") or {}),
                   "restarted after tritonserver exited, its last state recorded", 120)
    cs = container_status(pod, "tritonserver")
    assert cs["lastState"]["terminated"]["exitCode"] != 0
    assert not is_ready(pod)
    log = nodes.container_log(pod, "tritonserver", previous=True)
    assert "failed to load model '..data'" in log


def _netns_holding(ip: str) -> list[str]:
    """Network namespaces on this machine that hold `ip` (a pod's sandbox, while it exists)."""
    found = []
    for ns in sorted(Path("/run/netns").glob("*")) if Path("/run/netns").is_dir() else []:
        out = subprocess.run(["ip", "-n", ns.name, "-4", "-o", "addr"], capture_output=True, text=True,
                             check=False).stdout
        if f"inet {ip}/" in out:
            found.append(ns.name)
    return found


def test_deleting_pod_sigterms_tritonserver(kube: Kube, namespace: str, nodes) -> None:
    kube.create(add_one_model(namespace))
    kube.create(triton_pod(namespace, "doomed"))
    pod = wait_pod(kube, namespace, "doomed", is_ready, "Ready", 120)
    pid = nodes.container_pid(pod, "tritonserver")
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[0].endswith(b"tritonserver"), cmdline
    ip = pod["status"]["podIP"]
    assert infer_add_one(ip, [0.0]).tolist() == [1.0]
    assert _netns_holding(ip), f"no network namespace holds the pod's address {ip}"
    follower = LogFollower(nodes.of(pod), pod, "tritonserver")

    kube.delete("Pod", "doomed", namespace)
    wait_gone(kube, "Pod", namespace, "doomed", 60)
    assert not Path(f"/proc/{pid}").exists(), "tritonserver still running after its pod was deleted"
    assert "Signal (15) received." in follower.stop()  # SIGTERM, not SIGKILL
    wait_for("the pod's network namespace released", lambda: not _netns_holding(ip), 30)


#: The image built from our Dockerfile (`make images`), as the chart names it.
OPERATOR_IMAGE = DEFAULT_OPERATOR_IMAGE

#: A tiny HTTP server that reports, when SIGTERM arrives, whether the preStop exec hook has already run.
DRAIN_SCRIPT = """
import http.server, os, signal, sys, threading
port, name = int(sys.argv[1]), sys.argv[2]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(name.encode())
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
def on_term(*_):
    print(f"SIGTERM received; preStop marker present={os.path.exists('/scratch/prestop-ran')}", flush=True)
    threading.Thread(target=server.shutdown).start()
signal.signal(signal.SIGTERM, on_term)
print("serving", flush=True)
server.serve_forever()
print("exited cleanly", flush=True)
"""


def _drain_container(name: str, port: int, pre_stop: dict) -> dict:
    return {
        "name": name, "image": OPERATOR_IMAGE, "command": ["python", "-c", DRAIN_SCRIPT, str(port), name],
        "ports": [{"name": name[:15], "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/", "port": port}, "periodSeconds": 1},
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "lifecycle": {"preStop": pre_stop},
    }


def _output(log: LogFollower) -> list[str]:
    """A container's output lines so far."""
    return log.text().splitlines()


def _get(ip: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=5) as resp:
        return resp.read().decode()


def test_deleted_pod_runs_prestop_hooks_and_serves_until_sigterm(kube: Kube, namespace: str, nodes) -> None:
    """preStop as the kubelet runs it: each container's hook (sleep / exec), then SIGTERM, within the grace period.

    While the sleep hook runs the pod is terminating - no longer a ready endpoint - and its server still answers.
    """
    sleep = 5
    labels = {"app": "draining"}
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "draining", "namespace": namespace, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "containers": [_drain_container("sleeper", 8080, {"sleep": {"seconds": sleep}}),
                           _drain_container("execer", 8081, {"exec": {"command": ["touch", "/scratch/prestop-ran"]}})],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }
    created = kube.create(pod)
    # The API server keeps the sleep action (PodLifecycleSleepAction: beta and on from 1.30; a disabled gate would
    # drop it silently).
    assert created["spec"]["containers"][0]["lifecycle"]["preStop"] == {"sleep": {"seconds": sleep}}
    kube.create({**service(namespace, "draining", labels),
                 "spec": {"selector": labels, "ports": [{"name": "http", "port": 8080, "targetPort": 8080}]}})
    pod = wait_pod(kube, namespace, "draining", is_ready, "Ready", 60)
    ip = pod["status"]["podIP"]
    wait_for("the pod ready in the EndpointSlice", lambda: ready_endpoints(kube, namespace, "draining"), 30)
    sleeper_log, execer_log = (LogFollower(nodes.of(pod), pod, c) for c in ("sleeper", "execer"))

    kube.delete("Pod", "draining", namespace)
    [ep] = wait_for("the terminating pod's endpoint to turn not ready", lambda: [
        ep for ep in endpoints(kube, namespace, "draining")
        if not ep["conditions"].get("ready") and ep["conditions"].get("terminating")], 30)
    assert ep["addresses"] == [ip] and ep["conditions"]["serving"] is True
    # Out of the Service, yet still serving: the sleeper has not been sent SIGTERM (its hook is still sleeping).
    assert _get(ip, 8080) == "sleeper"
    assert _output(sleeper_log) == ["serving"], "SIGTERM before the preStop sleep was over"

    wait_gone(kube, "Pod", namespace, "draining", 60)
    sleeper_log.stop(), execer_log.stop()
    assert _output(sleeper_log)[1:] == ["SIGTERM received; preStop marker present=True", "exited cleanly"]
    # The exec hook ran inside the container (its /scratch) before the container got SIGTERM.
    assert _output(execer_log)[1:] == ["SIGTERM received; preStop marker present=True", "exited cleanly"]

# The operator's own API access (`platform.kube` over `platform.kubeconfig`'s in-cluster credentials), in its
# image, which ships no `kubernetes` client (issue 17: the operator's memory).
IN_CLUSTER_SCRIPT = """
import importlib.util, os
from triton_operator.platform.kube import Kube
kube = Kube.from_environment()
ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
pods = kube.list("v1", "Pod", ns)
print("listed", sorted(p["metadata"]["name"] for p in pods), "as", os.environ["POD_NAME"], os.environ["GREETING"])
print("kubernetes client installed:", importlib.util.find_spec("kubernetes") is not None)
"""


def test_operator_image_pod_reaches_api_server_with_its_service_account(kube: Kube, namespace: str, nodes) -> None:
    """What the operator's own pod needs: in-cluster config, a bound token, downward API and ConfigMap env."""
    kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "default-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]})
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": namespace},
                 "data": {"greeting": "hello"}})
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "in-cluster", "namespace": namespace},
                 "spec": {"restartPolicy": "Never", "containers": [{
                     "name": "client", "image": OPERATOR_IMAGE, "command": ["python", "-c", IN_CLUSTER_SCRIPT],
                     "env": [
                         {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                         {"name": "GREETING",
                          "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                     ]}]}})
    pod = wait_pod(kube, namespace, "in-cluster", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
                   "to finish", 90)
    log = nodes.container_log(pod, "client")
    assert pod["status"]["phase"] == "Succeeded", log
    assert "listed ['in-cluster'] as in-cluster hello" in log
    assert "kubernetes client installed: False" in log, log
    terminated = container_status(pod, "client")["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"


# Non-root (the image's 65532) into an emptyDir the kubelet made as root: each model's directory is created by
# the copy (copying into the volume's root would try to chmod a directory 65532 does not own: EPERM).
COPY_SCRIPT = """
import os, shutil, sys
for name in os.listdir(sys.argv[1]):
    if not name.startswith(".."):
        shutil.copytree(os.path.join(sys.argv[1], name), os.path.join(sys.argv[2], name))
print("copied")
"""


def test_init_container_prepares_repository_in_empty_dir(kube: Kube, namespace: str, nodes) -> None:
    """The fetch pattern: an init container fills an emptyDir, tritonserver loads every model in it.

    Also exercises an exec startup probe (run inside the container's mounts) and a gRPC readiness probe.
    """
    kube.create(add_one_model(namespace))
    server = triton_container(args=["--model-repository=/models", "--allow-gpu-metrics=false"])
    server["volumeMounts"] = [{"name": "repository", "mountPath": "/models"}]
    server["startupProbe"] = {"exec": {"command": ["test", "-f", "/models/add_one/1/model.py"]}, "periodSeconds": 1}
    server["readinessProbe"] = {"grpc": {"port": 8001}, "periodSeconds": 1}
    init = {"name": "fetch", "image": OPERATOR_IMAGE, "command": ["python", "-c", COPY_SCRIPT, "/src", "/models"],
            "volumeMounts": [{"name": "models", "mountPath": "/src", "readOnly": True},
                             {"name": "repository", "mountPath": "/models"}]}
    kube.create(triton_pod(namespace, "fetched", initContainers=[init], containers=[server],
                           volumes=[model_volume(), {"name": "repository", "emptyDir": {}}]))
    pod = wait_pod(kube, namespace, "fetched", is_ready, "Ready", 120)
    init_status = pod["status"]["initContainerStatuses"][0]
    assert init_status["state"]["terminated"]["exitCode"] == 0
    assert condition(pod, "Initialized")["status"] == "True"
    assert container_status(pod, "tritonserver")["started"] is True
    assert infer_add_one(pod["status"]["podIP"], [5.0]).tolist() == [6.0]
    assert "copied" in nodes.container_log(pod, "fetch")


def test_failing_liveness_probe_restarts_tritonserver(kube: Kube, namespace: str, nodes) -> None:
    kube.create(add_one_model(namespace))
    pod = triton_pod(namespace, "unlive", terminationGracePeriodSeconds=10)
    c = pod["spec"]["containers"][0]
    c["startupProbe"] = {"tcpSocket": {"port": "grpc"}, "periodSeconds": 1, "failureThreshold": 60}
    c["livenessProbe"] = {"httpGet": {"path": "/v2/models/no_such_model/ready", "port": "http"},
                          "periodSeconds": 1, "failureThreshold": 2}
    kube.create(pod)
    pod = wait_pod(kube, namespace, "unlive",
                   lambda p: container_status(p, "tritonserver").get("restartCount", 0) >= 1,
                   "restarted by its liveness probe", 120)
    # The kubelet stopped it (SIGTERM: tritonserver exits cleanly) and says why in its Killing event.
    last = container_status(pod, "tritonserver")["lastState"]["terminated"]
    assert last["reason"] == "Completed" and last["exitCode"] == 0, last
    events = kube.items("Event", namespace, field_selector={"involvedObject.name": "unlive"})
    assert any(e["reason"] == "Killing" and "failed liveness probe" in e["message"] for e in events), [
        (e["reason"], e["message"]) for e in events]
    assert "Signal (15) received." in nodes.container_log(pod, "tritonserver", previous=True)


def test_configmap_update_reaches_running_tritonserver(kube: Kube, namespace: str, nodes) -> None:
    """ConfigMap volumes are re-synced (atomic `..data` swap) and Triton reloads the new config on request."""
    kube.create(add_one_model(namespace))
    kube.create(triton_pod(namespace, "reload"))
    pod = wait_pod(kube, namespace, "reload", is_ready, "Ready", 120)
    client = grpcclient.InferenceServerClient(f"{pod['status']['podIP']}:8001")
    try:
        assert "revision" not in client.get_model_config("add_one").config.parameters
        config = ADD_ONE_CONFIG + 'parameters { key: "revision" value { string_value: "2" } }\n'
        kube.patch("ConfigMap", "add-one-model", {"data": {"config.pbtxt": config}}, namespace)

        def reloaded() -> str | None:
            try:
                client.load_model("add_one")  # explicit mode: re-reads the repository
                params = client.get_model_config("add_one").config.parameters
            except InferenceServerException:
                return None  # e.g. a load racing the volume swap: try again
            return params["revision"].string_value if "revision" in params else None

        assert wait_for("tritonserver to load the updated config", reloaded, 60, interval=2) == "2"
        assert infer_add_one(pod["status"]["podIP"], [1.0]).tolist() == [2.0]
    finally:
        client.close()


# What the operator image holds and runs with (issue 28): every distribution with its requirements, whether grpc (for
# the loads and unloads, `triton/repository.py`) and numpy are there, the modules of each command it runs (`run`,
# `fetch` with its s3:// and gs:// clients, `probe`) imported as those commands import them, and `validate`, which
# needs the `server` extra the image leaves out.
IMAGE_CONTENTS_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, subprocess, sys
dists = {d.metadata["Name"]: {"version": d.version, "requires": d.requires or []} for d in md.distributions()}
found = {m: importlib.util.find_spec(m) is not None for m in ("grpc", "numpy", "ml_dtypes", "rapidjson")}
import triton_operator.cli.run, triton_operator.controller.operator, triton_operator.agent.fetch, triton_operator.agent.probe
from triton_operator.render.modelconfig import pb
loaded = [m for m in ("grpc", "numpy") if m in sys.modules]  # by the commands' modules (gs:// clients load grpc)
import boto3, google.cloud.storage
import grpc.aio  # what triton/repository.py imports at its first load: it loads without numpy
helps = {c: subprocess.run(["triton-operator", c, "--help"], capture_output=True).returncode
         for c in ("run", "fetch", "probe")}
open("/tmp/model.yaml", "w").write(sys.argv[1])
validate = subprocess.run(["triton-operator", "validate", "/tmp/model.yaml", "--cpu"], capture_output=True, text=True)
print(json.dumps({"dists": dists, "found": found, "loaded": loaded, "numpy after grpc": "numpy" in sys.modules,
                  "schema": pb.ModelConfig.DESCRIPTOR.full_name, "help": helps,
                  "validate": [validate.returncode, validate.stderr]}))
"""


def test_operator_image_has_no_numpy_and_every_package_its_commands_need(
        kube: Kube, namespace: str, nodes) -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from e2e.images import LOCK_LEFT_OUT

    model = (REPO_ROOT / "examples" / "add-sub.yaml").read_text()
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "image-contents", "namespace": namespace},
                 "spec": {"restartPolicy": "Never", "containers": [{
                     "name": "inspect", "image": OPERATOR_IMAGE,
                     "command": ["python", "-c", IMAGE_CONTENTS_SCRIPT, model]}]}})
    pod = wait_pod(kube, namespace, "image-contents", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
                   "to finish", 120)
    log = nodes.container_log(pod, "inspect")
    assert pod["status"]["phase"] == "Succeeded", log
    seen = json.loads(log.strip().splitlines()[-1])
    names = {canonicalize_name(n) for n in seen["dists"]}
    assert "numpy" not in names and "grpcio" in names, sorted(names)
    assert seen["found"] == {"grpc": True, "numpy": False, "ml_dtypes": False, "rapidjson": False}, seen["found"]
    assert seen["loaded"] == [] and not seen["numpy after grpc"] and seen["schema"] == "inference.ModelConfig"
    assert seen["help"] == {"run": 0, "fetch": 0, "probe": 0}, seen["help"]
    code, stderr = seen["validate"]
    assert code == 2 and "pip install 'triton-operator[server]'" in stderr and "Traceback" not in stderr, (code, stderr)
    # Installed with --no-deps from the lock: every requirement of every package is there, but for what tritonclient
    # asks for its client, left out on purpose.
    env = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    missing = []
    for dist, info in sorted(seen["dists"].items()):
        for line in info["requires"]:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = canonicalize_name(req.name)
            if name not in names and not (canonicalize_name(dist) == "tritonclient" and name in LOCK_LEFT_OUT):
                missing.append(f"{dist} needs {line}")
    assert not missing, missing
    assert len(names) > 20, sorted(names)


def _tiny_oci_archive(path: Path, ref: str, content: bytes) -> str:
    """An oci-archive of a one-layer image named `ref` whose one file holds `content`; returns its layer's digest."""
    def blob(data: bytes) -> tuple[str, int, bytes]:
        return f"sha256:{hashlib.sha256(data).hexdigest()}", len(data), data

    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as tar:
        info = tarfile.TarInfo("payload")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    layer = blob(layer_buf.getvalue())
    config = blob(json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                              "rootfs": {"type": "layers", "diff_ids": [layer[0]]}}).encode())
    manifest = blob(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config[0], "size": config[1]},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer[0],
                    "size": layer[1]}]}).encode())
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest[0], "size": manifest[1],
        "annotations": {"org.opencontainers.image.ref.name": ref}}]}
    with tarfile.open(path, "w") as tar:
        files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
                 "index.json": json.dumps(index).encode()}
        files |= {f"blobs/sha256/{d.split(':')[1]}": data for d, _, data in (layer, config, manifest)}
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return layer[0]


def test_an_import_over_an_older_build_leaves_no_unused_layer_on_the_node(nodes, tmp_path: Path) -> None:
    """A warm node is given a new build of an image under the same ref (each code change makes a new operator
    image): the old build's layers go from the node's containerd at once, not at its 100th change (a node's store
    grew to 2.9 GB beside 1.2 GB fresh). Two tiny images under one ref, imported in turn into a real node's
    containerd; what the node runs is not touched."""

    node = nodes.real(nodes.names[0])
    address, snapshotter = node.containerd_address, node.snapshotter
    ref = f"localhost/triton-operator/e2e-gc-{uuid.uuid4().hex[:6]}:1"
    old_archive, new_archive = tmp_path / "old.oci.tar", tmp_path / "new.oci.tar"
    old_layer = _tiny_oci_archive(old_archive, ref, b"old build " + uuid.uuid4().bytes)
    new_layer = _tiny_oci_archive(new_archive, ref, b"new build " + uuid.uuid4().bytes)

    def content() -> set[str]:
        return set(node.ctr("content", "ls", "-q").split())

    def named() -> dict[str, str]:
        return {r: d for r, d in images.containerd_images(address).items() if not r.startswith("sha256:")}

    try:
        images.import_into([images.Image(ref, (), old_archive)], address, log=print, snapshotter=snapshotter)
        assert old_layer in content(), "the first build's layer was never imported"
        before = named()
        images.import_into([images.Image(ref, (), new_archive)], address, log=print, snapshotter=snapshotter)
        after = named()
        assert after[ref] == images.archive_digest(new_archive) and new_layer in content()
        assert old_layer not in content(), (
            f"the replaced build's layer is still in the node's content store; references: "
            f"{images.containerd_images(address)}")
        assert not images.orphaned_ids(images.containerd_images(address)), images.containerd_images(address)
        assert images.GC_TAG not in after, "the throwaway tag stayed"
        assert {r: d for r, d in after.items() if r != ref} == {r: d for r, d in before.items() if r != ref}, (
            "another image's name moved or went")
    finally:
        node.ctr("images", "rm", ref, check=False)
        images.collect_garbage(address, log=print)  # the CRI plugin's ID reference of the new build
