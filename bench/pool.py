"""Benchmark `pool`: a TritonPool against one Deployment per model, in the same run (issue 29).

On our own cluster (control plane, one real node with containerd, a kubelet and the fake-GPU device plugin; the
operator as a host process; kube-proxy too when the bench runs in a network namespace of its own, as the e2e tests
do: `e2e/netns-python -m bench.run pool`, so that its rules stay there):

1. GPUs for GPU_MODELS small Python models with one copy each. A GPU pool (server.gpus 1 per replica,
   capacity.memoryPerGpu) holding them all, until every model is Ready AllCopiesWarmed; then the same models as
   TritonModels with Deployments of their own (server.gpus 1), until each pod is Running or unschedulable. Counted:
   nvidia.com/gpu requested by Running pods (the kubelet allocated those devices through the device-plugin API),
   the node's allocatable, and the pods left Pending for want of a GPU.
2. `kubectl apply` of a new model -> its first ready endpoint in its Service's EndpointSlices (seen on a watch), on
   the warm pool (APPLY_REPEAT times, against the operator's own log line "Loaded model into pool replica ...
   seconds=": Triton's load + warm-up as the operator timed it, its load request to Triton's READY answer at the
   digest; and again from the API server's answer to the model's create, its audit line's stageTimestamp, which
   leaves kubectl's own start-up out: the operator's share), and for a new TritonModel with its own Deployment
   (APPLY_REPEAT times).
3. BIG_MODELS models created together into one CPU pool: time until every one is Ready AllCopiesWarmed, one
   inference request to each through its Service (its ClusterIP through kube-proxy; without kube-proxy, a
   ready endpoint of its slices), the operator's API requests per model (the
   audit log) and its peak RSS (VmHWM). If the machine's free memory would not hold that many Python models (each a
   stub process), the count is lowered to what fits, and the result says so.
4. Throughout, a gate audit: every endpoint the operator lists ready for a pooled model is checked at once against
   Triton at the pod IP (the model READY, at the config digest in the model's status). An endpoint listed ready for a
   model Triton does not serve there at that digest is a violation.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from e2e.kube import Kube, condition, wait_for
from triton_operator.api.kinds import LABEL_MODEL
from triton_operator.api.pod import DIGEST_PARAMETER
from triton_operator.api.pool import ENDPOINTSLICE_MANAGER, LABEL_POOL
from triton_operator.api.timestamps import parse_rfc3339

from .clients import by_client
from .common import CpuMeter, Result, Row, log, ms, summary, write_result
from .kubeenv import (
    NODE,
    BackgroundWatch,
    BenchCluster,
    OperatorProcess,
    audit_requests,
    create_all,
    delete_all,
    kubectl,
    own_netns,
    pool_bench,
)
from .models import DOUBLE_PY
from .pods import tree_rss_kb

NAMESPACE = "bench-pool"
GPU_MODELS = int(os.environ.get("BENCH_POOL_GPU_MODELS", "40"))
BIG_MODELS = int(os.environ.get("BENCH_POOL_MODELS", "200"))
NODE_GPUS = int(os.environ.get("BENCH_POOL_NODE_GPUS", "16"))
APPLY_REPEAT = int(os.environ.get("BENCH_POOL_APPLY_REPEAT", "3"))
BIG_REPLICAS = int(os.environ.get("BENCH_POOL_REPLICAS", "4"))
#: Memory the bench leaves to everything else on the machine (other people's clusters run here too).
HEADROOM_MB = int(os.environ.get("BENCH_POOL_HEADROOM_MB", "6144"))
#: The result's name (bench/results/<name>.json): another name keeps a comparison run beside the last `pool`.
RESULT_NAME = os.environ.get("BENCH_POOL_NAME", "pool")
MODEL_MEMORY = "128Mi"
LOADED = re.compile(r"Loaded model into pool replica namespace=(\S+) pool=(\S+) pod=(\S+) model=(\S+) digest=(\S+) "
                    r"seconds=([0-9.]+)")
FAILED = "Failed to load model into pool replica"



class PoolCluster(BenchCluster):
    """The bench cluster with NODE_GPUS fake GPUs, and kube-proxy when in a network namespace of its own (requests
    then go through each model's ClusterIP; else to a ready endpoint of its Service's slices)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpus, self.kube_proxy = NODE_GPUS, own_netns()


def model(name: str, pool: str | None = None, gpus: int = 0) -> dict[str, Any]:
    """A small Python model (INPUT * 2), on `pool` or with its own Deployment (`gpus` per replica)."""
    spec: dict[str, Any] = {
        "backend": "python", "maxBatchSize": 8,
        "inputs": [{"name": "INPUT", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUTPUT", "dataType": "FP32", "dims": [4]}],
        "instanceGroups": [{"kind": "CPU", "count": 1}],
        "source": {"inline": {"model.py": DOUBLE_PY}},
    }
    if pool:
        spec.update(pool=pool, memory=MODEL_MEMORY, replicas=1)
    else:
        spec.update(replicas=1, server={"gpus": gpus, "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}}})
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def pool_doc(name: str, replicas: int, gpus: int, capacity: str) -> dict[str, Any]:
    cap = {"memoryPerGpu": capacity} if gpus else {"memoryPerReplica": capacity}
    server: dict[str, Any] = {"resources": {"requests": {"cpu": "10m", "memory": "256Mi"}}}
    if gpus:
        server["gpus"] = gpus
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonPool",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"replicas": replicas, "capacity": cap, "server": server}}


def warmed(tm: dict[str, Any]) -> bool:
    c = condition(tm, "Ready") or {}
    return c.get("status") == "True" and c.get("reason") == "AllCopiesWarmed"


def triton_serves(ip: str, name: str) -> tuple[bool, str | None]:
    """Triton's own answer at the pod IP: the model READY, and the digest of the config it has loaded."""
    try:
        with urllib.request.urlopen(f"http://{ip}:8000/v2/models/{name}/ready", timeout=5) as resp:
            if resp.status != 200:
                return False, None
        with urllib.request.urlopen(f"http://{ip}:8000/v2/models/{name}/config", timeout=5) as resp:
            cfg = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False, None
    return True, ((cfg.get("parameters") or {}).get(DIGEST_PARAMETER) or {}).get("string_value")


def infer(address: str, name: str) -> bool:
    body = json.dumps({"inputs": [{"name": "INPUT", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    req = urllib.request.Request(f"http://{address}:8000/v2/models/{name}/infer", body.encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - a ClusterIP of our cluster
            return json.loads(resp.read())["outputs"][0]["data"] == [2, 4, 6, 8]
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError):
        return False


class Slices(BackgroundWatch):
    """Every EndpointSlice of the namespace: when each (Service, address) was first listed ready, and, for pooled
    models (our slices), the gate audit: each endpoint newly listed ready is checked at once against Triton."""

    kind = "EndpointSlice"

    def __init__(self, kube: Kube, namespace: str) -> None:
        super().__init__(kube, namespace)
        self.kube = Kube(kube.kubeconfig)
        self.lock = threading.Lock()
        self.first_ready: dict[tuple[str, str], float] = {}
        self.listed: dict[tuple[str, str], bool] = {}  # (service, address) -> listed ready now (our slices)
        self.checks = 0
        self.violations: list[dict[str, Any]] = []
        self.pool = ThreadPoolExecutor(4)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.pool.shutdown(wait=True)

    def _on_event(self, typ: str, eps: dict[str, Any], t: float) -> None:
        md = eps["metadata"]
        labels = md.get("labels") or {}
        svc = labels.get("kubernetes.io/service-name")
        if not svc:
            return
        ours = labels.get("endpointslice.kubernetes.io/managed-by") == ENDPOINTSLICE_MANAGER
        ready = set() if typ == "DELETED" else {
            a for e in eps.get("endpoints") or () if (e.get("conditions") or {}).get("ready")
            for a in e.get("addresses") or ()}
        with self.lock:
            for addr in ready:
                self.first_ready.setdefault((svc, addr), t)
            if not ours:
                return
            for (s, addr), was in list(self.listed.items()):
                if s == svc and was and addr not in ready:
                    self.listed[(s, addr)] = False
            for addr in ready:
                if not self.listed.get((svc, addr)):
                    self.listed[(svc, addr)] = True
                    self.pool.submit(self._audit, svc, addr, t, md.get("resourceVersion"))

    def _audit(self, svc: str, addr: str, t: float, rv: str | None) -> None:
        tm = self.kube.get_or_none("TritonModel", svc, NAMESPACE)
        want = ((tm or {}).get("status") or {}).get("configDigest")
        ok, digest = triton_serves(addr, svc)
        with self.lock:
            self.checks += 1
            if tm is None or (tm["metadata"].get("deletionTimestamp")):
                return  # its slices go with it (garbage collection); not a gate decision
            if not ok or (want and digest != want):
                self.violations.append({"service": svc, "address": addr, "listed_at": t, "slice_rv": rv,
                                        "triton_ready": ok, "triton_digest": digest, "desired": want,
                                        "checked_after_s": round(time.time() - t, 3)})
                log(f"Gate audit violation: {self.violations[-1]}")


def wait_models(kube: Kube, names: list[str], timeout: float, what: str = "Ready AllCopiesWarmed",
                ok: Any = warmed) -> dict[str, float]:
    """Polls the namespace's TritonModels until each of `names` satisfies `ok`; returns when each first did."""
    done: dict[str, float] = {}
    want = set(names)
    deadline = time.monotonic() + timeout
    while want - set(done) and time.monotonic() < deadline:
        now = time.time()
        for tm in kube.items("TritonModel", NAMESPACE):
            n = tm["metadata"]["name"]
            if n in want and n not in done and ok(tm):
                done[n] = now
        time.sleep(0.5)
    if want - set(done):
        log(f"Timed out waiting for {what}: {len(want - set(done))} of {len(want)} not yet, e.g. "
            f"{sorted(want - set(done))[:5]}")
    return done


def gpu_pods(kube: Kube, selector: str) -> dict[str, Any]:
    """GPUs requested by the selected pods, by phase, and the pods unschedulable for want of nvidia.com/gpu."""
    running = pending_gpu = pending_other = 0
    gpus_running = gpus_asked = 0
    for p in kube.items("Pod", NAMESPACE, labelSelector=selector):
        gpus = sum(int((c.get("resources") or {}).get("requests", {}).get("nvidia.com/gpu", 0))
                   for c in p["spec"]["containers"])
        gpus_asked += gpus
        phase = (p.get("status") or {}).get("phase")
        if phase == "Running":
            running += 1
            gpus_running += gpus
        else:
            c = condition(p, "PodScheduled") or {}
            if c.get("status") == "False" and "nvidia.com/gpu" in (c.get("message") or ""):
                pending_gpu += 1
            else:
                pending_other += 1
    node = kube.get("Node", NODE)
    return {"pods_running": running, "gpus_allocated_to_running_pods": gpus_running, "gpus_asked": gpus_asked,
            "pods_pending_for_gpu": pending_gpu, "pods_pending_other": pending_other,
            "node_gpus_allocatable": int(node["status"]["allocatable"].get("nvidia.com/gpu", 0))}


def settled(kube: Kube, selector: str, count: int) -> bool:
    g = gpu_pods(kube, selector)
    return g["pods_running"] + g["pods_pending_for_gpu"] >= count


def loaded_seconds(log_path: Path) -> dict[str, list[float]]:
    """The operator's "Loaded model into pool replica ... seconds=" figures, by model."""
    out: dict[str, list[float]] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        m = LOADED.search(line)
        if m:
            out.setdefault(m.group(4), []).append(float(m.group(6)))
    return out


def pool_rss_mb(cluster: BenchCluster, kube: Kube, pool: str) -> list[float]:
    """RSS of each replica's tritonserver and its Python stubs."""
    out = []
    for p in kube.items("Pod", NAMESPACE, labelSelector=f"{LABEL_POOL}={pool}"):
        try:
            out.append(round(tree_rss_kb(cluster.container_pid(p, "tritonserver")) / 1024, 1))
        except (OSError, LookupError, ValueError, KeyError):
            continue
    return out


def available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def gpu_phase(kube: Kube, cluster: BenchCluster) -> dict[str, Any]:
    names = [f"g-{i:03d}" for i in range(GPU_MODELS)]
    kube.create(pool_doc("gpu", 1, 1, "16Gi"))
    t0 = time.time()
    create_all(kube, [model(n, pool="gpu") for n in names])
    done = wait_models(kube, names, 300 + 10 * GPU_MODELS)
    pool_seconds = max(done.values()) - t0 if len(done) == len(names) else None
    pool_gpus = gpu_pods(kube, f"{LABEL_POOL}=gpu")
    log(f"GPU pool: {len(done)}/{len(names)} models Ready in {pool_seconds} s; {pool_gpus}")
    rss = pool_rss_mb(cluster, kube, "gpu")
    # The same models, each with its own Deployment and one GPU per replica.
    dnames = [f"d-{i:03d}" for i in range(GPU_MODELS)]
    t1 = time.time()
    create_all(kube, [model(n, gpus=1) for n in dnames])
    selector = LABEL_MODEL  # a model's own pods; pool replicas carry no model label
    wait_for(f"{GPU_MODELS} Deployment pods Running or unschedulable",
             lambda: settled(kube, selector, GPU_MODELS), 300 + 10 * GPU_MODELS, 1.0)
    dep_gpus = gpu_pods(kube, selector)
    log(f"Deployments: {dep_gpus} seconds={time.time() - t1:.0f}")
    delete_all(kube, "TritonModel", dnames, NAMESPACE)
    wait_for("the Deployments' pods gone", lambda: not kube.items("Pod", NAMESPACE, labelSelector=selector),
             300, 1.0)
    return {"models": GPU_MODELS, "pool": pool_gpus, "deployments": dep_gpus, "pool_models_ready": len(done),
            "pool_converge_seconds": pool_seconds, "pool_replica_rss_mb": rss, "pool_model_names": names}


def apply_phase(kube: Kube, slices: Slices, op: OperatorProcess) -> dict[str, Any]:
    """A new model applied to the warm GPU pool, then a new one with its own Deployment, APPLY_REPEAT times each."""
    out: dict[str, list[dict[str, Any]]] = {"pool": [], "deployment": []}
    for i in range(APPLY_REPEAT):
        for kind in ("pool", "deployment"):
            name = f"new-{kind[:4]}-{i}"
            doc = model(name, pool="gpu") if kind == "pool" else model(name, gpus=1)
            path = Path(op.log_path).parent / f"{name}.json"
            path.write_text(json.dumps(doc))
            t0 = time.time()
            kubectl(kube.kubeconfig, "apply", "-f", str(path))
            t_applied = time.time()

            def first(name: str = name) -> float | None:
                with slices.lock:
                    ts = [t for (s, _a), t in slices.first_ready.items() if s == name]
                return min(ts) if ts else None

            t_ready = wait_for(f"{name}: a ready endpoint", first, 300, 0.05)
            load = loaded_seconds(op.log_path).get(name, [])
            row = {"model": name, "apply_to_ready_s": round(t_ready - t0, 3),
                   "kubectl_s": round(t_applied - t0, 3), "triton_load_s": load[0] if load else None,
                   "kubectl_started_at": round(t0, 3), "ready_at": round(t_ready, 3)}
            if load:
                row["beyond_load_s"] = round(t_ready - t0 - load[0], 3)
            out[kind].append(row)
            log(f"Apply {kind} {name}: {row}")
            if kind == "deployment":
                kube.delete("TritonModel", name, NAMESPACE)
    return out


def big_phase(kube: Kube, cluster: BenchCluster, op: OperatorProcess, per_model_mb: float) -> dict[str, Any]:
    """BIG_MODELS (or as many as this machine's memory holds) created together into one CPU pool."""
    avail = available_mb()
    fits = int((avail - HEADROOM_MB) / per_model_mb) if per_model_mb > 0 else BIG_MODELS
    n = max(1, min(BIG_MODELS, fits))
    log(f"Big pool: {n} models (asked {BIG_MODELS}; available {avail} MB, headroom {HEADROOM_MB} MB, "
        f"{per_model_mb:.0f} MB per model measured)")
    replicas = max(1, min(BIG_REPLICAS, n))
    per_replica = math.ceil(n / replicas) + 2
    capacity = f"{per_replica * 128}Mi"
    kube.create(pool_doc("big", replicas, 0, capacity))
    wait_for("the big pool's replicas Ready", lambda: (kube.get("TritonPool", "big", NAMESPACE).get("status") or {})
             .get("readyReplicas") == replicas, 300, 1.0)
    names = [f"m-{i:03d}" for i in range(n)]
    t0 = time.time()
    created = create_all(kube, [model(x, pool="big") for x in names])
    t_created = time.time()
    done = wait_models(kube, names, 600 + 5 * n)
    t1 = time.time()
    conv = max(done.values()) - t0 if len(done) == n else None
    log(f"Big pool: {len(done)}/{n} Ready AllCopiesWarmed seconds={conv}")
    answered, failed = 0, []
    if cluster.kube_proxy:
        services = {s["metadata"]["name"]: s["spec"]["clusterIP"] for s in kube.items("Service", NAMESPACE)}
    else:
        services = {}
        for eps in kube.items("EndpointSlice", NAMESPACE):
            for e in eps.get("endpoints") or ():
                if (e.get("conditions") or {}).get("ready"):
                    services[(eps["metadata"].get("labels") or {}).get("kubernetes.io/service-name", "")] = \
                        e["addresses"][0]
    latencies: list[float] = []

    def one(x: str) -> tuple[str, bool]:
        t = time.monotonic()
        ok = infer(services.get(x, ""), x)
        latencies.append(time.monotonic() - t)
        return x, ok

    t_req = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, names))
    for x, ok in results:
        if ok:
            answered += 1
        else:
            failed.append(x)
    req_seconds = time.monotonic() - t_req
    log(f"Big pool: {answered}/{n} answered one request through their Service (failed {failed[:10]})")
    loads = loaded_seconds(op.log_path)
    return {"models": n, "asked": BIG_MODELS, "available_mb": avail, "per_model_mb": round(per_model_mb, 1),
            "replicas": replicas, "capacity_per_replica": capacity, "ready": len(done),
            "converge_seconds": round(conv, 2) if conv is not None else None,
            "create_seconds": round(t_created - t0, 2),
            "per_model_seconds": summary([done[x] - created[x] for x in done], 3),
            "answered": answered, "failed": failed, "via": "ClusterIP" if cluster.kube_proxy else "endpoint",
            "requests_seconds": round(req_seconds, 2), "request_latency_seconds": summary(latencies, 3),
            "triton_load_seconds": summary([s for x in names for s in loads.get(x, ())], 3),
            "failed_loads_logged": sum(FAILED in ln for ln in op.log_path.read_text(errors="replace").splitlines()),
            "replica_rss_mb": pool_rss_mb(cluster, kube, "big"), "window": [t0, t1],
            "operator_memory_kb": op.memory()}


def run() -> Path:
    started, meter = time.monotonic(), CpuMeter()
    cluster = PoolCluster()
    data: dict[str, Any] = {"node_gpus": NODE_GPUS}
    with pool_bench(cluster, NAMESPACE, "operator-pool.log") as b:
        kube, op = b.kube, b.op
        with Slices(kube, NAMESPACE) as slices:
            data["gpu"] = gpu_phase(kube, cluster)
            data["apply"] = apply_phase(kube, slices, op)
            # The GPU pool's models go (each unloaded) before the big pool: memory for its stubs.
            rss = data["gpu"]["pool_replica_rss_mb"]
            per_model = (sum(rss) / max(1, data["gpu"]["pool_models_ready"])) if rss else 100.0
            delete_all(kube, "TritonModel", data["gpu"].pop("pool_model_names")
                       + [f"new-pool-{i}" for i in range(APPLY_REPEAT)], NAMESPACE)
            kube.delete("TritonPool", "gpu", NAMESPACE)
            wait_for("the GPU pool's pods gone", lambda: not kube.items(
                "Pod", NAMESPACE, labelSelector=f"{LABEL_POOL}=gpu"), 300, 1.0)
            data["big"] = big_phase(kube, cluster, op, per_model)
            time.sleep(2.0)  # the last slice events reach the audit
            data["audit"] = {"checks": slices.checks, "violations": slices.violations,
                             "endpoints_listed_ready": sum(1 for v in slices.listed.values() if v)}
        data["operator_memory_kb"] = op.memory()
        data["operator_failed_loads_logged"] = [ln for ln in op.log_path.read_text(errors="replace").splitlines()
                                                if FAILED in ln][:20]
    big = data["big"]
    t0, t1 = big.pop("window")
    audit = by_client(audit_requests(cluster.audit_log, t0, t1))
    op_req = audit.get("operator", {})
    big["operator_requests"] = sum(op_req.values())
    big["operator_requests_per_model"] = round(sum(op_req.values()) / big["models"], 2)
    big["operator_requests_by_verb"] = op_req
    created = created_at(cluster.audit_log, {r["model"] for r in data["apply"]["pool"]})
    for r in data["apply"]["pool"]:
        if r["model"] in created and r.get("triton_load_s") is not None:
            r["api_created_at"] = created[r["model"]]
            r["created_to_ready_s"] = round(r["ready_at"] - created[r["model"]], 3)
            r["operator_beyond_load_s"] = round(r["created_to_ready_s"] - r["triton_load_s"], 3)
    return _report(data, started, meter)


def created_at(audit_log: Path, names: set[str]) -> dict[str, float]:
    """When the API server answered each named TritonModel's create (its audit line's stageTimestamp, the
    ResponseComplete stage: the object is in etcd), as wall-clock seconds."""
    out: dict[str, float] = {}
    if not audit_log.exists():
        return out
    with open(audit_log, encoding="utf-8", errors="replace") as f:
        for line in f:
            if '"tritonmodels"' not in line or '"create"' not in line:
                continue
            try:
                ev = json.loads(line)
                ref = ev.get("objectRef") or {}
                when = parse_rfc3339(ev.get("stageTimestamp"))
            except ValueError:
                continue
            if (ev.get("verb") == "create" and ref.get("resource") == "tritonmodels" and ref.get("name") in names
                    and (ev.get("responseStatus") or {}).get("code") == 201 and when is not None):
                out.setdefault(ref["name"], when.timestamp())
    return out


def _report(data: dict[str, Any], started: float, meter: CpuMeter) -> Path:
    g, a, b, au = data["gpu"], data["apply"], data["big"], data["audit"]
    p, d = g["pool"], g["deployments"]
    pool_gpus, dep_gpus = p["gpus_allocated_to_running_pods"], d["gpus_allocated_to_running_pods"]
    pool_rows = a["pool"]
    beyond = [r["beyond_load_s"] for r in pool_rows if r.get("beyond_load_s") is not None]
    op_beyond = [r["operator_beyond_load_s"] for r in pool_rows if r.get("operator_beyond_load_s") is not None]
    dep_total = [r["apply_to_ready_s"] for r in a["deployment"]]
    pool_total = [r["apply_to_ready_s"] for r in pool_rows]
    loads = [r["triton_load_s"] for r in pool_rows if r.get("triton_load_s") is not None]
    hwm = data["operator_memory_kb"].get("VmHWM", 0) / 1024
    result = Result(
        name=RESULT_NAME,
        title=f"TritonPool: {g['models']} models on shared GPUs, apply to endpoint, {b['models']} models in one pool",
        method=re.sub(r"\s+", " ", __doc__.split("\n\n", 1)[1]).strip().replace("GPU_MODELS", str(g["models"]))
        .replace("NODE_GPUS", str(data["node_gpus"])).replace("APPLY_REPEAT", str(len(pool_rows)))
        .replace("BIG_MODELS", str(b["asked"])),
    )
    deps_desc = (f"{dep_gpus} allocated ({d['pods_running']} pods Running), {d['gpus_asked']} asked, "
                 f"{d['pods_pending_for_gpu']} pods Pending for want of a GPU (the node has {d['node_gpus_allocatable']})")
    result.rows = [
        Row(f"GPUs to serve {g['models']} models, 1 copy each", f"{pool_gpus} ({p['pods_running']} pool replica, "
            f"{g['pool_models_ready']}/{g['models']} models Ready)", deps_desc,
            ">= 10x fewer", bool(pool_gpus) and d["gpus_asked"] >= 10 * pool_gpus and g["pool_models_ready"] == g["models"]),
        Row("kubectl apply -> first ready endpoint (new model)",
            f"{ms(summary(pool_total).get('p50'))} p50, {ms(summary(pool_total).get('max'))} max "
            f"(Triton load + warm-up {ms(summary(loads).get('p50'))} p50)",
            f"{ms(summary(dep_total).get('p50'))} p50, {ms(summary(dep_total).get('max'))} max (new Deployment)"),
        Row("the same, beyond Triton's own load + warm-up (pool)",
            f"{ms(summary(beyond).get('p50'))} p50, {ms(summary(beyond).get('max'))} max (n={len(beyond)})", "-",
            "<= 300 ms", bool(beyond) and len(beyond) == len(pool_rows) and max(beyond) <= 0.3),
        Row("the same from the API server's answer to the create (audit log), not from kubectl's start: the "
            "operator's share beyond Triton's load + warm-up (pool)",
            f"{ms(summary(op_beyond).get('p50'))} p50, {ms(summary(op_beyond).get('max'))} max (n={len(op_beyond)})"),
        Row(f"{b['models']} models in one pool ({b['replicas']} replicas): create -> all Ready AllCopiesWarmed",
            f"{b['converge_seconds']} s ({b['ready']}/{b['models']}; per model p50 "
            f"{b['per_model_seconds'].get('p50')} s, p95 {b['per_model_seconds'].get('p95')} s)"),
        Row("one request to each model through its Service", f"{b['answered']}/{b['models']} answered"),
        Row("operator API requests per model (create -> converged)", f"{b['operator_requests_per_model']}"),
        Row("operator peak RSS (VmHWM, whole run)", f"{hwm:.0f} MB"),
        Row("gate audit: endpoints listed ready before READY at the desired digest",
            f"{len(au['violations'])} of {au['checks']} checked", "-", "0", not au["violations"]),
    ]
    if b["models"] < b["asked"]:
        result.notes.append(
            f"{b['models']} models, not {b['asked']}: each Python model is a stub process; {b['per_model_mb']} MB "
            f"per model measured on the GPU pool's replica, {b['available_mb']} MB available, "
            f"{HEADROOM_MB} MB left for the machine's other work.")
    result.notes.append(f"Triton's load + warm-up per model in the big pool (operator's log): "
                        f"{b['triton_load_seconds']}; failed loads logged: {b['failed_loads_logged']}.")
    result.data = data
    return write_result(result, started, meter)
