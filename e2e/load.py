"""Client load through a Service: `ServiceLoad`.

By default (`via="cluster-ip"`) every request goes to the Service's ClusterIP on a new TCP connection,
and kube-proxy on this machine picks the replica, exactly as for a client in the cluster. For tests
that need per-replica figures, `via="endpoints"` does kube-proxy's job in the client instead: the
ready endpoints of the Service's EndpointSlices (an endpoint whose `conditions.ready` is unset counts
as ready, as kube-proxy reads it; terminating endpoints are not ready), one picked at random per
request. Either way one thread follows the Service's EndpointSlices as kube-proxy does, with a LIST and then a WATCH
from its resourceVersion (each watch ends after `refresh` seconds, default 1, and the next resumes where it stopped; a
410 Gone lists again), and records every distinct ready set, and several threads send add-sub inferences (or, with
`kind="sentiment"`, the sentiment ensemble's) over HTTP (`/v2/models/<m>/infer`, JSON) continuously, each at most `rate` per second.

Every request sent is counted, and so is every failure: a refused or reset connection, a
timeout, a non-200 answer, a wrong result, or no ready endpoint at all (what kube-proxy would
answer with a reject). Nothing is retried. The first few failures are kept as samples.
`tally()` is a snapshot of the counters; subtract two to get one phase of a test. `series()` bins answers,
failures and latency per second, for the benchmarks' pictures.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import socket
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.kube import ApiError, Kube, wait_for
from e2e.testing import proxied_addresses
from triton_operator.api.timestamps import rfc3339

SAMPLES = 10


@dataclass(frozen=True)
class Tally:
    """Counters of a load at one moment (or, subtracted, over a phase)."""

    sent: int = 0
    failed: int = 0
    by_address: dict[str, int] = field(default_factory=dict)  # successful requests per endpoint address
    seconds: float = 0.0

    def __sub__(self, other: Tally) -> Tally:
        return Tally(
            self.sent - other.sent, self.failed - other.failed,
            {a: n - other.by_address.get(a, 0) for a, n in self.by_address.items()
             if n - other.by_address.get(a, 0)},
            self.seconds - other.seconds,
        )

    def summary(self) -> str:
        rate = self.sent / self.seconds if self.seconds else 0.0
        return (f"{self.sent} sent, {self.failed} failed in {self.seconds:.1f}s ({rate:.0f}/s), "
                f"to {len(self.by_address)} address(es)")


class ServiceLoad:
    """Threads sending add-sub inferences to a Service's ready endpoints until `stop()`; use as a context manager."""

    def __init__(self, kubeconfig: Path, namespace: str, service: str, model: str = "add-sub", *,
                 threads: int = 4, rate: float = 40.0, refresh: float = 1.0, port: str = "http",
                 timeout: float = 10.0, via: str = "cluster-ip", kind: str = "add-sub") -> None:
        if via not in ("cluster-ip", "endpoints"):
            raise ValueError(f"via: cluster-ip or endpoints, not {via!r}")
        if kind not in ("add-sub", "sentiment"):
            raise ValueError(f"kind: add-sub or sentiment, not {kind!r}")
        self.kind = kind
        self.kube = Kube(kubeconfig, timeout=5)
        self.via = via
        self._cluster_ip: tuple[str, int] | None = None
        self.namespace, self.service, self.model, self.port = namespace, service, model, port
        self.threads, self.rate, self.refresh, self.timeout = threads, rate, refresh, timeout
        self._ready: tuple[tuple[str, int], ...] = ()
        self._slices: dict[str, dict[str, Any]] = {}  # the Service's EndpointSlices by name, as the last LIST and WATCH left them
        self._version: str | None = None  # the resourceVersion the refresher's first watch starts from
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._workers: list[threading.Thread] = []
        self._sent = self._failed = 0
        self._by_address: Counter[str] = Counter()
        self._answered_at: dict[str, list[float]] = {}  # address -> wall-clock times of its correct answers
        self._started = 0.0
        self.started_at = ""
        self.samples: list[str] = []
        self.refreshes = 0
        self.refresh_errors: list[str] = []
        self.ready_sets: list[tuple[str, ...]] = []  # every distinct ready set seen, in order
        self.ready_history: list[str] = []  # the same, each as "+<seconds since start>s [addresses]"
        self._states: list[str] = []
        #: every change of the Service's endpoints (pod names and conditions included), "+<seconds>s [...]"
        self.endpoint_history: list[str] = []
        #: (monotonic start, seconds) of every correct answer: the benches' latency percentiles
        self.latencies: list[tuple[float, float]] = []
        #: monotonic start of every failed request
        self.failed_at: list[float] = []

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> ServiceLoad:
        if self.via == "cluster-ip":
            svc = self.kube.get("Service", self.service, self.namespace)["spec"]
            port = next(p["port"] for p in svc["ports"] if p.get("name") == self.port)
            self._cluster_ip = (svc["clusterIP"], int(port))
        self._version = self._refresh_once()
        if self.via == "cluster-ip" and self._ready:
            self._wait_proxied()
        self._started = time.monotonic()
        self.started_at = rfc3339()  # "+<seconds>" in the samples counts from here
        refresher = threading.Thread(target=self._refresh_loop, name="load-endpoints", daemon=True)
        self._workers = [refresher] + [
            threading.Thread(target=self._send_loop, args=(i,), name=f"load-{i}", daemon=True)
            for i in range(self.threads)]
        for t in self._workers:
            t.start()
        return self

    def _wait_proxied(self) -> None:
        """Until kube-proxy sends the ClusterIP to every endpoint the slices call ready (when kube-proxy runs in this
        network namespace): a load started before it has synced would count its refusals as the operator's."""
        def synced() -> bool:
            proxied = proxied_addresses(self.namespace, self.service, self.port)
            if proxied is not None and not {a for a, _ in self._ready} <= proxied:
                self._version = self._refresh_once()
                return False
            return True
        wait_for(f"kube-proxy sending {self.namespace}/{self.service}:{self.port} to its ready endpoints", synced, 60)

    def stop(self) -> Tally:
        self._halt.set()
        for t in self._workers:
            t.join(self.timeout + 5)
        stuck = [t.name for t in self._workers if t.is_alive()]
        assert not stuck, f"load threads did not stop: {stuck}"
        return self.tally()

    def __enter__(self) -> ServiceLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self._halt.set()  # a test that failed midway: stop sending, let the threads end on their own

    def tally(self) -> Tally:
        with self._lock:
            return Tally(self._sent, self._failed, dict(self._by_address), time.monotonic() - self._started)

    def answered_between(self, address: str, start: float, end: float) -> int:
        """Correct answers from `address` that came between two wall-clock (time.time()) moments."""
        with self._lock:
            return sum(start < t < end for t in self._answered_at.get(address, ()))

    def series(self, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        """Per `step` seconds from `start` to `end` (monotonic), by when each request was sent: `t` (seconds after
        `start`), requests answered and failed, and the answers' p50 and p95 latency in ms (None with no answer)."""
        n = max(0, math.ceil((end - start) / step))
        bins: list[list[float]] = [[] for _ in range(n)]
        failed = [0] * n
        with self._lock:
            answered, failures = list(self.latencies), list(self.failed_at)
        for began, seconds in answered:
            if start <= began < end:
                bins[min(int((began - start) / step), n - 1)].append(seconds * 1000)
        for began in failures:
            if start <= began < end:
                failed[min(int((began - start) / step), n - 1)] += 1

        def pct(xs: list[float], q: float) -> float | None:
            if not xs:
                return None
            xs = sorted(xs)
            k = (len(xs) - 1) * q / 100
            lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
            return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 2)

        return [{"t": round(i * step, 3), "answered": len(b), "failed": f, "p50_ms": pct(b, 50), "p95_ms": pct(b, 95)}
                for i, (b, f) in enumerate(zip(bins, failed, strict=True))]

    # -- endpoints, as kube-proxy reads them ----------------------------------------------------

    def _refresh_once(self) -> str:
        """LISTs the Service's EndpointSlices; returns the list's resourceVersion, where a watch goes on from."""
        listed = self.kube.list("EndpointSlice", self.namespace,
                                label_selector={"kubernetes.io/service-name": self.service})
        self._slices = {s["metadata"]["name"]: s for s in listed["items"]}
        self._update()
        return str(listed["metadata"]["resourceVersion"])

    def _update(self) -> None:
        """The ready set and every endpoint's state from the slices held, recorded when they changed."""
        ready: list[tuple[str, int]] = []
        states: list[str] = []  # every endpoint, ready or not: "<address> <pod> ready|serving|terminating"
        for s in self._slices.values():
            port = next((p.get("port") for p in s.get("ports") or () if p.get("name") == self.port), None)
            if port is None:
                continue
            for ep in s.get("endpoints") or ():
                cond = ep.get("conditions") or {}
                if cond.get("ready", True):
                    ready += [(a, int(port)) for a in ep.get("addresses") or ()]
                flags = [k for k in ("ready", "serving", "terminating") if cond.get(k, k != "terminating")]
                pod = (ep.get("targetRef") or {}).get("name", "?")
                states += [f"{a} {pod} {'/'.join(flags) or 'not-ready'}" for a in ep.get("addresses") or ()]
        ready.sort()
        states.sort()
        with self._lock:
            if states != self._states:
                self._states = states
                at = time.monotonic() - self._started if self._started else 0.0
                self.endpoint_history.append(f"+{at:.2f}s {states}")
            if tuple(a for a, _ in ready) != (self.ready_sets[-1] if self.ready_sets else None):
                self.ready_sets.append(tuple(a for a, _ in ready))
                at = time.monotonic() - self._started if self._started else 0.0
                self.ready_history.append(f"+{at:.2f}s {list(self.ready_sets[-1])}")
            self._ready = tuple(ready)
            self.refreshes += 1

    def _refresh_loop(self) -> None:
        """WATCHes the slices from the last resourceVersion seen (a bookmark moves it too) until halted; each watch ends
        after `refresh` seconds (the halt is seen then) and the next resumes there. A watch that fails, or a 410 Gone
        (the version compacted away), LISTs again; until then the last good set stays in use, as kube-proxy keeps its
        rules."""
        version: str | None = self._version
        while not self._halt.is_set():
            try:
                if version is None:
                    version = self._refresh_once()
                for event in self.kube.watch("EndpointSlice", self.namespace, resource_version=version,
                                             timeout_seconds=max(1, round(self.refresh)),
                                             label_selector={"kubernetes.io/service-name": self.service}):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        raise ApiError(int(obj.get("code") or 0), str(obj.get("message")), "WATCH", "EndpointSlice")
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event.get("type") == "BOOKMARK":
                        continue
                    name = obj["metadata"]["name"]
                    if event.get("type") == "DELETED":
                        self._slices.pop(name, None)
                    else:
                        self._slices[name] = obj
                    self._update()
                    if self._halt.is_set():
                        break
            except Exception as e:  # noqa: BLE001 - the last good set stays in use, as kube-proxy keeps its rules
                version = None
                if len(self.refresh_errors) < SAMPLES and not (isinstance(e, ApiError) and e.status == 410):
                    self.refresh_errors.append(repr(e))
                self._halt.wait(0.1)

    # -- requests -------------------------------------------------------------------------------

    def _send_loop(self, index: int) -> None:
        rng = random.Random(index)
        period = 1.0 / self.rate if self.rate > 0 else 0.0
        next_at = time.monotonic()
        n = 0
        while not self._halt.is_set():
            n += 1
            a = [float(index), float(n % 1000), 1.0, -2.5]
            b = [10.0, 20.0, float(index * 7), 0.5]
            with self._lock:
                endpoints = self._ready
            target = self._cluster_ip or (rng.choice(endpoints) if endpoints else None)
            began = time.monotonic()
            error = self._infer(target, a, b) if target else f"no ready endpoint in Service {self.service}'s EndpointSlices"
            with self._lock:
                if not error:
                    self.latencies.append((began, time.monotonic() - began))
                self._sent += 1
                if error:
                    self._failed += 1
                    self.failed_at.append(began)
                    if len(self.samples) < SAMPLES:
                        where = f"{target[0]}:{target[1]}" if target else "-"
                        self.samples.append(f"+{time.monotonic() - self._started:.2f}s {where}: {error}")
                else:
                    assert target is not None
                    self._by_address[target[0]] += 1
                    self._answered_at.setdefault(target[0], []).append(time.time())
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                self._halt.wait(delay)  # pacing to `rate`, not waiting for any state
            else:
                next_at = time.monotonic()

    @staticmethod
    def _backend_of(target: tuple[str, int], sport: int) -> str:
        """Where kube-proxy's DNAT sent one connection, from the kernel's conntrack table (a failed connection's
        entry outlives the failure by minutes): " (DNAT to <pod ip>:<port>, <tcp state>)", or "" if unknown."""
        if not sport:
            return ""
        try:
            out = subprocess.run(
                ["conntrack", "-L", "-p", "tcp", "--orig-dst", target[0], "--orig-port-dst", str(target[1]),
                 "--orig-port-src", str(sport)], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
        for line in out.splitlines():
            fields = line.split()
            # tcp 6 <ttl> <STATE> src=.. dst=<clusterip> sport=.. dport=.. src=<pod ip> dst=.. sport=<pod port> ...
            replies = [f.split("=", 1)[1] for f in fields if f.startswith("src=")]
            ports = [f.split("=", 1)[1] for f in fields if f.startswith("sport=")]
            if len(replies) >= 2 and len(ports) >= 2:
                return f" (DNAT to {replies[1]}:{ports[1]}, {fields[3]})"
        return ""

    def _infer(self, target: tuple[str, int], a: list[float], b: list[float]) -> str:
        """One request on a new connection; returns "" on a correct answer, else what went wrong."""
        if self.kind == "sentiment":
            body = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                                           "data": [f"a good film, number {int(a[1])}"]}],
                               "outputs": [{"name": "LABEL"}]})
        else:
            body = json.dumps({"inputs": [
                {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": a},
                {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": b},
            ], "outputs": [{"name": "OUTPUT0"}]})
        conn = http.client.HTTPConnection(target[0], target[1], timeout=self.timeout)
        sport = 0
        try:
            # The socket is bound before it connects, so a connect that times out still has a source port
            # to find its conntrack entry (where kube-proxy's DNAT sent the SYN) by.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.sock = sock
            sock.settimeout(self.timeout)
            sock.bind(("", 0))
            sport = sock.getsockname()[1]
            sock.connect(target)
            conn.request("POST", f"/v2/models/{self.model}/infer", body,
                         {"Content-Type": "application/json", "Connection": "close"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            where = self._backend_of(target, sport) if self._cluster_ip else ""
            return f"{type(e).__name__}: {e}{where}"
        finally:
            conn.close()
        if resp.status != 200:
            return f"HTTP {resp.status}: {data[:200].decode(errors='replace')}"
        if self.kind == "sentiment":
            try:
                label = next(o for o in json.loads(data)["outputs"] if o["name"] == "LABEL")["data"]
            except (ValueError, KeyError, StopIteration) as e:
                return f"unreadable answer ({e!r}): {data[:200].decode(errors='replace')}"
            return "" if label == ["positive"] else f"wrong answer {label}, expected ['positive']"
        try:
            out: Any = next(o for o in json.loads(data)["outputs"] if o["name"] == "OUTPUT0")["data"]
        except (ValueError, KeyError, StopIteration) as e:
            return f"unreadable answer ({e!r}): {data[:200].decode(errors='replace')}"
        expected = [x + y for x, y in zip(a, b, strict=True)]
        if [round(float(v), 3) for v in out] != [round(v, 3) for v in expected]:
            return f"wrong answer {out}, expected {expected}"
        return ""
