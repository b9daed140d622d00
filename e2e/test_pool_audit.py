"""The pool audit itself (`e2e.pool.PoolAudit`), without a cluster: what `e2e/test_pool.py` relies on it for.

The audit's reads (the pooled TritonModels, the namespace's EndpointSlices, the pool's pods, what a replica's Triton
has READY) are replaced by a scripted world, the only stand-in here. The audit must find a slice that lists a replica
where the model is not READY at the desired digest (wrong digest, not loaded, a step missing, tritonserver gone),
whether the endpoint says ready, leaves ready unset or is only serving; accept the previous digest during a Swap but
not the one before it; allow a replica that stops serving under a listed endpoint `LAG` seconds and no more, and
none to an endpoint on its way in; and fail the test on an exception it cannot classify or on too few samples. No
marker: `make unit` runs these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e import pool
from e2e.kube import ApiError, wait_for
from e2e.pool import PoolAudit

Endpoint = dict[str, Any]


def _model(name: str, digest: str, steps: tuple[str, ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"pool": "p"}
    if steps:
        spec["ensemble"] = {"steps": [{"model": s} for s in steps]}
    return {"metadata": {"name": name, "generation": 1}, "spec": spec, "status": {"configDigest": digest}}


def _endpoint(pod: str, **conditions: bool) -> Endpoint:
    return {"addresses": [f"198.18.160.{len(pod)}"], "targetRef": {"kind": "Pod", "name": pod},
            "conditions": conditions}


class World:
    """Model `m` at digest d1, listed ready on replica `a`, whose Triton has it READY at d1; `served[(ip, model)]`
    is what a replica's Triton answers (None: not READY); `fail`, when set, is raised by the next read."""

    def __init__(self) -> None:
        self.models = {"m": _model("m", "d1")}
        self.endpoints: dict[str, list[Endpoint]] = {"m": [_endpoint("a", ready=True)]}
        self.served: dict[tuple[str, str], str | None] = {(self.ip("a"), "m"): "d1"}
        self.pod_ready = {"a": True, "b": True}
        self.fail: Callable[[], Exception] | None = None
        self.listed: dict[str, dict] | None = None  # what the list of models says, when it lags the objects

    @staticmethod
    def ip(pod: str) -> str:
        return f"198.18.160.{len(pod)}"

    def pooled_models(self, kube: Any, namespace: str) -> dict[str, dict]:
        if self.fail is not None:
            raise self.fail()
        return dict(self.models if self.listed is None else self.listed)

    def model_slices(self, kube: Any, namespace: str) -> list[dict]:
        return [{"metadata": {"name": f"{m}-ipv4", "labels": {pool.LABEL_SERVICE_NAME: m}}, "endpoints": eps}
                for m, eps in self.endpoints.items()]

    def pool_pods(self, kube: Any, namespace: str) -> dict[str, dict]:
        return {name: {"metadata": {"name": name}, "status": {"conditions": [
            {"type": "Ready", "status": "True" if ready else "False"}]}} for name, ready in self.pod_ready.items()}

    def served_digest(self, ip: str, model: str) -> str | None:
        return self.served.get((ip, model))

    def get_or_none(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        return self.models.get(name)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    w = World()
    for read in ("pooled_models", "model_slices", "pool_pods", "served_digest"):
        monkeypatch.setattr(pool, read, getattr(w, read))
    monkeypatch.setattr(PoolAudit, "INTERVAL", 0.02)
    yield w


def _audit(world: World, min_samples: int = 1) -> PoolAudit:
    return PoolAudit(world, "ns", min_samples=min_samples)  # type: ignore[arg-type]  # the world answers its reads


def _until(check: Callable[[], bool]) -> None:
    wait_for("the audit's samples", check, 30, 0.02)


def test_a_replica_serving_the_desired_digest_passes(world: World) -> None:
    with _audit(world, 5) as audit:
        _until(lambda: audit.judged >= 5)
    assert not audit.violations and not audit.lagged, audit.violations
    assert audit.changes["m"][0][1] == frozenset({"a"})


@pytest.mark.parametrize("served", ["d0", None])
@pytest.mark.parametrize("conditions", [{"ready": True}, {}, {"ready": False, "serving": True, "terminating": True}])
def test_a_slice_listing_a_replica_without_the_model_at_the_desired_digest_is_a_violation(
        world: World, served: str | None, conditions: dict[str, bool]) -> None:
    """The mutation the audit exists for: a wrong slice (the model at another digest, or not loaded, on the listed
    replica), listed as kube-proxy reads it: ready, ready unset, or serving while terminating."""
    world.served[(world.ip("a"), "m")] = served
    world.endpoints["m"] = [_endpoint("a", **conditions)]
    audit = _audit(world)
    with pytest.raises(AssertionError, match="listed where the model was not READY"), audit:
        _until(lambda: bool(audit.violations))
    assert f"m on a (198.18.160.1): newly listed (pod Ready): m READY at {served}, accepted ['d1']" in audit.violations[0]


def test_an_endpoint_not_ready_and_not_serving_is_not_judged(world: World) -> None:
    world.served[(world.ip("a"), "m")] = None
    world.endpoints["m"] = [_endpoint("a", ready=False, serving=False)]
    with pytest.raises(AssertionError, match="judged listed endpoints in 0 samples"), _audit(world, 3) as audit:
        _until(lambda: audit.samples >= 4)
    assert not audit.violations


def test_during_a_swap_the_previous_digest_is_accepted_and_the_one_before_it_is_not(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PoolAudit, "LAG", 0.5)
    audit = _audit(world)
    with pytest.raises(AssertionError, match="listed where the model was not READY"), audit:
        _until(lambda: audit.judged >= 2)
        world.models["m"] = _model("m", "d2")  # the update: the replica serves d1 until d2 is READY
        judged = audit.judged
        _until(lambda: audit.judged >= judged + 3)
        world.served[(world.ip("a"), "m")] = "d2"
        world.models["m"] = _model("m", "d3")
        world.served[(world.ip("a"), "m")] = "d1"  # a config two updates old
        _until(lambda: bool(audit.violations))
    assert "m READY at d1, accepted ['d2', 'd3']" in audit.violations[0], audit.violations


def test_the_new_digest_loaded_before_the_status_names_it_is_read_again_not_judged(world: World) -> None:
    """The operator loads the new config, then writes its digest: the audit reads the model again before judging."""
    world.listed = {"m": _model("m", "d1")}  # every sample's list is behind ...
    world.models["m"] = _model("m", "d2")  # ... the object itself
    world.served[(world.ip("a"), "m")] = "d2"
    with _audit(world, 3) as audit:
        _until(lambda: audit.judged >= 3)
    assert not audit.violations


def test_an_ensemble_listed_where_a_step_is_not_ready_is_a_violation(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PoolAudit, "LAG", 0.5)
    world.models = {"e": _model("e", "de", ("s1", "s2")), "s1": _model("s1", "d1"), "s2": _model("s2", "d2")}
    world.endpoints = {"e": [_endpoint("a", ready=True)]}
    world.served = {(world.ip("a"), "e"): "de", (world.ip("a"), "s1"): "d1", (world.ip("a"), "s2"): "d2"}
    audit = _audit(world)
    with pytest.raises(AssertionError, match="listed where the model was not READY"), audit:
        _until(lambda: audit.judged >= 2)
        assert not audit.violations, audit.violations
        world.served[(world.ip("a"), "s2")] = None
        _until(lambda: bool(audit.violations))
    # it served before, under the same listed endpoint: an exit, allowed LAG; then a violation
    assert "s2 READY at None, accepted ['d2']" in audit.violations[0], audit.violations


def test_a_replica_that_stops_serving_under_a_listed_endpoint_has_lag_seconds_then_is_a_violation(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PoolAudit, "LAG", 0.5)
    audit = _audit(world)
    with pytest.raises(AssertionError, match="listed where the model was not READY"), audit:
        _until(lambda: audit.judged >= 2)
        world.served[(world.ip("a"), "m")] = None  # its tritonserver killed; the slice still lists it
        _until(lambda: bool(audit.violations))
    assert audit.lagged and "still listed" in audit.lagged[0], audit.lagged
    assert "after it last served there (pod Ready): m READY at None" in audit.violations[0], audit.violations


def test_an_endpoint_that_left_and_came_back_before_serving_is_a_violation_at_once(world: World) -> None:
    audit = _audit(world)
    with pytest.raises(AssertionError, match="listed where the model was not READY"), audit:
        _until(lambda: audit.judged >= 2)
        world.endpoints["m"] = [_endpoint("a", ready=False, serving=False)]
        samples = audit.samples
        _until(lambda: audit.samples >= samples + 2)
        world.served[(world.ip("a"), "m")] = None
        world.endpoints["m"] = [_endpoint("a", ready=True)]  # back in the slice before the model is READY again
        _until(lambda: bool(audit.violations or audit.lagged))
    assert not audit.lagged and "newly listed" in audit.violations[0], (audit.lagged, audit.violations)
    assert [sorted(pods) for _, pods in audit.changes["m"]] == [["a"], [], ["a"]]


def test_a_transient_error_is_counted_and_the_audit_goes_on(world: World) -> None:
    with _audit(world, 3) as audit:
        world.fail = lambda: ApiError(503, "busy", "GET", "/apis/serving.triton-operator.dev/v1alpha1/tritonmodels")
        _until(lambda: len(audit.errors) >= 2)
        world.fail = None
        judged = audit.judged
        _until(lambda: audit.judged >= judged + 3)
    assert "ApiError" in audit.errors[0], audit.errors


def test_an_exception_the_audit_cannot_classify_fails_the_test_with_its_traceback(world: World) -> None:
    with pytest.raises(AssertionError, match=r"cannot classify(.|\n)*KeyError: 'boom'"), _audit(world) as audit:
        world.fail = lambda: KeyError("boom")
        _until(lambda: audit.failure is not None)
