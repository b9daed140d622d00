"""Benchmark `faults`: how fast a replica that stops serving leaves the Service, and how fast it serves again
(issue 33).

On our own cluster (control plane, one real node with containerd + kubelet, the operator as a host process), each
fault of e2e/test_heal.py is injected REPEAT times into one replica of a 2-replica model while client load runs
(`e2e.load.ServiceLoad`, 4 threads x 20 requests/s, a new HTTP connection each; the bench cluster has no kube-proxy,
so `via="endpoints"`: each request goes to a ready endpoint of the Service's EndpointSlices, re-read every 100 ms).
For each injection: the time from the fault until the replica's endpoint is `ready: false` in the EndpointSlice
(polled back to back), until it is ready again, and until the replica answers a request of its own; the requests
that failed meanwhile; and what the operator did (its Events on the pod). Injections alternate between the two
replicas, back to back: a replica hit again within 120 s of its heal is, by design, replaced by a new pod (the
Service is back once the new pod is in it), so the later injections of a kind measure replacements too.

Then what the checks cost: in the pods, once the injections are over and the load stopped, the `probe` container of
each replica of the sentiment ensemble (three models, Python stubs in the pod's shared process namespace), idle, for
COST_SECONDS: its own CPU (its process, on the host); and a local tritonserver serving the same ensemble, idle, for
COST_SECONDS without a probe and COST_SECONDS with `triton-operator probe --model` x3 checking it (on the host, where
its stub scan reads every process of the machine, unlike in a pod): tritonserver's CPU in both, the probe's own CPU,
and the requests per second the probe sent (its check count).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.healing import HOG_TRIGGER, Outcome, measure, post, python_model, repository_key, sentiment, serving, stubs_of
from e2e.kube import wait_for
from e2e.load import ServiceLoad
from triton_operator.api.pod import KEY_HEADER

from .common import CpuMeter, Result, Row, log, ms, summary, write_result
from .kubeenv import cpu_seconds
from .pods import pod_cluster

NAMESPACE = "bench-faults"
#: Injections per fault (the hang and the memory limit cost more: a 10 s stop, a container restart).
REPEAT = {"stub": 6, "step": 6, "unload": 4, "hog": 2, "stop": 2}
COST_SECONDS = 20.0
TITLES = {
    "stub": "Python stub SIGKILL (add-sub)",
    "step": "ensemble step's stub SIGKILL (sentiment's tokenizer)",
    "unload": "model unloaded, repository API with the operator's key (add-sub)",
    "hog": "Python model allocates past its memory limit (1Gi)",
    "stop": "tritonserver SIGSTOP 10 s, then SIGCONT (add-sub)",
}


def _kill(pids: list[int]) -> Callable[[], None]:
    return lambda: [os.kill(p, signal.SIGKILL) for p in pids]  # type: ignore[func-returns-value]


def faults(env: Any) -> dict[str, list[Outcome]]:
    kube, ns, cluster = env.kube, env.namespace, env.cluster
    kubeconfig = kube.kubeconfig
    kube.create({**python_model("add-sub"), "metadata": {"name": "add-sub", "namespace": ns}})
    for doc in sentiment(2):
        kube.create({**doc, "metadata": {"name": doc["metadata"]["name"], "namespace": ns}})
    kube.create({**python_model("hog", hog=True, memory="1Gi"), "metadata": {"name": "hog", "namespace": ns}})
    out: dict[str, list[Outcome]] = {k: [] for k in REPEAT}
    for model, kinds in (("add-sub", ("stub", "unload", "stop")), ("sentiment", ("step",)), ("hog", ("hog",))):
        serving(kube, ns, model, 2)
        key = repository_key(kube, ns, model)
        with ServiceLoad(kubeconfig, ns, model, model=model, kind="sentiment" if model == "sentiment" else "add-sub",
                         threads=4, rate=20, via="endpoints", timeout=3) as load:
            wait_for("the load answered", lambda load=load: load.tally().sent - load.tally().failed > 20, 60)
            for kind in kinds:
                for i in range(REPEAT[kind]):
                    pod = serving(kube, ns, model, 2)[i % 2]
                    ip = pod["status"]["podIP"]
                    after = None
                    if kind in ("stub", "step"):
                        fault = _kill(stubs_of(cluster, pod, "tokenizer" if kind == "step" else model))
                    elif kind == "unload":
                        url = f"http://{ip}:8000/v2/repository/models/{model}/unload"
                        fault = lambda url=url, key=key: post(url, {}, {KEY_HEADER: key})  # noqa: E731
                    elif kind == "hog":
                        body = {"inputs": [
                            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [HOG_TRIGGER, 0, 0, 0]},
                            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}
                        fault = lambda ip=ip, body=body: post(f"http://{ip}:8000/v2/models/hog/infer", body,  # noqa: E731
                                                              timeout=1)
                    else:
                        pid = cluster.container_pid(pod, "tritonserver")
                        at: list[float] = []

                        def fault(pid: int = pid, at: list[float] = at) -> None:
                            os.kill(pid, signal.SIGSTOP)
                            at.append(time.monotonic())

                        def after(pid: int = pid, at: list[float] = at) -> None:
                            time.sleep(max(0.0, at[0] + 10 - time.monotonic()))  # the fault lasts 10 s
                            os.kill(pid, signal.SIGCONT)

                    o = measure(kube, ns, model, pod, load, fault, after=after)
                    out[kind].append(o)
                    log(f"Fault {kind} {i + 1}/{REPEAT[kind]}: {o.line()}")
                    wait_for(f"{model} Ready again", lambda model=model: _ready(kube, ns, model), 180, 0.5)
    return out


def _ready(kube: Any, ns: str, model: str) -> bool:
    tm = kube.get("TritonModel", model, ns)
    conds = {c["type"]: c["status"] for c in (tm.get("status") or {}).get("conditions") or ()}
    return conds.get("Ready") == "True" and conds.get("Degraded") == "False"


def probe_in_pods(env: Any) -> list[float]:
    """The CPU (fraction of a core) of the `probe` container of each serving replica of sentiment, idle."""
    pids = [env.cluster.container_pid(p, "probe") for p in serving(env.kube, env.namespace, "sentiment", 2)]
    before = [cpu_seconds(pid) for pid in pids]
    t0 = time.monotonic()
    time.sleep(COST_SECONDS)  # the measurement window: idle, nothing to wait for
    after = [cpu_seconds(pid) for pid in pids]
    took = time.monotonic() - t0
    return [(a - b) / took for a, b in zip(after, before, strict=True) if a is not None and b is not None]


def cost(tmp: Path) -> dict[str, Any]:
    """tritonserver's CPU idle without and with the probe checking it, and the probe's own."""
    from tests.triton_helpers import load_models, serve  # a real tritonserver, as the tests start it

    root = Path(__file__).resolve().parents[1]
    models = load_models(root / "examples" / "sentiment-ensemble.yaml")
    with serve(models, tmp / "repo") as served:
        assert served.server.process is not None
        pid = served.server.process.pid
        time.sleep(3)  # settle after the loads: this waits for no state
        c0 = cpu_seconds(pid) or 0.0
        time.sleep(COST_SECONDS)
        without = (cpu_seconds(pid) or 0.0) - c0
        port = _free_port()
        from triton_operator.api.pod import REPOSITORY_KEY_ENV

        env = {**os.environ, "PYTHONPATH": str(root / "operator"), REPOSITORY_KEY_ENV: BENCH_KEY}  # its /status needs a key
        probe = subprocess.Popen(
            [sys.executable, "-m", "triton_operator.cli.main", "probe", "--listen", f"127.0.0.1:{port}",
             "--target", served.server.http_url, "--repository", str(served.server.model_repository),
             "--model", "sentiment", "--model", "tokenizer", "--model", "classifier"],
            stderr=subprocess.DEVNULL, env=env)
        try:
            time.sleep(2)  # the probe starts: this waits for no state
            c0, p0, t0 = cpu_seconds(pid) or 0.0, cpu_seconds(probe.pid) or 0.0, time.monotonic()
            checks0 = _checks(port)
            time.sleep(COST_SECONDS)
            with_probe = (cpu_seconds(pid) or 0.0) - c0
            probe_cpu = (cpu_seconds(probe.pid) or 0.0) - p0
            rate = (_checks(port) - checks0) / (time.monotonic() - t0)
        finally:
            probe.kill()  # on SIGTERM it would wait for tritonserver's port to close, as in a pod
            probe.wait(10)
    return {"seconds": COST_SECONDS, "tritonserver_cpu_without": without / COST_SECONDS,
            "tritonserver_cpu_with": with_probe / COST_SECONDS, "probe_cpu": probe_cpu / COST_SECONDS,
            "checks_per_second": rate}


#: The replica key the cost run's probe is started with.
BENCH_KEY = "bench-" + "k" * 58


def _free_port() -> int:
    from triton_operator.triton.local import free_port

    return free_port()


def _checks(port: int) -> int:
    import json
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}/status", headers={KEY_HEADER: BENCH_KEY})
    with urllib.request.urlopen(request, timeout=5) as resp:  # noqa: S310 - http:// to the bench's own probe
        return int(json.loads(resp.read())["checks"])


def run() -> Path:
    started, meter = time.monotonic(), CpuMeter()
    with pod_cluster(NAMESPACE) as env:
        outcomes = faults(env)
        in_pods = probe_in_pods(env)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        costs = cost(Path(tmp))

    def cell(values: list[float | None]) -> str:
        got = [v for v in values if v is not None]
        if not got:
            return "never"
        s = summary(got)
        return f"p50 {ms(s['p50'])}, p95 {ms(s['p95'])}, max {ms(s['max'])} (n={s['n']})"

    result = Result(
        name="faults",
        title="Faults: a replica that stops serving leaves the Service, and is healed",
        method=__doc__.split("\n\n", 1)[1].replace("\n", " ").replace("REPEAT", "a number of")
        .replace("COST_SECONDS", f"{COST_SECONDS:.0f} s"),
    )
    for kind, outs in outcomes.items():
        title = TITLES[kind]
        left = [o.left for o in outs]
        target = "p95 <= 1 s" if kind in ("stub", "step") else "-"
        met = None
        if kind in ("stub", "step"):
            got = [x for x in left if x is not None]
            met = bool(got) and len(got) == len(left) and summary(got)["p95"] <= 1.0
        result.rows.append(Row(f"{title}: fault -> endpoint ready false", cell(left), "-", target, met))
        result.rows.append(Row(f"{title}: fault -> serving again (answers a request)", cell([o.served for o in outs])))
        failed = [o.failed for o in outs]
        result.rows.append(Row(f"{title}: failed requests per fault (of ~80/s sent)",
                               f"median {sorted(failed)[len(failed) // 2]}, max {max(failed)} (n={len(failed)})"))
        actions = sorted({o.action.split(":", 1)[0] for o in outs})
        result.notes.append(f"{title}: operator's action {actions}; gate reasons seen {sorted({r for o in outs for r in o.gate_reasons})}")
    result.rows.append(Row("checks' cost: requests/s the probe sends tritonserver", f"{costs['checks_per_second']:.1f}"))
    result.rows.append(Row("checks' cost: tritonserver CPU, idle, without / with the probe",
                           f"{costs['tritonserver_cpu_without']:.1%} / {costs['tritonserver_cpu_with']:.1%} of a core"))
    result.rows.append(Row("checks' cost: the probe's own CPU, on the host (sees every process)",
                           f"{costs['probe_cpu']:.1%} of a core"))
    result.rows.append(Row("checks' cost: the probe container's CPU in a replica of sentiment, idle",
                           ", ".join(f"{c:.1%}" for c in in_pods) + " of a core" if in_pods else "not measured"))
    result.data = {"outcomes": {k: [o.__dict__ for o in v] for k, v in outcomes.items()},
                   "cost": {**costs, "probe_cpu_in_pods": in_pods}}
    return write_result(result, started, meter)
