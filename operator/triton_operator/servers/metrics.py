"""Prometheus metrics of the servers on the TLS port (prometheus-client): admission reviews, the webhook's reads and
list+watch, connections refused."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

ADMISSIONS = Counter(
    "triton_operator_admission_reviews_total", "TritonModel admission reviews answered by the webhook", ["verdict"]
)
TLS_REFUSED = Counter(
    "triton_operator_tls_connections_refused_total",
    "Connections to the webhook's TLS port refused at accept because the server had its maximum open",
)
METRICS_REFUSED = Counter(
    "triton_operator_metrics_connections_refused_total",
    "Connections to the operator's Prometheus port refused at accept because it had its maximum open",
)
WEBHOOK_MODELS = Gauge("triton_operator_webhook_models", "TritonModels in the webhook's own list+watch of them")
ADMISSION_READS = Counter(
    "triton_operator_admission_reads_total",
    "TritonModels the webhook read with a GET: its watch lacked them (missing), a refusal was being checked "
    "(refusal), an update's uid was not the one in its watch (uid)",
    ["why"],
)
