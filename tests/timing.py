"""How long tests wait, from one place: `scaled(seconds)` stretches a test's wait by this machine's measured slowness.

A wait (for a pod to turn Ready, a server to open its port, a model to load) is written with the number of seconds it
needs on this project's own 2-core machine when it is quiet. On a slower or busier machine the same wait would fail
for no fault of the code, so every wait goes through `scaled`, which multiplies it by `factor()`:

- **measured speed**: a fixed pure-Python workload (`workload`, ~65 ms here) is timed once per process and divided by
  `REFERENCE_SECONDS`, its time on the reference machine;
- **load**: the 1-minute load average per CPU, when above 1. The workload takes 65 ms and may land in a quiet slice of
  a busy minute; the load average says how many runnable tasks shared each CPU over that minute, which is how much
  slower the things the test waits for (tritonserver, a kubelet, the operator) ran. The larger of the two counts;
- clamped to [`FLOOR`, `CEILING`] = [1, 4]: a fast machine never shortens a wait below the written number, and a
  hopeless one does not turn a hang into a quarter-hour one;
- `TROP_TIME_SCALE` (a float) overrides all of it, e.g. `TROP_TIME_SCALE=1` for today's numbers exactly.

Only waits are scaled: how long a test is willing to wait for something to happen. A timing value that is part of
the behaviour under test (a probe's own deadline, a server's configured timeout, a measured duration) is not.
Scaling only stretches how long a failing test takes to fail; a passing one returns as soon as its condition holds.
No module of the operator imports this one (tests/test_timing.py checks it).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: The override, a float: the factor itself, neither measured nor clamped.
SCALE_ENV = "TROP_TIME_SCALE"
FLOOR, CEILING = 1.0, 4.0
#: `workload()`'s time on the reference machine: the minimum of 40 runs, 2026-11-28, this project's 2-core machine
#: (`nproc` 2, CPython 3.11.7 from /work/main/.venv). Those 40 runs spread only 26-29 ms for a 400k-step loop (the
#: machine had a load of 2.4 from another worktree's cluster, but the loop had a core to itself), so the minimum is
#: the quiet time; single 1M-step runs in fresh processes took 66-70 ms.
REFERENCE_SECONDS = 0.065
WORKLOAD_STEPS = 1_000_000


def workload(steps: int = WORKLOAD_STEPS) -> int:
    """A fixed, deterministic CPU-bound loop: the interpreter's speed, which is what most of a test's waiting on a
    Python harness and Python servers comes down to."""
    acc = 0
    for i in range(steps):
        acc = (acc * 31 + i) & 0xFFFFFFFF
    return acc


@dataclass(frozen=True)
class Measurement:
    """What `factor()` was made of: the workload's time, the load per CPU, and the factor (or the override)."""

    workload_seconds: float
    load_per_cpu: float
    factor: float
    overridden: bool

    def describe(self) -> str:
        if self.overridden:
            return f"time scale {self.factor:.2f} (from {SCALE_ENV})"
        return (f"time scale {self.factor:.2f} (workload {self.workload_seconds * 1000:.0f} ms vs "
                f"{REFERENCE_SECONDS * 1000:.0f} ms reference, load {self.load_per_cpu:.2f}/cpu, clamped to "
                f"[{FLOOR:g}, {CEILING:g}]; override: {SCALE_ENV})")


def combine(workload_seconds: float, load_per_cpu: float) -> float:
    """The factor from its two views of the machine: the slower one, clamped to [FLOOR, CEILING]."""
    slowness = max(workload_seconds / REFERENCE_SECONDS, load_per_cpu)
    return min(CEILING, max(FLOOR, slowness))


def measure() -> Measurement:
    """Measure now (~65 ms of CPU), or read the override."""
    override = os.environ.get(SCALE_ENV, "").strip()
    if override:
        value = float(override)
        if value <= 0:
            raise ValueError(f"{SCALE_ENV}={override!r}: the time scale must be a positive number")
        return Measurement(0.0, 0.0, value, overridden=True)
    start = time.perf_counter()
    workload()
    seconds = time.perf_counter() - start
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return Measurement(seconds, load, combine(seconds, load), overridden=False)


@functools.cache
def measurement() -> Measurement:
    """This process's measurement, made on first use and kept."""
    return measure()


def factor() -> float:
    return measurement().factor


def scaled(seconds: float) -> float:
    """`seconds` of waiting on the reference machine, as long as it takes on this one."""
    return seconds * factor()


def poll(what: str, probe: Callable[[], T | None], timeout: float, interval: float, *,
         transient: tuple[type[BaseException], ...] = (), error: type[Exception] = AssertionError) -> T:
    """The one polling loop of the tests: call `probe` until it returns something truthy and return it. An exception
    of `transient` counts as "not yet" (e2e's API errors while a component restarts). Past `scaled(timeout)`, raise
    `error` naming `what`, the nominal and scaled timeout and the last value or exception probed."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    last: object = None
    while True:
        try:
            result = probe()
            if result:
                return result
            last = result
        except transient as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise error(f"timed out after {limit:.1f}s ({timeout:g}s scaled by {factor():.2f}) waiting for {what} "
                        f"(last probe: {last!r})")
        time.sleep(interval)


def wait_until(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.05) -> T:
    """Poll `probe` until it returns something truthy and return it; fail (AssertionError) naming `what`, the nominal
    and scaled timeout and the last value probed. `timeout` is nominal: it is scaled here."""
    return poll(what, probe, timeout, interval)
