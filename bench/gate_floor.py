"""`gate`'s floor: how soon the kubelet turns a pod Ready after its readiness gate's condition is patched True.

No operator and no Triton in the loop: one pod of the tritonserver image running `sleep` (no probes, so
its container is ready as soon as it runs) with a readiness gate of a test condition type; the bench
itself patches that condition True on `pods/status`, and watches for Ready. Between samples it patches
the condition False and waits for Ready to fall, then waits a random part of a second, so that the
patches do not all land at the same phase of the kubelet's 1 s relist. Run by bench.gate_latency on the
same node in the same run as READY -> pod Ready.
"""

from __future__ import annotations

import random
import threading
import time
from functools import partial
from typing import Any

from e2e.kube import Kube, wait_for

from .common import log, ms
from .kubeenv import BackgroundWatch

CONDITION = "bench.triton-operator.dev/floor"
NAME = "gate-floor"
SAMPLES = 12


def floor_pod(namespace: str, image: str, pull_policy: str | None = None, name: str = NAME) -> dict[str, Any]:
    """The pod: one container that only sleeps, no probes, and a readiness gate on CONDITION."""
    container: dict[str, Any] = {"name": "sleep", "image": image, "command": ["sleep", "infinity"]}
    if pull_policy:
        container["imagePullPolicy"] = pull_policy
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"containers": [container], "readinessGates": [{"conditionType": CONDITION}],
                 "terminationGracePeriodSeconds": 0},
    }


def condition_patch(status: bool, now: float) -> dict[str, Any]:
    """The strategic merge patch of pods/status that sets CONDITION (conditions merge by type)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {"status": {"conditions": [{"type": CONDITION, "status": "True" if status else "False",
                                       "lastTransitionTime": stamp}]}}


def pod_condition(pod: dict[str, Any], ctype: str) -> str | None:
    return next((c.get("status") for c in (pod.get("status") or {}).get("conditions") or ()
                 if c.get("type") == ctype), None)


class ReadyWatch(BackgroundWatch):
    """Every change of one pod's Ready condition, with the watch event's receive time."""

    kind = "Pod"

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        super().__init__(kube, namespace)
        self.name = name
        self.lock = threading.Lock()
        self.ready: str | None = None
        self.containers_ready: str | None = None
        self.changes: list[tuple[float, str]] = []

    def _on_event(self, typ: str, pod: dict[str, Any], t: float) -> None:
        if pod["metadata"]["name"] != self.name or typ == "DELETED":
            return
        ready = pod_condition(pod, "Ready")
        with self.lock:
            self.containers_ready = pod_condition(pod, "ContainersReady")
            if ready != self.ready:
                self.ready = ready
                self.changes.append((t, str(ready)))

    def ready_since(self, status: str, after: float) -> float | None:
        with self.lock:
            return next((t for t, s in self.changes if s == status and t >= after), None)


def measure(kube: Kube, namespace: str, image: str, pull_policy: str | None = None,
            samples: int = SAMPLES) -> list[dict[str, float]]:
    """`samples` times: the condition patched True (`patched_at`, before the request) -> Ready seen (`ready_at`)."""
    out: list[dict[str, float]] = []
    rng = random.Random(31)
    with ReadyWatch(kube, namespace, NAME) as watch:
        kube.create(floor_pod(namespace, image, pull_policy))
        wait_for("the floor pod's container ready", lambda: watch.containers_ready == "True", 180, 0.1)
        try:
            for i in range(samples):
                time.sleep(rng.uniform(0.0, 1.0))
                patched = time.time()
                kube.patch("Pod", NAME, condition_patch(True, patched), namespace, sub="status")
                ready = wait_for("the floor pod Ready", partial(watch.ready_since, "True", patched), 60, 0.01)
                out.append({"patched_at": patched, "ready_at": ready})
                log(f"Gate floor sample {i + 1}/{samples}: condition True -> pod Ready {ms(ready - patched)}")
                unset = time.time()
                kube.patch("Pod", NAME, condition_patch(False, unset), namespace, sub="status")
                wait_for("the floor pod not Ready", partial(watch.ready_since, "False", unset), 60, 0.01)
        finally:
            kube.delete("Pod", NAME, namespace)
    return out
