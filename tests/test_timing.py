"""The time scale every test's wait is stretched by (tests/timing.py): the override wins, the factor stays within
[1, 4], a measurement gives a float of at least 1, and no module of the operator imports the tests' timing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import timing
from tests.import_scan import REPO, imported_modules


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No cached measurement before the test, and none of the test's left for the tests after it."""
    monkeypatch.delenv(timing.SCALE_ENV, raising=False)
    timing.measurement.cache_clear()
    yield monkeypatch
    timing.measurement.cache_clear()


def test_the_override_is_the_factor_neither_measured_nor_clamped(fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv(timing.SCALE_ENV, "6.5")
    m = timing.measurement()
    assert (m.factor, m.overridden, m.workload_seconds) == (6.5, True, 0.0), m
    assert timing.scaled(10) == 65.0
    assert timing.SCALE_ENV in m.describe()


@pytest.mark.parametrize("value", ["0", "-1", "fast"])
def test_an_override_that_is_not_a_positive_number_is_refused(fresh: pytest.MonkeyPatch, value: str) -> None:
    fresh.setenv(timing.SCALE_ENV, value)
    with pytest.raises(ValueError, match=value):
        timing.measure()


@pytest.mark.parametrize(("workload", "load", "factor"), [
    (timing.REFERENCE_SECONDS / 3, 0.2, 1.0),  # a faster machine never shortens a wait
    (timing.REFERENCE_SECONDS * 2, 0.5, 2.0),  # twice as slow: twice as long
    (timing.REFERENCE_SECONDS, 3.0, 3.0),  # three runnable tasks per CPU: three times as long
    (timing.REFERENCE_SECONDS * 2, 1.5, 2.0),  # the slower view counts, not their product
    (timing.REFERENCE_SECONDS * 10, 9.0, 4.0),  # a hopeless machine: at most 4 times
])
def test_the_factor_is_the_slower_view_clamped_to_1_and_4(workload: float, load: float, factor: float) -> None:
    assert timing.combine(workload, load) == pytest.approx(factor)


def test_a_measurement_is_a_float_of_at_least_1_and_kept_for_the_process(fresh: pytest.MonkeyPatch) -> None:
    m = timing.measurement()
    assert not m.overridden and m.workload_seconds > 0 and m.load_per_cpu >= 0, m
    assert isinstance(m.factor, float) and timing.FLOOR <= m.factor <= timing.CEILING, m
    assert timing.measurement() is m
    print(m.describe())


def test_wait_until_returns_what_the_probe_found_or_fails_naming_the_nominal_and_scaled_wait(
        fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv(timing.SCALE_ENV, "2")
    answers = iter([None, 0, "found"])
    assert timing.wait_until("a third answer", lambda: next(answers), 5, interval=0) == "found"
    with pytest.raises(AssertionError, match=r"timed out after 0\.1s \(0\.05s scaled by 2\.00\) waiting for nothing"):
        timing.wait_until("nothing", lambda: None, 0.05, interval=0.01)


def test_no_module_of_the_operator_imports_the_tests() -> None:
    files = sorted((REPO / "operator").rglob("*.py"))
    assert len(files) > 50, f"only {len(files)} files under operator/"
    offenders = [f"{path.relative_to(REPO)}:{line} imports {name}" for path in files
                 for line, name in imported_modules(path, REPO / "operator") if name.split(".")[0] == "tests"]
    assert not offenders, offenders
