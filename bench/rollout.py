"""Benchmark `rollout`: one config change on the same 3 replicas, in place (Swap, then Drain) and with new pods.

On our own cluster (control plane, one real node with containerd + kubelet, the operator as a host process):
3 replicas of e2e/inplace.py's reloadable add-sub (its initialize sleeps `initSeconds`, here 1 s; the
example's modelWarmup runs on every load). Three phases in one run, each changing only
spec.batcher.maxQueueDelayMicroseconds (another value each time), with spec.rollout in the same patch:

1. in place, Swap (the default): done when every pod's config-digest annotation is status.configDigest with no
   reload or previous-digest annotation, its gate True and its Triton reporting the new digest; pod UIDs must not
   change (the run is invalid otherwise);
2. in place, Drain (maxUnavailable 1): the same;
3. new pods (strategy NewPods): done when exactly 3 pods exist, none of the old ones (terminating ones count), all
   as in 1.

Client load (`e2e.load.ServiceLoad`, 4 threads x 40 requests/s, a new HTTP connection each) runs throughout each
phase. The bench cluster has no kube-proxy, so the load uses `via="endpoints"`: each request goes to a ready
endpoint picked from the Service's EndpointSlices, re-read every 100 ms, as kube-proxy would route it. A watch on
the EndpointSlices gives each replica's time out of the ready endpoints. Triton's own reload time per replica comes
from the operator's log (`Reloaded replica ... seconds=X`, minus `Drained replica ... seconds=Y` in Drain).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.inplace import reloadable, serving
from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad, Tally
from e2e.operator_fixtures import is_model_ready, live_pods, model_condition, model_pods, wait_model

from .common import CpuMeter, Result, Row, log, write_result
from .kubeenv import watch_forever
from .pods import Env, pod_cluster, tritonmodel

NAMESPACE = "bench-rollout"
MODEL = "add-sub"
REPLICAS = 3
INIT_SECONDS = 1
#: What the issue allows in place per replica on top of Triton's own reload (load + warm-up).
OVERHEAD_SECONDS = 1.0
#: (key, title, spec.rollout, new maxQueueDelayMicroseconds): the example's delay is 2000.
PHASES = (
    ("swap", "in place, Swap", {"strategy": "InPlace", "mode": "Swap"}, 500),
    ("drain", "in place, Drain", {"strategy": "InPlace", "mode": "Drain", "maxUnavailable": 1}, 700),
    ("new_pods", "new pods", {"strategy": "NewPods"}, 900),
)
POLL = 0.1


class EndpointWatch:
    """Watches the Service's EndpointSlices; keeps every distinct set of ready pods with the time it was seen.

    An endpoint counts as ready as kube-proxy reads it: `conditions.ready` true or unset."""

    def __init__(self, kube: Kube, namespace: str, service: str) -> None:
        self.kube, self.namespace, self.service = Kube(kube.kubeconfig), namespace, service
        self.slices: dict[str, frozenset[str]] = {}
        self.history: list[tuple[float, frozenset[str]]] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> EndpointWatch:
        listed = self.kube.list("EndpointSlice", self.namespace)
        now = time.time()
        for s in listed.get("items") or ():
            self._on_event("ADDED", s, now)
        self._thread = threading.Thread(target=watch_forever, daemon=True, args=(
            self.kube, "EndpointSlice", self.namespace, self._on_event, self._stop.is_set,
            listed["metadata"]["resourceVersion"]))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _on_event(self, typ: str, eps: dict[str, Any], t: float) -> None:
        if (eps["metadata"].get("labels") or {}).get("kubernetes.io/service-name") != self.service:
            return
        name = eps["metadata"]["name"]
        with self.lock:
            if typ == "DELETED":
                self.slices.pop(name, None)
            else:
                self.slices[name] = frozenset(
                    (ep.get("targetRef") or {}).get("name") or ",".join(ep.get("addresses") or ())
                    for ep in eps.get("endpoints") or () if (ep.get("conditions") or {}).get("ready", True))
            ready = frozenset().union(*self.slices.values())
            if not self.history or self.history[-1][1] != ready:
                self.history.append((t, ready))

    def ready_now(self) -> frozenset[str]:
        with self.lock:
            return self.history[-1][1] if self.history else frozenset()

    def _segments(self, start: float, end: float) -> list[tuple[float, float, frozenset[str]]]:
        """(from, to, ready pods) covering [start, end]."""
        with self.lock:
            hist = list(self.history)
        state: frozenset[str] = frozenset()
        for t, ready in hist:
            if t <= start:
                state = ready
        out, at = [], start
        for t, ready in hist:
            if start < t < end:
                out.append((at, t, state))
                at, state = t, ready
        out.append((at, end, state))
        return out

    def out_seconds(self, pod: str, start: float, end: float) -> float:
        return sum(b - a for a, b, ready in self._segments(start, end) if pod not in ready)

    def ready_counts(self, start: float, end: float) -> tuple[int, int]:
        counts = [len(ready) for _, _, ready in self._segments(start, end)]
        return min(counts), max(counts)

    def changes(self, start: float, end: float) -> list[str]:
        """Every change in [start, end] as "+<seconds since start>s left|joined <pod>"."""
        out = []
        segs = self._segments(start, end)
        for (_, _, before), (at, _, after) in zip(segs, segs[1:], strict=False):
            out += [f"+{at - start:.2f}s left {p}" for p in sorted(before - after)]
            out += [f"+{at - start:.2f}s joined {p}" for p in sorted(after - before)]
        return out


@dataclass
class Phase:
    key: str
    title: str
    rollout: dict[str, Any]
    delay_us: int
    old_digest: str = ""
    new_digest: str = ""
    old_pods: dict[str, str] = field(default_factory=dict)  # name -> uid at the patch
    new_pods: dict[str, str] = field(default_factory=dict)  # name -> uid at the end
    digest_seconds: float = 0.0  # patch -> status.configDigest changed
    done_seconds: float = 0.0  # patch -> the phase's end condition
    endpoints_seconds: float = 0.0  # patch -> every current pod among the ready endpoints
    out_seconds: dict[str, float] = field(default_factory=dict)  # old pod -> time out of the ready endpoints
    ready_min_max: tuple[int, int] = (0, 0)
    endpoint_changes: list[str] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)
    reloads: list[dict[str, Any]] = field(default_factory=list)  # from the operator's log

    @property
    def sent(self) -> int:
        return int(self.load.get("sent", 0))

    @property
    def failed(self) -> int:
        return int(self.load.get("failed", 0))

    def triton_seconds(self) -> list[float]:
        return [r["triton_seconds"] for r in self.reloads]

    def budget(self) -> float:
        """The issue's allowance in place: N x (Triton's own reload + warm-up) + 1 s per replica."""
        return sum(self.triton_seconds()) + OVERHEAD_SECONDS * REPLICAS


def _quietly(check: Callable[[], Any]) -> Callable[[], Any]:
    """A probe for wait_for that counts any error (a pod going away, a Triton not up yet) as "not yet"."""
    def probe() -> Any:
        try:
            return check()
        except Exception:  # noqa: BLE001 - polled again
            return False
    return probe


def _names(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def run_phase(env: Env, ew: EndpointWatch, ph: Phase) -> None:
    kube, ns = env.kube, env.namespace
    tm = kube.get("TritonModel", MODEL, ns)
    ph.old_digest = tm["status"]["configDigest"]
    ph.old_pods = _names(live_pods(kube, ns, MODEL))
    assert len(ph.old_pods) == REPLICAS and len(ew.ready_now()) == REPLICAS, (ph.old_pods, ew.ready_now())
    with ServiceLoad(kube.kubeconfig, ns, MODEL, via="endpoints") as load:
        wait_for("the load to be answered", lambda: load.tally().sent - load.tally().failed > 50, 30)
        before: Tally = load.tally()
        t0, m0 = time.time(), time.monotonic()
        kube.patch("TritonModel", MODEL, {"spec": {"rollout": ph.rollout,
                                                   "batcher": {"maxQueueDelayMicroseconds": ph.delay_us}}},
                   ns, type="merge")
        tm = wait_model(kube, ns, MODEL, lambda tm: tm["status"].get("configDigest") not in (None, ph.old_digest),
                        "a new status.configDigest", 30, 0.05)
        ph.digest_seconds = time.time() - t0
        ph.new_digest = new = tm["status"]["configDigest"]
        old_uids = set(ph.old_pods.values())

        def done() -> bool:
            if ph.key == "new_pods":
                pods = model_pods(kube, ns, MODEL)  # terminating ones too: the old ones must be gone
                if len(pods) != REPLICAS or old_uids & {p["metadata"]["uid"] for p in pods}:
                    return False
            return serving(kube, ns, new, REPLICAS)

        wait_for(f"{ph.title}: every replica serving {new}", _quietly(done), 300, POLL)
        ph.done_seconds = time.time() - t0
        wait_for(f"{ph.title}: every replica among the ready endpoints", _quietly(
            lambda: ew.ready_now() == set(_names(live_pods(kube, ns, MODEL)))), 120, 0.02)
        t_end, m_end = time.time(), time.monotonic()
        ph.endpoints_seconds = t_end - t0
        tally = load.stop() - before
        ph.load = {"sent": tally.sent, "failed": tally.failed, "seconds": round(tally.seconds, 2),
                   "by_address": tally.by_address, "failure_samples": list(load.samples),
                   "ready_history": load.ready_history, "refresh_errors": load.refresh_errors,
                   # per second from the patch, for the picture (bench/plots.py): answered, failed, latency
                   "series": load.series(m0, m_end)}
    ph.new_pods = _names(live_pods(kube, ns, MODEL))
    if ph.key != "new_pods" and ph.new_pods != ph.old_pods:
        raise RuntimeError(f"{ph.title}: pods were replaced (before {ph.old_pods}, after {ph.new_pods}): "
                           "the in-place figures are invalid")
    ph.out_seconds = {p: round(ew.out_seconds(p, t0, t_end), 3) for p in ph.old_pods}
    ph.ready_min_max = ew.ready_counts(t0, t_end)
    ph.endpoint_changes = ew.changes(t0, t_end)
    log(f"{ph.title}: done in {ph.done_seconds:.1f}s (all in the endpoints at {ph.endpoints_seconds:.1f}s); "
        f"out of the endpoints {sorted(ph.out_seconds.values())}; {tally.summary()}")
    try:  # settled before the next phase (not timed; the next phase checks its own start)
        wait_model(kube, ns, MODEL, lambda tm: is_model_ready(tm) and tm["status"].get("warmedReplicas") == REPLICAS
                   and model_condition(tm, "Progressing").get("reason") == "RolloutComplete", "settled", 60)
    except TimeoutError as e:
        log(f"{ph.title}: {e}")


RELOADING = re.compile(r"Reloading replica pod=(\S+) .*?digest=(\S+) mode=(\S+)")
DRAINED = re.compile(r"Drained replica pod=(\S+) drained=(\S+) seconds=([\d.]+)")
RELOADED = re.compile(r"Reloaded replica pod=(\S+) digest=(\S+) mode=(\S+) seconds=([\d.]+)")


def reloads_from_log(text: str) -> list[dict[str, Any]]:
    """Every successful reload in the operator's log: pod, digest, mode, seconds (from the reloader's start, with
    any drain), drain seconds, and Triton's own part (unload + load + warm-up) = seconds - drain seconds."""
    drained: dict[str, tuple[bool, float]] = {}
    out = []
    for line in text.splitlines():
        if m := RELOADING.search(line):
            drained.pop(m.group(1), None)
        elif m := DRAINED.search(line):
            drained[m.group(1)] = (m.group(2) == "True", float(m.group(3)))
        elif m := RELOADED.search(line):
            pod, digest, mode, seconds = m.group(1), m.group(2), m.group(3), float(m.group(4))
            ok, drain = drained.pop(pod, (None, 0.0))
            out.append({"pod": pod.split("/")[-1], "digest": digest, "mode": mode, "seconds": seconds,
                        "drained": ok, "drain_seconds": drain, "triton_seconds": round(seconds - drain, 2)})
    return out


def run(replicas: int = REPLICAS) -> Path:
    assert replicas == REPLICAS, "the figures and the target are for 3 replicas"
    started, meter = time.monotonic(), CpuMeter()
    phases = [Phase(*p) for p in PHASES]
    with pod_cluster(NAMESPACE) as env:
        kube, ns = env.kube, env.namespace
        kube.create(tritonmodel(reloadable(REPLICAS, init_seconds=INIT_SECONDS), MODEL, ns, REPLICAS))
        wait_model(kube, ns, MODEL, lambda tm: is_model_ready(tm) and tm["status"].get("warmedReplicas") == REPLICAS,
                   f"Ready with {REPLICAS} warmed replicas", 300, 0.5)
        with EndpointWatch(kube, ns, MODEL) as ew:
            wait_for(f"{REPLICAS} ready endpoints", lambda: len(ew.ready_now()) == REPLICAS, 60, 0.1)
            for ph in phases:
                log(f"Phase {ph.title}: spec.rollout {ph.rollout}, maxQueueDelayMicroseconds {ph.delay_us}")
                run_phase(env, ew, ph)
        reloads = reloads_from_log(env.operator.log_path.read_text(errors="replace"))
    for ph in phases:
        ph.reloads = [r for r in reloads if r["digest"] == ph.new_digest]
    return write_result(_result(phases), started, meter)


def _s(x: float) -> str:
    return f"{x:.1f} s"


def _result(phases: list[Phase]) -> Result:
    swap, drain, new = phases
    result = Result(
        name="rollout",
        title="Config change on 3 replicas: in place vs new pods",
        method=(
            "Our own cluster (control plane, one node with containerd + kubelet, the operator as a host process). "
            f"{REPLICAS} replicas of the reloadable add-sub of e2e/inplace.py (initialize sleeps "
            f"initSeconds={INIT_SECONDS}; the example's modelWarmup runs on every load). Three phases in one run, "
            "each patching only spec.batcher.maxQueueDelayMicroseconds (another value each time) together with "
            "spec.rollout: in place with mode Swap (the default), in place with mode Drain (maxUnavailable 1), "
            "then strategy NewPods (the Deployment rolls: maxSurge 1, maxUnavailable 0). Done = every pod's "
            "config-digest annotation is status.configDigest with no reload/previous annotation, gate True and "
            "Triton reporting the new digest (polled every 100 ms); in place the pod UIDs must be unchanged, with "
            f"new pods exactly {REPLICAS} pods must exist and the old ones be gone. Client load throughout each "
            "phase: e2e.load.ServiceLoad, 4 threads x 40 requests/s, a new HTTP connection each; the bench "
            "cluster has no kube-proxy, so each request goes to a ready endpoint picked from the Service's "
            "EndpointSlices (re-read every 100 ms), as kube-proxy would route it. A watch on the EndpointSlices "
            "gives each replica's time out of the ready endpoints. Triton's own reload time comes from the "
            "operator's log (Reloaded replica ... seconds, minus Drained replica ... seconds in Drain)."
        ),
    )

    def outs(ph: Phase) -> str:
        return ", ".join(_s(x) for x in sorted(ph.out_seconds.values()))

    def reloads(ph: Phase) -> str:
        if not ph.reloads:
            return "- (none logged)"
        txt = ", ".join(_s(x) for x in sorted(ph.triton_seconds()))
        drains = [r["drain_seconds"] for r in ph.reloads if r["mode"] == "Drain"]
        return txt + (f" (after draining {', '.join(_s(x) for x in sorted(drains))})" if drains else "")

    def within(ph: Phase) -> bool:
        return bool(ph.reloads) and ph.done_seconds <= ph.budget()

    half = new.done_seconds / 2
    result.rows = [
        Row("time to complete (patch -> every replica serving the new config, gate True)",
            f"Swap {_s(swap.done_seconds)}; Drain {_s(drain.done_seconds)}", _s(new.done_seconds)),
        Row("patch -> every replica among the ready endpoints again",
            f"Swap {_s(swap.endpoints_seconds)}; Drain {_s(drain.endpoints_seconds)}", _s(new.endpoints_seconds)),
        Row("time out of the ready endpoints, per replica",
            f"Swap {outs(swap)}; Drain {outs(drain)}",
            f"{outs(new)} (each old replica from leaving to the end"
            + ("; a new pod had joined first)" if new.ready_min_max[0] >= REPLICAS else ")")),
        Row("ready endpoints during the change (fewest-most)",
            f"Swap {swap.ready_min_max[0]}-{swap.ready_min_max[1]}; Drain {drain.ready_min_max[0]}-{drain.ready_min_max[1]}",
            f"{new.ready_min_max[0]}-{new.ready_min_max[1]}"),
        Row("requests failed / sent under load",
            f"Swap {swap.failed} / {swap.sent}; Drain {drain.failed} / {drain.sent}", f"{new.failed} / {new.sent}"),
        Row("pods created", f"Swap {len(set(swap.new_pods.values()) - set(swap.old_pods.values()))}; "
            f"Drain {len(set(drain.new_pods.values()) - set(drain.old_pods.values()))} (pod UIDs unchanged)",
            str(len(set(new.new_pods.values()) - set(new.old_pods.values())))),
        Row("Triton's own reload (unload/load + warm-up) per replica, from the operator's log",
            f"Swap {reloads(swap)}; Drain {reloads(drain)}", "- (new Triton processes)"),
        Row(f"in place <= N x (Triton's own reload + warm-up) + {OVERHEAD_SECONDS:.0f} s per replica",
            f"Swap {_s(swap.done_seconds)} of {_s(swap.budget())} allowed; "
            f"Drain {_s(drain.done_seconds)} of {_s(drain.budget())} allowed ({'within' if within(drain) else 'over'})",
            "-", "Swap (the default) within", within(swap)),
        Row("in place < half the new-pods time",
            f"Swap {_s(swap.done_seconds)}; Drain {_s(drain.done_seconds)} "
            f"({'under' if drain.done_seconds < half else 'over'} half)",
            f"half of {_s(new.done_seconds)} = {_s(half)}", "Swap (the default) under half",
            swap.done_seconds < half),
    ]
    result.notes.append(
        "The load dials pod IPs from the EndpointSlices (the bench cluster has no kube-proxy), picking a ready "
        "endpoint at random per request and re-reading the slices every 100 ms, as kube-proxy would; a request "
        "that reaches a replica which has just left the endpoints is a failure only if that replica no longer "
        "answers correctly.")
    result.notes.append(
        "'met' judges Swap, the default mode. Drain takes each replica out of the Service first and waits until it "
        "has had no request for a second (plus the EndpointSlice round trip) before Triton unloads and loads, so "
        "its time includes that drain; the budget counts Triton's own part only.")
    result.notes.append(
        f"Time to complete is polled every {POLL * 1000:.0f} ms (each poll asks every replica's Triton for its "
        "loaded config), so it is late by up to about that much; the operator logs reload seconds to 0.1 s. "
        "With new pods, each old replica counts as out of the endpoints from when it left until the phase ended "
        "(it never comes back)"
        + ("; the Deployment's surge pod had joined before each old one left, so the Service kept its capacity."
           if new.ready_min_max[0] >= REPLICAS else
           f"; the Service had as few as {new.ready_min_max[0]} ready endpoints meanwhile."))
    failures = {ph.title: ph.load.get("failure_samples") for ph in phases if ph.failed}
    if failures:
        result.notes.append(f"Failed-request samples: {failures}")
    result.data = {"replicas": REPLICAS, "init_seconds": INIT_SECONDS, "overhead_seconds": OVERHEAD_SECONDS,
                   "phases": {ph.key: {**ph.__dict__, "budget_seconds": round(ph.budget(), 2)} for ph in phases}}
    return result
