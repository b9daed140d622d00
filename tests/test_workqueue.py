"""The work queue both reconcilers run on (`controller.workqueue`, issue 41: the pool had its own copy of the
TritonModel's): one worker per key, a burst of requests coalesced into one run, at most `slots` runs at once, a
failed run retried after its back-off, a run that says so run again after its seconds, and a key no longer wanted
let go. On a virtual clock (tests/virtual_clock.py): the times read are exact, minutes take milliseconds.

The TritonModel's use of it: tests/test_retry.py (the back-off's figures, the slots, the handler's context);
the pool's: the last test here."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import pytest

from tests.virtual_clock import VirtualClockLoop, run_virtual
from triton_operator.controller.cache import Cache
from triton_operator.controller.pool import PoolReconciler
from triton_operator.controller.workqueue import WorkQueue
from triton_operator.platform.errors import ApiError

log = logging.getLogger("tests.workqueue")


def _forbidden() -> ApiError:
    return ApiError(status=403, reason="Forbidden", body=json.dumps(
        {"kind": "Status", "message": 'deployments.apps "p" is forbidden: User "x" cannot patch'}))


async def _settle(queue: WorkQueue, until: float, loop: VirtualClockLoop) -> None:
    """Runs the queue until virtual time `until`, then cancels the workers left and awaits them."""
    await asyncio.sleep(until - loop.time())
    tasks = list(queue.workers.values())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_requests_during_a_run_are_coalesced_into_one_more_run_then_the_worker_goes() -> None:
    times: list[float] = []

    async def main(loop: VirtualClockLoop) -> bool:
        async def run(namespace: str, name: str) -> None:
            times.append(loop.time())
            await asyncio.sleep(1)

        queue = WorkQueue(run, "TritonModel", log)
        queue.request("ns", "m")
        await asyncio.sleep(0.5)
        for _ in range(5):
            queue.request("ns", "m")
        await asyncio.wait_for(asyncio.gather(*queue.workers.values()), 10)
        return queue.idle()

    assert run_virtual(main) is True, "no worker nor request left"
    assert times == [0, 1], "five requests during the first run: one run more"


def test_one_worker_per_key_never_two_runs_of_one_key_at_once_and_keys_side_by_side() -> None:
    runs: list[tuple[str, float, float]] = []

    async def main(loop: VirtualClockLoop) -> None:
        async def run(namespace: str, name: str) -> None:
            start = loop.time()
            await asyncio.sleep(1)
            runs.append((name, start, loop.time()))

        queue = WorkQueue(run, "TritonModel", log)
        queue.request("ns", "a")
        queue.request("ns", "b")
        await asyncio.sleep(0.5)
        assert set(queue.workers) == {("ns", "a"), ("ns", "b")}
        queue.request("ns", "a")
        await asyncio.wait_for(asyncio.gather(*queue.workers.values()), 10)

    run_virtual(main)
    assert sorted(runs) == [("a", 0, 1), ("a", 1, 2), ("b", 0, 1)]


def test_at_most_slots_runs_at_once_and_a_request_waiting_for_a_slot_is_served_by_its_run() -> None:
    running: list[str] = []
    done: list[str] = []
    peak = 0

    async def main(loop: VirtualClockLoop) -> float:
        async def run(namespace: str, name: str) -> None:
            nonlocal peak
            running.append(name)
            peak = max(peak, len(running))
            await asyncio.sleep(1)
            running.remove(name)
            done.append(name)

        queue = WorkQueue(run, "TritonModel", log, slots=2)
        for i in range(6):
            queue.request("ns", f"m{i}")
        await asyncio.sleep(0)
        queue.request("ns", "m5")  # waiting for a slot: served by the run it waits for
        await asyncio.wait_for(asyncio.gather(*queue.workers.values()), 10)
        return loop.time()

    assert run_virtual(main) == pytest.approx(3.0), "6 runs of 1 s, 2 at a time"
    assert peak == 2 and sorted(done) == [f"m{i}" for i in range(6)]


def test_a_run_that_says_when_to_come_back_runs_again_then_or_at_the_next_request_if_sooner() -> None:
    times: list[float] = []

    async def main(loop: VirtualClockLoop) -> bool:
        async def run(namespace: str, name: str) -> float | None:
            times.append(loop.time())
            return 5.0 if len(times) < 3 else None

        queue = WorkQueue(run, "TritonPool", log)
        queue.request("ns", "p")
        await asyncio.sleep(7)
        queue.request("ns", "p")  # sooner than the 5 s the second run asked for
        await asyncio.wait_for(asyncio.gather(*queue.workers.values()), 10)
        return queue.idle()

    assert run_virtual(main) is True
    assert times == [0, 5, 7], "the third run says None: the worker goes"


def test_a_failed_run_backs_off_doubling_and_a_success_resets_the_count() -> None:
    times: list[float] = []

    async def main(loop: VirtualClockLoop) -> None:
        async def run(namespace: str, name: str) -> None:
            times.append(loop.time())
            if len(times) in (1, 2, 3, 5):
                raise _forbidden()

        queue = WorkQueue(run, "TritonModel", log)
        queue.request("ns", "m")
        await asyncio.sleep(100)
        assert queue.idle()
        queue.request("ns", "m")
        await asyncio.wait_for(asyncio.gather(*queue.workers.values()), 10)

    run_virtual(main)
    assert times == [0, 2, 6, 14, 100, 102], times


def _failing(times: list[float], loop: VirtualClockLoop, seconds: float = 0) -> Callable[[str, str], Awaitable[None]]:
    async def run(namespace: str, name: str) -> None:
        times.append(loop.time())
        await asyncio.sleep(seconds)
        raise _forbidden()
    return run


def test_with_a_version_a_back_off_ends_early_only_when_the_version_changes() -> None:
    """A TritonModel's: its pods' events during a back-off do not cut it short, a new generation does."""
    times: list[float] = []
    versions = {("ns", "m"): 1}

    async def main(loop: VirtualClockLoop) -> None:
        queue = WorkQueue(_failing(times, loop), "TritonModel", log,
                          version=lambda ns, name: versions[(ns, name)])
        queue.request("ns", "m")  # fails at 0: back in 2 s
        await asyncio.sleep(1)
        queue.request("ns", "m")  # same version: nothing earlier
        await asyncio.sleep(2)  # t=3, in the 4 s back-off after the failure at 2
        versions[("ns", "m")] = 2
        queue.request("ns", "m")  # a new version: at once
        await _settle(queue, 10, loop)

    run_virtual(main)
    assert times == [0, 2, 3], times


def test_without_a_version_any_request_ends_a_back_off_and_one_during_the_failed_run_retries_at_once() -> None:
    """A TritonPool's: its round is also how its models' and pods' events are served."""
    times: list[float] = []

    async def main(loop: VirtualClockLoop) -> None:
        queue = WorkQueue(_failing(times, loop, seconds=1), "TritonPool", log)
        queue.request("ns", "p")
        await asyncio.sleep(0.5)
        queue.request("ns", "p")  # during the run that fails at 1: retried at 1, no back-off
        await asyncio.sleep(3.5)  # t=4: in the 4 s back-off after the failure at 2
        queue.request("ns", "p")
        await _settle(queue, 4.5, loop)

    run_virtual(main)
    assert times == [0, 1, 4], times


def test_after_a_wait_a_key_no_longer_wanted_lets_its_worker_go() -> None:
    times: list[float] = []
    wanted = {"p": True}

    async def main(loop: VirtualClockLoop) -> bool:
        async def run(namespace: str, name: str) -> float:
            times.append(loop.time())
            return 5.0

        queue = WorkQueue(run, "TritonPool", log, wanted=lambda ns, name: wanted[name])
        queue.request("ns", "p")
        await asyncio.sleep(7)
        wanted["p"] = False
        await asyncio.sleep(5)
        return queue.idle()

    assert run_virtual(main) is True
    assert times == [0, 5], "the wait after the run at 5 ends at 10 with the pool no longer wanted"


def test_a_refusal_is_logged_as_a_warning_naming_it_and_a_bug_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main(loop: VirtualClockLoop) -> None:
        async def run(namespace: str, name: str) -> None:
            raise _forbidden() if loop.time() == 0 else KeyError("bug")

        queue = WorkQueue(run, "TritonPool", log)
        queue.request("ns", "p")
        await _settle(queue, 3, loop)

    with caplog.at_level(logging.WARNING, logger="tests.workqueue"):
        run_virtual(main)
    told = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records if r.name == log.name]
    assert told[0][0] == "WARNING" and told[0][1].startswith("Failed to reconcile TritonPool namespace=ns name=p ")
    assert "forbidden" in told[0][1] and "retry=2s attempt=1" in told[0][1] and not told[0][2], told
    assert told[1] == ("ERROR", "Failed to reconcile TritonPool namespace=ns name=p retry=4s attempt=2", True), told


def test_a_pools_rounds_run_on_the_queue_come_back_when_they_say_and_stop_when_the_pool_is_wanted_no_more() -> None:
    times: list[float] = []

    async def main(loop: VirtualClockLoop) -> bool:
        pools = PoolReconciler(None, Cache())  # type: ignore[arg-type]

        async def round_(namespace: str, name: str) -> float:
            times.append(loop.time())
            return 2.0

        pools.reconcile = round_  # type: ignore[method-assign]
        pools.put_pool({"metadata": {"namespace": "ns", "name": "p", "uid": "u"}})
        pools.request("ns", "p")
        await asyncio.sleep(5)
        pools.put_pool({"metadata": {"namespace": "ns", "name": "p", "uid": "u"}}, deleted=True)
        await asyncio.sleep(5)
        return pools.queue.idle()

    assert run_virtual(main) is True, "deleted, and no model names it: its worker went"
    assert times == [0, 2, 4], times
