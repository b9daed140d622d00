"""Triton's statistics extension: one model's cumulative counters on one replica (for autoscaling)."""

from __future__ import annotations

from ..plan.autoscaling import Counters
from .rest import TritonClient


async def model_counters(address: str, model: str, timeout: float = 2.0) -> Counters:
    """The counters of `model` (every version summed) at the Triton whose HTTP endpoint is `address`.

    A request counts once it is done (success or failure): Triton's statistics show nothing of one in flight."""
    async with TritonClient(address) as client:
        stats = await client.statistics(model, timeout=timeout)
    total = Counters()
    for s in stats.model_stats:
        if s.name != model:
            continue
        i = s.inference_stats
        total += Counters(requests=i.success.count + i.fail.count, request_ns=i.success.ns + i.fail.ns,
                          queued=i.queue.count, queue_ns=i.queue.ns)
    return total
