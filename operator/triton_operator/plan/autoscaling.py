"""Autoscaling on Triton's own statistics, pure: the metrics, computed over a sliding window of samples.

Triton's statistics extension gives cumulative counters per model (requests completed, the nanoseconds
they spent queued and in all). A replica's metric over a window is the difference between the newest
sample and the oldest one inside the window. The model's value combines every warmed replica's:

- `triton_queue_time_ms`: mean queue time per request, milliseconds (all requests of all replicas);
- `triton_inflight_requests`: requests in flight or pending per replica, on average over the window:
  the time requests spent in Triton per second of window (Little's law), averaged over the replicas;
- `triton_inferences_per_second`: requests completed per second, the model's total;
- `triton_copies_queue_time_ms`, `triton_copies_inflight_requests`: the first two times the replicas measured (a
  pooled model's HPA divides them by its copies: `render.autoscaling.pooled_hpa_metric`).

A pooled model's replicas are the pool replicas where a copy of it serves; a pool's own metric is the memory its
models demand (`pool_demand`), from its status.

A replica restarted (or its model reloaded) starts its counters again: only its samples since then count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.v1alpha1 import quantity_bytes
from ..render.autoscaling import COPIES_INFLIGHT, COPIES_QUEUE_TIME, INFLIGHT, QUEUE_TIME, RATE

#: The window the model's metrics are computed over (seconds), as the HPA reads them.
WINDOW_SECONDS = 30.0


@dataclass(frozen=True)
class Counters:
    """One replica's cumulative statistics for one model (every version summed), as Triton reports them."""

    requests: int = 0  # requests completed, successfully or not
    request_ns: int = 0  # their total time in Triton: queue, compute and response
    queued: int = 0  # requests that went through the queue
    queue_ns: int = 0  # their total time queued

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.requests - other.requests, self.request_ns - other.request_ns,
                        self.queued - other.queued, self.queue_ns - other.queue_ns)

    def __add__(self, other: Counters) -> Counters:
        return Counters(self.requests + other.requests, self.request_ns + other.request_ns,
                        self.queued + other.queued, self.queue_ns + other.queue_ns)

    @property
    def restarted_since(self) -> bool:
        """True for a difference where a counter went down: the replica started counting again in between."""
        return min(self.requests, self.request_ns, self.queued, self.queue_ns) < 0


@dataclass(frozen=True)
class Sample:
    at: float  # seconds (monotonic)
    counters: Counters


@dataclass(frozen=True)
class Delta:
    seconds: float
    counters: Counters


def delta(samples: Sequence[Sample], now: float, window: float = WINDOW_SECONDS) -> Delta | None:
    """What one replica did in the window ending at `now`: from the newest sample at or before its start (else the
    oldest) to the newest, counting only since the last restart of its counters. None below two samples."""
    usable: list[Sample] = []
    for s in samples:
        if usable and (s.counters - usable[-1].counters).restarted_since:
            usable = []
        usable.append(s)
    usable = usable[_start(usable, now, window):]
    if len(usable) < 2 or usable[-1].at <= usable[0].at:
        return None
    return Delta(usable[-1].at - usable[0].at, usable[-1].counters - usable[0].counters)


def trim(samples: list[Sample], now: float, window: float = WINDOW_SECONDS) -> list[Sample]:
    """The samples `delta` can still use: those inside the window and the newest one at or before its start."""
    return samples[_start(samples, now, window):]


def _start(samples: Sequence[Sample], now: float, window: float) -> int:
    """Where a window starts in `samples`: at the newest sample at or before `now - window` (so the window
    is covered end to end), else at the oldest."""
    return max((i for i, s in enumerate(samples) if s.at <= now - window), default=0)


def replica_metrics(d: Delta) -> dict[str, float]:
    """One replica's three metrics."""
    c = d.counters
    return {
        QUEUE_TIME: c.queue_ns / c.queued / 1e6 if c.queued else 0.0,
        INFLIGHT: c.request_ns / 1e9 / d.seconds,
        RATE: c.requests / d.seconds,
    }


def model_metrics(deltas: Iterable[Delta]) -> dict[str, float] | None:
    """The model's metrics over its warmed replicas' deltas; None without any."""
    ds = list(deltas)
    if not ds:
        return None
    total = sum((d.counters for d in ds), Counters())
    per = [replica_metrics(d) for d in ds]
    queue_time = total.queue_ns / total.queued / 1e6 if total.queued else 0.0
    inflight = sum(p[INFLIGHT] for p in per)
    return {
        QUEUE_TIME: queue_time,
        INFLIGHT: inflight / len(per),
        RATE: sum(p[RATE] for p in per),
        COPIES_QUEUE_TIME: queue_time * len(per),
        COPIES_INFLIGHT: inflight,
    }


def pool_demand(status: Mapping[str, Any], target_bytes: int) -> int | None:
    """The memory a pool's models demand (bytes), from its status: what is placed (`used`) and the copies that fit
    no replica (`unplaced`), and at least `target_bytes` (what the pool's HPA keeps per replica) for each copy of
    its model with the most (`mostCopies`: copies go on distinct replicas, so a model of 3 copies needs 3 replicas
    however small). None before the operator wrote the figures."""
    if status.get("used") is None:
        return None
    placed = quantity_bytes(str(status["used"])) + quantity_bytes(str(status.get("unplaced") or "0"))
    return max(placed, int(status.get("mostCopies") or 0) * target_bytes)
