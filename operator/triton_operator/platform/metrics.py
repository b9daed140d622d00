"""Prometheus metrics of the operator's calls to the API server (prometheus-client): its writes, the Lease's apart."""

from __future__ import annotations

from prometheus_client import Counter

API_WRITES = Counter("triton_operator_api_writes_total", "Writes the operator sent to the API server (the leader Lease's "
                     "apart: triton_operator_lease_writes_total)", ["kind", "verb"])
LEASE_WRITES = Counter("triton_operator_lease_writes_total",
                       "Writes of the leader-election Lease that succeeded: taking it, renewing it every retry period, "
                       "releasing it", ["verb"])
