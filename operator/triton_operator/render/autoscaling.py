"""The names of the metrics the operator serves for autoscaling, and the HPA metric a target renders to: of a model
with its own replicas, of a pooled model (its copies on a pool), and of a pool."""

from __future__ import annotations

from dataclasses import dataclass

from ..api.v1alpha1 import AutoscalingTarget

QUEUE_TIME = "triton_queue_time_ms"
INFLIGHT = "triton_inflight_requests"
RATE = "triton_inferences_per_second"
#: A model's queue time times its copies measured, and its requests in flight in all (the per-replica mean times the
#: copies): what a pooled model's HPA compares, as an AverageValue, with its target times its copies. A pooled model
#: has no pods of its own, and the HPA counts a Value target's replicas by pods (see `pooled_hpa_metric`).
COPIES_QUEUE_TIME = "triton_copies_queue_time_ms"
COPIES_INFLIGHT = "triton_copies_inflight_requests"
#: The metrics served for TritonModels' pods (custom.metrics.k8s.io), each replica's own.
METRICS = (QUEUE_TIME, INFLIGHT, RATE)
#: The metrics served for TritonModels.
MODEL_METRICS = (*METRICS, COPIES_QUEUE_TIME, COPIES_INFLIGHT)
#: A TritonPool's one metric: the memory its models demand, placed or not (bytes; `plan.autoscaling.pool_demand`).
POOL_DEMAND = "triton_pool_demand_bytes"
POOL_METRICS = (POOL_DEMAND,)


def quantity(value: float) -> str:
    """`value` to the thousandth (the HPA compares milli-values) as the API server writes a quantity back: the
    largest SI suffix that keeps the number whole (2000 is `2k`, 12.5 is `12500m`). The same text, so that a
    re-applied HPA equals the one stored."""
    n, suffixes = round(value * 1000), ("m", "", "k", "M", "G", "T", "P", "E")
    if n == 0:
        return "0"
    i = 0
    while n % 1000 == 0 and i < len(suffixes) - 1:
        n, i = n // 1000, i + 1
    return f"{n}{suffixes[i]}"


@dataclass(frozen=True)
class HpaMetric:
    name: str
    target_type: str  # autoscaling/v2 MetricTarget type: Value or AverageValue
    value: str


#: Each target (its field in spec.autoscaling.target): the metric it names and how the HPA compares it. A mean (queue
#: time, in flight per replica) is a Value (desired = ready replicas x measured / target); the model's total rate
#: an AverageValue (total / target).
_TARGETS = {
    "queueTimeMilliseconds": (QUEUE_TIME, "Value"),
    "inflightRequests": (INFLIGHT, "Value"),
    "inferencesPerSecond": (RATE, "AverageValue"),
}


#: A pooled model's targets, all AverageValues of the model's totals. For a Value, the HPA multiplies the ratio by
#: the ready pods its scale's selector finds, and a pooled model's selects none (the pool's replicas are shared, and
#: its own HPA's); for an AverageValue it divides the total by the scale's status.replicas, the copies placed:
#: desired = ceil(total / target), the same figure as a Value's with every placed copy measured.
_POOLED_TARGETS = {
    "queueTimeMilliseconds": COPIES_QUEUE_TIME,
    "inflightRequests": COPIES_INFLIGHT,
    "inferencesPerSecond": RATE,
}


def _given(target: AutoscalingTarget) -> tuple[str, float]:
    given = target.given()
    if len(given) != 1:
        raise ValueError("spec.autoscaling.target: set exactly one of queueTimeMilliseconds, inflightRequests or "
                         "inferencesPerSecond")
    ((field, value),) = given.items()
    return field, value


def hpa_metric(target: AutoscalingTarget) -> HpaMetric:
    """The HPA's Object metric for a target (see `_TARGETS`)."""
    field, value = _given(target)
    name, target_type = _TARGETS[field]
    return HpaMetric(name, target_type, quantity(value))


def pooled_hpa_metric(target: AutoscalingTarget) -> HpaMetric:
    """A pooled model's HPA metric for a target (see `_POOLED_TARGETS`)."""
    field, value = _given(target)
    return HpaMetric(_POOLED_TARGETS[field], "AverageValue", quantity(value))


def pool_hpa_metric(target_bytes: int) -> HpaMetric:
    """A pool's HPA metric: its demand, kept at `target_bytes` per replica (`PoolAutoscaling.target_bytes`)."""
    return HpaMetric(POOL_DEMAND, "AverageValue", quantity(target_bytes))
