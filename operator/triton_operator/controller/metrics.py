"""Prometheus metrics of the operator (prometheus-client), served by `triton-operator run --metrics-port`."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("triton_operator_reconciles_total", "TritonModel reconciles", ["result"])
RECONCILE_ERRORS = Counter("triton_operator_reconcile_errors_total", "TritonModel reconciles that failed", ["reason"])
RECONCILE_SECONDS = Histogram(
    "triton_operator_reconcile_duration_seconds", "Time of one TritonModel reconcile",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
API_WRITES = Counter("triton_operator_api_writes_total", "Writes the operator sent to the API server (the leader Lease's "
                     "apart: triton_operator_lease_writes_total)", ["kind", "verb"])
LEASE_WRITES = Counter("triton_operator_lease_writes_total",
                       "Writes of the leader-election Lease: taking it, renewing it every retry period, releasing it", ["verb"])
GATE_TRANSITIONS = Counter(
    "triton_operator_gate_transitions_total", "Readiness-gate condition changes", ["status", "reason"]
)
WARMUP_SECONDS = Histogram(
    "triton_operator_warmup_duration_seconds", "Time from tritonserver container start to the gate turning True",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)
READY_TO_GATE_SECONDS = Histogram(
    "triton_operator_ready_to_gate_seconds", "Time from Triton first reporting the model READY to the gate turning True",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
ADMISSIONS = Counter(
    "triton_operator_admission_reviews_total", "TritonModel admission reviews answered by the webhook", ["verdict"]
)
RELOADS = Counter(
    "triton_operator_reloads_total", "In-place reloads of a replica's config through Triton's repository API",
    ["mode", "result"],
)
TLS_REFUSED = Counter(
    "triton_operator_tls_connections_refused_total",
    "Connections to the webhook's TLS port refused at accept because the server had its maximum open",
)
WEBHOOK_MODELS = Gauge("triton_operator_webhook_models", "TritonModels in the webhook's own list+watch of them")
ADMISSION_READS = Counter(
    "triton_operator_admission_reads_total",
    "TritonModels the webhook read with a GET: its watch lacked them (missing), a refusal was being checked "
    "(refusal), an update's uid was not the one in its watch (uid)",
    ["why"],
)
HEALS = Counter(
    "triton_operator_heals_total",
    "Replicas healed after they stopped serving: action reload (unload and load the broken models) or delete (the pod)",
    ["action", "result"],
)
