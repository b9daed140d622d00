"""The three test tiers and the time each takes, for the summary the root conftest.py prints after a run.

A test's tier comes from its markers, as `make unit`, `make triton` and `make e2e` select it: `cluster` (the local
control plane and real nodes), `triton` (a real tritonserver, no cluster), otherwise `unit`. Its time is the sum of
its setup, call and teardown (pytest's `report.duration`), so a tier's figure is test-seconds: under pytest-xdist it
adds up the workers' time, which is more than the wall time the run took.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

TIERS = ("unit", "triton", "cluster")
WHENS = ("setup", "call", "teardown")


def tier_of(markers: Iterable[str]) -> str:
    names = set(markers)
    return "cluster" if "cluster" in names else "triton" if "triton" in names else "unit"


def tier_totals(phases: Iterable[tuple[str, str, float]]) -> dict[str, tuple[int, float]]:
    """(test count, seconds) per tier, from (test id, tier, seconds) of each phase (setup, call, teardown) of each
    test; every tier is there, at (0, 0.0) when none of its tests ran."""
    tests: dict[str, set[str]] = {t: set() for t in TIERS}
    seconds = dict.fromkeys(TIERS, 0.0)
    for nodeid, tier, duration, *_ in phases:
        tests[tier].add(nodeid)
        seconds[tier] += duration
    return {t: (len(tests[t]), seconds[t]) for t in TIERS}


def summary_line(totals: dict[str, tuple[int, float]]) -> str:
    return "test-seconds per tier (setup + call + teardown, summed over workers): " + ", ".join(
        f"{tier} {seconds:.1f} s in {count} tests" for tier, (count, seconds) in totals.items())


def file_totals(phases: Iterable[tuple[str, str, float]]) -> list[tuple[str, float]]:
    """(file, seconds) of each test file, its tests' phases summed, longest first (the schedule in conftest.py's
    E2E_LONGEST_FIRST is kept by it)."""
    seconds: dict[str, float] = {}
    for nodeid, _, duration, *_ in phases:
        path = nodeid.split("::", 1)[0]
        seconds[path] = seconds.get(path, 0.0) + duration
    return sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))


def phase_line(phases: Iterable[Sequence[object]]) -> str:
    """Each tier's seconds by phase, from (test id, tier, seconds, phase, ...): how much of a tier's time its
    fixtures take to set up and tear down (a cluster's namespaces, servers started and stopped) beside the calls."""
    seconds = {(t, w): 0.0 for t in TIERS for w in WHENS}
    for _, tier, duration, when, *_ in phases:
        seconds[(str(tier), str(when))] += float(duration)  # type: ignore[arg-type]
    return "test-seconds per phase: " + "; ".join(
        f"{tier} " + ", ".join(f"{w} {seconds[(tier, w)]:.1f}" for w in WHENS) for tier in TIERS)


def worker_line(phases: Iterable[Sequence[object]]) -> str:
    """Each xdist worker's test-seconds, from (test id, tier, seconds, phase, worker): how evenly `--dist loadfile`
    and the schedule in conftest.py spread the work (the run takes as long as the busiest worker)."""
    seconds: dict[str, float] = {}
    for _, _, duration, _, worker, *_ in phases:
        if worker:
            seconds[str(worker)] = seconds.get(str(worker), 0.0) + float(duration)  # type: ignore[arg-type]
    return "test-seconds per worker: " + (", ".join(f"{w} {s:.1f}" for w, s in sorted(seconds.items())) or "one process")
