"""The unit tier (tests/, `make unit`) reaches no module of the cluster harness, directly or through another module:
what a unit test needs of e2e/ lives in modules that start nothing (e2e/health_checks.py, e2e/ports.py, e2e/proxy.py,
e2e/objectstores.py). Tests of the harness itself live beside it in e2e/ (e2e/test_images.py,
e2e/test_node_state.py, e2e/test_gate_audit.py; unmarked, so `make unit` still runs them). Read with `ast`.
"""

from __future__ import annotations

from tests.import_scan import REPO, chain, reached

#: The cluster harness: what brings up, drives or talks to a local cluster and its nodes, and builds their images.
HARNESS = frozenset(REPO / "e2e" / f"{name}.py" for name in (
    "cluster", "node", "images", "kube", "testing", "operator_fixtures", "conftest", "load", "demo", "inplace",
    "healing", "traffic"))


def test_no_unit_test_reaches_the_cluster_harness() -> None:
    assert all(p.is_file() for p in HARNESS), sorted(str(p) for p in HARNESS if not p.is_file())
    files = sorted((REPO / "tests").rglob("*.py"))
    assert len(files) > 50, f"only {len(files)} files under tests/"
    offenders = []
    for path in files:
        via = reached(path)
        offenders += [chain(path, target, via) for target in sorted(HARNESS & via.keys())]
    assert not offenders, "unit tests import the cluster harness:\n  " + "\n  ".join(offenders)


def test_the_scan_follows_imports_through_other_modules() -> None:
    """e2e/test_inplace.py (a cluster test) reaches e2e/node.py only through other modules: the scan finds it."""
    path = REPO / "e2e" / "test_inplace.py"
    via = reached(path)
    assert REPO / "e2e" / "node.py" in via, sorted(str(p) for p in via)
    assert chain(path, REPO / "e2e" / "node.py", via).startswith("e2e/test_inplace.py -> "), via
