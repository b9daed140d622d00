"""Benchmark `placement`: a pool of fixed size under equal load on all its models, its copies placed by `Spread`
against `Pack` (`spec.placement.strategy`, issue 41), measured with NVIDIA's perf_analyzer (bench/perf_analyzer.py).

On our own cluster (control plane, one real node with containerd and a kubelet, the operator as a host process;
kube-proxy too when the bench runs in a network namespace of its own: `e2e/netns-python -m bench.run placement`):

1. One CPU TritonPool of REPLICAS replicas (a fixed count, no autoscaling), each replica's tritonserver container
   limited to CPU_LIMIT of CPU (`server.resources.limits.cpu`: each replica has its share of CPU, as replicas on
   nodes or GPUs of their own would; with no limit (`BENCH_PLACEMENT_CPU_LIMIT=`) the replicas share the node's
   cores with everything else, and the machine, not the placement, bounds them), and capacity for every model on
   one replica (`memoryPerReplica` MODELS x the model's memory): so `Pack` (best fit) puts all the models on one
   replica, and `Spread` (the fewest models first) puts as many on each.
2. For each strategy in turn (ROUNDS times each, in the order Spread, Pack, Pack, Spread, ... so that neither is
   always measured first): the pool's strategy is set, MODELS pooled models of equal size are created (one copy
   each), until each is Ready AllCopiesWarmed; their placement is read from their status. Then, all at once, one
   perf_analyzer per model (HTTP, `--concurrency-range CONCURRENCY`, time windows of WINDOW_MS ms, stopping after
   its first three windows (`-s 1000`), whose figures it reports) against the model's Service: its ClusterIP
   through kube-proxy, or, without kube-proxy, the ready endpoint of the model's EndpointSlice (one copy: the same
   replica). Its CSV (`-f`) gives each model's throughput and p50/p95/p99 latency, and Triton's own queue and
   compute time. The models are deleted (each unloaded) before the next placement: a change of strategy moves no
   copy that serves, so the copies are placed anew.
3. Meanwhile: each replica's tritonserver container's CPU (its cgroup: the CPU time used, and the CFS periods in
   which it was throttled at its limit), the CPU the perf_analyzer processes used, and the whole machine's.

The model: add-sub (e2e/pool.py's `pooled_add_sub`: INPUT0 + INPUT1, INPUT0 - INPUT1, one CPU instance) whose
`execute` also burns BURN_MS ms of its thread's CPU time per request (`parameters.burnMs`): a fixed amount of work,
as a model's compute is, so that what a replica's CPU can do decides the throughput; add-sub alone costs less than
Triton's own HTTP handling.
"""

from __future__ import annotations

import csv
import io
import os
import re
import resource
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from e2e.kube import Kube, condition, wait_for
from e2e.pool import placement, pooled_add_sub, replica_pods
from triton_operator.api.pool import LABEL_POOL

from .common import CpuMeter, Result, Row, log, summary, write_result
from .kubeenv import BenchCluster, own_netns, pool_bench
from .perf_analyzer import PerfAnalyzer, ensure

NAMESPACE = "bench-placement"
POOL = "shared"
MODELS = int(os.environ.get("BENCH_PLACEMENT_MODELS", "12"))
REPLICAS = int(os.environ.get("BENCH_PLACEMENT_REPLICAS", "3"))
ROUNDS = int(os.environ.get("BENCH_PLACEMENT_ROUNDS", "2"))
CONCURRENCY = int(os.environ.get("BENCH_PLACEMENT_CONCURRENCY", "2"))
WINDOW_MS = int(os.environ.get("BENCH_PLACEMENT_WINDOW_MS", "5000"))
BURN_MS = float(os.environ.get("BENCH_PLACEMENT_BURN_MS", "5"))
CPU_LIMIT = os.environ.get("BENCH_PLACEMENT_CPU_LIMIT", "300m")
MODEL_MEMORY_MI = 64
#: The result's name (bench/results/<name>.json): another name keeps a variant run beside `placement`.
RESULT_NAME = os.environ.get("BENCH_PLACEMENT_NAME", "placement")
STRATEGIES = ("Spread", "Pack")

BURN_PY = '''import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.burn = float(params.get("burnMs", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            end = time.thread_time() + self.burn  # CPU time, not wall time: the same work however busy the CPU
            while time.thread_time() < end:
                pass
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32)),
            ]))
        return responses
'''


class PlacementCluster(BenchCluster):
    """The bench cluster, with kube-proxy when in a network namespace of its own (then perf_analyzer dials each
    model's ClusterIP; else the ready endpoint of its slices)."""

    def __init__(self) -> None:
        super().__init__()
        self.kube_proxy = own_netns()


def pool_doc() -> dict[str, Any]:
    limits: dict[str, str] = {"memory": "3Gi"}
    if CPU_LIMIT:
        limits["cpu"] = CPU_LIMIT
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonPool",
            "metadata": {"name": POOL, "namespace": NAMESPACE},
            "spec": {"replicas": REPLICAS, "capacity": {"memoryPerReplica": f"{MODELS * MODEL_MEMORY_MI}Mi"},
                     "placement": {"strategy": STRATEGIES[0]},
                     "server": {"resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": limits}}}}


def model_doc(name: str) -> dict[str, Any]:
    doc = pooled_add_sub(name, POOL, copies=1, memory=f"{MODEL_MEMORY_MI}Mi")
    doc["metadata"]["namespace"] = NAMESPACE
    doc["spec"]["source"]["inline"]["model.py"] = BURN_PY
    doc["spec"]["parameters"] = {"burnMs": str(BURN_MS)}
    return doc


def warmed(tm: dict[str, Any] | None) -> bool:
    c = condition(tm or {}, "Ready") or {}
    return c.get("status") == "True" and c.get("reason") == "AllCopiesWarmed"


# -- perf_analyzer's report ---------------------------------------------------------------------------------------

#: perf_analyzer's CSV columns (microseconds) -> our keys (milliseconds).
CSV_MS = {"p50 latency": "p50_ms", "p90 latency": "p90_ms", "p95 latency": "p95_ms", "p99 latency": "p99_ms",
          "Avg latency": "avg_ms", "Client Send": "client_send_ms", "Network+Server Send/Recv": "network_ms",
          "Server Queue": "server_queue_ms", "Server Compute Input": "server_input_ms",
          "Server Compute Infer": "server_infer_ms", "Server Compute Output": "server_output_ms",
          "Client Recv": "client_recv_ms"}


def parse_csv(text: str) -> dict[str, float]:
    """perf_analyzer's `-f` report (one concurrency level): throughput in infer/s, latencies in ms."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise ValueError(f"no row in perf_analyzer's CSV: {text[:200]!r}")
    row = rows[0]
    out = {"concurrency": float(row["Concurrency"]), "infer_per_s": float(row["Inferences/Second"])}
    for col, key in CSV_MS.items():
        if row.get(col) not in (None, ""):
            out[key] = round(float(row[col]) / 1000, 3)
    return out


def perf_args(model: str, address: str, csv_path: Path) -> list[str]:
    return ["-m", model, "-u", f"{address}:8000", "-i", "http", "--concurrency-range", str(CONCURRENCY),
            "--measurement-mode", "time_windows", "-p", str(WINDOW_MS), "-s", "1000", "-f", str(csv_path)]


# -- what each replica's tritonserver used ------------------------------------------------------------------------


def cgroup_cpu(pid: int) -> dict[str, float]:
    """The CPU of the cgroup a process is in: seconds used, CFS periods and those throttled (cgroup v1 or v2)."""
    paths = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else ("",):
            paths[c] = (controllers, path)
    out: dict[str, float] = {}
    if "cpu" in paths:  # v1: cpu.stat in the cpu hierarchy, usage in cpuacct's
        stat = Path("/sys/fs/cgroup", paths["cpu"][0]) / paths["cpu"][1].lstrip("/") / "cpu.stat"
        kv = dict(ln.split() for ln in stat.read_text().splitlines())
        out.update(periods=float(kv["nr_periods"]), throttled=float(kv["nr_throttled"]),
                   throttled_s=float(kv["throttled_time"]) / 1e9)
        acct = paths.get("cpuacct", paths["cpu"])
        usage = Path("/sys/fs/cgroup", acct[0]) / acct[1].lstrip("/") / "cpuacct.usage"
        out["cpu_s"] = int(usage.read_text()) / 1e9
    else:  # v2
        stat = Path("/sys/fs/cgroup") / paths[""][1].lstrip("/") / "cpu.stat"
        kv = dict(ln.split() for ln in stat.read_text().splitlines())
        out.update(cpu_s=float(kv["usage_usec"]) / 1e6, periods=float(kv.get("nr_periods", 0)),
                   throttled=float(kv.get("nr_throttled", 0)), throttled_s=float(kv.get("throttled_usec", 0)) / 1e6)
    return out


def replicas_cpu(cluster: BenchCluster, kube: Kube) -> dict[str, dict[str, float]]:
    out = {}
    for pod in replica_pods(kube, NAMESPACE, POOL):
        try:
            out[pod["metadata"]["name"]] = cgroup_cpu(cluster.container_pid(pod, "tritonserver"))
        except (OSError, LookupError, ValueError, KeyError) as exc:
            log(f"No cgroup CPU for {pod['metadata']['name']}: {type(exc).__name__}: {exc}")
    return out


def cpu_delta(after: dict[str, dict[str, float]], before: dict[str, dict[str, float]], seconds: float) -> dict[str, Any]:
    out = {}
    for pod, a in after.items():
        b = before.get(pod)
        if b is None:
            continue
        d = {k: a[k] - b[k] for k in a if k in b}
        out[pod] = {"cpu_per_s": round(d["cpu_s"] / seconds, 3), "cpu_s": round(d["cpu_s"], 2),
                    "periods": int(d.get("periods", 0)), "throttled_periods": int(d.get("throttled", 0)),
                    "throttled_s": round(d.get("throttled_s", 0.0), 2)}
    return out


def machine_ticks() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]


# -- one placement, one measurement -------------------------------------------------------------------------------


def set_strategy(kube: Kube, strategy: str) -> None:
    kube.patch("TritonPool", POOL, {"spec": {"placement": {"strategy": strategy}}}, NAMESPACE, type="merge")
    wait_for(f"pool status placementStrategy {strategy}", lambda: (kube.get("TritonPool", POOL, NAMESPACE)
             .get("status") or {}).get("placementStrategy") == strategy, 60, 0.2)


def place(kube: Kube, names: list[str]) -> tuple[dict[str, str], float]:
    """Creates the models; returns where each copy went (model -> replica pod) and the seconds until all warmed."""
    t0 = time.monotonic()
    for n in names:
        kube.create(model_doc(n))

    def all_warm() -> dict[str, dict[str, Any]] | None:
        tms = {tm["metadata"]["name"]: tm for tm in kube.items("TritonModel", NAMESPACE)}
        return tms if all(warmed(tms.get(n)) for n in names) else None

    tms = wait_for(f"{len(names)} models Ready AllCopiesWarmed", all_warm, 300 + 20 * len(names), 0.5)
    seconds = time.monotonic() - t0
    return {n: placement(tms[n])[0] for n in names}, seconds


def addresses(kube: Kube, cluster: BenchCluster, names: list[str]) -> dict[str, str]:
    """Where perf_analyzer sends each model's requests: its Service's ClusterIP (kube-proxy), else its ready
    endpoint."""
    if cluster.kube_proxy:
        return {n: kube.get("Service", n, NAMESPACE)["spec"]["clusterIP"] for n in names}
    out: dict[str, str] = {}
    for eps in kube.items("EndpointSlice", NAMESPACE):
        svc = (eps["metadata"].get("labels") or {}).get("kubernetes.io/service-name", "")
        for e in eps.get("endpoints") or ():
            if svc in names and (e.get("conditions") or {}).get("ready"):
                out[svc] = e["addresses"][0]
    return out


def model_answers(address: str, name: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:8000/v2/models/{name}/ready", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def load(pa: PerfAnalyzer, targets: dict[str, str], out_dir: Path) -> dict[str, dict[str, Any]]:
    """One perf_analyzer per model, all at once; each model's figures from its CSV (or its error)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = {}
    for name, address in targets.items():
        logf = open(out_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed below, after the process ends
        procs[name] = (subprocess.Popen(pa.command(perf_args(name, address, out_dir / f"{name}.csv")), env=pa.env(),
                                        stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), logf)
    results: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 20 * WINDOW_MS / 1000 + 120
    for name, (proc, logf) in procs.items():
        try:
            rc = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        logf.close()
        try:
            results[name] = {"exit": rc, **parse_csv((out_dir / f"{name}.csv").read_text())}
        except (OSError, ValueError, KeyError) as exc:
            tail = (out_dir / f"{name}.log").read_text(errors="replace")[-400:]
            results[name] = {"exit": rc, "error": f"{type(exc).__name__}: {exc}; log: {tail}"}
    return results


def measure(pa: PerfAnalyzer, kube: Kube, cluster: BenchCluster, strategy: str, tag: str) -> dict[str, Any]:
    """Sets the strategy, places MODELS new models, loads them all, deletes them; the figures of it."""
    set_strategy(kube, strategy)
    pods_before = sorted(p["metadata"]["name"] for p in replica_pods(kube, NAMESPACE, POOL))
    names = [f"{tag}-m{i:02d}" for i in range(MODELS)]
    where, load_s = place(kube, names)
    per_replica = {p: sorted(n for n, r in where.items() if r == p) for p in pods_before}
    counts = sorted((len(v) for v in per_replica.values()), reverse=True)
    log(f"{tag}: {strategy} placed models per replica {counts} in {load_s:.1f} s")
    targets = wait_for("every model's address answering ready", lambda: (
        t if len(t := addresses(kube, cluster, names)) == len(names)
        and all(model_answers(a, n) for n, a in t.items()) else None), 60, 0.5)
    cpu0, ticks0, ru0, t0 = replicas_cpu(cluster, kube), machine_ticks(), resource.getrusage(
        resource.RUSAGE_CHILDREN), time.monotonic()
    models = load(pa, targets, cluster.logs / f"perf-{tag}")
    seconds = time.monotonic() - t0
    cpu1, ticks1, ru1 = replicas_cpu(cluster, kube), machine_ticks(), resource.getrusage(resource.RUSAGE_CHILDREN)
    for n, m in models.items():
        m["replica"] = where[n]
    total = sum(m.get("infer_per_s", 0.0) for m in models.values())
    log(f"{tag}: {strategy} {total:.1f} infer/s in all; p95 per model "
        f"{summary([m['p95_ms'] for m in models.values() if 'p95_ms' in m], 1)}")
    for n in names:
        kube.delete("TritonModel", n, NAMESPACE)
    wait_for(f"{tag}: models gone and unloaded", lambda: not kube.items("TritonModel", NAMESPACE) and not any(
        r.get("loaded") or r.get("models") for r in (kube.get("TritonPool", POOL, NAMESPACE).get("status") or {})
        .get("replicaModels") or ()), 300, 0.5)
    busy = 1 - (ticks1[1] - ticks0[1]) / max(1, ticks1[0] - ticks0[0])
    return {"strategy": strategy, "tag": tag, "models_per_replica": counts, "placement": per_replica,
            "replica_pods": pods_before, "place_seconds": round(load_s, 1), "load_seconds": round(seconds, 1),
            "total_infer_per_s": round(total, 1), "models": models,
            "failed": sorted(n for n, m in models.items() if "error" in m or m["exit"] != 0),
            "replica_cpu": cpu_delta(cpu1, cpu0, seconds),
            "clients_cpu_s": round(ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, 2),
            "machine_cpu_busy": round(busy, 3)}


def order(rounds: int) -> list[str]:
    """Spread, Pack, Pack, Spread, Spread, Pack, ...: each strategy `rounds` times, neither always first."""
    return [s for r in range(rounds) for s in (STRATEGIES if r % 2 == 0 else STRATEGIES[::-1])]


def run() -> Path:
    started, meter = time.monotonic(), CpuMeter()
    pa = ensure()
    cluster = PlacementCluster()
    runs: list[dict[str, Any]] = []
    with pool_bench(cluster, NAMESPACE, "operator-placement.log") as b:
        kube = b.kube
        kube.create(pool_doc())
        wait_for(f"{REPLICAS} pool replicas Ready", lambda: (kube.get("TritonPool", POOL, NAMESPACE).get("status")
                 or {}).get("readyReplicas") == REPLICAS, 300, 0.5)
        seen: dict[str, int] = {}
        for strategy in order(ROUNDS):
            seen[strategy] = seen.get(strategy, 0) + 1
            runs.append(measure(pa, kube, cluster, strategy, f"{strategy.lower()}{seen[strategy]}"))
        pods = sorted(p["metadata"]["name"] for p in kube.items("Pod", NAMESPACE, labelSelector=LABEL_POOL))
    data = {"config": {"models": MODELS, "replicas": REPLICAS, "rounds": ROUNDS, "concurrency": CONCURRENCY,
                       "window_ms": WINDOW_MS, "windows": 3, "burn_ms": BURN_MS, "cpu_limit": CPU_LIMIT or None,
                       "model_memory": f"{MODEL_MEMORY_MI}Mi", "capacity_per_replica": f"{MODELS * MODEL_MEMORY_MI}Mi",
                       "via": "ClusterIP (kube-proxy)" if cluster.kube_proxy else "the ready endpoint of its slice",
                       "perf_analyzer": pa.version(), "perf_analyzer_args": perf_args("MODEL", "ADDRESS", Path("CSV"))},
            "runs": runs, "replica_pods_at_end": pods}
    return write_result(result(data), started, meter)


# -- the result ---------------------------------------------------------------------------------------------------


def _of(runs: list[dict[str, Any]], strategy: str) -> list[dict[str, Any]]:
    return [r for r in runs if r["strategy"] == strategy]


def _per_model(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [m[key] for r in runs for m in r["models"].values() if key in m]


def _spread_of(values: list[float], unit: str) -> str:
    s = summary(values, 1)
    return f"median {s['p50']:.1f} {unit}, min {s['min']:.1f} {unit}, max {s['max']:.1f} {unit} (n={s['n']})" \
        if s["n"] else "-"


def _cells(runs: list[dict[str, Any]], strategy: str) -> dict[str, str]:
    rs = _of(runs, strategy)
    totals = [r["total_infer_per_s"] for r in rs]
    mean = sum(totals) / len(totals) if totals else float("nan")
    placements = "; ".join(dict.fromkeys(", ".join(map(str, r["models_per_replica"])) for r in rs))
    cpu = [c for r in rs for c in r["replica_cpu"].values()]
    periods = sum(c["periods"] for c in cpu)
    throttled = sum(c["throttled_periods"] for c in cpu)
    per_rep = "; ".join(" / ".join(f"{c['cpu_per_s']:.2f}" for c in sorted(
        r["replica_cpu"].values(), key=lambda c: -c["cpu_per_s"])) for r in rs)
    queue, infer = _per_model(rs, "server_queue_ms"), _per_model(rs, "server_infer_ms")
    return {
        "placement": placements or "-",
        "throughput": f"{mean:.1f} infer/s (" + ", ".join(f"{t:.1f}" for t in totals) + " by round)",
        "p95": _spread_of(_per_model(rs, "p95_ms"), "ms"),
        "p50": _spread_of(_per_model(rs, "p50_ms"), "ms"),
        "server": (f"queue {summary(queue, 1).get('p50', '-')} ms, compute {summary(infer, 1).get('p50', '-')} ms"
                   if queue else "-"),
        "cpu": f"{per_rep} CPU (throttled in {throttled / periods:.0%} of CFS periods)" if periods else per_rep or "-",
        "failed": f"{sum(len(r['failed']) for r in rs)} of {sum(len(r['models']) for r in rs)}",
        "place": ", ".join(f"{r['place_seconds']:.1f} s" for r in rs),
    }


def result(data: dict[str, Any]) -> Result:
    cfg, runs = data["config"], data["runs"]
    n, reps = cfg["models"], cfg["replicas"]
    method = re.sub(r"\s+", " ", (__doc__ or "").split("\n\n", 1)[1]).strip()
    if not cfg["cpu_limit"]:
        method = method.replace("limited to CPU_LIMIT of CPU", "with no CPU limit (a variant run)")
    for key, value in (("REPLICAS", reps), ("MODELS", n), ("ROUNDS", cfg["rounds"]), ("CONCURRENCY", cfg["concurrency"]),
                       ("WINDOW_MS", cfg["window_ms"]), ("BURN_MS", f"{cfg['burn_ms']:g}"),
                       ("CPU_LIMIT", cfg["cpu_limit"] or "no limit")):
        method = method.replace(key, str(value))
    res = Result(name=RESULT_NAME, title=f"Spread against Pack: {n} models under equal load on a pool of {reps} "
                 "replicas (perf_analyzer)", method=method)
    s, p = _cells(runs, "Spread"), _cells(runs, "Pack")
    res.rows = [
        Row(f"models per replica ({n} models of {cfg['model_memory']}, one copy each; {reps} replicas of "
            f"{cfg['capacity_per_replica']}, {cfg['cpu_limit'] or 'no'} CPU limit each)", s["placement"], p["placement"]),
        Row(f"throughput, all {n} models together (sum of perf_analyzer's infer/s)", s["throughput"], p["throughput"]),
        Row("p95 latency per model (perf_analyzer)", s["p95"], p["p95"]),
        Row("p50 latency per model (perf_analyzer)", s["p50"], p["p50"]),
        Row("of which in Triton, per request (perf_analyzer's server-side figures, median over models)", s["server"],
            p["server"]),
        Row("tritonserver CPU per replica during the load (its cgroup; CPU-seconds per second, by round)", s["cpu"],
            p["cpu"]),
        Row("perf_analyzer runs that failed", s["failed"], p["failed"]),
        Row(f"create -> all {n} models Ready AllCopiesWarmed (by round)", s["place"], p["place"]),
    ]
    res.notes.append(f"Each model: concurrency {cfg['concurrency']} (perf_analyzer's synchronous mode, "
                     f"{cfg['concurrency']} threads), three windows of {cfg['window_ms']} ms, through "
                     f"{cfg['via']}; {cfg['perf_analyzer']}: `perf_analyzer {' '.join(cfg['perf_analyzer_args'])}`.")
    for r in runs:
        res.notes.append(f"{r['tag']}: models per replica {r['models_per_replica']}; perf_analyzer processes used "
                         f"{r['clients_cpu_s']} CPU-s in {r['load_seconds']} s; the machine was "
                         f"{r['machine_cpu_busy']:.0%} busy during the load"
                         + (f"; failed: {r['failed']}" if r["failed"] else "") + ".")
    res.data = data
    return res


if __name__ == "__main__":
    print(run())
