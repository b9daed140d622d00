"""Helpers the e2e tests share: waiting on API state, manifests for Triton pods, diagnostics.

Owns the small vocabulary tests are written in (`wait_pod`, `ready_endpoints`, `add_one_model`,
`triton_container`) and `diagnostics()`, the text dumped when a cluster test fails: pods with
their conditions and container states, events, and the tails of the kubelets', containerds', the API
server's and every container's logs.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from e2e.images import TRITON_REF
from e2e.kube import ApiError, Kube, condition, wait_for

#: What the test clusters run as tritonserver: the local CPU build of 2.51 (e2e/images.py), named as what it is.
TRITON_IMAGE = TRITON_REF

ADD_ONE_CONFIG = textwrap.dedent(
    """\
    name: "add_one"
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
    """
)

ADD_ONE_MODEL = textwrap.dedent(
    """\
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                out = pb_utils.Tensor("OUTPUT0", (x + 1).astype(np.float32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses
    """
)


def add_one_model(namespace: str, name: str = "add-one-model") -> dict:
    """A ConfigMap holding the add_one Python model; mount it with `model_volume()`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"config.pbtxt": ADD_ONE_CONFIG, "model.py": ADD_ONE_MODEL},
    }


def model_volume(configmap: str = "add-one-model", model: str = "add_one") -> dict:
    """A ConfigMap can't hold a tree: `items` lay the keys out as <model>/config.pbtxt, <model>/1/model.py."""
    return {
        "name": "models",
        "configMap": {
            "name": configmap,
            "items": [
                {"key": "config.pbtxt", "path": f"{model}/config.pbtxt"},
                {"key": "model.py", "path": f"{model}/1/model.py"},
            ],
        },
    }


def triton_container(args: list[str] | None = None, gpus: int = 1, probe: bool = True) -> dict:
    """The tritonserver container as users write it for the NGC image.

    A ConfigMap volume carries the kubelet's `..data` and `..<timestamp>` directories, which
    Triton would try to load as models; explicit mode with --load-model loads only the model.
    """
    c: dict[str, Any] = {
        "name": "tritonserver",
        "image": TRITON_IMAGE,
        "command": ["tritonserver"],
        "args": args
        or [
            "--model-repository=/models",
            "--model-control-mode=explicit",
            "--load-model=add_one",
            "--allow-gpu-metrics=false",
        ],
        "ports": [
            {"name": "http", "containerPort": 8000},
            {"name": "grpc", "containerPort": 8001},
            {"name": "metrics", "containerPort": 8002},
        ],
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    }
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if probe:
        c["readinessProbe"] = {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 1,
                               "failureThreshold": 3}
    return c


def triton_pod(namespace: str, name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": [triton_container()], "volumes": [model_volume()], **spec},
    }


def service(namespace: str, name: str, selector: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": selector,
            "ports": [
                {"name": "http", "port": 8000, "targetPort": "http"},
                {"name": "grpc", "port": 8001, "targetPort": "grpc"},
            ],
        },
    }


# -- waiting ------------------------------------------------------------------------------------


def wait_pod(kube: Kube, namespace: str, name: str, pred: Callable[[dict], Any], what: str,
             timeout: float = 90.0) -> dict:
    def probe() -> dict | None:
        pod = kube.get("Pod", name, namespace)
        return pod if pred(pod) else None

    return wait_for(f"pod {namespace}/{name} {what}", probe, timeout)


def is_ready(pod: dict) -> bool:
    c = condition(pod, "Ready")
    return bool(c and c["status"] == "True")


def container_status(pod: dict, name: str) -> dict:
    for s in (pod.get("status") or {}).get("containerStatuses") or []:
        if s["name"] == name:
            return s
    return {}


def endpoints(kube: Kube, namespace: str, svc: str) -> list[dict]:
    """Every endpoint of the Service's EndpointSlices, each with its addresses and conditions."""
    slices = kube.items("EndpointSlice", namespace, label_selector={"kubernetes.io/service-name": svc})
    return [ep for s in slices for ep in s.get("endpoints") or []]


def ready_endpoints(kube: Kube, namespace: str, svc: str) -> list[dict]:
    return [ep for ep in endpoints(kube, namespace, svc) if (ep.get("conditions") or {}).get("ready")]


def ready_addresses(kube: Kube, namespace: str, svc: str) -> set[str]:
    """The addresses (pod IPs) of the Service's ready endpoints: where it sends new connections."""
    return {a for ep in ready_endpoints(kube, namespace, svc) for a in ep.get("addresses") or ()}


def proxied_addresses(namespace: str, service: str, port: str = "http") -> set[str] | None:
    """The pod IPs kube-proxy's rules in this network namespace send the Service's `port` to (the jumps of its
    KUBE-SVC chain, iptables mode); None when no kube-proxy writes rules here (no KUBE-SERVICES chain). A ready
    endpoint is among them only once kube-proxy has synced, which lags the EndpointSlice on a busy machine: a load
    through the ClusterIP started before that is refused (seen in e2e/test_rollouts.py: 4 connections refused in the
    first 0.4 s, both endpoints ready in the slice)."""
    try:
        out = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    if ":KUBE-SERVICES " not in out:
        return None
    tag = f'"{namespace}/{service}:{port} -> '
    return {line.split(tag, 1)[1].split(":", 1)[0] for line in out.splitlines()
            if line.startswith("-A KUBE-SVC-") and tag in line}


def routed(kube: Kube, namespace: str, service: str, port: str = "grpc", timeout: float = 60.0) -> str:
    """The Service's ClusterIP, once kube-proxy sends its `port` to every ready endpoint of its EndpointSlices (and
    to nothing else): a model's status says Ready as soon as its slices do, and kube-proxy's rule sync lags them on a
    busy machine, when a connection to the ClusterIP is refused (seen in e2e/test_pool_sources.py with four xdist
    workers on two cores). Where no kube-proxy writes rules here, once the slices have a ready endpoint."""
    ip = str(kube.get("Service", service, namespace)["spec"]["clusterIP"])

    def synced() -> bool:
        ready = ready_addresses(kube, namespace, service)
        proxied = proxied_addresses(namespace, service, port)
        return bool(ready) and proxied in (ready, None)

    wait_for(f"kube-proxy sending {namespace}/{service}:{port} to its ready endpoints", synced, timeout, 0.2)
    return ip


def consistently(what: str, check: Callable[[], Any], duration: float, interval: float = 0.5) -> None:
    """Asserts `check()` stays truthy for `duration` seconds (polled), e.g. a pod that must stay unready."""
    import time

    deadline = time.monotonic() + duration
    while True:
        assert check(), f"expected {what} to hold for {duration:.0f}s, but it stopped holding"
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


def wait_gone(kube: Kube, kind: str, namespace: str, name: str, timeout: float = 60.0) -> None:
    wait_for(f"{kind} {namespace}/{name} to be gone", lambda: kube.get_or_none(kind, name, namespace) is None,
             timeout)


def delete_namespace(kube: Kube, name: str, timeout: float = 120.0, grace: int = 0) -> None:
    """Deletes a test's namespace and returns once its pods are gone from the API, so none holds a GPU the next test's
    pods need (the scheduler counts a pod's GPUs until its object is gone). A terminating namespace admits no new pod,
    so its pods go at once: deleted with grace 0, a force deletion, the object goes at once and the kubelet stops the
    containers after it (its minimum grace, 2 s), when the next test has begun. With a grace of 1 s, as until issue 40,
    the wait lasted until the kubelet had stopped every container, torn the sandbox down and confirmed: 4 s a test at
    the median, 14-27 s for some, about 460 of the cluster tier's 3,800 test-seconds; e2e/test_smoke.py took 148 s
    with it and 84 s without. What a replica does when deleted is checked by the tests about it, not here.

    `grace=1` waits for the kubelet to have stopped every container: for a namespace where an operator ran (a test's
    own helm release), none of whose processes may go on after its test, even for the kubelet's 2 s."""
    with contextlib.suppress(ApiError):
        kube.delete("Namespace", name)
    with contextlib.suppress(ApiError):
        kube.request("DELETE", f"/api/v1/namespaces/{name}/pods",
                     {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace})
    wait_for(f"pods in {name} to be gone", lambda: not kube.items("Pod", name), timeout)


# -- diagnostics ----------------------------------------------------------------------------------


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"<{e}>"


def diagnostics(kube: Kube | None, namespace: str | None, cluster_logs: Path | None) -> str:
    """What went on in a failed test's namespace: pods, containers (with their logs, read through the API
    server as `kubectl logs` does), events and EndpointSlices, then the tails of the cluster's own logs
    (API server, controller-manager, scheduler, and each node's kubelet and containerd)."""
    out: list[str] = []
    if kube is not None and namespace:
        try:
            for pod in kube.items("Pod", namespace):
                md, st = pod["metadata"], pod.get("status") or {}
                out.append(f"--- pod {md['name']} uid={md['uid']} node={pod['spec'].get('nodeName')} "
                           f"phase={st.get('phase')} podIP={st.get('podIP')}")
                for c in st.get("conditions") or []:
                    out.append(f"    condition {c['type']}={c['status']} reason={c.get('reason')} "
                               f"message={c.get('message')}")
                statuses = (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or [])
                for cs in statuses:
                    out.append(f"    container {cs['name']} ready={cs.get('ready')} restarts={cs.get('restartCount')}"
                               f" state={json.dumps(cs.get('state'))} last={json.dumps(cs.get('lastState'))}")
                for cs in statuses:
                    if "waiting" in (cs.get("state") or {}) and not cs.get("restartCount"):
                        continue  # never started: no log
                    # The running container's log, and for a restarted one why the last one ended (kept by
                    # the kubelet).
                    for label, query in (("container log", ""), ("previous container log", "&previous=true")):
                        if query and not cs.get("restartCount"):
                            continue
                        try:
                            text = kube.request_text(
                                "GET", f"/api/v1/namespaces/{namespace}/pods/{md['name']}/log?container={cs['name']}"
                                       f"&tailLines=60{query}", timeout=10)
                        except (ApiError, OSError) as e:
                            text = f"<{e}>"
                        out.append(f"--- {label} {md['name']}/{cs['name']} (tail)\n{text}")
            for ev in kube.items("Event", namespace)[-30:]:
                out.append(f"    event {ev.get('type')} {ev.get('reason')} "
                           f"{ev['involvedObject'].get('name')}: {ev.get('message')}")
            for ep in kube.items("EndpointSlice", namespace):
                out.append(f"--- endpointslice {ep['metadata']['name']}: {json.dumps(ep.get('endpoints'))}")
        except (ApiError, OSError) as e:
            out.append(f"<diagnostics: {e}>")
    if cluster_logs is not None:
        names = ["kube-apiserver.log", "kube-controller-manager.log", "kube-scheduler.log", "kube-proxy.log"]
        names += sorted(str(p.relative_to(cluster_logs)) for p in cluster_logs.glob("*/*.log"))
        for name in names:
            path = cluster_logs / name
            if path.exists():
                out.append(f"--- {path} (tail)\n{_tail(path, 30)}")
    return "\n".join(out)


def metric_samples(text: str, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of one metric in Prometheus text, keyed by its sorted labels."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == metric:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def endpoint_of(kube: Kube, namespace: str, service: str, ip: str) -> dict | None:
    return next((ep for ep in endpoints(kube, namespace, service) if ip in ep.get("addresses", ())), None)


def endpoint_ready(kube: Kube, namespace: str, service: str, ip: str) -> bool:
    ep = endpoint_of(kube, namespace, service, ip)
    return bool(ep and (ep.get("conditions") or {}).get("ready"))


def working_set(pid: int) -> int:
    """The working set of the memory cgroup (v1) of the container that runs `pid` on this machine's node: usage less
    inactive file pages, as the kubelet counts it (and evicts by); the OOM killer acts at the container's limit on
    the same usage."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            usage = int((d / "memory.usage_in_bytes").read_text())
            stat = dict(ln.split() for ln in (d / "memory.stat").read_text().splitlines())
            return usage - int(stat.get("total_inactive_file", 0))
    raise LookupError(f"process {pid} has no memory cgroup")


def vm_rss(pid: int) -> int:
    """The resident memory of process `pid` (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"process {pid} has no VmRSS")
