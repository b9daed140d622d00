"""Retrying a failed reconcile (issue 12, #9): back off, and tell the user what the API server refused.

A 403 or a 422 will not go away by itself: retried every 2 s forever it costs the API server and says
nothing to the user. The policy (`controller.errors.retry_after`) is pure; the worker that follows it is
run here on a virtual clock, so minutes of retries take milliseconds.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import urllib3
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError, ReadTimeoutError

from tests.virtual_clock import VirtualClockLoop
from triton_operator.controller.cache import Cache
from triton_operator.controller.reconcile import Reconciler
from triton_operator.platform.errors import ApiError


def _attempts(exc: BaseException, seconds: float, fail_first: int | None = None) -> list[float]:
    """Virtual times at which one model's reconcile ran within `seconds` while it raised `exc` (only the first
    `fail_first` times, if given)."""
    loop = VirtualClockLoop()
    times: list[float] = []

    async def failing(namespace: str, name: str) -> None:
        times.append(loop.time())
        if fail_first is None or len(times) <= fail_first:
            raise exc

    async def main() -> None:
        rec = Reconciler(kube=None, cache=Cache())  # type: ignore[arg-type]
        rec.reconcile = failing  # type: ignore[method-assign]
        rec.request("ns", "m")
        await asyncio.sleep(seconds)
        tasks = list(rec.queue.workers.values())
        for task in tasks:
            task.cancel()
        # Awaited, or the closed loop leaves them "cancelling": "Task was destroyed but it is pending!" is then
        # logged whenever the garbage collector gets to them, in whichever test runs then (tests/test_tls_server's
        # no-error-logged check failed on it).
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return times


def _forbidden() -> ApiError:
    return ApiError(status=403, reason="Forbidden", body=json.dumps(
        {"kind": "Status", "message": 'deployments.apps "m" is forbidden: User "x" cannot patch'}))


def test_a_persistent_refusal_is_retried_with_exponential_backoff_up_to_five_minutes() -> None:
    times = _attempts(_forbidden(), 3600)
    gaps = [round(b - a, 3) for a, b in zip(times, times[1:], strict=False)]
    assert gaps[:6] == [2, 4, 8, 16, 32, 64], gaps
    assert max(gaps) == 300 and gaps[-3:] == [300, 300, 300], gaps
    assert len(times) < 20, f"{len(times)} attempts in an hour"


def test_a_transient_failure_backs_off_too_but_is_retried_within_30_s() -> None:
    """An API server restarting (503, a refused connection) comes back: keep retrying often."""
    for exc in (ApiError(status=503, reason="Service Unavailable"), ConnectionRefusedError(111, "refused"),
                ApiError(status=429, reason="Too Many Requests")):
        times = _attempts(exc, 600)
        gaps = [round(b - a, 3) for a, b in zip(times, times[1:], strict=False)]
        assert gaps[:4] == [2, 4, 8, 16] and max(gaps) == 30, (exc, gaps)


def test_a_success_resets_the_backoff() -> None:
    times = _attempts(_forbidden(), 600, fail_first=5)
    assert len(times) == 6, times  # 5 failures, then one reconcile that succeeded and nothing more to do


# -- the policy, pure --------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "persistent"), [
    (400, True), (401, True), (403, True), (404, True), (405, True), (409, False), (410, True), (413, True),
    (415, True), (422, True), (408, False), (429, False), (500, False), (502, False), (503, False), (504, False),
])
def test_which_refusals_are_persistent(status: int, persistent: bool) -> None:
    from triton_operator.controller.errors import retry_after
    from triton_operator.platform.errors import ApiCallError

    err = ApiCallError("apply", "Deployment", "ns", "m", status, "Reason", "the API server's message")
    retry = retry_after(err, 1)
    assert retry.delay == 2.0
    assert (retry.failure is not None and retry.failure.persistent) == persistent


def test_the_failure_names_the_verb_the_kind_and_the_api_servers_message() -> None:
    from triton_operator.controller.errors import retry_after
    from triton_operator.platform.errors import ApiCallError

    err = ApiCallError("apply", "Deployment", "team-a", "add-sub", 422, "Unprocessable Entity",
                       'Deployment.apps "add-sub" is invalid: spec.template.spec.containers[0].resources.requests: '
                       'Invalid value: "2": must be less than or equal to cpu limit of 1')
    failure = retry_after(err, 3).failure
    assert failure is not None and failure.persistent
    assert failure.describe() == (
        'apply Deployment team-a/add-sub: 422 Unprocessable Entity: Deployment.apps "add-sub" is invalid: '
        'spec.template.spec.containers[0].resources.requests: Invalid value: "2": must be less than or equal to '
        'cpu limit of 1')


def test_a_plain_api_exception_is_classified_by_its_status_and_body() -> None:
    from triton_operator.controller.errors import retry_after

    failure = retry_after(_forbidden(), 1).failure
    assert failure is not None and failure.persistent and failure.status == 403
    assert "cannot patch" in failure.describe()


def _connection_errors() -> list[BaseException]:
    pool = urllib3.HTTPConnectionPool("127.0.0.1", 1)
    refused = NewConnectionError(pool, "Failed to establish a new connection: [Errno 111] Connection refused")  # type: ignore[arg-type]
    return [refused, MaxRetryError(pool, "/api", refused), ProtocolError("Connection aborted.", ConnectionResetError()),
            ReadTimeoutError(pool, "/api", "Read timed out. (read timeout=30)"), ApiError()]


@pytest.mark.parametrize("exc", _connection_errors(), ids=lambda e: type(e).__name__)
def test_no_answer_at_all_is_transient(exc: BaseException) -> None:
    """urllib3's connection errors (what the operator's client raises when the API server is away), and an ApiError
    without a status: retried within 30 s, no failure reported on the status."""
    from triton_operator.controller.errors import retry_after

    retry = retry_after(exc, 10)
    assert retry.failure is None and retry.delay == 30.0


def test_a_real_refused_connection_is_transient() -> None:
    """The operator's own client against a closed port: what it raises is retried as transient."""
    from triton_operator.controller.errors import retry_after
    from triton_operator.platform.kube import Kube
    from triton_operator.platform.kubeconfig import Credentials, CredentialSource

    class Closed(CredentialSource):
        def _current(self) -> Credentials:
            return Credentials(server="http://127.0.0.1:1")

        _reload = _current

    with pytest.raises(Exception) as raised:  # whatever urllib3 raises is the point
        Kube(Closed()).get("v1", "Pod", "ns", "p")
    assert retry_after(raised.value, 10).delay == 30.0, repr(raised.value)


def test_a_bug_is_no_api_failure_and_backs_off_like_a_persistent_one() -> None:
    from triton_operator.controller.errors import retry_after

    retry = retry_after(KeyError("spec"), 10)
    assert retry.failure is None and retry.delay == 300.0


def test_at_most_max_concurrent_reconciles_run_at_once_and_a_waiting_model_is_reconciled_once() -> None:
    """Bounded work in progress (issue 17: each reconcile holds its rendered plan while it waits for the API), and a
    model asked for again while it waits for a slot is reconciled once, not twice."""
    running: list[str] = []
    peak = 0
    done: list[str] = []

    async def slow(namespace: str, name: str) -> None:
        nonlocal peak
        running.append(name)
        peak = max(peak, len(running))
        await asyncio.sleep(1.0)
        running.remove(name)
        done.append(name)

    async def main() -> None:
        rec = Reconciler(kube=None, cache=Cache(), max_concurrent=2)  # type: ignore[arg-type]
        rec.reconcile = slow  # type: ignore[method-assign]
        for i in range(6):
            rec.request("ns", f"m{i}")
        await asyncio.sleep(0)
        rec.request("ns", "m5")  # waiting for a slot: served by the reconcile it is waiting for
        await asyncio.wait_for(asyncio.gather(*rec.queue.workers.values()), 10)

    loop = VirtualClockLoop()
    try:
        loop.run_until_complete(main())
        assert loop.time() == pytest.approx(3.0)  # 6 reconciles of 1 s, 2 at a time
    finally:
        loop.close()
    assert peak == 2
    assert sorted(done) == [f"m{i}" for i in range(6)]


def test_a_worker_keeps_nothing_of_the_handler_context_that_started_it_and_goes_when_done() -> None:
    """kopf calls handlers with context variables set (the cause, holding the watch event it decoded, the whole
    object). A reconcile worker started from a handler must neither see them nor keep them alive: at 1000 models
    the workers' copies held 21 MiB of events (issue 17). A worker that has no more requests leaves no task
    behind; a later request starts a new one."""
    import contextvars
    import gc
    import weakref

    cause: contextvars.ContextVar[object] = contextvars.ContextVar("cause")

    class Event:  # stands for kopf's WatchingCause: only its lifetime matters
        pass

    seen: list[object] = []

    async def reconcile(namespace: str, name: str) -> None:
        seen.append(cause.get(None))

    async def main() -> tuple[weakref.ref[Event], bool, int]:
        rec = Reconciler(kube=None, cache=Cache())  # type: ignore[arg-type]
        rec.reconcile = reconcile  # type: ignore[method-assign]
        event = Event()
        alive = weakref.ref(event)
        token = cause.set(event)
        rec.request("ns", "m")  # as kopf's handler does, with its cause in the context
        cause.reset(token)
        del event
        await asyncio.wait_for(asyncio.gather(*rec.queue.workers.values()), 10)
        idle = rec.queue.idle()
        rec.request("ns", "m")  # a later request: a new worker
        await asyncio.wait_for(asyncio.gather(*rec.queue.workers.values()), 10)
        return alive, idle, len(rec.queue.workers)

    alive, idle, after = asyncio.run(main())
    gc.collect()
    assert seen == [None, None], "a worker saw the handler's context variables"
    assert alive() is None, "the handler's context outlived the reconcile"
    assert (idle, after) == (True, 0)
