"""Benchmark `pool_routing`: requests that reach a pool replica whose model is not loaded there.

On our own cluster (control plane, one real node with containerd + kubelet, the operator as a host process): a
CPU TritonPool of REPLICAS replicas, and pooled add-sub models (e2e/pool.py's `pooled_add_sub`). Each model is
reached two ways at once, each with its own load (e2e.load.ServiceLoad, `via="endpoints"`: the bench cluster has no
kube-proxy, so each request goes to a ready endpoint of the Service's EndpointSlices, re-read every 100 ms, as
kube-proxy would route it):

- ours: the model's own Service, whose EndpointSlices the operator writes: a replica is listed for a model only once
  its Triton has that model READY at the desired config;
- without per-model gating: a Service that selects the pool's pods (`LABEL_POOL`), so the EndpointSlice controller
  lists every Ready pool pod for every model, as a plain Service in front of a shared Triton Deployment does.

Phases, one after the other, each under both loads:
1. place: `kubectl apply` of a new model with COPIES copies, until its status says every copy is warm (Ready
   AllCopiesWarmed for its generation), and SETTLE seconds more;
2. unload one copy: spec.replicas COPIES -> COPIES - 1, until the status shows one copy fewer, and SETTLE more;
3. move: the replica that holds the last copy is deleted (its pod), so the copy is placed on another replica, until
   the status is Ready AllCopiesWarmed again with a placement on a live pod, and SETTLE more.

A failed request is classified (`classify`): reached a replica that answered that it does not have the model
ready ("unknown model", "not ready", HTTP 400/404 with such a message), no ready endpoint at all (what kube-proxy
answers with a reject), or another error (a refused or reset connection: a replica going away).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad
from e2e.pool import model_ready, placement, pool_doc, pooled_add_sub, replica_pods
from triton_operator.api.pool import LABEL_POOL

from .common import CpuMeter, Result, Row, log, write_result
from .kubeenv import BenchCluster, pool_bench

NAMESPACE = "bench-pool-routing"
POOL = "shared"
REPLICAS = 3
COPIES = 2
MODEL = "placed"
THREADS, RATE = 2, 25.0  # per load: two loads at once on two shared cores
SETTLE = 10.0
NOT_LOADED = "not loaded"
NO_ENDPOINT = "no ready endpoint"
OTHER = "other"
KINDS = (NOT_LOADED, NO_ENDPOINT, OTHER)


def classify(error: str) -> str:
    """What a failed request met: a replica without the model ready, no ready endpoint, or something else."""
    low = error.lower()
    if low.startswith("no ready endpoint"):
        return NO_ENDPOINT
    if low.startswith("http 4") and any(s in low for s in ("unknown model", "not ready", "is not found",
                                                           "not found", "unavailable")):
        return NOT_LOADED
    return OTHER


class ClassifiedLoad(ServiceLoad):
    """ServiceLoad that also counts its failures by `classify`, with when each came (monotonic)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kinds: list[tuple[float, str]] = []
        self.kind_samples: dict[str, list[str]] = {}
        self._kinds_lock = threading.Lock()

    def _infer(self, target: tuple[str, int], a: list[float], b: list[float]) -> str:
        began = time.monotonic()  # the load's own `began` is taken a moment before this call
        error = super()._infer(target, a, b)
        if error:
            self._note(began, error)
        return error

    def _note(self, began: float, error: str) -> None:
        kind = classify(error)
        with self._kinds_lock:
            self.kinds.append((began, kind))
            samples = self.kind_samples.setdefault(kind, [])
            if len(samples) < 3:
                samples.append(error[:200])

    def counts(self, start: float, end: float) -> dict[str, int]:
        """Failures by kind among the requests sent between two monotonic moments (`failures_by_kind`)."""
        with self._kinds_lock:
            kinds = list(self.kinds)
        with self._lock:
            failed = list(self.failed_at)
        return failures_by_kind(kinds, failed, start, end)

    def sent_between(self, start: float, end: float) -> int:
        with self._lock:
            return sum(start <= t <= end for t, _ in self.latencies) + sum(start <= t <= end for t in self.failed_at)


def failures_by_kind(kinds: list[tuple[float, str]], failed_at: list[float], start: float, end: float) -> dict[str, int]:
    """Failures in [start, end] by kind: `kinds` the classified ones (those that reached `_infer`), `failed_at` every
    failed request; the rest (no endpoint to send to: the load never calls `_infer` then) count as NO_ENDPOINT."""
    inside = [k for t, k in kinds if start <= t <= end]
    out = Counter(inside)
    out[NO_ENDPOINT] += max(0, sum(start <= t <= end for t in failed_at) - len(inside))
    return {k: out.get(k, 0) for k in KINDS}


def readiness_service(name: str) -> dict[str, Any]:
    """A Service selecting every pod of the pool: its EndpointSlices follow pod readiness alone."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"selector": {LABEL_POOL: POOL},
                     "ports": [{"name": "http", "port": 8000, "targetPort": 8000, "protocol": "TCP"}]}}


@dataclass
class Phase:
    key: str
    title: str
    seconds: float = 0.0
    sent: dict[str, int] = field(default_factory=dict)
    failed: dict[str, dict[str, int]] = field(default_factory=dict)


def warm(kube: Kube, copies: int) -> Any:
    def probe() -> Any:
        tm = kube.get_or_none("TritonModel", MODEL, NAMESPACE)
        if not model_ready(tm):
            return None
        assert tm is not None
        c = next(c for c in tm["status"]["conditions"] if c["type"] == "Ready")
        live = {p["metadata"]["name"] for p in replica_pods(kube, NAMESPACE, POOL)}
        places = placement(tm)
        ok = c.get("reason") == "AllCopiesWarmed" and len(places) == copies and set(places) <= live
        return tm if ok else None
    return probe


def run_phases(kube: Kube, loads: dict[str, ClassifiedLoad]) -> list[Phase]:
    phases: list[Phase] = []

    def phase(key: str, title: str, act: Any, copies: int) -> None:
        ph = Phase(key, title)
        m0 = time.monotonic()
        act()
        wait_for(f"{title}: {MODEL} Ready AllCopiesWarmed with {copies} copies on live replicas",
                 warm(kube, copies), 300, 0.2)
        time.sleep(SETTLE)  # the loads keep counting for SETTLE seconds after the status says done
        m1 = time.monotonic()
        ph.seconds = round(m1 - m0, 2)
        for side, load in loads.items():
            ph.sent[side] = load.sent_between(m0, m1)
            ph.failed[side] = load.counts(m0, m1)
        log(f"Phase {title}: {ph.seconds:.1f}s; sent {ph.sent}; failed {ph.failed}")
        phases.append(ph)

    phase("place", f"place a new model ({COPIES} copies) on the {REPLICAS}-replica pool",
          lambda: kube.create({**pooled_add_sub(MODEL, POOL, copies=COPIES), "metadata": {
              "name": MODEL, "namespace": NAMESPACE}}), COPIES)
    phase("unload", f"unload one copy ({COPIES} -> {COPIES - 1})",
          lambda: kube.patch("TritonModel", MODEL, {"spec": {"replicas": COPIES - 1}}, NAMESPACE, type="merge"),
          COPIES - 1)

    def move() -> None:
        tm = kube.get("TritonModel", MODEL, NAMESPACE)
        kube.delete("Pod", placement(tm)[0], NAMESPACE)

    phase("move", "move: the replica holding the copy is deleted", move, COPIES - 1)
    return phases


def run() -> Path:
    started, meter = time.monotonic(), CpuMeter()
    cluster = BenchCluster()
    with pool_bench(cluster, NAMESPACE, "operator-pool-routing.log") as b:
        kube, kubeconfig = b.kube, b.kubeconfig
        kube.create({**pool_doc(POOL, REPLICAS, "1Gi"), "metadata": {"name": POOL, "namespace": NAMESPACE}})
        wait_for(f"{REPLICAS} pool replicas Ready", lambda: sum(
            any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or ())
            for p in replica_pods(kube, NAMESPACE, POOL)) == REPLICAS, 300, 0.5)
        baseline = f"{MODEL}-by-readiness"
        kube.create(readiness_service(baseline))
        loads = {"ours": ClassifiedLoad(kubeconfig, NAMESPACE, MODEL, MODEL, via="endpoints", threads=THREADS,
                                         rate=RATE),
                 "usual": ClassifiedLoad(kubeconfig, NAMESPACE, baseline, MODEL, via="endpoints", threads=THREADS,
                                          rate=RATE)}
        # Our Service does not exist until the model does: our load starts once it is there.
        loads["usual"].start()
        ours_started = threading.Event()

        def start_ours() -> None:
            wait_for(f"Service {MODEL}", lambda: kube.get_or_none("Service", MODEL, NAMESPACE), 120, 0.05)
            loads["ours"].start()
            ours_started.set()

        starter = threading.Thread(target=start_ours, daemon=True)
        starter.start()
        try:
            phases = run_phases(kube, loads)
        finally:
            for load in loads.values():
                load._halt.set()
        totals = {side: (load.tally().sent, load.tally().failed) for side, load in loads.items()}
        samples = {side: load.kind_samples for side, load in loads.items()}
    return write_result(result(phases, totals, samples), started, meter)


def _failed(ph: Phase, side: str, kind: str) -> str:
    return f"{ph.failed[side][kind]} of {ph.sent[side]}"


def result(phases: list[Phase], totals: dict[str, tuple[int, int]], samples: dict[str, Any]) -> Result:
    res = Result(
        name="pool_routing",
        title="Requests that reach a pool replica whose model is not loaded",
        method=(
            "Our own cluster (control plane, one real node: containerd + kubelet running real tritonserver pods, the "
            f"operator as a host process). A CPU TritonPool of {REPLICAS} replicas (e2e/pool.py's pool_doc, 1Gi per "
            "replica) and the pooled add-sub of e2e/pool.py. Two loads at once (e2e.load.ServiceLoad, "
            f"{THREADS} threads x {RATE:.0f} requests/s each; the bench cluster has no kube-proxy, so each request goes "
            "to a ready endpoint of the Service's EndpointSlices, re-read every 100 ms, as kube-proxy would route it): "
            "ours through the model's own Service, whose EndpointSlices the operator writes (a replica listed once "
            "its Triton has the model READY at the desired config); the usual approach without per-model gating through a Service that "
            f"selects the pool's pods ({LABEL_POOL}={POOL}), whose EndpointSlices follow pod readiness alone, as a "
            "plain Service in front of a shared Triton Deployment does. Phases: place a new model with "
            f"{COPIES} copies (kubectl apply), unload one copy (spec.replicas {COPIES} -> {COPIES - 1}), move the "
            "last copy (its replica's pod deleted); each until the model's status is Ready AllCopiesWarmed for its "
            f"generation with its copies on live replicas, plus {SETTLE:.0f} s. Failed requests are classified: "
            "reached a replica that answered it has no such model ready (HTTP 4xx, unknown model / not ready), no "
            "ready endpoint to send to (kube-proxy would reject), other (a refused or reset connection). Our load "
            "starts when the model's Service exists (a moment after the apply); the usual one before the apply."),
    )
    for ph in phases:
        res.rows.append(Row(f"{ph.title}: requests that reached a replica without the model ready",
                            _failed(ph, "ours", NOT_LOADED), _failed(ph, "usual", NOT_LOADED), "0",
                            ph.failed["ours"][NOT_LOADED] == 0))
        res.rows.append(Row(f"  {ph.key}: no ready endpoint / other failures",
                            f"{ph.failed['ours'][NO_ENDPOINT]} / {ph.failed['ours'][OTHER]}",
                            f"{ph.failed['usual'][NO_ENDPOINT]} / {ph.failed['usual'][OTHER]}"))
        res.rows.append(Row(f"  {ph.key}: phase length (action -> status done + {SETTLE:.0f} s)",
                            f"{ph.seconds:.1f} s", f"{ph.seconds:.1f} s"))
    res.rows.append(Row("all requests failed / sent", f"{totals['ours'][1]} / {totals['ours'][0]}",
                        f"{totals['usual'][1]} / {totals['usual'][0]}"))
    gaps = {ph.key: ph.failed["ours"][NO_ENDPOINT] for ph in phases if ph.failed["ours"][NO_ENDPOINT]}
    if gaps:
        res.notes.append(
            "Ours had no ready endpoint for some requests (" + ", ".join(f"{k}: {n}" for k, n in gaps.items())
            + "): while no replica has the model READY (before its first copy is loaded; in move, while its only "
            "copy is placed again after its replica's pod was deleted) the model's Service lists none, and "
            "kube-proxy rejects the request instead of sending it to a replica that answers it has no such model.")
    for side, kinds in samples.items():
        if kinds:
            res.notes.append(f"Failure samples ({side}): {kinds}")
    res.data = {"replicas": REPLICAS, "copies": COPIES, "settle_seconds": SETTLE,
                "phases": [ph.__dict__ for ph in phases], "totals": totals}
    return res
