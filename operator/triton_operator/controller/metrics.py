"""Prometheus metrics of the reconcile, the gate, reloads and heals (prometheus-client), served by
`triton-operator run --metrics-port` with those of `platform.metrics` and `servers.metrics`."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("triton_operator_reconciles_total", "TritonModel reconciles", ["result"])
RECONCILE_ERRORS = Counter("triton_operator_reconcile_errors_total", "TritonModel reconciles that failed", ["reason"])
RECONCILE_SECONDS = Histogram(
    "triton_operator_reconcile_duration_seconds", "Time of one TritonModel reconcile",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
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
RELOADS = Counter(
    "triton_operator_reloads_total", "In-place reloads of a replica's config through Triton's repository API",
    ["mode", "result"],
)
HEALS = Counter(
    "triton_operator_heals_total",
    "Replicas healed after they stopped serving: action reload (unload and load the broken models) or delete (the pod)",
    ["action", "result"],
)
POOL_ROUNDS = Counter("triton_operator_pool_rounds_total", "TritonPool reconcile rounds", ["result"])
POOL_ROUND_SECONDS = Histogram(
    "triton_operator_pool_round_duration_seconds", "Time of one TritonPool round (its loads included)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
POOL_LOADS = Counter(
    "triton_operator_pool_loads_total", "Loads of a model into a pool replica, and unloads", ["verb", "result"],
)
POOL_LOAD_SECONDS = Histogram(
    "triton_operator_pool_load_duration_seconds", "Time of one load of a model into a pool replica (warm-up included)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
UPGRADE_ROLLOUTS = Gauge(
    "triton_operator_upgrade_rollouts",
    "Model Deployments in an unfinished upgrade rollout, as of the last decision (the count --max-upgrade-rollouts bounds)",
)
UPGRADE_WAITING = Gauge(
    "triton_operator_upgrade_rollouts_waiting", "TritonModels whose upgrade rollout waits for a slot",
)
UPGRADE_STARTS = Counter("triton_operator_upgrade_rollouts_started_total", "Upgrade rollouts started")
