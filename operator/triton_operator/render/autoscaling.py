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
    """A Kubernetes quantity for `value`, in thousandths (the HPA compares milli-values)."""
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


@dataclass(frozen=True)
class HpaMetric:
    name: str
    target_type: str  # autoscaling/v2 MetricTarget type: Value or AverageValue
    value: str


def hpa_metric(target: AutoscalingTarget) -> HpaMetric:
    """The HPA's Object metric for a target. A mean (queue time, in flight per replica) is compared as a Value
    (desired = ready replicas x measured / target); the model's total rate as an AverageValue (total / target)."""
    if target.queue_time_milliseconds is not None:
        return HpaMetric(QUEUE_TIME, "Value", quantity(target.queue_time_milliseconds))
    if target.inflight_requests is not None:
        return HpaMetric(INFLIGHT, "Value", quantity(target.inflight_requests))
    if target.inferences_per_second is not None:
        return HpaMetric(RATE, "AverageValue", quantity(target.inferences_per_second))
    raise ValueError("spec.autoscaling.target: set exactly one of queueTimeMilliseconds, inflightRequests or "
                     "inferencesPerSecond")
