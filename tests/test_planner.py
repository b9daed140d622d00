"""The reconcile's decisions, pure: `plan.planner.plan(World) -> Plan`.

A small in-memory API server (`_Api`) stands in for the cluster only to carry plans out: it stores what is
applied (adding the server-side fields a real one adds), deletes, and answers reads. The decisions
themselves are the planner's, unchanged. The e2e "0 writes on a second reconcile" tests check the same
idempotence against a real API server; `e2e/test_reconciler.py` calls the real `Reconciler` twice.
"""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.planner_world import NS, T0, _Api, _body, _conditions, _settle, _world
from triton_operator.api import steps as step_graph
from triton_operator.api.kinds import LABEL_MODEL
from triton_operator.api.pod import ANNOTATION_DIGEST, ANNOTATION_LOADED, WARMED_CONDITION
from triton_operator.api.v1alpha1 import TritonModelStatus
from triton_operator.plan.planner import (
    ApiFailure,
    Apply,
    Plan,
    Read,
    World,
    carried_out,
    contains,
    differs,
    plan,
    steps_to_revisit,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _ensemble(name: str, step: str) -> dict[str, Any]:
    body = _body(name, uid=f"uid-{name}", platform="ensemble",
                 inputs=[{"name": "IN", "dataType": "FP32", "dims": [4]}],
                 outputs=[{"name": "OUT", "dataType": "FP32", "dims": [4]}],
                 ensemble={"steps": [{"model": step, "inputMap": {"INPUT0": "IN"}, "outputMap": {"OUTPUT0": "OUT"}}]})
    del body["spec"]["backend"], body["spec"]["source"]
    return body


def _pod(name: str, digest: str, *, warm: bool, ready: bool, terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": {LABEL_MODEL: "m"},
                            "annotations": {ANNOTATION_DIGEST: digest}}
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"readinessGates": [{"conditionType": WARMED_CONDITION}]},
        "status": {
            "podIP": "198.18.200.10",
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"},
                {"type": WARMED_CONDITION, "status": "True" if warm else "False",
                 "reason": "ModelWarmed" if warm else "ModelWarming", "lastTransitionTime": "2026-01-01T00:00:05Z"},
            ],
            "containerStatuses": [{"name": "tritonserver", "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}],
        },
    }


# -- decisions -------------------------------------------------------------------------------------


def test_a_new_model_applies_its_children_in_order_and_reports_that_it_rolls_out() -> None:
    decided = plan(_world(_body(replicas=2)))
    assert [a.obj["kind"] for a in decided.apply] == ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget"]
    assert not any(a.verify for a in decided.apply), "a model with no status was never reconciled: nothing to verify"
    assert isinstance(decided.status, TritonModelStatus)
    conds = {c.type: c for c in decided.status.conditions or ()}
    assert conds["Ready"].status == "False" and conds["Ready"].reason == "ReplicasWarming"
    assert conds["Progressing"].reason == "RollingOut"
    assert decided.status_patch is not None and decided.status_patch["configDigest"] == decided.digest
    # A model on its way is no warning, and its first status gets one Event: Ready's (Progressing=True and
    # Degraded=False are what every new model says).
    assert [(e.condition, e.type, e.reason) for e in decided.events] == [("Ready", "Normal", "ReplicasWarming")]


def test_a_reconciled_model_whose_child_the_cache_lacks_verifies_it_in_apply_order() -> None:
    first = plan(_world(_body()))
    body = _body(status=first.status_patch)
    decided = plan(_world(body))
    assert [(a.obj["kind"], a.verify) for a in decided.apply] == [
        ("ConfigMap", True), ("Deployment", True), ("Service", True)], "read each first: it may exist unchanged"


def test_a_verified_child_is_applied_only_if_it_differs() -> None:
    *_, service = [a.obj for a in plan(_world(_body())).apply]
    assert differs(None, service), "not there: apply"
    assert not differs({**service, "status": {"loadBalancer": {}}}, service), "there, with server fields: leave it"
    assert differs({**service, "spec": {**service["spec"], "selector": {"other": "x"}}}, service)


def test_a_child_read_and_not_found_is_applied() -> None:
    first = plan(_world(_body()))
    body = _body(status=first.status_patch)
    gone = {(a.obj["kind"], a.obj["metadata"]["name"]): None for a in first.apply}
    decided = plan(_world(body, children=gone))
    assert [(a.obj["kind"], a.verify) for a in decided.apply] == [("ConfigMap", False), ("Deployment", False),
                                                                 ("Service", False)]


def test_a_child_that_drifted_is_applied_again_and_only_that_one() -> None:
    api, cache = _Api(), {}
    world, _ = _settle(_world(_body()), api, cache)
    drifted = copy.deepcopy(cache[("Service", "m")])
    drifted["spec"]["ports"][0]["port"] = 9999
    decided = plan(replace(world, children={**world.children, ("Service", "m"): drifted}))
    assert [a.obj["kind"] for a in decided.apply] == ["Service"]


def test_scaling_to_one_replica_deletes_the_pdb() -> None:
    api, cache = _Api(), {}
    world, _ = _settle(_world(_body(replicas=3)), api, cache)
    assert ("PodDisruptionBudget", "m") in world.children
    one = {**world.body, "spec": {**world.body["spec"], "replicas": 1}}
    decided = plan(replace(world, body=one, models={"m": one}))
    assert [(d.kind, d.name) for d in decided.delete] == [("PodDisruptionBudget", "m")]


def test_old_repositories_are_deleted_once_no_replicaset_uses_them() -> None:
    api, cache = _Api(), {}
    # NewPods: the Deployment's template moves to the new config (in place it keeps the old one, and its ConfigMap:
    # tests/test_rollout.py).
    world, _ = _settle(_world(_body(rollout={"strategy": "NewPods"})), api, cache)
    old_repo = next(n for k, n in world.children if k == "ConfigMap")
    old_rs = {"kind": "ReplicaSet", "metadata": {"name": "m-1", "labels": {LABEL_MODEL: "m"}},
              "spec": {"replicas": 1, "template": api.objects[("Deployment", "m")]["spec"]["template"]},
              "status": {"replicas": 1}}
    api.objects[("ReplicaSet", "m-1")] = old_rs
    changed = {**world.body, "spec": {**world.body["spec"], "maxBatchSize": 8}, "metadata": {**world.body["metadata"], "generation": 2}}
    world = replace(world, body=changed, models={"m": changed})
    first = plan(world)
    # An old repository ConfigMap is cached besides the new one: which ReplicaSets still use it?
    assert [r.kind for r in first.reads] == ["ReplicaSet"] and not first.delete, "nothing deleted before knowing"
    world, decided = _settle(world, api, cache)
    assert not decided.delete, "the old ReplicaSet still has a replica: its repository stays"
    old_rs["spec"]["replicas"] = 0
    old_rs["status"]["replicas"] = 0
    world, decided = _settle(world, api, cache)
    assert [(d.kind, d.name) for d in decided.delete] == [("ConfigMap", old_repo)]


def test_a_missing_step_model_deploys_nothing_and_says_which() -> None:
    ens = _ensemble("ens", "absent")
    decided = plan(_world(ens))
    assert not decided.apply
    assert decided.problem is not None and decided.problem.reason == "StepModelMissing"
    assert "absent" in decided.problem.message
    conds = {c.type: c for c in decided.status.conditions or ()}  # type: ignore[union-attr]
    assert conds["Degraded"].status == "True"
    assert {e.condition: e.type for e in decided.events}["Degraded"] == "Warning"


def test_an_ensemble_deploys_once_its_step_exists() -> None:
    ens = _ensemble("ens", "m")
    step = _body(inputs=[{"name": "INPUT0", "dataType": "FP32", "dims": [4]}],
                 outputs=[{"name": "OUTPUT0", "dataType": "FP32", "dims": [4]}])
    decided = plan(_world(ens, models={"m": step}))
    assert decided.problem is None, decided.problem
    assert [a.obj["kind"] for a in decided.apply] == ["ConfigMap", "Deployment", "Service"]


def test_an_invalid_spec_is_degraded_and_writes_no_child() -> None:
    decided = plan(_world(_body(maxBatchSize=4, batcher={"preferredBatchSize": [8]})))
    assert not decided.apply and decided.problem is not None and decided.problem.reason == "InvalidSpec"
    assert "spec.batcher.preferredBatchSize" in decided.problem.message


@pytest.mark.parametrize(("field", "value", "path"), [
    ("batcher", {"defaultQueuePolicy": {"maxQueueSize": 2**32}}, "spec.batcher.defaultQueuePolicy.maxQueueSize"),
    ("sequenceBatcher", {"oldest": {"maxCandidateSequences": 2**31}}, "spec.sequenceBatcher.oldest.maxCandidateSequences"),
])
def test_a_number_beyond_tritons_proto_is_degraded_naming_the_field_not_a_failed_reconcile(
        field: str, value: dict[str, Any], path: str) -> None:
    """The review's finding: these passed the CRD and the webhook, then every reconcile raised `ValueError: Value
    out of range` and the status said nothing."""
    decided = plan(_world(_body(maxBatchSize=4, **{field: value})))
    assert not decided.apply and decided.problem is not None and decided.problem.reason == "InvalidSpec"
    assert path in decided.problem.message, decided.problem.message
    conds = {c.type: c for c in decided.status.conditions or ()}  # type: ignore[union-attr]
    assert (conds["Degraded"].status, conds["Degraded"].reason) == ("True", "InvalidSpec")


@pytest.mark.parametrize("where", ["render_repository", "render_children"])
def test_a_render_that_fails_is_degraded_render_failed_with_the_message_and_planned_again_writes_nothing(
        where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec the checks pass but the renderer cannot render (a defect of the operator's) is said on the status, not
    raised: a raised error would be retried with back-off forever, with nothing on the TritonModel."""
    from triton_operator.plan import planner

    def out_of_range(*_: Any, **__: Any) -> Any:
        raise ValueError("Value out of range: 4294967296")

    monkeypatch.setattr(planner, where, out_of_range)
    world = _world(_body())
    decided = plan(world)
    assert not decided.apply and decided.problem is not None and decided.problem.reason == "RenderFailed"
    conds = {c.type: c for c in decided.status.conditions or ()}  # type: ignore[union-attr]
    assert (conds["Degraded"].status, conds["Degraded"].reason) == ("True", "RenderFailed")
    assert "ValueError: Value out of range: 4294967296" in conds["Degraded"].message
    assert ("Degraded", "Warning") in {(e.condition, e.type) for e in decided.events}
    # The status written, the next reconcile of the same spec has nothing to do: no hot retry.
    assert plan(carried_out(world, decided)).writes_nothing


def test_a_persistent_api_error_is_degraded_api_error_naming_the_verb_and_the_kind() -> None:
    world = _world(_body())
    refused = ApiFailure("apply", "Deployment", "team-a/m", 403, "Forbidden", 'deployments.apps "m" is forbidden')
    decided = plan(replace(world, api_error=refused))
    conds = {c.type: c for c in decided.status.conditions or ()}  # type: ignore[union-attr]
    assert (conds["Degraded"].status, conds["Degraded"].reason) == ("True", "ApiError")
    assert conds["Degraded"].message == 'apply Deployment team-a/m: 403 Forbidden: deployments.apps "m" is forbidden'
    assert ("Degraded", "Warning") in {(e.condition, e.type) for e in decided.events}


@pytest.mark.parametrize("status", [409, 429, 500, 503])
def test_a_transient_api_error_is_nothing_to_the_planner(status: int) -> None:
    world = _world(_body())
    passing = ApiFailure("apply", "Deployment", "team-a/m", status, "Whatever", "try again")
    assert plan(replace(world, api_error=passing)) == plan(world)


def test_serving_replicas_make_the_model_ready_and_the_transition_an_event() -> None:
    api, cache = _Api(), {}
    world, first = _settle(_world(_body(replicas=2)), api, cache)
    digest = first.digest
    assert digest
    pods = [_pod("m-a", digest, warm=True, ready=True), _pod("m-b", digest, warm=True, ready=True)]
    decided = plan(replace(world, pods=pods, now=T0 + dt.timedelta(seconds=30)))
    conds = {c.type: c for c in decided.status.conditions or ()}  # type: ignore[union-attr]
    assert conds["Ready"].status == "True" and conds["Ready"].reason == "AllReplicasWarmed"
    assert conds["Ready"].last_transition_time == "2026-01-01T00:00:30Z", "Ready flipped: a new transition time"
    assert conds["Degraded"].last_transition_time == "2026-01-01T00:00:00Z", "Degraded held: its time is kept"
    assert [(e.condition, e.reason) for e in decided.events] == [("Ready", "AllReplicasWarmed"), ("Progressing", "RolloutComplete")]


def test_a_removed_status_field_is_nulled_in_the_patch() -> None:
    stale = {"configDigest": "old", "observedGeneration": 1, "somethingWeNoLongerWrite": 3}
    decided = plan(_world(_body(status=stale), children={}))
    assert decided.status_patch is not None and decided.status_patch["somethingWeNoLongerWrite"] is None


def test_reads_are_a_read_not_a_write() -> None:
    reading = Plan(reads=(Read("apps/v1", "ReplicaSet"),))
    assert reading.writes_nothing and not reading.empty
    assert not Plan(apply=(Apply({"kind": "Service"}),)).writes_nothing
    assert Plan().empty


# -- step models served by their ensembles (issue 12 #6) ---------------------------------------------


def _step(name: str = "m", **spec: Any) -> dict[str, Any]:
    return _body(name, uid=f"uid-{name}", inputs=[{"name": "INPUT0", "dataType": "FP32", "dims": [4]}],
                 outputs=[{"name": "OUTPUT0", "dataType": "FP32", "dims": [4]}], **spec)


def _ens(name: str, step: str, *, replicas: int = 1, tensors: tuple[str, str] = ("INPUT0", "OUTPUT0"),
         **meta: Any) -> dict[str, Any]:
    body = _ensemble(name, step)
    body["spec"]["replicas"] = replicas
    body["spec"]["ensemble"]["steps"][0].update(inputMap={tensors[0]: "IN"}, outputMap={tensors[1]: "OUT"})
    body["metadata"].update(meta)
    return body


def test_a_step_at_zero_replicas_is_served_by_its_ensemble_and_its_status_says_so() -> None:
    step = _step(replicas=0)
    decided = plan(_world(step, models={"ens": _ens("ens", "m")}))
    assert decided.problem is None, decided.problem
    assert decided.status is not None and decided.status.served_by == ["ens"]
    ready = _conditions(decided)["Ready"]
    assert (ready.status, ready.reason) == ("True", "ServedByEnsembles")
    assert "ens" in (ready.message or "") and "no replica of its own" in (ready.message or "")
    assert _conditions(decided)["Degraded"].status == "False"
    assert decided.status_patch is not None and decided.status_patch["servedBy"] == ["ens"]
    # Its children stay, at zero: no pod, no GPU, and `kubectl scale` brings it back by this one number.
    kids = {a.obj["kind"]: a.obj for a in decided.apply}
    assert set(kids) == {"ConfigMap", "Deployment", "Service"}
    assert kids["Deployment"]["spec"]["replicas"] == 0
    assert {e.condition: e.type for e in decided.events}["Ready"] == "Normal"


def test_a_model_at_zero_replicas_that_no_ensemble_runs_says_nothing_serves_it() -> None:
    alone = plan(_world(_step(replicas=0)))
    ready = _conditions(alone)["Ready"]
    assert ready.reason == "ScaledToZero" and "no ensemble uses it: nothing serves it" in (ready.message or "")
    assert alone.status is not None and alone.status.served_by is None
    assert alone.status_patch is not None and "servedBy" not in alone.status_patch
    # Used, but by an ensemble that runs no replica either: still nothing serves it, and the message says which.
    idle = plan(_world(_step(replicas=0), models={"ens": _ens("ens", "m", replicas=0)}))
    ready = _conditions(idle)["Ready"]
    assert ready.reason == "ScaledToZero" and "every ensemble that uses it (ens)" in (ready.message or "")
    assert idle.status is not None and idle.status.served_by is None
    # An ensemble on its way out serves nothing either.
    leaving = _ens("ens", "m", deletionTimestamp="2026-01-01T00:00:00Z")
    assert _conditions(plan(_world(_step(replicas=0), models={"ens": leaving})))["Ready"].reason == "ScaledToZero"
    # At zero the rollout has nothing to do, and says so.
    progressing = _conditions(alone)["Progressing"]
    assert (progressing.status, progressing.reason) == ("False", "RolloutComplete")
    assert "no replica of its own" in (progressing.message or "")


def test_nested_ensembles_serve_every_model_they_reach() -> None:
    """outer (2 replicas) -> inner (an ensemble at 0) -> m (at 0): outer's replicas load both."""
    inner = _ens("inner", "m", replicas=0)
    outer = _ens("outer", "inner", replicas=2, tensors=("IN", "OUT"))
    models = {"inner": inner, "outer": outer}
    for name, body in (("m", _step(replicas=0)), ("inner", inner)):
        decided = plan(_world(body, models={**models, "m": _step(replicas=0)}))
        assert decided.problem is None, (name, decided.problem)
        assert decided.status is not None and decided.status.served_by == ["outer"], name
        assert _conditions(decided)["Ready"].reason == "ServedByEnsembles", name


def test_a_step_with_replicas_of_its_own_is_ready_by_them_and_names_its_ensembles_too() -> None:
    decided = plan(_world(_step(replicas=2), models={"ens": _ens("ens", "m")}))
    assert decided.status is not None and decided.status.served_by == ["ens"]
    assert _conditions(decided)["Ready"].reason == "ReplicasWarming", "its own replicas decide its Ready"


def test_the_example_steps_run_no_replica_and_are_served_by_sentiment() -> None:
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all((EXAMPLES / "sentiment-ensemble.yaml").read_text()) if d}
    bodies = {name: {**d, "metadata": {**d["metadata"], "namespace": NS, "uid": f"uid-{name}", "generation": 1}}
              for name, d in docs.items()}
    for step in ("tokenizer", "classifier"):
        assert bodies[step]["spec"]["replicas"] == 0, step
        decided = plan(_world(bodies[step], models=bodies))
        assert decided.problem is None, decided.problem
        assert decided.status is not None and decided.status.served_by == ["sentiment"], step
        assert _conditions(decided)["Ready"].reason == "ServedByEnsembles", step
    assert plan(_world(bodies["sentiment"], models=bodies)).status.served_by is None  # type: ignore[union-attr]


def test_an_ensemble_created_after_its_step_turns_the_steps_status_and_that_is_an_event() -> None:
    api, cache = _Api(), {}
    world, first = _settle(_world(_step(replicas=0)), api, cache)
    assert _conditions(first)["Ready"].reason == "ScaledToZero"
    assert plan(world).writes_nothing
    with_ensemble = replace(world, models={**world.models, "ens": _ens("ens", "m")}, now=T0 + dt.timedelta(seconds=9))
    decided = plan(with_ensemble)
    assert not decided.apply, "the children do not change: the step still runs no replica of its own"
    assert decided.status_patch is not None and decided.status_patch["servedBy"] == ["ens"]
    assert [(e.condition, e.reason, e.type) for e in decided.events] == [("Ready", "ServedByEnsembles", "Normal")]
    settled, _ = _settle(with_ensemble, api, cache)
    assert plan(replace(settled, now=settled.now + dt.timedelta(seconds=5))).writes_nothing
    # The ensemble deleted: the servedBy field goes (nulled in the merge patch).
    gone = plan(replace(settled, models={k: v for k, v in settled.models.items() if k != "ens"}))
    assert gone.status_patch is not None and gone.status_patch["servedBy"] is None
    assert _conditions(gone)["Ready"].reason == "ScaledToZero"


def test_steps_to_revisit_are_those_an_ensembles_change_may_serve_or_stop_serving() -> None:
    inner = _ens("inner", "m", replicas=0)
    outer = _ens("outer", "inner", tensors=("IN", "OUT"))
    models = {"m": _step(replicas=0), "inner": inner, "outer": outer, "other": _step("other")}
    assert steps_to_revisit(None, outer, models) == ["inner", "m"], "created: every model it reaches"
    assert steps_to_revisit(outer, None, models) == ["inner", "m"], "deleted"
    assert steps_to_revisit(outer, {**outer, "status": {"observedGeneration": 1}}, models) == [], "a status write"
    scaled = {**outer, "spec": {**outer["spec"], "replicas": 0}}
    assert steps_to_revisit(outer, scaled, models) == ["inner", "m"]
    moved = _ens("outer", "other")
    assert steps_to_revisit(outer, moved, models) == ["inner", "m", "other"], "the old steps and the new"
    leaving = {**outer, "metadata": {**outer["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert steps_to_revisit(outer, leaving, models) == ["inner", "m"]
    plain = _step("other")
    assert steps_to_revisit(None, plain, models) == [], "a model with no steps serves none"
    assert steps_to_revisit(plain, {**plain, "spec": {**plain["spec"], "replicas": 3}}, models) == []


def test_users_are_every_ensemble_that_reaches_a_model_and_never_itself() -> None:
    bodies = {"a": _ens("a", "b"), "b": _ens("b", "m"), "c": _ens("c", "other"), "m": _step(),
              "loop1": _ens("loop1", "loop2"), "loop2": _ens("loop2", "loop1")}
    assert step_graph.users("m", bodies) == ["a", "b"]
    assert step_graph.users("a", bodies) == []
    assert step_graph.users("loop1", bodies) == ["loop2"]


# -- idempotence, property-wise ---------------------------------------------------------------------


@st.composite
def worlds(draw: Any) -> tuple[World, _Api, dict[tuple[str, str], Any]]:
    """A model (replicas, batching, a cache, a response cache, the gate), optionally reconciled before with
    some of its children lost from the cache or drifted, and replicas in any state at any digest."""
    spec: dict[str, Any] = {"replicas": draw(st.integers(0, 3))}
    if draw(st.booleans()):
        spec["maxBatchSize"] = draw(st.sampled_from([4, 8]))
        if draw(st.booleans()):
            spec["batcher"] = {"maxQueueDelayMicroseconds": draw(st.integers(0, 1000))}
    if draw(st.booleans()):
        spec["responseCache"] = True
    if draw(st.booleans()):
        spec["warmupGate"] = {"enabled": False}
    api, cache = _Api(), {}
    world = _world(_body(**spec), now=T0)
    if draw(st.booleans()):  # reconciled before, then changed
        world, _ = _settle(world, api, cache)
        if draw(st.booleans()):
            spec2 = {**spec, "replicas": draw(st.integers(0, 3))}
            body = _body(status=world.body.get("status"), generation=2, **spec2)
            world = replace(world, body=body, models={"m": body})
        for key in list(cache):
            what = draw(st.sampled_from(["keep", "lose", "drift"]))
            if what == "lose":
                cache.pop(key)
            elif what == "drift":
                cache[key] = {**cache[key], "metadata": {**cache[key]["metadata"], "labels": {LABEL_MODEL: "m"}}}
        world = replace(world, children=dict(cache))
    digest = plan(replace(world, children={k: api.objects.get(k) for k in world.children})).digest or "none"
    pods = []
    for i in range(draw(st.integers(0, 4))):
        at = draw(st.sampled_from([digest, "old"]))
        warm = draw(st.booleans())
        pods.append(_pod(f"m-{i}", at, warm=warm, ready=warm and draw(st.booleans()),
                         terminating=draw(st.booleans())))
    return replace(world, pods=pods, now=T0 + dt.timedelta(seconds=draw(st.integers(0, 100)))), api, cache


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_planning_again_over_a_plans_result_writes_nothing(case: tuple[World, _Api, dict[tuple[str, str], Any]]) -> None:
    world, api, cache = case
    after, _ = _settle(world, api, cache)
    writes = api.writes
    again, second = _settle(replace(after, now=after.now + dt.timedelta(seconds=5)), api, cache)
    assert not second.apply and not second.delete, f"second plan writes children: {second.apply} {second.delete}"
    assert second.status is None and not second.events, f"second plan rewrites the status: {second.status_patch}"
    assert api.writes == writes
    assert again.body == after.body


def test_contains_ignores_server_defaults_but_sees_changes() -> None:
    desired = {"spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}}}
    existing = {"spec": {"replicas": 2, "revisionHistoryLimit": 10,
                         "template": {"spec": {"containers": [{"name": "a", "image": "x", "imagePullPolicy": "IfNotPresent"}]}}}}
    assert contains(existing, desired)
    desired["spec"]["replicas"] = 3
    assert not contains(existing, desired)


# -- the warm-up gate's decision (plan.readiness) ----------------------------------------------------

from triton_operator.plan.readiness import (  # noqa: E402 - this section's own imports
    MESSAGE_REFRESH_SECONDS,
    gate_condition,
    loaded_to_record,
    message_refresh_due,
    with_condition,
)


def test_the_gate_writes_nothing_when_the_pod_already_says_so() -> None:
    pod = _pod("m-a", "d", warm=True, ready=True)
    assert gate_condition(pod, True, "ModelWarmed", "model m is READY", T0) is None


def test_the_gate_turning_true_stamps_the_transition_and_the_warm_up_time() -> None:
    pod = _pod("m-a", "d", warm=False, ready=False)
    write = gate_condition(pod, True, "ModelWarmed", "model m is READY", T0 + dt.timedelta(seconds=9))
    assert write is not None
    assert write.condition["status"] == "True" and write.condition["lastTransitionTime"] == "2026-01-01T00:00:09Z"
    assert write.warmup_seconds == 8.0, "the container started at 00:00:01"
    assert write.condition["message"].endswith("warmed 8.0s after tritonserver started")
    stored = {c["type"]: c for c in with_condition(pod, write.condition)}
    assert stored[WARMED_CONDITION]["status"] == "True" and stored["Ready"]["status"] == "False"


def test_the_loaded_digest_is_written_only_when_the_pods_annotations_cannot_say_it() -> None:
    created_for = {ANNOTATION_DIGEST: "d1"}
    assert loaded_to_record(created_for, "d1") is None, "serving what it was created for: its gate says so"
    assert loaded_to_record(created_for, None) is None, "Triton said nothing yet"
    # mid-reload: the pod was told d2 and Triton still has d1; then the reload lands d2
    told = {ANNOTATION_DIGEST: "d2"}
    assert loaded_to_record(told, "d1") == "d1"
    assert loaded_to_record({**told, ANNOTATION_LOADED: "d1"}, "d1") is None
    assert loaded_to_record({**told, ANNOTATION_LOADED: "d1"}, "d2") == "d2"


def test_a_new_reason_with_the_same_status_keeps_the_transition_time() -> None:
    pod = _pod("m-a", "d", warm=False, ready=False)  # False, ModelWarming, since 00:00:05
    write = gate_condition(pod, False, "ModelLoadFailed", "model m is UNAVAILABLE: boom", T0 + dt.timedelta(seconds=20))
    assert write is not None and "lastTransitionTime" not in write.condition and write.warmup_seconds is None
    stored = {c["type"]: c for c in with_condition(pod, write.condition)}
    assert stored[WARMED_CONDITION]["lastTransitionTime"] == "2026-01-01T00:00:05Z"


def test_a_heals_next_step_rewrites_the_message_under_the_same_reason() -> None:
    """Issue 33: while a replica heals, the gate keeps the cause as its reason (ModelLoadFailed, ModelFailing) and
    the message says what the heal does; a new heal step (`changed`) writes the new message, nothing else does."""
    pod = _pod("m-a", "d", warm=False, ready=False)
    first = gate_condition(pod, False, "ModelLoadFailed", "boom; healing (heal 1)", T0)
    assert first is not None
    pod["status"]["conditions"] = with_condition(pod, first.condition)
    assert gate_condition(pod, False, "ModelLoadFailed", "boom; next heal at 2026-01-01T00:00:02Z", T0) is None, \
        "the same reason and no new heal step: no write"
    again = gate_condition(pod, False, "ModelLoadFailed", "boom; next heal at 2026-01-01T00:00:02Z", T0, changed=True)
    assert again is not None and again.condition["reason"] == "ModelLoadFailed"
    assert "lastTransitionTime" not in again.condition, "still False: the transition time stays"
    assert gate_condition(pod, False, "ModelLoadFailed", "boom; healing (heal 1)", T0, changed=True) is None, \
        "a new step with the message already written: no write"


def test_a_false_gates_new_cause_under_the_same_reason_is_written_at_a_bounded_pace() -> None:
    """A replica first refused connections, then its server answered over the read cap: both TritonUnreachable. The
    gate said the first forever (a loaded CI run with 4 workers: e2e/test_hostile_replica.py read "Cannot connect"
    after 60 s of oversized answers). The new message is written once the last write is MESSAGE_REFRESH_SECONDS old,
    never more often; a True gate is written only when its reason changes."""
    pod = _pod("m-a", "d", warm=False, ready=False)
    first = gate_condition(pod, False, "TritonUnreachable", "Triton did not answer: Cannot connect", T0)
    assert first is not None
    pod["status"]["conditions"] = with_condition(pod, first.condition)
    oversized = "Triton did not answer: an answer of more than 4194304 bytes; at most 4194304 are read"
    soon = message_refresh_due(False, MESSAGE_REFRESH_SECONDS - 0.5)
    assert soon is False
    assert gate_condition(pod, False, "TritonUnreachable", oversized, T0, changed=soon) is None, "too soon: no write"
    due = message_refresh_due(False, MESSAGE_REFRESH_SECONDS)
    assert due is True and message_refresh_due(False, float("inf")) is True, "no write yet by this process"
    write = gate_condition(pod, False, "TritonUnreachable", oversized, T0, changed=due)
    assert write is not None and write.condition["message"] == oversized
    assert "lastTransitionTime" not in write.condition, "still False: the transition time stays"
    pod["status"]["conditions"] = with_condition(pod, write.condition)
    assert gate_condition(pod, False, "TritonUnreachable", oversized, T0, changed=due) is None, "said already"
    assert message_refresh_due(True, 3600.0) is False, "a True gate's message changes with its reason only"
