"""An asyncio event loop on a virtual clock, for the work queue's tests (tests/test_retry.py,
tests/test_workqueue.py): when nothing is ready to run, its clock jumps to the next timer, so minutes of back-off
take milliseconds and the times a test reads are exact."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer whenever nothing is ready to run."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def _run_once(self) -> None:
        if not self._ready and self._scheduled:
            self._now = max(self._now, self._scheduled[0].when())
        super()._run_once()


def run_virtual(main: Callable[[VirtualClockLoop], Coroutine[Any, Any, T]]) -> T:
    """`main(loop)` run to its end on a fresh virtual-clock loop, closed after."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()
