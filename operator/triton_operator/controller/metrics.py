"""Prometheus metrics of the reconcile, the gate, reloads and heals (prometheus-client), served by
`triton-operator run --metrics-port` with those of `platform.metrics` and `servers.metrics`; and gauges of the
TritonModels and TritonPools as the leader's cache holds them (`observe_model`, `observe_pool`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from ..api.v1alpha1 import quantity_bytes

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
    "Replicas healed after they stopped serving: action reload (unload and load the broken models) or delete (the pod); "
    "action retry: the models of a replica that never served (failed to load) loaded again, with back-off",
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

# Every label set the operator counts under, at 0 from the start (Prometheus's "avoid missing metrics"): the chart's
# alerts take increase() of these, and a series whose first sample is already 1 shows no increase for that step, so
# an operator's first heal (of each action) after it started was never counted by TritonReplicaHealsRepeating.
for _action in ("reload", "delete", "retry"):
    for _result in ("ok", "failed"):
        HEALS.labels(action=_action, result=_result)
for _verb in ("load", "unload"):
    for _result in ("ok", "error"):
        POOL_LOADS.labels(verb=_verb, result=_result)
for _result in ("ok", "error"):
    POOL_ROUNDS.labels(result=_result)

# -- the objects, as the leader's cache holds them (kube-state-metrics' way: one series per object, gone with it) --
# Set by `Cache.put_model` and `PoolReconciler.put_pool` on every body the cache takes (a watch event, the answer to
# the operator's own write, a LIST) and removed when it drops one (a DELETED event, the resync's sweep), so a deleted
# object's series is gone at the next scrape. Only the leader has that cache: the other replicas serve none of these.
# The object's namespace is `object_namespace`, not `namespace`: the scrape's own `namespace` label (the operator's,
# a ServiceMonitor's target label) would rename it `exported_namespace`, or replace it under honor_labels.
OBJECT_LABELS = ("object_namespace", "tritonmodel")
MODEL_READY = Gauge(
    "triton_operator_model_ready",
    "TritonModels by their Ready condition: 1 True, 0 False, Unknown or not written yet (the leader's view)",
    list(OBJECT_LABELS),
)
MODEL_QUEUE_TARGET = Gauge(
    "triton_operator_model_queue_time_target_seconds",
    "spec.autoscaling.target.queueTimeMilliseconds of the TritonModels that autoscale on queue time, in seconds",
    list(OBJECT_LABELS),
)
POOL_UNPLACED = Gauge(
    "triton_operator_pool_unplaced_bytes",
    "TritonPools' status.unplaced: the memory of the model copies that fit no replica (0: every copy is placed)",
    ["object_namespace", "tritonpool"],
)


def model_ready(body: Mapping[str, Any]) -> float:
    """1.0 when the TritonModel's status says Ready True, else 0.0 (False, Unknown, or no status yet)."""
    conditions = (body.get("status") or {}).get("conditions") or ()
    ready = next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"), None)
    return 1.0 if ready is not None and ready.get("status") == "True" else 0.0


def queue_time_target_seconds(body: Mapping[str, Any]) -> float | None:
    """The model's autoscaling target on queue time, in seconds; None when it autoscales on another metric or not."""
    autoscaling = (body.get("spec") or {}).get("autoscaling") or {}
    target = autoscaling.get("target") or {} if isinstance(autoscaling, Mapping) else {}
    value = target.get("queueTimeMilliseconds") if isinstance(target, Mapping) else None
    return float(value) / 1000 if isinstance(value, int | float) and not isinstance(value, bool) else None


def unplaced_bytes(body: Mapping[str, Any]) -> float | None:
    """The pool's status.unplaced in bytes; None before the operator has written it (or when it is not a quantity)."""
    value = (body.get("status") or {}).get("unplaced")
    try:
        return float(quantity_bytes(str(value))) if value is not None else None
    except (ValueError, ArithmeticError):  # decimal.InvalidOperation is an ArithmeticError
        return None


def observe_model(body: Mapping[str, Any], deleted: bool = False) -> None:
    """The model's gauges from the body the cache took (removed when it dropped it)."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    target = None if deleted else queue_time_target_seconds(body)
    if deleted:
        MODEL_READY.remove(*key)
    else:
        MODEL_READY.labels(*key).set(model_ready(body))
    if target is None:
        MODEL_QUEUE_TARGET.remove(*key)
    else:
        MODEL_QUEUE_TARGET.labels(*key).set(target)


def observe_pool(body: Mapping[str, Any], deleted: bool = False) -> None:
    """The pool's gauge from the body the pool controller took (removed when it dropped it)."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    unplaced = None if deleted else unplaced_bytes(body)
    if unplaced is None:
        POOL_UNPLACED.remove(*key)
    else:
        POOL_UNPLACED.labels(*key).set(unplaced)


def forget_objects() -> None:
    """No object's series: a new cache starts empty (the operator started again in the same process)."""
    for gauge in (MODEL_READY, MODEL_QUEUE_TARGET, POOL_UNPLACED):
        gauge.clear()
