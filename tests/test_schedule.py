"""`make test`'s schedule (tests/schedule.py), driven as pytest-xdist's controller drives it, with stand-in workers:
what runs where is the scheduler's own decision, and a real xdist run is `make test` itself."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.schedule import ClusterAwareScheduling, make_scheduler, needs_cluster

COLLECTION = [
    "e2e/test_long.py::test_a", "e2e/test_long.py::test_b",
    "e2e/test_short.py::test_a",
    "tests/test_triton.py::test_a", "tests/test_triton.py::test_b", "tests/test_triton.py::test_c",
    "tests/test_unit.py::test_a",
]


class Worker:
    """What the scheduler calls on a WorkerController: the tests sent to it, and whether it was told to stop."""

    def __init__(self, index: int) -> None:
        self.gateway = SimpleNamespace(id=f"gw{index}")
        self.sent: list[str] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(COLLECTION[i] for i in indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _config(workers: int, dist: str = "loadfile") -> Any:
    values = {"tx": [f"{workers}*popen"], "dist": dist}
    return SimpleNamespace(getvalue=values.__getitem__, option=SimpleNamespace(loadscopereorder=False))


def _started(cluster_workers: int, workers: int) -> tuple[ClusterAwareScheduling, list[Worker]]:
    sched = ClusterAwareScheduling(_config(workers), cluster_workers=cluster_workers)
    nodes = [Worker(i) for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, COLLECTION)
    sched.schedule()
    return sched, nodes


def _finish(sched: ClusterAwareScheduling, node: Worker) -> None:
    for nodeid in list(node.sent):
        if not sched.assigned_work[node][nodeid.split("::")[0]][nodeid]:
            sched.mark_test_complete(node, COLLECTION.index(nodeid))


def test_the_light_worker_takes_no_e2e_file_and_stops_when_only_e2e_files_are_left() -> None:
    sched, (c0, light) = _started(cluster_workers=1, workers=2)
    assert all(t.startswith("e2e/") for t in c0.sent) and c0.sent
    assert light.sent and not any(needs_cluster(t) for t in light.sent)
    _finish(sched, light)
    _finish(sched, c0)
    _finish(sched, light)
    _finish(sched, c0)
    assert sorted(c0.sent + light.sent) == sorted(COLLECTION), "every test runs once"
    assert not any(needs_cluster(t) for t in light.sent)
    assert light.shutting_down and sched.tests_finished


def test_a_cluster_worker_out_of_e2e_files_takes_what_the_light_worker_has_not_started() -> None:
    sched, (c0, light) = _started(cluster_workers=1, workers=2)
    for _ in range(3):  # the light worker stalls on its first file; the cluster worker runs everything else
        _finish(sched, c0)
    assert "tests/test_unit.py::test_a" in c0.sent
    assert not set(c0.sent) & set(light.sent)


def test_only_make_tests_loadfile_run_gets_this_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_CLUSTER_WORKERS", "1")
    assert isinstance(make_scheduler(_config(2), None), ClusterAwareScheduling)
    assert make_scheduler(_config(2, dist="load"), None) is None
    monkeypatch.delenv("TEST_CLUSTER_WORKERS")
    assert make_scheduler(_config(2), None) is None
