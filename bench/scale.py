"""Benchmark `scale`: reconciling 100, 1000 and 3000 TritonModels (BENCH_SCALE_SIZES) that run no pods (`replicas: 0`).

For each size and each operator, on a fresh cluster of our own (its one node runs no pod): start the
operator, create N copies of examples/add-sub.yaml with `replicas: 0` from 8 client threads, and
watch until every one has its ConfigMap, Deployment and Service and a status for its generation
(`status.observedGeneration`). Then: API requests per model (the API server's
`apiserver_request_total` before/after, all clients, and the audit log attributed by user agent),
writes during 60 s of steady state (which covers one drift pass), and the operator's peak RSS
(VmHWM). The side-by-side is `bench.naive_operator`: the same renderer behind the control loop
kopf operators usually have; the floor is `bench.floor`: the same writes from a bare client, no
controller logic.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.kube import Kube, wait_for
from triton_operator.api.kinds import CHILDREN, HPA, LABEL_MODEL, PDB

from .clients import by_client
from .common import CpuMeter, Result, Row, log, summary, write_result
from .floor import CONCURRENCY as FLOOR_CONCURRENCY
from .kubeenv import (
    BenchCluster,
    OperatorProcess,
    apiserver_requests,
    audit_requests,
    cpu_delta,
    cpu_snapshot,
    delta,
    ensure_namespace,
    watch_forever,
    writes_of,
)
from .models import checked, example

# The growth run (issue 17): 100, 1000 and 3000 models; the targets are judged at 1000.
SIZES = tuple(int(n) for n in os.environ.get("BENCH_SCALE_SIZES", "100,1000,3000").split(","))
JUDGED = 1000
IMPLS = ("ours", "usual", "floor")
NAMESPACE = "bench-scale"
# The children both implementations make for a model (`replicas: 0` renders no PodDisruptionBudget, and
# add-sub has no spec.autoscaling, so no HorizontalPodAutoscaler).
CHILD_KINDS = tuple(k.kind for k in CHILDREN if k not in (PDB, HPA))
STEADY_SECONDS = 60.0
QUIET_CAP_SECONDS = 30.0  # the usual approach's timer keeps patching: it never settles


def model_docs(n: int) -> list[dict[str, Any]]:
    base = example("add-sub")
    base["spec"]["replicas"] = 0
    docs = []
    for i in range(n):
        d = {**base, "metadata": {"name": f"add-sub-{i:04d}", "namespace": NAMESPACE}}
        docs.append(d)
    checked(docs[0])
    return docs


class Convergence:
    """When each model was first seen with a status for its generation and with each of its children."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.status_at: dict[str, float] = {}
        self.child_at: dict[str, dict[str, float]] = {k: {} for k in CHILD_KINDS}

    def on_model(self, _type: str, obj: dict[str, Any], t: float) -> None:
        md, st = obj["metadata"], obj.get("status") or {}
        if st.get("observedGeneration") == md.get("generation"):
            with self.lock:
                self.status_at.setdefault(md["name"], t)

    def on_child(self, kind: str) -> Any:
        def handle(_type: str, obj: dict[str, Any], t: float) -> None:
            owner = (obj["metadata"].get("labels") or {}).get(LABEL_MODEL)
            if owner:
                with self.lock:
                    self.child_at[kind].setdefault(owner, t)

        return handle

    def converged_at(self, name: str) -> float | None:
        with self.lock:
            times = [self.status_at.get(name)] + [self.child_at[k].get(name) for k in CHILD_KINDS]
        return None if any(t is None for t in times) else max(times)  # type: ignore[type-var]


OPERATOR_RESOURCES = ("configmaps", "services", "deployments", "poddisruptionbudgets", "tritonmodels",
                      "tritonmodels/status", "events")


def operator_like_writes(kube: Kube) -> float:
    """POST/PATCH/APPLY/DELETE the API server took on the resources an operator writes.

    Not PUT: neither operator sends one, while the controller-manager keeps PUTting Deployment status
    (and POSTing ReplicaSets) for minutes after 1000 Deployments appear; those would never settle.
    """
    return sum(v for k, v in apiserver_requests(kube).items()
               if k.split(" ")[0] in ("POST", "PATCH", "APPLY", "DELETE") and k.split(" ")[1] in OPERATOR_RESOURCES)


def wait_quiet(kube: Kube, quiet: float = 5.0, timeout: float = 120.0) -> float:
    """Waits until no create/patch/delete (leases aside) reached the API server for `quiet` seconds; returns when one last did."""
    deadline = time.monotonic() + timeout
    last, since = operator_like_writes(kube), time.time()
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = operator_like_writes(kube)
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= quiet:
            break
    return since


@dataclass
class ScaleRow(Row):
    """A `scale` row: each implementation's figure at each size, the floor's in a column of its own."""

    floor: str = "-"


def per_size(sizes: Sequence[int], phases: Sequence[dict[str, Any]], impl: str,
             fmt: Callable[[dict[str, Any]], str]) -> str:
    """`100: <fmt of impl's phase at 100>; 1000: …`, `-` for a size the run lacks."""
    def get(n: int) -> dict[str, Any] | None:
        return next((p for p in phases if p["impl"] == impl and p["models"] == n), None)

    return "; ".join(f"{n}: {fmt(p)}" if (p := get(n)) else f"{n}: -" for n in sizes)


def to_floor(p: dict[str, Any], floor: dict[str, Any] | None) -> float | None:
    """An implementation's converge time over the floor's at the same size (None without a floor, or unconverged)."""
    if floor is None or floor.get("converged") != floor.get("models") or p.get("converged") != p.get("models"):
        return None
    return float(p["converge_seconds"]) / max(float(floor["converge_seconds"]), 1e-9)


def cpu_ms_per_model(p: dict[str, Any]) -> float | None:
    """The operator's own CPU until convergence, per model, in ms (the floor's: its client's)."""
    cpu = (p.get("cpu_seconds_until_converged") or {}).get("operator")
    return None if cpu is None else float(cpu) * 1000 / int(p["models"])


def floor_rows(sizes: Sequence[int], phases: Sequence[dict[str, Any]], big: int) -> list[Row]:
    """The two rows against the floor: converge time over the floor's, and CPU per model against the usual operator's."""
    def get(impl: str, n: int) -> dict[str, Any] | None:
        return next((p for p in phases if p["impl"] == impl and p["models"] == n), None)

    def ratio(impl: str) -> Callable[[dict[str, Any]], str]:
        def fmt(p: dict[str, Any]) -> str:
            r = to_floor(p, get("floor", p["models"]))
            return "-" if r is None else f"{r:.2f}x"
        return fmt

    def cpu(impl: str) -> Callable[[dict[str, Any]], str]:
        def fmt(p: dict[str, Any]) -> str:
            mine, usual = cpu_ms_per_model(p), cpu_ms_per_model(get("usual", p["models"]) or {"models": 1})
            if mine is None:
                return "-"
            if impl == "ours" and usual:
                return f"{mine:.1f} ms ({mine / usual:.2f}x usual)"
            return f"{mine:.1f} ms"
        return fmt

    ours_big, floor_big, usual_big = get("ours", big), get("floor", big), get("usual", big)
    ratio_big = to_floor(ours_big, floor_big) if ours_big else None
    cpu_ours, cpu_usual = (cpu_ms_per_model(x) if x else None for x in (ours_big, usual_big))
    return [
        ScaleRow("converge time over the floor's (same run, same size)", per_size(sizes, phases, "ours", ratio("ours")),
                 per_size(sizes, phases, "usual", ratio("usual")), f"<= 1.3x at {big}",
                 None if ratio_big is None else ratio_big <= 1.3, floor=per_size(sizes, phases, "floor", ratio("floor"))),
        ScaleRow("operator CPU per model until converged", per_size(sizes, phases, "ours", cpu("ours")),
                 per_size(sizes, phases, "usual", cpu("usual")), f"<= 1/4 of usual's at {big}",
                 None if cpu_ours is None or not cpu_usual else cpu_ours <= cpu_usual / 4,
                 floor=per_size(sizes, phases, "floor", cpu("floor"))),
    ]


def phase(cluster: BenchCluster, impl: str, n: int) -> dict[str, Any]:
    log(f"Scale phase impl={impl} models={n}: fresh control plane")
    kubeconfig = cluster.fresh()
    kube = Kube(kubeconfig)
    ensure_namespace(kube, NAMESPACE)
    log_path = cluster.logs / f"operator-{impl}-{n}.log"
    profile = cluster.logs / f"tracemalloc-{n}.txt" if impl == "ours" and os.environ.get("BENCH_TRACEMALLOC") else None
    if impl == "ours":
        op = OperatorProcess.ours(kubeconfig, log_path)
        if profile is not None:  # bench.memprofile: the same operator under tracemalloc
            op.argv = [sys.executable, "-m", "bench.memprofile", *op.argv[1:]]
            op.env["BENCH_TRACEMALLOC_OUT"] = str(profile)
    elif impl == "floor":  # bench.floor: renders before the clock starts, then only writes
        ready_file = cluster.logs / f"floor-{n}.ready"
        ready_file.unlink(missing_ok=True)
        op = OperatorProcess([sys.executable, "-m", "bench.floor", "--kubeconfig", str(kubeconfig), "--namespace",
                              NAMESPACE, "--models", str(n), "--ready-file", str(ready_file)], log_path)
    else:
        op = OperatorProcess([sys.executable, "-m", "bench.naive_operator", "--kubeconfig", str(kubeconfig)],
                             log_path, env={"KUBECONFIG": str(kubeconfig)})
    docs = model_docs(n)
    conv = Convergence()
    stop = threading.Event()
    op.start()
    try:
        time.sleep(3.0)  # the operator's initial lists and watches are up
        if impl == "floor":  # and the floor has rendered every model
            wait_for("the floor's rendering", lambda: op.process is not None and op.process.poll() is None
                     and ready_file.exists(), max(60.0, n * 0.2), 0.2)
        watchers = [threading.Thread(target=watch_forever, args=(Kube(kubeconfig), "TritonModel", NAMESPACE,
                                                                 conv.on_model, stop.is_set), daemon=True)]
        watchers += [threading.Thread(target=watch_forever, args=(Kube(kubeconfig), k, NAMESPACE, conv.on_child(k),
                                                                  stop.is_set), daemon=True) for k in CHILD_KINDS]
        for w in watchers:
            w.start()
        time.sleep(1.0)
        pids = {**{k: v for k, v in cluster.read_pids().items()}, "operator": op.pid, "bench": os.getpid()}
        cpu0, machine_cpu = cpu_snapshot(pids), CpuMeter()
        api0, t0 = apiserver_requests(kube), time.time()
        writes0 = op.writes() if impl == "ours" else {}
        created: dict[str, float] = {}
        client = Kube(kubeconfig)

        def create(doc: dict[str, Any]) -> None:
            client.create(doc)
            created[doc["metadata"]["name"]] = time.time()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, docs))
        t_created = time.time()
        log(f"Created {n} TritonModels seconds={t_created - t0:.1f}")
        deadline = time.monotonic() + max(120.0, n * 0.6)
        pending = set(created)
        while pending and time.monotonic() < deadline:
            if op.process is not None and op.process.poll() is not None:
                raise RuntimeError(f"{impl} operator exited with {op.process.returncode}; log {log_path}")
            pending = {name for name in pending if conv.converged_at(name) is None}
            time.sleep(0.2)
        cpu_conv, machine_conv = cpu_snapshot(pids), machine_cpu.stop()
        done = {name: conv.converged_at(name) for name in created}
        conv_times = [t for t in done.values() if t is not None]
        t_conv = max(conv_times) if conv_times else float("nan")
        log(f"Converged {len(conv_times)}/{n} seconds={t_conv - t0:.1f} (after last create {t_conv - t_created:.1f})")
        t_quiet = wait_quiet(kube, timeout=QUIET_CAP_SECONDS)
        api1, t1 = apiserver_requests(kube), time.time()
        cpu1 = cpu_snapshot(pids)
        writes1 = op.writes() if impl == "ours" else {}
        steady = 0.0 if impl == "floor" else STEADY_SECONDS  # the floor writes nothing after its first pass
        log(f"API quiet {t_quiet - t0:.1f}s after the first create; steady state for {steady:.0f}s")
        time.sleep(steady)
        api2, t2 = apiserver_requests(kube), time.time()
        writes2 = op.writes() if impl == "ours" else {}
        memory = op.memory()
        if profile is not None:
            profile.unlink(missing_ok=True)
            os.kill(op.pid, signal.SIGUSR1)
            wait_for("the operator's tracemalloc report", profile.exists, 120, 0.5)
            log(f"tracemalloc report ({memory.get('VmRSS')} kB RSS under tracemalloc): {profile}\n"
                + "\n".join(profile.read_text().splitlines()[:60]))
    finally:
        stop.set()
        op.stop()
    cluster.down(quiet=True)  # flushes the audit log (batch mode)
    audit_reconcile = by_client(audit_requests(cluster.audit_log, t0, t1))
    audit_steady = by_client(audit_requests(cluster.audit_log, t1, t2))
    op_reconcile = audit_reconcile.get("operator", {})
    op_steady = audit_steady.get("operator", {})
    all_reconcile = delta(api1, api0)
    all_steady = delta(api2, api1)
    per_minute = (lambda v: round(v * 60 / (t2 - t1), 2)) if steady else (lambda v: None)
    result = {
        "impl": impl,
        "models": n,
        "converged": len(conv_times),
        "create_seconds": round(t_created - t0, 2),
        "converge_seconds": round(t_conv - t0, 2),
        "converge_after_last_create_seconds": round(t_conv - t_created, 2),
        "quiet_after_seconds": round(t_quiet - t0, 2),
        "request_window_seconds": round(t1 - t0, 2),
        "cpu_seconds_until_converged": cpu_delta(cpu_conv, cpu0),
        "machine_cpu_busy_until_converged": machine_conv["cpu_busy_fraction"],
        "cpu_seconds_until_quiet": cpu_delta(cpu1, cpu0),
        "per_model_seconds": summary([done[k] - created[k] for k in created if done[k] is not None], 3),
        "operator_requests": sum(op_reconcile.values()),
        "operator_requests_per_model": round(sum(op_reconcile.values()) / n, 2),
        "operator_writes_per_model": round(writes_of(op_reconcile) / n, 2),
        "operator_requests_by_verb": op_reconcile,
        "apiserver_requests_all_clients": sum(all_reconcile.values()),
        "apiserver_requests_all_clients_per_model": round(sum(all_reconcile.values()) / n, 2),
        "apiserver_requests_by_verb": all_reconcile,
        "audit_reconcile_by_client": audit_reconcile,
        "steady_seconds": round(t2 - t1, 1),
        "steady_operator_writes_per_minute": per_minute(writes_of(op_steady)),
        "steady_operator_requests_per_minute": per_minute(sum(op_steady.values())),
        "steady_operator_requests_by_verb": op_steady,
        "steady_apiserver_writes_per_minute_all_clients": per_minute(
            writes_of({k: v for k, v in all_steady.items() if "leases" not in k})),
        "steady_apiserver_requests_by_verb": all_steady,
        "steady_audit_by_client": audit_steady,
        "operator_metric_writes_reconcile": {k: writes1.get(k, 0) - writes0.get(k, 0) for k in writes1},
        "operator_metric_writes_steady": {k: writes2.get(k, 0) - writes1.get(k, 0) for k in writes2
                                          if writes2.get(k, 0) - writes1.get(k, 0)},
        "operator_memory_kb": memory,
        "peak_rss_mb": round(memory.get("VmHWM", 0) / 1024, 1),
    }
    log(f"Phase impl={impl} models={n}: converge={result['converge_seconds']}s "
        f"requests/model={result['operator_requests_per_model']} steadyWrites/min={result['steady_operator_writes_per_minute']} "
        f"peakRSS={result['peak_rss_mb']}MB")
    return result


def run(sizes: tuple[int, ...] = SIZES, impls: tuple[str, ...] = IMPLS) -> Path:
    started, meter = time.monotonic(), CpuMeter()
    cluster = BenchCluster()
    phases: list[dict[str, Any]] = []
    try:
        for n in sizes:
            for impl in impls:
                phases.append(phase(cluster, impl, n))
    finally:
        cluster.down(quiet=True)

    def get(impl: str, n: int) -> dict[str, Any] | None:
        return next((p for p in phases if p["impl"] == impl and p["models"] == n), None)

    def across(impl: str, fmt: Any) -> str:
        cells = []
        for n in sizes:
            p = get(impl, n)
            cells.append(f"{n}: {fmt(p)}" if p else f"{n}: -")
        return "; ".join(cells)

    big = JUDGED if JUDGED in sizes else max(sizes)
    ours_big = get("ours", big) or {}
    conv = lambda p: (f"{p['converge_seconds']:.1f} s ({p['converged']}/{p['models']}; "  # noqa: E731
                      f"p50 {p['per_model_seconds'].get('p50', float('nan')):.2f} s, "
                      f"p95 {p['per_model_seconds'].get('p95', float('nan')):.2f} s per model)")
    req = lambda p: f"{p['operator_requests_per_model']:.1f} ({p['operator_writes_per_model']:.1f} writes)"  # noqa: E731
    allreq = lambda p: f"{p['apiserver_requests_all_clients_per_model']:.1f}"  # noqa: E731
    steady = lambda p: ("- (not measured)" if p["steady_operator_writes_per_minute"] is None else  # noqa: E731
                        f"{p['steady_operator_writes_per_minute']:.0f} ({p['steady_operator_requests_per_minute']:.0f} requests)")
    rss = lambda p: f"{p['peak_rss_mb']:.0f} MB"  # noqa: E731
    result = Result(
        name="scale",
        title=f"Reconcile scale: {', '.join(str(n) for n in sorted(sizes))} TritonModels",
        method=(
            "For each size and operator, a fresh control plane of our own (etcd, kube-apiserver with an audit "
            "log, controller-manager, scheduler; one node, on which no pod runs), the operator started, then N copies of "
            "examples/add-sub.yaml with `replicas: 0` created by 8 client threads. 'Converged' = the model has "
            "its ConfigMap, Deployment and Service and `status.observedGeneration` = its generation (seen on "
            "watches), timed from the first create. Requests are the operator's, from the API server's audit "
            "log by user agent, from the first create until no create/patch reached the API server for 5 s (at most "
            f"{QUIET_CAP_SECONDS:.0f} s after convergence: the usual approach's timer, first run at once and then "
            "every 60 s, never lets it settle, so its count includes its first drift pass); the "
            "`apiserver_request_total` delta over the same window (all clients: also the controller-manager "
            "and our creates) is in the JSON by verb/resource. Steady state = the next "
            f"{STEADY_SECONDS:.0f} s (one drift pass). Peak RSS = the operator's VmHWM. 'usual approach' = "
            "bench/naive_operator.py: the same renderer behind kopf on.create/update/resume handlers + a "
            "kopf.timer, get-then-create-or-patch every child, kopf defaults on. 'floor' = bench/floor.py, in the "
            "same run on a fresh control plane of its own: a bare client that renders every model's ConfigMap, "
            "Deployment, Service and status with our renderer before the clock starts, then watches TritonModels "
            "and sends those four writes (3 POSTs, 1 status merge-patch) for each new one from "
            f"{FLOOR_CONCURRENCY} threads with no rate limit; no steady state is measured for it (it writes "
            "nothing more). 'converge time over the floor's' divides each converge time by the floor's at the "
            "same size; CPU per model is the operator process's CPU seconds until converged over N (the floor's: "
            "its client's)."
        ),
    )
    result.rows = [
        ScaleRow("time until every model converged", across("ours", conv), across("usual", conv),
                 f"{big} models <= 20 s", (ours_big.get("converge_seconds", 1e9) <= 20
                                           and ours_big.get("converged") == big) if ours_big else None,
                 floor=across("floor", conv)),
        *(floor_rows(sizes, phases, big) if "floor" in impls else []),
        ScaleRow("operator API requests per model", across("ours", req), across("usual", req),
                 f"<= 5 per model at {big}", ours_big.get("operator_requests_per_model", 1e9) <= 5 if ours_big else None,
                 floor=across("floor", req)),
        ScaleRow("all clients' API requests per model (apiserver_request_total)", across("ours", allreq),
                 across("usual", allreq), floor=across("floor", allreq)),
        ScaleRow("operator writes per minute at steady state", across("ours", steady), across("usual", steady),
                 "0", ours_big.get("steady_operator_writes_per_minute", 1) == 0 if ours_big else None,
                 floor=across("floor", steady)),
        ScaleRow("operator peak RSS", across("ours", rss), across("usual", rss), f"<= 150 MB at {big}",
                 ours_big.get("peak_rss_mb", 1e9) <= 150 if ours_big else None, floor=across("floor", rss)),
    ]
    ordered = sorted(sizes)
    for impl in impls:
        steps = []
        for small, large in zip(ordered, ordered[1:], strict=False):
            a, b = get(impl, small), get(impl, large)
            if not a or not b:
                continue
            grow = (b["peak_rss_mb"] - a["peak_rss_mb"]) * 1024 / (large - small)
            steps.append(
                f"{small} -> {large}: converge time x{b['converge_seconds'] / max(a['converge_seconds'], 1e-9):.1f} "
                f"({a['converge_seconds'] * 1000 / small:.0f} -> {b['converge_seconds'] * 1000 / large:.0f} ms per model), "
                f"requests per model {a['operator_requests_per_model']:.1f} -> {b['operator_requests_per_model']:.1f}, "
                f"peak RSS +{grow:.0f} kB per added model")
        if steps:
            result.notes.append(f"Growth ({impl}): " + "; ".join(steps) + ".")
    for n in sorted({big, max(sizes)}):
        for impl in impls:
            p = get(impl, n)
            if p and p.get("cpu_seconds_until_converged"):
                cpu = p["cpu_seconds_until_converged"]
                result.notes.append(
                    f"Where the time went ({impl}, {n} models, {p['converge_seconds']:.0f} s to converge, whole "
                    f"machine {p['machine_cpu_busy_until_converged']:.0%} busy): CPU seconds "
                    + ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])) + ".")
    result.data = {"phases": phases}
    return write_result(result, started, meter)


if __name__ == "__main__":  # `python -m bench.scale N`: one profiled phase of ours (BENCH_TRACEMALLOC=1), no result
    _cluster = BenchCluster()
    try:
        phase(_cluster, "ours", int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
    finally:
        _cluster.down(quiet=True)
