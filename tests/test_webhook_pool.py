"""The webhook and TritonPools (issue 29): a pooled model larger than one replica of its pool is refused naming
spec.memory (the pool read live, with a GET; a pool not there yet refuses nothing), and a pool change that would
strand the models placed on it (their status.placement) is refused naming the pool's field. Deleting a pool is not
reviewed: its models report PoolNotFound (docs/concepts/pools.md).

The verdicts are pure (`validate.admission.review`, `review_pool`); the webhook's reads go to `FakeModelsApi`, the
stand-in for the API server. The same refusals through a real API server: e2e/test_admission.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.documents import pool_document, python_model
from tests.webhook_server import FakeModelsApi
from triton_operator.render.webhook import WebhookTarget, render_webhook_configuration
from triton_operator.servers.webhook import AdmissionWebhook
from triton_operator.validate.admission import UNTOLD_STRANDED, redacted, review, review_pool

NS = "team-a"


def _model(name: str, placement: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    body = python_model(name, **spec)
    body["metadata"].update(namespace=NS, uid=f"uid-{name}", resourceVersion="1")
    if placement is not None:
        body["status"] = {"placement": placement}
    return body


def _pool(name: str = "p", **spec: Any) -> dict[str, Any]:
    body = pool_document(name, **spec)
    body["metadata"].update(namespace=NS, uid=f"uid-pool-{name}", resourceVersion="1")
    return body


def _ensemble(*steps: str) -> dict[str, Any]:
    chain = [{"model": s, "inputMap": {"INPUT": "IN"}, "outputMap": {"OUTPUT": f"OUT{i}"}} for i, s in enumerate(steps)]
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
            "metadata": {"name": "ens", "namespace": NS, "uid": "uid-ens"},
            "spec": {"platform": "ensemble", "pool": "p", "maxBatchSize": 4,
                     "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
                     "outputs": [{"name": f"OUT{i}", "dataType": "FP32", "dims": [4]} for i in range(len(steps))],
                     "ensemble": {"steps": chain}}}


def _placed() -> list[dict[str, Any]]:
    """Pool p (2 replicas of 4Gi): `a` (3Gi) on p-pool-x, `b` (1Gi, 2 copies) on p-pool-x and p-pool-y; p-pool-x is
    full. `c` is on another pool."""
    return [_model("a", ["p-pool-x"], pool="p", memory="3Gi"),
            _model("b", ["p-pool-x", "p-pool-y"], pool="p", memory="1Gi", replicas=2),
            _model("c", ["q-pool-z"], pool="q", memory="8Gi")]


# -- the verdicts, pure ------------------------------------------------------------------------


def test_a_pooled_model_larger_than_a_replica_of_its_pool_is_refused_naming_spec_memory() -> None:
    verdict = review(_model("m", pool="p", memory="5Gi"), None, {}, pool=_pool())
    assert not verdict.allowed
    ((error),) = verdict.errors
    assert (error.path, error.rule) == ("spec.memory", "pool-capacity")
    assert "a copy takes 5Gi, more than a replica of pool 'p' holds (spec.capacity.memoryPerReplica gives 4Gi)" \
        in error.message
    assert review(_model("m", pool="p", memory="4Gi"), None, {}, pool=_pool()).allowed, "4Gi fits 4Gi"


def test_a_pooled_model_whose_pool_does_not_exist_yet_is_allowed() -> None:
    """GitOps applies a pool and its models in any order: the operator reports PoolNotFound meanwhile."""
    assert review(_model("m", pool="p", memory="500Gi"), None, {}, pool=None).allowed
    assert review(_model("m", pool="p", memory="500Gi"), None, {}, pool=_pool("other")).allowed, "not its pool"


def test_an_ensemble_counts_the_steps_it_reaches_and_is_refused_at_spec_pool() -> None:
    steps = {"s1": _model("s1", pool="p", memory="3Gi"), "s2": _model("s2", pool="p", memory="2Gi")}
    verdict = review(_ensemble("s1", "s2"), None, steps, pool=_pool())
    assert [(e.path, e.rule) for e in verdict.errors] == [("spec.pool", "pool-capacity")], verdict.errors
    assert "with its steps (s1 3Gi, s2 2Gi)" in verdict.errors[0].message
    assert review(_ensemble("s1", "s2"), None, steps, pool=_pool(capacity={"memoryPerReplica": "5Gi"})).allowed


def test_a_step_that_grows_past_what_its_ensemble_and_steps_fit_is_refused_naming_spec_memory_and_the_ensemble() -> None:
    """Each step fits a replica (4Gi) alone, but the ensemble is placed with both steps on the same replicas: s1 grown
    from 1Gi to 3Gi makes 5Gi. The update is refused at the step's spec.memory, naming the ensemble; growing it to
    2Gi (4Gi in all) is not."""
    s1, s2 = _model("s1", pool="p", memory="1Gi"), _model("s2", pool="p", memory="2Gi")
    ens = _ensemble("s1", "s2")
    assert review(ens, None, {"s1": s1, "s2": s2}, pool=_pool()).allowed, "1Gi + 2Gi fits"
    grown = copy.deepcopy(s1)
    grown["spec"]["memory"] = "3Gi"
    verdict = review(grown, s1, {"ens": ens, "s2": s2}, dependents=["ens"], pool=_pool())
    assert not verdict.allowed
    assert [(e.path, e.rule) for e in verdict.errors] == [("spec.memory", "pool-capacity")], verdict.errors
    message = verdict.errors[0].message
    assert "a copy of ensemble 'ens', placed with its steps on the same replicas, takes 5Gi (ens 0, s1 3Gi, s2 2Gi)" \
        in message and "more than a replica of pool 'p' holds (spec.capacity.memoryPerReplica gives 4Gi)" in message
    fits = copy.deepcopy(s1)
    fits["spec"]["memory"] = "2Gi"
    assert review(fits, s1, {"ens": ens, "s2": s2}, dependents=["ens"], pool=_pool()).allowed, "2Gi + 2Gi fits 4Gi"
    # Created at 3Gi under an ensemble already there: refused as well.
    assert not review(grown, None, {"ens": ens, "s2": s2}, dependents=["ens"], pool=_pool()).allowed


def test_a_step_change_that_does_not_make_its_ensemble_fit_less_is_not_refused_for_it() -> None:
    """An ensemble that already did not fit (the pool was read smaller than it was placed on, say) does not block an
    unrelated change of its step: what is refused is the change that strands it."""
    s1, s2 = _model("s1", pool="p", memory="3Gi"), _model("s2", pool="p", memory="2Gi")
    relabelled = copy.deepcopy(s1)
    relabelled["spec"]["maxBatchSize"] = 8
    assert review(relabelled, s1, {"ens": _ensemble("s1", "s2"), "s2": s2}, dependents=["ens"], pool=_pool()).allowed


def test_a_pooled_model_with_a_pvc_source_or_its_own_credentials_is_refused_by_name() -> None:
    body = _model("m", pool="p", memory="1Gi")
    body["spec"]["source"] = {"uri": "pvc://models/m/"}
    verdict = review(body, None, {}, pool=_pool())
    assert [(e.path, e.rule) for e in verdict.errors] == [("spec.source.uri", "pool-source")]
    assert "mounts no model's PersistentVolumeClaim" in verdict.errors[0].message
    body["spec"]["source"] = {"uri": "s3://models/m/", "credentialsSecret": "s3-keys"}
    verdict = review(body, None, {}, pool=_pool())
    assert [(e.path, e.rule) for e in verdict.errors] == [("spec.source.credentialsSecret", "pool-source")]
    body["spec"]["source"] = {"uri": "s3://models/m/"}
    assert review(body, None, {}, pool=_pool()).allowed  # the pool's own credentials fetch it


def test_a_pooled_model_asking_for_the_cache_of_a_pool_without_one_is_refused_naming_spec_response_cache() -> None:
    """A pool's replicas have one response cache, sized by its spec.server.cacheSize (a pooled model's own is not
    used): with 0, Triton accepts the model's config and caches nothing, as for a model's own server of cacheSize 0."""
    no_cache = _pool(server={"cacheSize": "0"})
    verdict = review(_model("m", pool="p", memory="1Gi", responseCache=True), None, {}, pool=no_cache)
    assert [(e.path, e.rule) for e in verdict.errors] == [("spec.responseCache", "response-cache-size")], verdict.errors
    assert "pool 'p' has no response cache (its spec.server.cacheSize is 0)" in verdict.errors[0].message
    assert review(_model("m", pool="p", memory="1Gi"), None, {}, pool=no_cache).allowed, "no cache asked for"
    assert review(_model("m", pool="p", memory="1Gi", responseCache=True), None, {}, pool=_pool()).allowed, (
        "the pool's default cacheSize, 64Mi")


def test_a_pool_is_checked_on_its_own_when_created() -> None:
    verdict = review_pool(_pool(capacity={"memoryPerReplica": "1Gi", "memoryPerGpu": "1Gi"}), None)
    assert [(e.model, e.path) for e in verdict.errors] == [("TritonPool/p", "spec.capacity")]
    assert review_pool(_pool(), None, _placed()).allowed


def test_a_pool_with_an_unknown_placement_strategy_is_refused_naming_the_field() -> None:
    """The CRD's enum refuses it first at the API server; the webhook's own verdict names the same field."""
    verdict = review_pool(_pool(placement={"strategy": "Balanced"}), _pool(), _placed())
    assert [(e.path, e.message) for e in verdict.errors] == [
        ("spec.placement.strategy", "Input should be 'Spread' or 'Pack'")]
    assert review_pool(_pool(placement={"strategy": "Pack"}), _pool(), _placed()).allowed


def test_a_pool_change_that_would_strand_placed_models_is_refused_naming_the_field() -> None:
    old = _pool()
    smaller = _pool(capacity={"memoryPerReplica": "3Gi"})
    verdict = review_pool(smaller, old, _placed())
    assert [(e.path, e.rule) for e in verdict.errors] == [("spec.capacity.memoryPerReplica", "pool-change")]
    assert "replica p-pool-x holds 4Gi of them (a, b)" in verdict.errors[0].message
    fewer = _pool(replicas=1)
    verdict = review_pool(fewer, old, _placed())
    assert {e.path for e in verdict.errors} == {"spec.replicas"}
    assert any("b has 2 copies on distinct replicas, more than 1 replicas" in e.message for e in verdict.errors)


def test_a_pool_change_that_strands_nothing_is_allowed() -> None:
    old = _pool()
    assert review_pool(_pool(capacity={"memoryPerReplica": "8Gi"}), old, _placed()).allowed
    assert review_pool(_pool(replicas=3), old, _placed()).allowed
    # Models of another pool, or not placed yet, hold nothing on this one.
    unplaced = [_model("a", None, pool="p", memory="3Gi"), _model("c", ["q-pool-z"], pool="q", memory="8Gi")]
    assert review_pool(_pool(capacity={"memoryPerReplica": "1Gi"}, replicas=1), old, unplaced).allowed


def test_a_pool_already_stranding_on_a_field_is_not_blocked_from_other_changes() -> None:
    """A placement a lagging review let through must not freeze the pool: a change of its image is allowed."""
    old = _pool(capacity={"memoryPerReplica": "3Gi"})
    new = _pool(capacity={"memoryPerReplica": "3Gi"}, server={"image": "nvcr.io/nvidia/tritonserver:24.11-py3"})
    assert review_pool(new, old, _placed()).allowed


def test_the_redacted_pool_verdict_names_the_field_not_the_models_or_replicas() -> None:
    verdict = review_pool(_pool(capacity={"memoryPerReplica": "3Gi"}), _pool(), _placed())
    told = redacted(verdict, _pool())
    assert not told.allowed and [(e.path, e.message) for e in told.errors] == [
        ("spec.capacity.memoryPerReplica", UNTOLD_STRANDED)]
    assert "p-pool-x" not in told.message and "(a, b)" not in told.message


def test_the_webhook_configuration_sends_tritonpools_too() -> None:
    obj = render_webhook_configuration("c", WebhookTarget(url="https://127.0.0.1:9443"), "")
    ((rule,),) = [hook["rules"] for hook in obj["webhooks"]]  # type: ignore[attr-defined]
    assert rule["resources"] == ["tritonmodels", "tritonpools", "tritonpools/scale"]
    assert rule["operations"] == ["CREATE", "UPDATE"]


# -- through the webhook -----------------------------------------------------------------------


class _Reviewer:
    def __init__(self, api: FakeModelsApi) -> None:
        self.api = api
        self.loop = asyncio.new_event_loop()
        self.hook = AdmissionWebhook(api, WebhookTarget(url="https://127.0.0.1:9443"),  # type: ignore[arg-type]
                                     configuration="t", failure_policy="Fail", namespaces=[], clusterwide=True,
                                     address="127.0.0.1", port=0)
        self.hook.informer.start()
        assert self.loop.run_until_complete(self.hook.informer.wait_synced(10)), "the informer never listed"

    def review(self, obj: dict, old: dict | None = None, operation: str | None = None,
               **more: Any) -> dict[str, Any]:
        req = {"uid": "u", "namespace": NS, "operation": operation or ("UPDATE" if old else "CREATE"), "object": obj,
               "oldObject": old, **more}
        return self.loop.run_until_complete(self.hook._review(req))

    def close(self) -> None:
        self.hook.informer.stop()
        self.hook._dir.cleanup()
        self.loop.close()


@pytest.fixture
def reviewer() -> Iterator[Any]:
    made: list[_Reviewer] = []

    def make(api: FakeModelsApi) -> _Reviewer:
        made.append(_Reviewer(api))
        return made[-1]

    yield make
    for r in made:
        r.close()


def test_the_webhook_reads_the_pool_a_model_names_and_refuses_one_too_large(reviewer) -> None:
    api = FakeModelsApi([], [_pool()])
    r = reviewer(api)
    response = r.review(_model("big", pool="p", memory="6Gi"))
    assert response.get("allowed") is False, response
    (cause,) = response["status"]["details"]["causes"]
    assert cause["field"] == "spec.memory" and response["status"]["details"]["kind"] == "TritonModel"
    assert "get pool team-a/p" in api.calls, api.calls
    assert r.review(_model("small", pool="p", memory="1Gi")).get("allowed") is not False
    assert r.review(_model("elsewhere", pool="not-yet", memory="600Gi")).get("allowed") is not False, (
        "a pool that does not exist yet refuses nothing")
    calls = len(api.calls)
    assert r.review(_model("own", replicas=1)).get("allowed") is not False
    assert len(api.calls) == calls, f"a model on no pool reads no pool: {api.calls[calls:]}"


def test_an_update_by_the_api_server_gets_the_figures(reviewer) -> None:
    """The API server's UPDATE carries the stored uid: the answer is whole, with the pool's capacity."""
    stored = _model("big", pool="p", memory="1Gi")
    api = FakeModelsApi([stored], [_pool()])
    r = reviewer(api)
    bigger = copy.deepcopy(stored)
    bigger["spec"]["memory"] = "6Gi"
    response = r.review(bigger, stored)
    assert response.get("allowed") is False
    assert "spec.memory: a copy takes 6Gi, more than a replica of pool 'p' holds" in response["status"]["message"]


def test_the_webhook_refuses_a_pool_change_that_would_strand_placed_models(reviewer) -> None:
    old = _pool()
    api = FakeModelsApi(_placed(), [old])
    r = reviewer(api)
    response = r.review(_pool(capacity={"memoryPerReplica": "3Gi"}), old)
    assert response.get("allowed") is False, response
    status = response["status"]
    assert status["details"]["kind"] == "TritonPool" and status["details"]["name"] == "p"
    assert [c["field"] for c in status["details"]["causes"]] == ["spec.capacity.memoryPerReplica"]
    assert "would strand placed models: replica p-pool-x holds 4Gi of them (a, b)" in status["message"], (
        "the API server's UPDATE carries the stored uid: the whole answer")
    assert api.count(f"list {NS}") == 1, "placements are in the models' status, which the watch's cache does not keep"
    # A spec change that does not touch what the pool holds reads no model.
    image = _pool(server={"image": "nvcr.io/nvidia/tritonserver:24.11-py3"})
    assert r.review(image, old).get("allowed") is not False
    assert api.count(f"list {NS}") == 1, api.calls
    # Deleting a pool is not reviewed (its models report PoolNotFound).
    assert r.review(old, old, operation="DELETE") == {}


def test_a_stranding_change_from_a_caller_without_the_stored_uid_learns_no_model_and_costs_no_list(reviewer) -> None:
    """A review without the stored pool's uid is not the API server's (which always sends it): the webhook does not
    LIST the namespace's models for it (issue 39: anyone could make every replica parse a whole namespace), and its
    answer names no model or replica; a refusal on the pool's own rules is still redacted."""
    old = _pool()
    api = FakeModelsApi(_placed(), [old])
    r = reviewer(api)
    forged = copy.deepcopy(old)
    forged["metadata"]["uid"] = "guessed"
    response = r.review(_pool(capacity={"memoryPerReplica": "3Gi"}), forged)
    assert api.count(f"list {NS}") == 0, api.calls
    assert "p-pool-x" not in json.dumps(response) and "(a, b)" not in json.dumps(response), response
    own = r.review(_pool(capacity={"memoryPerReplica": "1Gi", "memoryPerGpu": "1Gi"}), forged)
    assert own.get("allowed") is False and "spec.capacity" in own["status"]["message"], own
    assert api.count(f"list {NS}") == 0, api.calls
    # The API server's own review of the same change (the stored uid) is LISTed and refused in full.
    refused = r.review(_pool(capacity={"memoryPerReplica": "3Gi"}), old)
    assert refused.get("allowed") is False and "p-pool-x" in refused["status"]["message"], refused
    assert api.count(f"list {NS}") == 1, api.calls


def _scale(replicas: int, uid: str = "uid-pool-p") -> dict[str, Any]:
    """The Scale the API server reviews for `kubectl scale tritonpool p --replicas=N`."""
    return {"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": "p", "namespace": NS, "uid": uid}, "spec": {"replicas": replicas}}


def test_scaling_a_pool_through_its_scale_subresource_is_reviewed_as_the_same_change(reviewer) -> None:
    api = FakeModelsApi(_placed(), [_pool()])
    r = reviewer(api)
    where = {"resource": {"group": "serving.triton-operator.dev", "version": "v1alpha1", "resource": "tritonpools"},
             "subResource": "scale"}
    response = r.review(_scale(1), _scale(2), **where)
    assert response.get("allowed") is False, response
    assert response["status"]["details"]["kind"] == "TritonPool"
    assert "spec.replicas: would strand placed models: b has 2 copies" in response["status"]["message"]
    assert r.review(_scale(3), _scale(2), **where).get("allowed") is not False
    lists = api.count(f"list {NS}")
    forged = r.review(_scale(1, uid="guessed"), _scale(2, uid="guessed"), **where)
    assert "b has 2 copies" not in json.dumps(forged) and api.count(f"list {NS}") == lists, (forged, api.calls)


def test_the_webhook_refuses_a_step_update_that_strands_the_ensemble_using_it(reviewer) -> None:
    """The ensembles using the step come from the informer's step graph (the webhook's dependents), with the other
    steps they reach: the step's update is refused naming its spec.memory and the ensemble."""
    stored = _model("s1", pool="p", memory="1Gi")
    api = FakeModelsApi([stored, _model("s2", pool="p", memory="2Gi"), _ensemble("s1", "s2")], [_pool()])
    r = reviewer(api)
    grown = copy.deepcopy(stored)
    grown["spec"]["memory"] = "3Gi"
    response = r.review(grown, stored)
    assert response.get("allowed") is False, response
    (cause,) = response["status"]["details"]["causes"]
    assert cause["field"] == "spec.memory", cause
    assert "a copy of ensemble 'ens', placed with its steps on the same replicas, takes 5Gi" in response["status"][
        "message"], response["status"]["message"]
    fits = copy.deepcopy(stored)
    fits["spec"]["memory"] = "2Gi"
    assert r.review(fits, stored).get("allowed") is not False


# -- one Triton name per pool (rule pool-triton-name) --------------------------------------------


def test_a_model_taking_the_triton_name_of_another_on_its_pool_is_refused_naming_spec_model_name() -> None:
    taker = _model("b", pool="p", memory="1Gi", modelName="a")
    verdict = review(taker, None, {}, pool=_pool(), on_pool={"a": "a", "c": "c"})
    assert [(e.path, e.rule) for e in verdict.errors] == [("spec.modelName", "pool-triton-name")], verdict.errors
    assert "Triton name 'a' is taken on pool 'p' by TritonModel a" in verdict.errors[0].message
    assert review(taker, None, {}, pool=_pool(), on_pool={"c": "c"}).allowed, "no other model loads as a"
    # A model named like another's spec.modelName: refused at spec.pool (it has no modelName to change).
    plain = _model("a", pool="p", memory="1Gi")
    verdict = review(plain, None, {}, pool=_pool(), on_pool={"b": "a"})
    assert [(e.path, e.rule) for e in verdict.errors] == [("spec.pool", "pool-triton-name")], verdict.errors
    # An update of a model that had this name on this pool already is not refused again (the older one keeps it).
    assert review(taker, copy.deepcopy(taker), {}, pool=_pool(), on_pool={"a": "a"}).allowed


def test_the_webhook_refuses_a_second_model_of_one_triton_name_on_a_pool_even_one_created_a_moment_ago(
        reviewer) -> None:
    """The informer's models on the pool, and the model whose name the newcomer takes read fresh when the informer
    lacks it (created a moment ago)."""
    api = FakeModelsApi([_model("a", pool="p", memory="1Gi")], [_pool()])
    r = reviewer(api)
    response = r.review(_model("a2", pool="p", memory="1Gi", modelName="a"))
    assert response.get("allowed") is False, response
    (cause,) = response["status"]["details"]["causes"]
    assert cause["field"] == "spec.modelName", cause
    assert r.review(_model("c", pool="p", memory="1Gi", modelName="c2")).get("allowed") is not False
    assert r.review(_model("d", pool="q", memory="1Gi", modelName="a")).get("allowed") is not False, "another pool"
    # Created after the informer listed (its watch here delivers nothing): read with a GET.
    api.models[(NS, "late")] = _model("late", pool="p", memory="1Gi")
    response = r.review(_model("b", pool="p", memory="1Gi", modelName="late"))
    assert response.get("allowed") is False, response
    assert f"get {NS}/late" in api.calls, api.calls


# -- a model named after a pool's own objects (rule pool-object-names) -----------------------------------------


def test_a_model_named_after_a_pools_objects_is_refused_and_so_is_the_pool_created_after_it(reviewer) -> None:
    """A TritonModel `p-pool` beside the TritonPool `p` would take the names of the pool's Deployment, PDB and HPA
    (issue 39): refused at its creation, naming metadata.name, when the pool exists; and a pool created after such a
    model is refused too. Another name, or the same name with no such pool, is allowed."""
    api = FakeModelsApi([], [_pool()])
    r = reviewer(api)
    response = r.review(_model("p-pool", replicas=1))
    assert response.get("allowed") is False, response
    assert [c["field"] for c in response["status"]["details"]["causes"]] == ["metadata.name"], response
    assert "Deployment, PodDisruptionBudget and HorizontalPodAutoscaler" in response["status"]["message"]
    assert r.review(_model("q-pool", replicas=1)).get("allowed") is not False, "no pool q: nothing clashes"
    assert r.review(_model("p-pools", replicas=1)).get("allowed") is not False

    api = FakeModelsApi([_model("q-pool", replicas=1)], [])
    r = reviewer(api)
    response = r.review(_pool("q"))
    assert response.get("allowed") is False and "q-pool" in response["status"]["message"], response
    assert r.review(_pool("other")).get("allowed") is not False
