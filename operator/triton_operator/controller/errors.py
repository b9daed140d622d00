"""What a failed reconcile means: retry soon, back off, or tell the user. Pure.

An API server that is restarting (a 503, a refused connection, a timeout) comes back by itself: retry,
backing off from 2 s to 30 s. A refusal (a 403 of missing RBAC, a 422 of an object the API server finds
invalid, a namespace being deleted) will not: back off from 2 s to 5 minutes, as kopf's
`TemporaryError(delay=)` would be raised with a growing delay, and report it on the TritonModel's status
rather than only in the log: the reconcile hands the `ApiFailure` to the planner, whose `api_problem` makes it
`Degraded=True`, reason `ApiError`, naming the verb and the kind. Which statuses are refusals for good is
`ApiFailure.persistent` (`plan.planner`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..plan.planner import ApiFailure
from ..platform.errors import ApiCallError, ApiError

FIRST_DELAY = 2.0
TRANSIENT_CAP = 30.0
PERSISTENT_CAP = 300.0


@dataclass(frozen=True)
class Retry:
    delay: float
    failure: ApiFailure | None  # None: not an answer of the API server (a dropped connection, a bug)


def api_failure(exc: BaseException) -> ApiFailure | None:
    """The API server's answer in `exc`, if it is one."""
    if isinstance(exc, ApiCallError):
        target = f"{exc.namespace}/{exc.name}" if exc.namespace else exc.name or ""
        return ApiFailure(exc.verb, exc.kind, target, int(exc.status), exc.reason or "", exc.message)
    if isinstance(exc, ApiError) and exc.status:
        message = ""
        try:
            message = str((json.loads(exc.body) if exc.body else {}).get("message") or "")
        except (ValueError, TypeError, AttributeError):
            message = str(exc.body or "")[:300]
        return ApiFailure("", "", "", int(exc.status), exc.reason or "", message)
    return None


def retry_after(exc: BaseException, attempt: int) -> Retry:
    """When to try again after the `attempt`-th failure in a row (1 for the first), and what failed.

    Exponential from `FIRST_DELAY`: capped at `TRANSIENT_CAP` for what passes by itself (server errors, timeouts,
    throttling, lost connections), at `PERSISTENT_CAP` for refusals and for anything else (a bug will not fix
    itself either).
    """
    failure = api_failure(exc)
    transient = (failure is not None and not failure.persistent) or (
        failure is None and isinstance(exc, (OSError, TimeoutError, ConnectionError)))
    if failure is None and (_from_urllib3(exc) or isinstance(exc, ApiError)):  # status 0: no answer at all
        transient = True
    cap = TRANSIENT_CAP if transient else PERSISTENT_CAP
    return Retry(min(FIRST_DELAY * 2 ** min(max(attempt, 1) - 1, 16), cap), failure)


def _from_urllib3(exc: BaseException) -> bool:
    """urllib3's connection errors (MaxRetryError, ProtocolError, ...), without importing it here."""
    return type(exc).__module__.startswith("urllib3")
