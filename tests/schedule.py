"""`make test`'s pytest-xdist schedule: whole test files (as `--dist loadfile`), with workers of two kinds.

The first CLUSTER_WORKERS workers (gw0, gw1, ...) each start a local cluster when their first e2e test needs one and
take any file, in collection order (conftest.py puts the longest e2e files first). The workers after them are *light*:
they never start a cluster, so they take only files outside `e2e/` (the unit tier and the tests against a real
tritonserver), and stop when none is left. A light worker costs a Python process and the tritonservers of its own
tests, not a control plane and two nodes: issue 40 measured four cluster workers on the 2-core machine running away
(four API servers answering "Handler timeout"), where three left about a third of the CPU idle.

A cluster worker whose e2e files are done takes the files the light workers have not started, so no file waits for a
light worker while a cluster worker is idle.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from xdist.scheduler import LoadFileScheduling

#: The environment variable `make test` sets to the number of its cluster workers; the rest are light.
CLUSTER_WORKERS_ENV = "TEST_CLUSTER_WORKERS"


def needs_cluster(scope: str) -> bool:
    """Whether a file (a scope of `--dist loadfile`) may need a cluster: every file under e2e/ is kept off the light
    workers (a few there need none, but a light worker starting a cluster is what this schedule exists to avoid)."""
    return scope.startswith("e2e/")


def worker_index(node: Any) -> int:
    """gw<N> -> N: pytest-xdist numbers its workers in the order of the --tx specs."""
    return int(str(node.gateway.id).removeprefix("gw"))


class ClusterAwareScheduling(LoadFileScheduling):  # type: ignore[misc]  # xdist ships no type hints for it
    """`--dist loadfile` where workers from index `cluster_workers` on take no file `needs_cluster` names."""

    def __init__(self, config: Any, log: Any = None, *, cluster_workers: int,
                 index: Callable[[Any], int] = worker_index) -> None:
        super().__init__(config, log)
        self.cluster_workers = cluster_workers
        self._index = index

    def is_light(self, node: Any) -> bool:
        return self._index(node) >= self.cluster_workers

    def _next_scope(self, node: Any) -> str | None:
        light = self.is_light(node)
        return next((s for s in self.workqueue if not (light and needs_cluster(s))), None)

    def _assign_work_unit(self, node: Any) -> None:
        scope = self._next_scope(node)
        if scope is None:  # a light worker, and only e2e files are left
            node.shutdown()
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if self._next_scope(node) is None:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 2:  # as loadscope: top up a worker with 2 tests or fewer left
            return
        self._assign_work_unit(node)


def make_scheduler(config: Any, log: Any) -> ClusterAwareScheduling | None:
    """The scheduler `make test` runs with (TEST_CLUSTER_WORKERS set, `--dist loadfile`), else None (xdist's own)."""
    raw = os.environ.get(CLUSTER_WORKERS_ENV)
    if not raw or config.getvalue("dist") != "loadfile":
        return None
    return ClusterAwareScheduling(config, log, cluster_workers=int(raw))
