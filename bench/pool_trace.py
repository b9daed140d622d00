"""`python -m bench.pool_trace run ...`: the operator (`triton-operator run ...`, the same arguments) with each phase of
a pool round timed in its log, for benchmark `pool_speed` (bench/pool_speed.py): where the operator's share of a
pooled model's time goes. The operator's code is not changed: its methods are wrapped, in this process only.

Each traced call writes one line when it ends, `Traced pool phase namespace=N pool=P round=R phase=X start=<epoch>
seconds=S` (bench/pool_speed_math.py reads them). The phases of a round (`PoolReconciler.reconcile`, phase `round`),
one after the other: `prime`, `apply_children`, `observe` (twice when something was loaded), `in_flight`,
`fetch_phase`, `plan` (`plan.pool.plan_pool`, twice), `publish` (twice), `drain`, `carry_out` (each replica's
unloads and loads, replicas at once), and beside them `deletion_costs`; inside those: `load` (the load request to
Triton until it answers), `served` (the question after it), `listed` (a copy's slices written as soon as it is
READY), `apply.<Kind>` (each apply the rounds send), `model_status`, `pool_status`; before a round, `queued` (from the
first request for the pool to the round's start: the work queue and the round before it); `members` and `round_of`
(the pure derivations at the round's start). What is in `round` and none of its phases is the rest of the round:
listing the pool's pods, and the event loop's other work meanwhile.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("triton_operator.pool.trace")
_ROUND: contextvars.ContextVar[tuple[str, str, int] | None] = contextvars.ContextVar("bench_pool_round", default=None)
_COUNTER = itertools.count(1)
_PENDING: dict[tuple[str, str], float] = {}


def _emit(where: tuple[str, str, int] | None, phase: str, start: float, seconds: float) -> None:
    ns, pool, rnd = where or ("-", "-", 0)
    log.info("Traced pool phase namespace=%s pool=%s round=%d phase=%s start=%.6f seconds=%.6f", ns, pool, rnd, phase,
             start, seconds)


def _async(phase: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        start, t0 = time.time(), time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            _emit(_ROUND.get(), phase if isinstance(phase, str) else phase(*args, **kwargs), start,
                  time.perf_counter() - t0)
    return wrapper


def _sync(phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start, t0 = time.time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _emit(_ROUND.get(), phase, start, time.perf_counter() - t0)
    return wrapper


def install() -> None:
    """Wraps the pool reconciler's phases (and the Triton calls and pure steps it makes through module attributes)."""
    from triton_operator.controller import pool as controller
    from triton_operator.plan import pool as plan
    from triton_operator.triton import pool as triton

    cls = controller.PoolReconciler
    reconcile = cls.reconcile

    @functools.wraps(reconcile)
    async def traced_reconcile(self: Any, namespace: str, name: str) -> Any:
        start, t0 = time.time(), time.perf_counter()
        queued = _PENDING.pop((namespace, name), None)
        where = (namespace, name, next(_COUNTER))
        if queued is not None:
            _emit(where, "queued", queued, max(0.0, start - queued))
        token = _ROUND.set(where)
        try:
            return await reconcile(self, namespace, name)
        finally:
            _emit(where, "round", start, time.perf_counter() - t0)
            _ROUND.reset(token)

    request = cls.request

    @functools.wraps(request)
    def traced_request(self: Any, namespace: str, name: str) -> None:
        _PENDING.setdefault((namespace, name), time.time())
        request(self, namespace, name)

    cls.reconcile = traced_reconcile  # type: ignore[method-assign]
    cls.request = traced_request  # type: ignore[method-assign]
    for method, phase in (("_prime", "prime"), ("_apply_children", "apply_children"), ("_observe", "observe"),
                          ("_in_flight", "in_flight"), ("_fetch_phase", "fetch_phase"), ("_publish", "publish"),
                          ("_drain", "drain"), ("_carry_out", "carry_out"), ("_listed", "listed"),
                          ("_deletion_costs", "deletion_costs"), ("_write_model_status", "model_status"),
                          ("_write_pool_status", "pool_status")):
        setattr(cls, method, _async(phase, getattr(cls, method)))
    apply = cls._apply

    @functools.wraps(apply)
    async def traced_apply(self: Any, obj: dict[str, Any]) -> None:
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        before = self._applied.get(key)
        start, t0 = time.time(), time.perf_counter()
        await apply(self, obj)
        if self._applied.get(key) is not before:  # sent: an apply the cache found unchanged sends nothing
            _emit(_ROUND.get(), f"apply.{obj['kind']}", start, time.perf_counter() - t0)

    cls._apply = traced_apply  # type: ignore[method-assign]
    triton.load = _async("load", triton.load)  # type: ignore[assignment]
    triton.served = _async("served", triton.served)  # type: ignore[assignment]
    plan.plan_pool = _sync("plan", plan.plan_pool)  # type: ignore[assignment]
    plan.members = _sync("members", plan.members)  # type: ignore[assignment]
    plan.round_of = _sync("round_of", plan.round_of)  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    install()
    from triton_operator.cli.main import main as operator_main

    return operator_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
