"""Autoscaling on Triton's own statistics, pure: the metrics, computed over a sliding window of samples.

Triton's statistics extension gives cumulative counters per model (requests completed, the nanoseconds
they spent queued and in all). A replica's metric over a window is the difference between the newest
sample and the oldest one inside the window. The model's value combines every warmed replica's:

- `triton_queue_time_ms`: mean queue time per request, milliseconds (all requests of all replicas);
- `triton_inflight_requests`: requests in flight or pending per replica, on average over the window:
  the time requests spent in Triton per second of window (Little's law), averaged over the replicas;
- `triton_inferences_per_second`: requests completed per second, the model's total.

A replica restarted (or its model reloaded) starts its counters again: only its samples since then count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..render.autoscaling import INFLIGHT, QUEUE_TIME, RATE

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
    """The model's three metrics over its warmed replicas' deltas; None without any."""
    ds = list(deltas)
    if not ds:
        return None
    total = sum((d.counters for d in ds), Counters())
    per = [replica_metrics(d) for d in ds]
    return {
        QUEUE_TIME: total.queue_ns / total.queued / 1e6 if total.queued else 0.0,
        INFLIGHT: sum(p[INFLIGHT] for p in per) / len(per),
        RATE: sum(p[RATE] for p in per),
    }
