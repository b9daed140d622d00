"""How `make test` spreads the tests over its pytest-xdist workers (the Makefile's TEST_WORKERS).

Each worker runs in a network namespace of its own with a local cluster of its own (`e2e/netns-python`,
`e2e.cluster.session_root`), and takes a whole test file at a time (`--dist loadfile`), in collection order, whenever
it has fewer than two files left; the Makefile's LIGHT_WORKERS more start no cluster and take only files outside e2e/
(tests/schedule.py). So the order below is the schedule: the longest files start first and the short
ones fill in at the end, which keeps the workers busy until close to the finish. The e2e files go by their measured
length (`--durations=0` of a `make test` run on this machine kind), then the files with tests against a real
tritonserver, then the rest. A file missing from the list runs after the listed ones; nothing depends on the order
but the wall time. A run in one process (`pytest`, or TEST_WORKERS=0) keeps pytest's own order.

It also shows the time scale every wait of the session is stretched by (tests/timing.py): in the report's header (the
controller's), and at the end each worker's (measured in each process, when it starts). pytest-timeout's per-test
limit (`timeout` in pyproject.toml, 900 s) is not stretched: it is the guard of the whole run's time (CI's hard limit
is 90 minutes), not a wait, and a test near it is a defect of its own.

And it prints, at the end of a run, the time each tier took (tests/tiers.py) and the longest files (their tests'
setup, call and teardown summed: what E2E_LONGEST_FIRST is kept by): each test carries its tier in its
`user_properties`, which pytest-xdist sends back with every report, so the sums are made where the reports arrive.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests import schedule, timing
from tests.tiers import file_totals, phase_line, summary_line, tier_of, tier_totals, worker_line

#: e2e files, longest first: seconds per file (setup, call and teardown of its tests) in a warm `make test` with three
#: cluster workers and one light one on this project's 2-core machine, from the summary's "longest files" (the mean of
#: two quiet CI rehearsals at f1c3e8f: 1,114 s and 1,123 s of pytest; the cluster tier 3,138 and 3,187 test-seconds;
#: the first file of each worker carries its cluster's start, ~55 s). Files under ~25 s are left out: they fill in.
E2E_LONGEST_FIRST = (
    "e2e/test_operator.py",  # 232
    "e2e/test_faults.py",  # 227
    "e2e/test_pool.py",  # 207
    "e2e/test_upgrade.py",  # 193
    "e2e/test_upgrade_bound.py",  # 192
    "e2e/test_inplace.py",  # 166
    "e2e/test_heal.py",  # 163
    "e2e/test_pool_wiring.py",  # 150
    "e2e/test_pool_autoscaling.py",  # 142
    "e2e/test_autoscaling.py",  # 135
    "e2e/test_rollouts.py",  # 128
    "e2e/test_credentials.py",  # 119
    "e2e/test_nodes.py",  # 96
    "e2e/test_admission.py",  # 76
    "e2e/test_smoke.py",  # 72
    "e2e/test_sources.py",  # 72
    "e2e/test_hostile_replica.py",  # 69
    "e2e/test_probe_flood.py",  # 66
    "e2e/test_helm.py",  # 64
    "e2e/test_defects.py",  # 57
    "e2e/test_crd_upgrade.py",  # 56
    "e2e/test_metrics_api.py",  # 55
    "e2e/test_repository_api.py",  # 54
    "e2e/test_availability.py",  # 51
    "e2e/test_monitoring.py",  # 35
    "e2e/test_pool_features.py",  # 35
    "e2e/test_pool_moves.py",  # 34
    "e2e/test_install_order.py",  # 34
    "e2e/test_demo.py",  # 27
    "e2e/test_pool_sources.py",  # 26
)


def _rank(item: pytest.Item, triton_files: set[str]) -> int:
    path = item.nodeid.split("::", 1)[0]
    if path in E2E_LONGEST_FIRST:
        return E2E_LONGEST_FIRST.index(path)
    return len(E2E_LONGEST_FIRST) + (0 if path in triton_files else 1)


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return schedule.make_scheduler(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    # Every worker collects the same items and sorts them the same way (a stable sort of a deterministic key):
    # xdist requires identical collections.
    triton_files = {i.nodeid.split("::", 1)[0] for i in items if i.get_closest_marker("triton")}
    items.sort(key=lambda i: _rank(i, triton_files))


#: How many of the longest files the summary lists.
LONGEST_FILES = 40
#: (test id, tier, seconds, phase, worker) of every phase reported to this process: the controller's under
#: pytest-xdist (worker "" in one process).
_PHASES: list[tuple[str, str, float, str, str]] = []


def pytest_itemcollected(item: pytest.Item) -> None:
    item.user_properties.append(("tier", tier_of(m.name for m in item.iter_markers())))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = dict(report.user_properties).get("tier")  # pairs come back from an xdist worker as lists
    if tier is not None:
        node = getattr(report, "node", None)  # the xdist worker that ran it, on the controller
        worker = str(getattr(getattr(node, "gateway", None), "id", "") or "")
        _PHASES.append((report.nodeid, str(tier), report.duration, report.when, worker))



def pytest_report_header(config: pytest.Config) -> str:
    limit = config.getoption("timeout", None) or config.getini("timeout") if config.pluginmanager.hasplugin("timeout") else None
    return f"{timing.measurement().describe()}; per-test timeout {limit}s"


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its factor goes back to the controller (pytest_testnodedown)
        workeroutput["time_scale"] = timing.measurement().describe()


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_testnodedown(node: Any, error: object) -> None:
    scale = getattr(node, "workeroutput", {}).get("time_scale")
    if scale:
        WORKER_SCALES[node.gateway.id] = scale


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The time per tier and the longest files; then the time scale (at the end too, since `-q` shows no header):
    this process's factor, then each worker's."""
    if _PHASES:
        _write_phases(terminalreporter.config.rootpath / PHASES_FILE)
        terminalreporter.write_sep("=", "time per tier")
        terminalreporter.write_line(summary_line(tier_totals(_PHASES)))
        terminalreporter.write_line(phase_line(_PHASES))
        terminalreporter.write_line(worker_line(_PHASES))
        terminalreporter.write_sep("=", f"longest {LONGEST_FILES} files (test-seconds)")
        for path, seconds in file_totals(_PHASES)[:LONGEST_FILES]:
            terminalreporter.write_line(f"{seconds:8.1f}s {path}")
    terminalreporter.write_line(timing.measurement().describe())
    for worker, scale in sorted(WORKER_SCALES.items()):
        terminalreporter.write_line(f"{worker}: {scale}")


#: Where the controller writes every phase of the run (test id, tier, seconds, phase, worker), one JSON list per line,
#: for a profile beyond the summary's (`.cluster/` is the run's own and ignored by git).
PHASES_FILE = ".cluster/phases.jsonl"


def _write_phases(path: Any) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for phase in _PHASES:
            f.write(json.dumps(phase) + "\n")


#: Each xdist worker's time scale, by worker id, as it reported it when it finished.
WORKER_SCALES: dict[str, str] = {}
