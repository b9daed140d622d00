"""What an operator upgrade does to the models of a namespace, sampled from LISTs: which Deployments roll at once,
which models wait and why (their Progressing reason), pods Pending for want of room, container restarts and new pods.
bench/upgrade.py measures an upgrade with it, and `make demo-upgrade` (e2e/demo.py `--upgrade`) prints its changes.

Everything but `Sampler`'s thread is pure, and the thread reads through a callable it is given (no API client here),
so the unit tier tests it all (tests/test_upgrade_sampler.py). A Deployment rolls from the moment its spec changed
until its rollout is finished as `kubectl rollout status` judges it (`plan.upgrade.rollout_finished`); its pods are
grouped by the model (or pool) label the operator gives them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from triton_operator.api.kinds import LABEL_MODEL, LABEL_POOL
from triton_operator.plan.upgrade import rollout_finished

Obj = Mapping[str, Any]
#: What one sample reads: the Deployments, the Pods and the TritonModels (or TritonPools) to watch.
Read = Callable[[], tuple[list[Obj], list[Obj], list[Obj]]]


def unschedulable(pod: Obj) -> bool:
    """Pending because the scheduler found no node with room for it (PodScheduled False, reason Unschedulable)."""
    status = pod.get("status") or {}
    return status.get("phase") == "Pending" and any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or ())


def owner(pod: Obj) -> str:
    """The model (or pool) a pod serves, from the operator's labels; else the pod's own name."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(LABEL_MODEL) or labels.get(LABEL_POOL) or (pod.get("metadata") or {}).get("name", "?"))


def progressing(obj: Obj) -> str:
    """The reason of an object's Progressing condition ("" without one)."""
    return next((str(c.get("reason") or "") for c in (obj.get("status") or {}).get("conditions") or ()
                 if c.get("type") == "Progressing"), "")


@dataclass(frozen=True)
class Snapshot:
    """One sample."""

    at: float  # seconds since the sampler started
    rolling: frozenset[str]  # Deployments whose rollout is not finished
    reasons: Mapping[str, str]  # object name -> its Progressing reason
    pending: frozenset[str]  # pods Pending as Unschedulable
    restarts: Mapping[str, int]  # "<pod>/<container>" -> restartCount
    pods: Mapping[str, frozenset[str]]  # owner -> uids of its pods (terminating ones included)
    images: Mapping[str, frozenset[str]]  # Deployment -> the images of its pod template's containers


def snapshot(at: float, deployments: Iterable[Obj], pods: Iterable[Obj], objects: Iterable[Obj]) -> Snapshot:
    deployments, pods = list(deployments), list(pods)
    uids: dict[str, set[str]] = {}
    for p in pods:
        uids.setdefault(owner(p), set()).add(str(p["metadata"].get("uid", p["metadata"].get("name"))))
    return Snapshot(
        at=at,
        # A Deployment of 0 replicas (an ensemble's step, served by its ensembles) replaces no pod: its new template
        # is seen "not finished" for the moment its controller takes to observe it, and it counted as rolling beside
        # the bound (the demo's summary said 3 at a bound of 2: add-sub and two such steps).
        rolling=frozenset(d["metadata"]["name"] for d in deployments
                          if not rollout_finished(d) and (d.get("spec") or {}).get("replicas", 1) != 0),
        reasons={o["metadata"]["name"]: progressing(o) for o in objects},
        pending=frozenset(p["metadata"]["name"] for p in pods if unschedulable(p)),
        restarts={f"{p['metadata']['name']}/{c['name']}": int(c.get("restartCount") or 0)
                  for p in pods for c in (p.get("status") or {}).get("containerStatuses") or ()},
        pods={k: frozenset(v) for k, v in uids.items()},
        images={d["metadata"]["name"]: frozenset(c.get("image", "") for c in
                                                 d["spec"]["template"]["spec"].get("containers") or ())
                for d in deployments},
    )


@dataclass
class Record:
    """Snapshots folded into what an upgrade did, from the first one (the state before it) on."""

    samples: int = 0
    max_rolling: int = 0
    most: list[str] = field(default_factory=list)  # the Deployments rolling in the first sample at the most
    over: list[str] = field(default_factory=list)  # samples above `bound`, as "+<s>s [names]"
    reasons: dict[str, set[str]] = field(default_factory=dict)  # object -> every Progressing reason seen
    pending: set[str] = field(default_factory=set)  # pods seen Pending as Unschedulable
    restarts: dict[str, int] = field(default_factory=dict)  # "<pod>/<container>" -> restarts since the first sample
    new_pods: dict[str, set[str]] = field(default_factory=dict)  # owner -> uids not in the first sample
    #: (seconds, rolling, waiting for a slot, pending) at every sample where one of the three changed
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    #: Deployment -> [first sample it was seen rolling, first sample it was seen finished again] (seconds)
    spans: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    bound: int = 0  # 0: none
    waiting_reason: str = ""  # the Progressing reason counted as "waiting" in the timeline
    first: Snapshot | None = None

    def add(self, s: Snapshot) -> None:
        if self.first is None:
            self.first = s
        first = self.first
        self.samples += 1
        if len(s.rolling) > self.max_rolling:
            self.max_rolling, self.most = len(s.rolling), sorted(s.rolling)
        if self.bound and len(s.rolling) > self.bound:
            self.over.append(f"+{s.at:.1f}s {sorted(s.rolling)}")
        for name, reason in s.reasons.items():
            if reason:
                self.reasons.setdefault(name, set()).add(reason)
        self.pending |= s.pending
        for name in s.rolling:
            self.spans.setdefault(name, [round(s.at, 2)])
        for name, span in self.spans.items():
            if len(span) == 1 and name not in s.rolling:
                span.append(round(s.at, 2))
        for key, count in s.restarts.items():
            if count > first.restarts.get(key, 0):
                self.restarts[key] = count - first.restarts.get(key, 0)
        for name, uids in s.pods.items():
            if new := uids - first.pods.get(name, frozenset()):
                self.new_pods.setdefault(name, set()).update(new)
        point = (len(s.rolling), sum(r == self.waiting_reason for r in s.reasons.values()) if self.waiting_reason
                 else 0, len(s.pending))
        if not self.timeline or self.timeline[-1][1:] != point:
            self.timeline.append((round(s.at, 2), *point))

    def waited(self, reason: str) -> list[str]:
        """The objects seen with this Progressing reason."""
        return sorted(name for name, seen in self.reasons.items() if reason in seen)


def changes(before: Snapshot | None, now: Snapshot) -> list[str]:
    """What changed between two samples, one line each, as `make demo-upgrade` prints them: a Deployment that starts
    or finishes rolling (with its template's new image), an object whose Progressing reason changes, a pod
    Pending for want of room, and a container that restarted."""
    if before is None:
        return [f"{name} rolling" for name in sorted(now.rolling)]
    out = []
    for name in sorted(now.rolling - before.rolling):
        new = sorted(now.images.get(name, frozenset()) - before.images.get(name, frozenset()))
        out.append(f"{name} rolling" + (f" (new pod template: {', '.join(new)})" if new else ""))
    out += [f"{name} rolled out" for name in sorted(before.rolling - now.rolling)]
    for name, reason in sorted(now.reasons.items()):
        if before.reasons.get(name, "") != reason:
            out.append(f"{name} Progressing reason={reason or '-'}")
    out += [f"pod {name} Pending: no node has room (Unschedulable)" for name in sorted(now.pending - before.pending)]
    out += [f"container {key} restarted ({count})" for key, count in sorted(now.restarts.items())
            if count > before.restarts.get(key, 0)]
    return out


class Sampler:
    """Samples `read()` every `period` seconds on a thread into a `Record` (and calls `on_change` with the lines of
    `changes` when there are any) until `stop()`. A failed read is one sample lost, kept in `record.errors`."""

    def __init__(self, read: Read, *, bound: int = 0, waiting_reason: str = "", period: float = 0.2,
                 on_change: Callable[[float, list[str]], None] | None = None) -> None:
        self.read, self.period, self.on_change = read, period, on_change
        self.record = Record(bound=bound, waiting_reason=waiting_reason)
        self.last: Snapshot | None = None
        #: time.monotonic() at start(): a Snapshot's `at` counts from it
        self.started = time.monotonic()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="upgrade-sampler", daemon=True)

    def sample(self) -> Snapshot:
        s = snapshot(time.monotonic() - self.started, *self.read())
        self.record.add(s)
        if self.on_change is not None and (lines := changes(self.last, s)):
            self.on_change(s.at, lines)
        self.last = s
        return s

    def start(self) -> Sampler:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> Record:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(15)
        return self.record

    def _loop(self) -> None:
        while not self._halt.is_set():
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 - a transient API error is one sample lost, reported at the end
                self.record.errors.append(repr(exc)[:200])
            self._halt.wait(self.period)  # the sampling period, not a wait for a condition
