"""The work queue both reconcilers run on: a TritonModel's (`controller.reconcile`) and a TritonPool's
(`controller.pool`). One implementation, as client-go's workqueue is one for every controller (issue 41: the pool
had its own copy of the model's).

- One worker per key, started by the first request and gone when no request is left (a later one starts another).
- A burst of requests is coalesced into one run: a request while a run is under way asks for one more run after it.
- At most `slots` runs at once across keys (none: no bound); a request that came while its run waited for a slot is
  served by that run. A back-off or a wait holds no slot.
- A run that raises is retried after `errors.retry_after`'s back-off (exponential from 2 s, capped at 30 s for what
  passes by itself, at 5 minutes for a refusal or a bug), and logged: an API server's answer named, anything else
  with its traceback. A run that succeeds resets the count.
- A run may return a number of seconds: run again then, or at the next request if sooner (a pool's round while it
  is not settled). None: only at the next request.

What cuts a back-off short differs by kind, and is the one thing each says (`version`): a TritonModel's back-off
ends early only when the model's version (uid, generation) changes, for its pods' events are many and say nothing
of a refused write; with no `version`, any request ends it (a pool's round is also how its models' and pods' events
are served). After a back-off or a wait, a key no longer `wanted` (a pool neither known nor named by a model) lets
its worker go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .errors import retry_after
from .tasks import detached

Key = tuple[str, str]  # (namespace, name)


class WorkQueue:
    def __init__(self, run: Callable[[str, str], Awaitable[float | None]], kind: str, log: logging.Logger, *,
                 slots: int | None = None, version: Callable[[str, str], object] | None = None,
                 wanted: Callable[[str, str], bool] | None = None) -> None:
        self._run = run
        self._kind = kind
        self._log = log
        self._slots: contextlib.AbstractAsyncContextManager[Any] = (
            contextlib.nullcontext() if slots is None else asyncio.Semaphore(slots))
        self._version = version
        self._wanted = wanted
        self._dirty: dict[Key, asyncio.Event] = {}
        self._workers: dict[Key, asyncio.Task[None]] = {}

    def request(self, namespace: str, name: str) -> None:
        """Asks for a run of (namespace, name): now if none is under way, else once more after it."""
        key = (namespace, name)
        ev = self._dirty.setdefault(key, asyncio.Event())
        ev.set()
        task = self._workers.get(key)
        if task is None or task.done():
            self._workers[key] = detached(self._worker(key), name=f"{self._kind}-{namespace}/{name}")

    @property
    def workers(self) -> Mapping[Key, asyncio.Task[None]]:
        """The workers running, by key."""
        return self._workers

    def idle(self) -> bool:
        """No worker runs and no request waits."""
        return not self._workers and not self._dirty

    async def _worker(self, key: Key) -> None:
        try:
            await self._work(key)
        finally:
            # No await between the worker's last look at its request and here, and `request` replaces only a
            # finished worker: the entries are this worker's. A later request starts a new one.
            self._workers.pop(key, None)
            self._dirty.pop(key, None)

    async def _work(self, key: Key) -> None:
        ev = self._dirty[key]
        failures = 0
        while ev.is_set():
            try:
                async with self._slots:  # not held through a back-off nor a wait
                    ev.clear()  # here: requests that came while waiting for a slot are served by this run
                    again = await self._run(*key)
                failures = 0
            except Exception as exc:  # noqa: BLE001 - retried after a back-off, and logged
                failures += 1
                retry = retry_after(exc, failures)
                if retry.failure is not None:
                    self._log.warning("Failed to reconcile %s namespace=%s name=%s error=%r retry=%.0fs attempt=%d",
                                      self._kind, *key, retry.failure.describe(), retry.delay, failures)
                else:
                    self._log.exception("Failed to reconcile %s namespace=%s name=%s retry=%.0fs attempt=%d",
                                        self._kind, *key, retry.delay, failures)
                await self._back_off(key, retry.delay)
            else:
                if again is None or ev.is_set():
                    continue
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ev.wait(), again)
            ev.set()
            if self._wanted is not None and not self._wanted(*key):
                return

    async def _back_off(self, key: Key, delay: float) -> None:
        """Waits `delay` seconds before the next attempt, or less: with a `version`, until it changes (requests
        meanwhile do not cut it short); without, until the next request (one already made: no wait)."""
        ev = self._dirty[key]
        before = None if self._version is None else self._version(*key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + delay
        while (left := deadline - loop.time()) > 0:
            if self._version is not None:
                ev.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ev.wait(), left)
            if self._version is None or self._version(*key) != before:
                return
