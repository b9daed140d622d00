"""The names of the metrics the operator serves for autoscaling, and the HPA metric a target renders to."""

from __future__ import annotations

from dataclasses import dataclass

from ..api.v1alpha1 import AutoscalingTarget

QUEUE_TIME = "triton_queue_time_ms"
INFLIGHT = "triton_inflight_requests"
RATE = "triton_inferences_per_second"
#: Every metric served, for TritonModels and for their pods (custom.metrics.k8s.io).
METRICS = (QUEUE_TIME, INFLIGHT, RATE)


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


def hpa_metric(target: AutoscalingTarget) -> HpaMetric:
    """The HPA's Object metric for a target (see `_TARGETS`)."""
    given = target.given()
    if len(given) != 1:
        raise ValueError("spec.autoscaling.target: set exactly one of queueTimeMilliseconds, inflightRequests or "
                         "inferencesPerSecond")
    ((field, value),) = given.items()
    name, target_type = _TARGETS[field]
    return HpaMetric(name, target_type, quantity(value))
