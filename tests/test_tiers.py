"""The time per tier that a run prints at its end (tests/tiers.py, the root conftest.py)."""

from __future__ import annotations

from tests.tiers import file_totals, phase_line, summary_line, tier_of, tier_totals, worker_line


def test_a_tier_is_read_from_the_markers_as_make_selects_it() -> None:
    assert tier_of([]) == "unit"
    assert tier_of(["parametrize", "timeout"]) == "unit"
    assert tier_of(["triton"]) == "triton"
    assert tier_of(["cluster"]) == "cluster"
    assert tier_of(["triton", "cluster"]) == "cluster", "make triton leaves out what needs a cluster"


def test_the_phases_of_each_test_add_up_in_its_tier_and_each_test_counts_once() -> None:
    totals = tier_totals([("a", "unit", 0.5), ("a", "unit", 1.0), ("a", "unit", 0.25), ("b", "triton", 3.0),
                          ("c", "triton", 1.5), ("b", "triton", 2.0)])
    assert totals == {"unit": (1, 1.75), "triton": (2, 6.5), "cluster": (0, 0.0)}
    assert summary_line(totals) == ("test-seconds per tier (setup + call + teardown, summed over workers): "
                                    "unit 1.8 s in 1 tests, triton 6.5 s in 2 tests, cluster 0.0 s in 0 tests")


def test_files_add_up_their_tests_phases_longest_first() -> None:
    phases = [("e2e/test_a.py::t1", "cluster", 10.0), ("e2e/test_a.py::t1", "cluster", 2.0),
              ("tests/test_b.py::t[x]", "unit", 20.0), ("e2e/test_a.py::t2", "cluster", 9.0),
              ("tests/test_c.py::t", "unit", 1.0)]
    assert file_totals(phases) == [("e2e/test_a.py", 21.0), ("tests/test_b.py", 20.0), ("tests/test_c.py", 1.0)]


def test_each_tier_splits_into_its_phases_and_each_worker_adds_up_what_it_ran() -> None:
    phases = [("a", "unit", 0.5, "setup", "gw0"), ("a", "unit", 1.0, "call", "gw0"), ("a", "unit", 0.25, "teardown", "gw0"),
              ("b", "cluster", 30.0, "setup", "gw1"), ("b", "cluster", 3.0, "call", "gw1"),
              ("c", "cluster", 12.0, "teardown", "gw2")]
    assert phase_line(phases) == (
        "test-seconds per phase: unit setup 0.5, call 1.0, teardown 0.2; triton setup 0.0, call 0.0, teardown 0.0; "
        "cluster setup 30.0, call 3.0, teardown 12.0")
    assert worker_line(phases) == "test-seconds per worker: gw0 1.8, gw1 33.0, gw2 12.0"
    assert worker_line([("a", "unit", 1.0, "call", "")]) == "test-seconds per worker: one process"
