"""Benchmark `pool_speed`: the pool's speed against Triton's own (issue 41, item 6).

On our own cluster (control plane, one real node with containerd and a kubelet, the operator as a host process run
through bench/pool_trace.py, which times each phase of its pool rounds in its log), with small Python models
(INPUT * 2, one CPU instance). Triton's own time comes only from the replica's tritonserver log, as the kubelet keeps
it: from `loading: <model>:1` to `successfully loaded '<model>'`, Triton's own timestamps (its load and warm-up).
Whatever else passes is the operator's share (bench/pool_speed_math.py).

1. A new model on a warm pool: one replica holding WARM models; SAMPLES times, a new model created (the API
   server's POST), until its first ready endpoint in its Service's EndpointSlices (seen on a watch). The operator's
   share is that time less Triton's load, split into before Triton began the load and after Triton's READY.
2. The pool's replica's tritonserver SIGKILLed (the container's main process, from the node: the kubelet restarts
   the container in the same pod) while it holds N models (for each N of KILL, the pool's models deleted down to
   N; KILL_REPEAT times each): until every one of them has all its copies serving again (each left its slices and
   came back). Taken out as not the operator's: from the kill to the pod Ready again (the kubelet's restart and
   Triton's start-up) and Triton's loads of those models in its new container's log (their union).
3. BIG models created together into one pool of BIG_REPLICAS replicas (fewer if this machine's free memory would
   not hold them: each Python model is a stub process): for each replica, from the create to its last model
   serving, the time Triton was loading against the rest (the gaps between loads), and which phases of the
   operator's rounds ran in its longest gaps.
"""

from __future__ import annotations

import math
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.kube import Kube, wait_for
from triton_operator.api.pool import ENDPOINTSLICE_MANAGER, LABEL_POOL

from . import pool_speed_math as psm
from .common import CpuMeter, Result, Row, log, ms, summary, write_result
from .kubeenv import BackgroundWatch, BenchCluster, OperatorProcess, create_all, delete_all, pool_bench
from .models import DOUBLE_PY
from .pods import tree_rss_kb

NAMESPACE = "bench-pool-speed"
WARM = int(os.environ.get("BENCH_POOL_SPEED_WARM", "40"))
SAMPLES = int(os.environ.get("BENCH_POOL_SPEED_SAMPLES", "12"))
KILL = [int(x) for x in os.environ.get("BENCH_POOL_SPEED_KILL", "40,10").replace(",", " ").split()]
KILL_REPEAT = int(os.environ.get("BENCH_POOL_SPEED_KILL_REPEAT", "1"))
BIG = int(os.environ.get("BENCH_POOL_SPEED_MODELS", "200"))
BIG_REPLICAS = int(os.environ.get("BENCH_POOL_SPEED_REPLICAS", "4"))
#: Memory the bench leaves to everything else on the machine (other people's clusters run here too).
HEADROOM_MB = int(os.environ.get("BENCH_POOL_SPEED_HEADROOM_MB", "6144"))
#: Seconds between one measurement and the next, for the rounds of the last to end.
SETTLE = float(os.environ.get("BENCH_POOL_SPEED_SETTLE", "3"))
#: 0: the operator as `triton-operator run`, with no trace of its rounds.
TRACE = os.environ.get("BENCH_POOL_SPEED_TRACE", "1") != "0"
RESULT_NAME = os.environ.get("BENCH_POOL_SPEED_NAME", "pool_speed")
MODEL_MEMORY_MI = 64
SERVICE_NAME = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"



@dataclass
class Bench:
    cluster: BenchCluster
    kube: Kube
    op: OperatorProcess
    deleted: dict[str, float] = field(default_factory=dict)  # model -> when its delete was sent


def model_doc(name: str, pool: str) -> dict[str, Any]:
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"pool": pool, "memory": f"{MODEL_MEMORY_MI}Mi", "replicas": 1, "backend": "python",
                     "maxBatchSize": 8, "inputs": [{"name": "INPUT", "dataType": "FP32", "dims": [4]}],
                     "outputs": [{"name": "OUTPUT", "dataType": "FP32", "dims": [4]}],
                     "instanceGroups": [{"kind": "CPU", "count": 1}], "source": {"inline": {"model.py": DOUBLE_PY}}}}


def pool_doc(name: str, replicas: int, models_per_replica: int) -> dict[str, Any]:
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonPool",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"replicas": replicas, "capacity": {"memoryPerReplica": f"{models_per_replica * MODEL_MEMORY_MI}Mi"},
                     "server": {"resources": {"requests": {"cpu": "10m", "memory": "256Mi"}}}}}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- what the watches saw -----------------------------------------------------------------------------------------


class SliceHistory(BackgroundWatch):
    """Our EndpointSlices of the namespace: each model's Service's ready addresses over time (the union of its
    slices), as the watch delivered them."""

    kind = "EndpointSlice"

    def __init__(self, kube: Kube, namespace: str) -> None:
        super().__init__(kube, namespace)
        self.lock = threading.Lock()
        self._slices: dict[str, tuple[str, frozenset[str]]] = {}  # slice -> (service, ready addresses)
        self.history: dict[str, list[tuple[float, frozenset[str]]]] = {}  # service -> (t, ready addresses)

    def _on_event(self, typ: str, eps: dict[str, Any], t: float) -> None:
        md = eps["metadata"]
        labels = md.get("labels") or {}
        svc = labels.get(SERVICE_NAME)
        if not svc or labels.get(MANAGED_BY) != ENDPOINTSLICE_MANAGER:
            return
        ready = frozenset() if typ == "DELETED" else frozenset(
            a for e in eps.get("endpoints") or () if (e.get("conditions") or {}).get("ready")
            for a in e.get("addresses") or ())
        with self.lock:
            self._slices[md["name"]] = (svc, ready)
            now = frozenset(a for s, r in self._slices.values() if s == svc for a in r)
            hist = self.history.setdefault(svc, [])
            if not hist or hist[-1][1] != now:
                hist.append((t, now))

    def first_ready(self, svc: str, after: float = 0.0) -> tuple[float, str] | None:
        with self.lock:
            for t, ready in self.history.get(svc, ()):
                if t >= after and ready:
                    return t, sorted(ready)[0]
        return None

    def back(self, svc: str, copies: int, after: float) -> tuple[float | None, float | None]:
        """After `after`: when the Service first listed fewer than `copies` ready addresses, and then again all."""
        out_at = None
        with self.lock:
            for t, ready in self.history.get(svc, ()):
                if t < after:
                    continue
                if out_at is None and len(ready) < copies:
                    out_at = t
                elif out_at is not None and len(ready) >= copies:
                    return out_at, t
        return out_at, None


class PodHistory(BackgroundWatch):
    """The namespace's pods: when each was seen Ready or not."""

    kind = "Pod"

    def __init__(self, kube: Kube, namespace: str) -> None:
        super().__init__(kube, namespace)
        self.lock = threading.Lock()
        self.history: dict[str, list[tuple[float, bool]]] = {}

    def _on_event(self, typ: str, pod: dict[str, Any], t: float) -> None:
        ready = typ != "DELETED" and any(c.get("type") == "Ready" and c.get("status") == "True"
                                         for c in (pod.get("status") or {}).get("conditions") or ())
        with self.lock:
            hist = self.history.setdefault(pod["metadata"]["name"], [])
            if not hist or hist[-1][1] != ready:
                hist.append((t, ready))

    def ready_again(self, pod: str, after: float) -> float | None:
        """The first time after `after` the pod was seen Ready once it had been seen not Ready."""
        was_down = False
        with self.lock:
            for t, ready in self.history.get(pod, ()):
                if t < after:
                    continue
                if not ready:
                    was_down = True
                elif was_down:
                    return t
        return None


# -- helpers ------------------------------------------------------------------------------------------------------


def wait_serving(slices: SliceHistory, names: list[str], after: float, timeout: float) -> dict[str, tuple[float, str]]:
    """Each model's first ready endpoint at or after `after` (time, address)."""
    def all_there() -> dict[str, tuple[float, str]] | None:
        found = {n: r for n in names if (r := slices.first_ready(n, after)) is not None}
        return found if len(found) == len(names) else None
    return wait_for(f"{len(names)} models with a ready endpoint", all_there, timeout, 0.05)


def replica_pods(kube: Kube, pool: str) -> list[dict[str, Any]]:
    return [p for p in kube.items("Pod", NAMESPACE, labelSelector=f"{LABEL_POOL}={pool}")
            if not p["metadata"].get("deletionTimestamp")]


def pool_ready(kube: Kube, pool: str, replicas: int) -> bool:
    return (kube.get("TritonPool", pool, NAMESPACE).get("status") or {}).get("readyReplicas") == replicas


def triton_log(cluster: BenchCluster, pod: dict[str, Any]) -> tuple[psm.TritonLog, str]:
    """The newest tritonserver container's log of a pod (the kubelet's file on the node), parsed; and its raw text."""
    path = cluster.node(pod["spec"]["nodeName"]).container_log(pod, "tritonserver")
    raw = path.read_text(errors="replace")
    return psm.parse(raw), raw


def restarts(pod: dict[str, Any]) -> int:
    for st in (pod.get("status") or {}).get("containerStatuses") or ():
        if st["name"] == "tritonserver":
            return int(st.get("restartCount", 0))
    return 0


def available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def traced(op_log: Path) -> list[psm.Span]:
    return psm.spans(op_log.read_text(errors="replace"))


def window_phases(op_log: Path, start: float, end: float, pool: str) -> dict[str, float]:
    return psm.phase_seconds(traced(op_log), start, end, pool)


# -- 1. a new model on a warm pool --------------------------------------------------------------------------------


def warm_phase(b: Bench, slices: SliceHistory) -> dict[str, Any]:
    kube, cluster = b.kube, b.cluster
    kube.create(pool_doc("warm", 1, WARM + SAMPLES + 4))
    wait_for("the warm pool's replica Ready", lambda: pool_ready(kube, "warm", 1), 300, 0.5)
    names = [f"w-{i:03d}" for i in range(WARM)]
    t0 = time.time()
    create_all(kube, [model_doc(n, "warm") for n in names])
    wait_serving(slices, names, t0, 300 + 10 * WARM)
    log(f"Warm pool: {WARM} models serving after {time.time() - t0:.1f} s")
    time.sleep(SETTLE)
    samples: list[dict[str, Any]] = []
    for i in range(SAMPLES):
        name = f"new-{i:02d}"
        la = loadavg()
        t_sent = time.time()
        kube.create(model_doc(name, "warm"))
        t_ready, address = wait_serving(slices, [name], t_sent, 300)[name]
        samples.append({"model": name, "sent_at": t_sent, "ready_at": t_ready, "address": address, "loadavg": la})
        log(f"New model {name}: first ready endpoint after {t_ready - t_sent:.3f} s")
        time.sleep(SETTLE)
    [pod] = replica_pods(kube, "warm")
    tl, raw = triton_log(cluster, pod)
    (cluster.logs / "tritonserver-warm.log").write_text(raw)
    spans = traced(b.op.log_path)
    for s in samples:
        loads = tl.loads.get(s["model"]) or []
        if not loads:
            s["error"] = "no load of it in Triton's log"
            continue
        load = loads[0]
        s.update(psm.new_model_share(s["sent_at"], load, s["ready_at"]))
        s["triton_loading_at"], s["triton_loaded_at"] = load.start, load.end
        s["breakdown"] = psm.round_breakdown(spans, s["sent_at"], load.start, load.end, s["ready_at"], "warm")
        s["phases_before"] = psm.phase_seconds(spans, s["sent_at"], load.start, "warm")
        s["phases_after"] = psm.phase_seconds(spans, load.end, s["ready_at"], "warm")
    rss = tree_rss_kb(cluster.container_pid(pod, "tritonserver")) / 1024
    return {"models": WARM, "samples": samples, "pod": pod["metadata"]["name"], "names": names,
            "replica_rss_mb": round(rss, 1), "triton_clock_skew_s": tl.skew(),
            "log_excerpt": _excerpt(raw, samples[0]["model"]) if samples else []}


def _excerpt(raw: str, model: str) -> list[str]:
    """The raw log lines (CRI format) of one model's load: kept in the result as what the parse read."""
    return [ln for ln in raw.splitlines() if f"'{model}'" in ln or f"loading: {model}:" in ln][:4]


# -- 2. the replica's tritonserver killed -------------------------------------------------------------------------


def down_to(b: Bench, keep: list[str], drop: list[str]) -> dict[str, Any]:
    """Deletes `drop` (each unloaded) and waits until the replica's Triton has unloaded each."""
    kube, cluster = b.kube, b.cluster
    if drop:
        b.deleted.update(dict.fromkeys(drop, time.time()))
        delete_all(kube, "TritonModel", drop, NAMESPACE)

        def unloaded() -> bool:
            [pod] = replica_pods(kube, "warm")
            _, raw = triton_log(cluster, pod)
            return all(f"successfully unloaded '{n}'" in raw for n in drop)

        wait_for(f"{len(drop)} models unloaded", unloaded, 120 + 2 * len(drop), 0.5)
    time.sleep(SETTLE)
    return {"held": len(keep), "deleted": len(drop)}


def kill_once(b: Bench, slices: SliceHistory, pods: PodHistory, held: list[str]) -> dict[str, Any]:
    kube, cluster = b.kube, b.cluster
    [pod] = replica_pods(kube, "warm")
    name, before = pod["metadata"]["name"], restarts(pod)
    pid = cluster.container_pid(pod, "tritonserver")
    la = loadavg()
    op_log_at = b.op.log_path.stat().st_size
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)

    def all_back() -> dict[str, tuple[float | None, float | None]] | None:
        found = {n: slices.back(n, 1, t_kill) for n in held}
        return found if all(v[1] is not None for v in found.values()) else None

    back = wait_for(f"{len(held)} models serving again after the kill", all_back, 300 + 10 * len(held), 0.1)
    t_serving = max(v[1] for v in back.values() if v[1] is not None)
    pod = kube.get("Pod", name, NAMESPACE)
    pod_ready = wait_for("the pod seen Ready again", lambda: pods.ready_again(name, t_kill), 30, 0.1)
    tl, raw = triton_log(cluster, pod)
    (cluster.logs / f"tritonserver-warm-restart{restarts(pod)}.log").write_text(raw)
    loads = [iv for ivs in tl.loads_of(held, t_kill).values() for iv in ivs]
    share = psm.kill_share(t_kill, pod_ready, loads, t_serving, tl.first)
    spans = traced(b.op.log_path)
    op_text = b.op.log_path.read_text(errors="replace")[op_log_at:] if b.op.log_path.exists() else ""
    out = {"held": len(held), "pod": name, "pid": pid, "killed_at": t_kill, "serving_at": t_serving,
           "pod_ready_at": pod_ready, "triton_first_line_at": tl.first, "triton_http_at": tl.http,
           "restart_count": [before, restarts(pod)], "loadavg": la,
           "loads_seen": len(loads), "models_loaded_twice": sorted(m for m, ivs in tl.loads_of(held, t_kill).items()
                                                                    if len(ivs) > 1),
           "left_slices_after_s": summary([v[0] - t_kill for v in back.values() if v[0] is not None], 3),
           **share,
           "phases": psm.phase_seconds(spans, pod_ready, t_serving, "warm"),
           "applied_services_after_kill": sum("Applied Service " in ln for ln in op_text.splitlines())}
    log(f"Kill with {len(held)} models: {share}")
    return out


def kill_phase(b: Bench, slices: SliceHistory, pods: PodHistory, warm: dict[str, Any]) -> dict[str, Any]:
    current = list(warm["names"]) + [s["model"] for s in warm["samples"]]
    runs: list[dict[str, Any]] = []
    for n in sorted(KILL, reverse=True):
        keep, drop = current[:n], current[n:]
        down_to(b, keep, drop)
        current = keep
        for _ in range(KILL_REPEAT):
            runs.append(kill_once(b, slices, pods, keep))
            time.sleep(SETTLE)
    # A deleted pooled model's Service applied again after its delete (fixed in d81c5a5).
    again = psm.services_applied_after(b.op.log_path.read_text(errors="replace").splitlines(), b.deleted)
    return {"runs": runs, "deleted": len(b.deleted), "applied_service_lines_for_deleted_models": len(again),
            "applied_service_samples": again[:5]}


# -- 3. many models into one pool ---------------------------------------------------------------------------------


def big_phase(b: Bench, slices: SliceHistory, per_model_mb: float) -> dict[str, Any]:
    kube, cluster = b.kube, b.cluster
    avail = available_mb()
    fits = int((avail - HEADROOM_MB) / per_model_mb) if per_model_mb > 0 else BIG
    n = max(1, min(BIG, fits))
    replicas = max(1, min(BIG_REPLICAS, n))
    log(f"Big pool: {n} models on {replicas} replicas (asked {BIG}; available {avail} MB, headroom {HEADROOM_MB} MB, "
        f"{per_model_mb:.0f} MB per model measured)")
    kube.create(pool_doc("big", replicas, math.ceil(n / replicas) + 2))
    wait_for("the big pool's replicas Ready", lambda: pool_ready(kube, "big", replicas), 300, 1.0)
    time.sleep(SETTLE)
    names = [f"m-{i:03d}" for i in range(n)]
    la = loadavg()
    t0 = time.time()
    create_all(kube, [model_doc(x, "big") for x in names])
    t_created = time.time()
    ready = wait_serving(slices, names, t0, 600 + 5 * n)
    t_all = max(t for t, _ in ready.values())
    log(f"Big pool: {n} models serving after {t_all - t0:.1f} s")
    spans = traced(b.op.log_path)
    per_replica: dict[str, Any] = {}
    for pod in replica_pods(kube, "big"):
        ip = (pod.get("status") or {}).get("podIP")
        mine = [x for x in names if ready[x][1] == ip]
        if not mine:
            continue
        end = max(ready[x][0] for x in mine)
        tl, _ = triton_log(cluster, pod)
        loads = [iv for ivs in tl.loads_of(mine, t0).values() for iv in ivs]
        share = psm.replica_share(loads, t0, end)
        for g in share["longest_gaps"]:
            g["phases"] = psm.phase_seconds(spans, t0 + g["at_s"], t0 + g["at_s"] + g["seconds"], "big")
        share["first_load_after_s"] = round(min(iv.start for iv in loads) - t0, 3) if loads else None
        share["last_load_to_serving_s"] = round(end - max(iv.end for iv in loads), 3) if loads else None
        share["load_seconds"] = summary([iv.seconds for iv in loads], 3)
        per_replica[pod["metadata"]["name"]] = {"models": len(mine), **share}
    rounds = sorted((s for s in spans if s.pool == "big" and s.phase == "round" and t0 <= s.start <= t_all),
                    key=lambda s: s.start)
    return {"models": n, "asked": BIG, "available_mb": avail, "per_model_mb": round(per_model_mb, 1),
            "replicas": replicas, "loadavg": la, "create_seconds": round(t_created - t0, 2),
            "all_serving_s": round(t_all - t0, 2), "per_replica": per_replica,
            "phases": psm.phase_seconds(spans, t0, t_all, "big"),
            "rounds": [{"at_s": round(s.start - t0, 3), "seconds": round(s.seconds, 3)} for s in rounds]}


# -- the run ------------------------------------------------------------------------------------------------------


def run() -> Path:
    started, meter = time.monotonic(), CpuMeter()
    cluster = BenchCluster()
    program = [sys.executable, "-m", "bench.pool_trace"] if TRACE else None
    data: dict[str, Any] = {"config": {"warm": WARM, "samples": SAMPLES, "kill": KILL, "kill_repeat": KILL_REPEAT,
                                       "big": BIG, "big_replicas": BIG_REPLICAS, "settle_s": SETTLE, "traced": TRACE}}
    with pool_bench(cluster, NAMESPACE, "operator-pool-speed.log", program=program) as pb:
        b = Bench(pb.cluster, pb.kube, pb.op)
        with SliceHistory(b.kube, NAMESPACE) as slices, PodHistory(b.kube, NAMESPACE) as pods:
            data["loadavg_at_start"] = loadavg()
            data["warm"] = warm_phase(b, slices)
            data["kill"] = kill_phase(b, slices, pods, data["warm"])
            per_model = data["warm"]["replica_rss_mb"] / max(1, WARM + SAMPLES)
            left = [n for n in data["warm"].pop("names") + [s["model"] for s in data["warm"]["samples"]]]
            delete_all(b.kube, "TritonModel", [n for n in left if b.kube.get_or_none("TritonModel", n, NAMESPACE)],
                       NAMESPACE)
            b.kube.delete("TritonPool", "warm", NAMESPACE)
            wait_for("the warm pool's pod gone", lambda: not replica_pods(b.kube, "warm"), 300, 1.0)
            if BIG > 0:
                data["big"] = big_phase(b, slices, per_model)
        data["operator_memory_kb"] = b.op.memory()
    return write_result(result(data), started, meter)


# -- the result ---------------------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def result(data: dict[str, Any]) -> Result:
    cfg, warm, kill = data["config"], data["warm"], data["kill"]
    method = re.sub(r"\s+", " ", (__doc__ or "").split("\n\n", 1)[1]).strip()
    for key, value in (("WARM", cfg["warm"]), ("SAMPLES", cfg["samples"]), ("KILL_REPEAT", cfg["kill_repeat"]),
                       ("KILL", " and ".join(map(str, cfg["kill"]))), ("BIG_REPLICAS", cfg["big_replicas"]),
                       ("BIG", cfg["big"])):
        method = method.replace(key, str(value))
    res = Result(name=RESULT_NAME, title="The pool's speed against Triton's own: a new model, a killed replica, "
                 "many models at once", method=method)
    ok = [s for s in warm["samples"] if "operator_s" in s]
    share = [s["operator_s"] for s in ok]
    sp = summary(share)
    res.rows.append(Row(f"new model on a warm pool ({warm['models']} models): the operator's share beyond Triton's "
                        "load + warm-up (create -> first ready endpoint)",
                        f"{ms(sp.get('p50'))} p50, {ms(sp.get('p95'))} p95, {ms(sp.get('max'))} max (n={len(ok)})",
                        "-", "p95 <= 300 ms", bool(ok) and len(ok) >= 10 and sp["p95"] <= 0.3))
    for key, label in (("before_s", "before Triton begins the load"), ("after_s", "after Triton's READY"),
                       ("triton_s", "Triton's load + warm-up (its log)"), ("total_s", "create -> first ready endpoint")):
        s = summary([x[key] for x in ok])
        res.rows.append(Row(f"  {label}", f"{ms(s.get('p50'))} p50, {ms(s.get('p95'))} p95"))
    for r in kill["runs"]:
        res.rows.append(Row(
            f"replica's tritonserver SIGKILLed holding {r['held']} models -> all serving again: the operator's share",
            f"{_pct(r['operator_fraction'])} ({r['operator_s']:.2f} s of {r['total_s']:.2f} s)", "-", "<= 10%",
            r["operator_fraction"] is not None and r["operator_fraction"] <= 0.10))
        res.rows.append(Row(f"  {r['held']} models: kill -> pod Ready (restart {r['restart_s']} s, Triton start-up "
                            f"{r['triton_startup_s']} s); Triton's loads (union; sum)",
                            f"{r['killed_to_pod_ready_s']:.2f} s; {r['triton_loads_s']:.2f} s; "
                            f"{r['triton_loads_sum_s']:.2f} s"))
        res.rows.append(Row(f"  {r['held']} models: pod Ready -> first load; between loads; last load -> serving",
                            f"{r['pod_ready_to_first_load_s']} s; {r['between_loads_s']} s; "
                            f"{r['last_load_to_serving_s']} s"))
    big = data.get("big")
    if big:
        reps = big["per_replica"].values()
        fr = [r["operator_fraction"] for r in reps if r["operator_fraction"] is not None]
        res.rows.append(Row(f"{big['models']} models into one pool ({big['replicas']} replicas): create -> all serving",
                            f"{big['all_serving_s']:.1f} s"))
        res.rows.append(Row("  per replica: the operator's share (time not loading in Triton, create -> its last "
                            "model serving)", ", ".join(_pct(x) for x in fr)))
        gaps = [g["seconds"] for r in reps for g in r["longest_gaps"]]
        res.rows.append(Row("  longest gap between Triton's loads on a replica", f"{max(gaps):.2f} s" if gaps else "-"))
    res.rows.append(Row("Services applied again for deleted pooled models (operator log)",
                        str(kill["applied_service_lines_for_deleted_models"]), "-", "0",
                        kill["applied_service_lines_for_deleted_models"] == 0))
    if warm.get("triton_clock_skew_s") is not None:
        res.notes.append(f"Triton's log times against the kubelet's (median kubelet - Triton): "
                         f"{warm['triton_clock_skew_s'] * 1000:.1f} ms.")
    parts = [s["breakdown"] for s in ok if s.get("breakdown")]
    if parts:
        res.notes.append(f"New model, where the operator's share went, in order (the round that loaded it, from "
                         f"bench/pool_trace.py's lines; p50 over {len(parts)} samples): "
                         + ", ".join(f"{k.removesuffix('_s')} {summary([p[k] for p in parts])['p50'] * 1000:.0f} ms"
                                     for k in parts[0]) + ".")
    res.notes.append(f"Load average (1 min) at the start of each measurement: new models "
                     f"{[s['loadavg'][0] for s in warm['samples']]}; kills {[r['loadavg'][0] for r in kill['runs']]}"
                     + (f"; big pool {big['loadavg'][0]}" if big else "") + ".")
    if big and big["models"] < big["asked"]:
        res.notes.append(f"{big['models']} models, not {big['asked']}: {big['per_model_mb']} MB per model measured, "
                         f"{big['available_mb']} MB available, {HEADROOM_MB} MB left for the machine's other work.")
    res.data = data
    return res


if __name__ == "__main__":
    print(run())
