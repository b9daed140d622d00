"""`ServiceLoad.series` (e2e/load.py), without a cluster: the per-second answers, failures and latency that the
autoscale and rollout benchmarks record for their pictures. No marker: `make unit` runs it."""

from __future__ import annotations

import threading

from e2e.load import ServiceLoad


def test_service_load_series_bins_answers_failures_and_latency_by_send_time() -> None:
    load = ServiceLoad.__new__(ServiceLoad)  # no cluster: only the recorded answers and failures
    load._lock = threading.Lock()
    load.latencies = [(100.2, 0.010), (100.7, 0.030), (101.1, 0.020), (99.9, 5.0), (103.0, 1.0)]
    load.failed_at = [101.5, 101.6, 102.9]
    assert load.series(100.0, 102.5) == [
        {"t": 0.0, "answered": 2, "failed": 0, "p50_ms": 20.0, "p95_ms": 29.0},
        {"t": 1.0, "answered": 1, "failed": 2, "p50_ms": 20.0, "p95_ms": 20.0},
        {"t": 2.0, "answered": 0, "failed": 0, "p50_ms": None, "p95_ms": None},
    ]
