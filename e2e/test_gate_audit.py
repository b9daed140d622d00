"""The gate audit itself (`e2e.inplace.GateAudit`), without a cluster: what the e2e tests that use it rely on.

The audit's reads (the Service's ready endpoints, the model's live pods, what a replica's Triton has loaded) are
replaced by a scripted world, the only stand-in here: the audit must see a violation, count an error it knows as
transient and go on, stop and fail the test on any other exception, and fail the test when it judged fewer ready
endpoints than its use asked for. No marker: `make unit` runs these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e import inplace
from e2e.inplace import GateAudit
from e2e.kube import ApiError
from e2e.operator_fixtures import WARMED
from triton_operator.api.pod import ANNOTATION_DIGEST


def _pod(name: str, digest: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {ANNOTATION_DIGEST: digest}},
            "status": {"podIP": f"198.18.200.{len(name)}", "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": WARMED, "status": "True", "reason": "ModelWarmed", "message": f"config digest {digest}"}]}}


class World:
    """One ready replica `a`, told `digest` and serving `loaded`; `fail` (when set) is raised by the next read."""

    def __init__(self) -> None:
        self.digest, self.loaded, self.ready = "d1", "d1", True
        self.fail: Callable[[], Exception] | None = None

    def endpoints(self, kube: Any, namespace: str, svc: str) -> list[dict[str, Any]]:
        if self.fail is not None:
            raise self.fail()
        return [{"targetRef": {"name": "a"}, "conditions": {"ready": True}}] if self.ready else []

    def pods(self, kube: Any, namespace: str, model: str) -> list[dict[str, Any]]:
        return [_pod("a", self.digest)]

    def loaded_digest(self, ip: str, model: str = "add-sub") -> str | None:
        return self.loaded


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    w = World()
    monkeypatch.setattr(inplace, "ready_endpoints", w.endpoints)
    monkeypatch.setattr(inplace, "live_pods", w.pods)
    monkeypatch.setattr(inplace, "loaded_digest", w.loaded_digest)
    yield w


def _until(check: Callable[[], bool]) -> None:
    inplace.wait_for("the audit's samples", check, 30, 0.05)


def test_a_replica_serving_what_its_gate_approves_passes_and_one_serving_another_config_is_a_violation(
        world: World) -> None:
    with GateAudit(None, "ns", min_samples=3) as audit:
        _until(lambda: audit.judged >= 3)
    assert not audit.violations and audit.judged >= 3, (audit.violations, audit.errors)

    world.loaded = "d0"  # a config its gate never approved
    with GateAudit(None, "ns", min_samples=1) as audit:
        _until(lambda: bool(audit.violations))
    assert "a: a ready endpoint serving d0, its gate approves ['d1']" in audit.violations[0], audit.violations


def test_a_transient_error_is_counted_and_the_audit_goes_on(world: World) -> None:
    with GateAudit(None, "ns", min_samples=3) as audit:
        world.fail = lambda: ApiError(503, "busy", "GET", "/apis/discovery.k8s.io/v1/endpointslices")
        _until(lambda: len(audit.errors) >= 2)
        world.fail = None
        judged = audit.judged
        _until(lambda: audit.judged >= judged + 3)
    assert "ApiError" in audit.errors[0], audit.errors


def test_an_exception_the_audit_cannot_classify_fails_the_test_with_its_traceback(world: World) -> None:
    with (pytest.raises(AssertionError, match=r"cannot classify(.|\n)*KeyError: 'boom'"),
          GateAudit(None, "ns", min_samples=1) as audit):
        world.fail = lambda: KeyError("boom")
        _until(lambda: audit.failure is not None)
    assert audit.failure is not None and "KeyError" in audit.failure


def test_an_audit_that_judged_too_few_samples_fails_rather_than_saying_no_violations(world: World) -> None:
    world.ready = False  # no ready endpoint: samples run, and judge nothing
    with (pytest.raises(AssertionError, match=r"judged ready endpoints in 0 samples, fewer than the 5"),
          GateAudit(None, "ns", min_samples=5) as audit):
        _until(lambda: audit.samples >= 6)
    assert not audit.violations
