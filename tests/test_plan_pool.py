"""The pool's round, its pure part (plan.pool): members, the replicas' work, which copies serve, the statuses."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from tests.documents import pool_document, python_model
from triton_operator.api.pool import ANNOTATION_LEAVING, TritonPool
from triton_operator.plan import pool as pp
from triton_operator.plan.placement import Placement, PoolReplica, Shortfall

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)


def _body(doc: dict[str, Any], placement: list[str] | None = None, generation: int = 1) -> dict[str, Any]:
    doc = {**doc, "metadata": {**doc["metadata"], "namespace": "ns", "uid": f"uid-{doc['metadata']['name']}",
                               "generation": generation}}
    if placement is not None:
        doc["status"] = {"placement": placement}
    return doc


def _pod(name: str, ready: bool = True, ip: str = "198.18.0.9", node: str = "n1",
         terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"u-{name}"}
    if terminating:
        meta["deletionTimestamp"] = "2026-11-26T12:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node},
            "status": {"podIP": ip, "phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _world(copies: int = 2, placement: list[str] | None = None) -> tuple[Any, ...]:
    bodies = {"a": _body(python_model("a", pool="p", memory="1Gi", replicas=copies), placement),
              "other": _body(python_model("other"))}
    members = pp.members("p", bodies)
    pool = TritonPool.model_validate(pool_document("p"))
    live = [PoolReplica("r1", "n1"), PoolReplica("r2", "n2")]
    return members, pool, live, pp.placement_of(pool, live, members)


def test_members_are_the_models_naming_the_pool_rendered_with_their_load_request() -> None:
    members, *_ = _world()
    assert list(members) == ["a"]
    a = members["a"]
    assert a.problem is None and a.digest and a.request is not None
    assert a.request.files == {"file:1/model.py": b"# m"}


def test_a_uri_model_on_a_pool_is_fetched_by_the_sidecar_and_its_digest_follows_its_pin() -> None:
    uri = python_model("u", pool="p", memory="1Gi")
    uri["spec"]["source"] = {"uri": "https://example.invalid/m.tgz", "sha256": "0" * 64}
    members = pp.members("p", {"u": _body(uri), "a": _body(python_model("a", pool="p", memory="1Gi"))})
    u = members["u"]
    assert u.problem is None and u.request is not None and u.request.fetch is not None and u.request.files == {}
    assert members["a"].problem is None and members["a"].request is not None and members["a"].request.fetch is None
    uri["spec"]["source"]["sha256"] = "1" * 64
    assert pp.members("p", {"u": _body(uri)})["u"].digest != u.digest, "a new pin is a new digest"
    uri["spec"]["source"]["uri"] = "https://example.invalid/other.tgz"
    assert pp.members("p", {"u": _body(uri)})["u"].digest != u.digest, "a new uri is a new digest"


def test_a_failed_fetch_says_source_fetch_failed() -> None:
    assert pp._failure_reason({"r1": f"{pp.FETCH_FAILED_PREFIX}spec.source.uri: ..."}) == pp.SOURCE_FETCH_FAILED
    assert pp._failure_reason({"r1": f"{pp.FETCH_FAILED_PREFIX}x", "r2": "load failed"}) == pp.LOAD_FAILED


def test_a_fresh_replica_loads_what_is_placed_there() -> None:
    members, _, _, placement = _world()
    todo = pp.work(placement, members, ["r1", "r2"], {}, {}, {})
    assert [ld.member for ld in todo["r1"].load] == ["a"] and [ld.member for ld in todo["r2"].load] == ["a"]
    assert todo["r1"].unload == []


def test_a_copy_that_serves_the_desired_digest_loads_nothing_and_serves() -> None:
    members, _, _, placement = _world()
    d = members["a"].digest
    seen = {(r, "a"): pp.Seen(True, d) for r in ("r1", "r2")}
    todo = pp.work(placement, members, ["r1", "r2"], {}, seen, {})
    assert all(not w.load for w in todo.values())
    pods = {r: pp.ReplicaPod.of(_pod(r)) for r in ("r1", "r2")}
    assert pp.serving(placement, members, pods, {}, seen)["a"] == {"r1", "r2"}


def test_an_update_goes_replica_by_replica_and_the_old_digest_serves_meanwhile() -> None:
    members, _, _, placement = _world()
    records = {"r1": {"a": "old"}, "r2": {"a": "old"}}
    seen = {(r, "a"): pp.Seen(True, "old") for r in ("r1", "r2")}
    todo = pp.work(placement, members, ["r1", "r2"], records, seen, {})
    assert sum(len(w.load) for w in todo.values()) == 1, "maxUnavailable 1: one copy at a time"
    pods = {r: pp.ReplicaPod.of(_pod(r)) for r in ("r1", "r2")}
    assert pp.serving(placement, members, pods, records, seen)["a"] == {"r1", "r2"}
    # A digest neither desired nor recorded does not serve.
    assert pp.serving(placement, members, pods, {}, seen)["a"] == set()
    # Meanwhile the model is Ready (the old config serves), updating, and no copy is at the desired config yet.
    on = pp.serving(placement, members, pods, records, seen)
    assert pp.current(members, on, seen)["a"] == set()
    status = pp.model_status(members["a"], "p", True, placement, on["a"], {}, NOW, pp.current(members, on, seen)["a"])
    conds = {c.type: c for c in status.conditions or ()}
    assert (conds["Ready"].status, conds["Ready"].reason) == ("True", pp.COPIES_UPDATING)
    assert conds["Progressing"].status == "True" and status.warmed_replicas == 0 and status.ready_replicas == 2


def test_a_copy_not_ready_or_drained_or_on_a_pod_not_ready_is_not_listed_ready() -> None:
    members, _, _, placement = _world()
    d = members["a"].digest
    seen = {("r1", "a"): pp.Seen(True, d), ("r2", "a"): pp.Seen(False, None)}
    pods = {"r1": pp.ReplicaPod.of(_pod("r1")), "r2": pp.ReplicaPod.of(_pod("r2"))}
    assert pp.serving(placement, members, pods, {}, seen)["a"] == {"r1"}
    assert pp.serving(placement, members, pods, {}, seen, frozenset({("r1", "a")}))["a"] == set()
    pods["r1"] = pp.ReplicaPod.of(_pod("r1", ready=False))
    assert pp.serving(placement, members, pods, {}, seen)["a"] == set()


def test_what_is_recorded_and_no_longer_placed_is_unloaded() -> None:
    members, _, _, placement = _world()
    todo = pp.work(placement, members, ["r1"], {"r1": {"gone": "x"}}, {}, {})
    assert todo["r1"].unload == ["gone"]


def test_a_held_load_waits_for_its_back_off() -> None:
    members, _, _, placement = _world()
    todo = pp.work(placement, members, ["r1", "r2"], {}, {}, {("r1", "a"): True})
    assert not todo["r1"].load and todo["r2"].load


def test_statuses_say_loading_then_warmed_then_short_of_capacity() -> None:
    members, _, _, placement = _world()
    a = members["a"]
    loading = pp.model_status(a, "p", True, placement, {"r1"}, {}, NOW)
    ready = {c.type: c for c in loading.conditions or ()}["Ready"]
    assert (ready.status, ready.reason) == ("False", pp.COPIES_LOADING)
    warm = pp.model_status(a, "p", True, placement, {"r1", "r2"}, {}, NOW)
    assert {c.type: c for c in warm.conditions or ()}["Ready"].reason == pp.ALL_COPIES_WARMED
    assert warm.placement == list(placement.copies["a"]) and warm.ready_replicas == 2
    members3, _, _, placement3 = _world(copies=3)
    short = pp.model_status(members3["a"], "p", True, placement3, {"r1", "r2"}, {}, NOW)
    ready3 = {c.type: c for c in short.conditions or ()}["Ready"]
    assert ready3.reason == "InsufficientPoolCapacity" and "2 of 3 copies placed" in (ready3.message or "")
    # Short only because the pool's replicas are not all there yet: loading, not degraded.
    waiting = pp.model_status(members3["a"], "p", True, placement3, {"r1", "r2"}, {}, NOW, coming=1)
    conds = {c.type: c for c in waiting.conditions or ()}
    assert conds["Ready"].reason == pp.COPIES_LOADING and conds["Degraded"].status == "False"
    gone = pp.model_status(a, "p", False, None, set(), {}, NOW)
    assert {c.type: c for c in gone.conditions or ()}["Ready"].reason == pp.POOL_NOT_FOUND


_SHORT = Placement(2**30, {"a": ("r1", "r2")}, {}, {}, {"a": Shortfall("a", 2, 2, 2**30, 0, 2)})
_TWO = Placement(2**30, {"a": ("r1", "r2")}, {}, {})


@pytest.mark.parametrize(("case", "copies", "ready", "progressing", "degraded"), [
    ("no pool", {"found": False, "placement": None},
     ("False", pp.POOL_NOT_FOUND), ("False", "Settled"), ("True", pp.POOL_NOT_FOUND)),
    ("a spec that cannot load", {"problem": ("InvalidSpec", "bad")},
     ("False", "InvalidSpec"), ("False", "Settled"), ("True", "InvalidSpec")),
    ("short while replicas come, a load failed too", {"placement": _SHORT, "coming": 1, "failures": {"r1": "x"}},
     ("False", pp.COPIES_LOADING), ("True", pp.COPIES_LOADING), ("False", "AsExpected")),
    ("short, none coming", {"placement": _SHORT},
     ("False", "InsufficientPoolCapacity"), ("False", "Settled"), ("True", "InsufficientPoolCapacity")),
    ("a broken copy healing, a load failed too", {"serving_on": {"r1", "r2"}, "failing": {"r2": "dead"},
                                                  "failures": {"r1": "x"}},
     ("True", pp.MODEL_FAILING), ("True", "Healing"), ("True", pp.MODEL_FAILING)),
    ("a fetch failed", {"serving_on": {"r1"}, "failures": {"r2": f"{pp.FETCH_FAILED_PREFIX}404"}},
     ("False", pp.SOURCE_FETCH_FAILED), ("False", "Settled"), ("True", pp.SOURCE_FETCH_FAILED)),
    ("every copy warm at the desired config", {"serving_on": {"r1", "r2"}, "current": {"r1", "r2"}},
     ("True", pp.ALL_COPIES_WARMED), ("False", "Settled"), ("False", "AsExpected")),
    ("an update: the previous config serves", {"serving_on": {"r1", "r2"}, "current": {"r1"}},
     ("True", pp.COPIES_UPDATING), ("True", pp.COPIES_UPDATING), ("False", "AsExpected")),
    ("loading", {"serving_on": {"r1"}, "current": {"r1"}},
     ("False", pp.COPIES_LOADING), ("True", pp.COPIES_LOADING), ("False", "AsExpected")),
])
def test_a_pooled_models_conditions_come_from_its_chains_of_policies_first_answer_winning(
        case: str, copies: dict[str, Any], ready: tuple[str, str], progressing: tuple[str, str],
        degraded: tuple[str, str]) -> None:
    members, *_ = _world()
    m = members["a"]
    if "problem" in copies:
        m = replace(m, problem=copies.pop("problem"))
    seen = pp.Copies(**{"m": m, "pool": "p", "found": True, "placement": _TWO, "serving_on": set(), "failures": {},
                        "current": set(), **copies})
    got = [(c["status"], c["reason"]) for c in pp._model_ready(seen)]
    assert got == [ready, progressing, degraded], case


def test_a_recorded_placement_is_kept() -> None:
    _, _, _, placement = _world(copies=1, placement=["r2"])
    assert placement.copies["a"] == ("r2",)


def test_the_pool_status_lists_each_replica_with_what_it_loaded() -> None:
    members, pool, live, placement = _world()
    pods = {r.name: pp.ReplicaPod.of(_pod(r.name)) for r in live}
    status = pp.pool_status(pool, _body(pool_document("p")), live, pods, placement,
                            {"r1": {"a": members["a"].digest or ""}}, 0, 0, "x=y", NOW)
    rows = {r["pod"]: r for r in status["replicaModels"]}
    assert rows["r1"]["models"] == ["a"] and rows["r1"]["loaded"] == {"a": members["a"].digest}
    assert "loaded" not in rows["r2"]
    assert status["used"] == "2Gi" and status["free"] == "6Gi"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert status["placementStrategy"] == "Spread", "a pool of fixed size spreads unless it says"
    scaled = TritonPool.model_validate(pool_document("p", autoscaling={"maxReplicas": 4}))
    assert pp.pool_status(scaled, _body(pool_document("p")), live, pods, placement, {}, 0, 0, "x=y",
                          NOW)["placementStrategy"] == "Pack"


def test_a_question_that_got_no_answer_loads_nothing() -> None:
    """A replica that did not answer (a timeout under load) may well serve the model: a load would be a second one
    (seen after an operator restart, e2e/test_pool.py)."""
    members, _, _, placement = _world()
    seen = {(r, "a"): pp.Seen(False, None, "Triton did not answer: timeout", answered=False) for r in ("r1", "r2")}
    todo = pp.work(placement, members, ["r1", "r2"], {}, seen, {})
    assert all(not w.load for w in todo.values())


def test_a_question_that_got_no_answer_keeps_a_serving_copy_in_its_slices_and_loads_nothing() -> None:
    """Issue 41: a healthy replica slow to answer (under load, while another replica restarts and loads) kept its
    copies' endpoints only if it answered in time; read as 'not serving', its copies left their slices and their
    status. The record of what it served answers instead, on a replica whose tritonserver is the one that last
    answered; a copy it never served stays out; a pod that is not Ready (tritonserver stopped answering its probe)
    takes every copy out all the same."""
    members, _, _, placement = _world()
    d = members["a"].digest
    records = {"r1": {"a": d}}
    silent = {(r, "a"): pp.Seen(False, None, "Triton did not answer: timeout", answered=False) for r in ("r1", "r2")}
    pods = {r: pp.ReplicaPod.of(_pod(r)) for r in ("r1", "r2")}
    assert pp.serving(placement, members, pods, records, silent)["a"] == set(), "as read before: no copy serves"
    seen = pp.as_last_seen(silent, records, members, steady={"r1", "r2"})
    assert seen[("r1", "a")].ready and seen[("r1", "a")].digest == d and not seen[("r1", "a")].answered
    # A tritonserver restarted since it last answered (another container: not steady) holds nothing of its record:
    # as unknown as before (seen on the real node: a replica restarted under load, its old record listed it).
    restarted = pp.as_last_seen(silent, records, members, steady={"r2"})
    assert restarted == silent and pp.serving(placement, members, pods, records, restarted)["a"] == set()
    assert seen[("r2", "a")] == silent[("r2", "a")], "never recorded there: still unknown"
    on = pp.serving(placement, members, pods, records, seen)
    assert on["a"] == {"r1"} and pp.current(members, on, seen)["a"] == {"r1"}
    assert all(not w.load and not w.unload for w in pp.work(placement, members, ["r1", "r2"], records, seen, {}).values())
    pods["r1"] = pp.ReplicaPod.of(_pod("r1", ready=False))
    assert pp.serving(placement, members, pods, records, seen)["a"] == set()


def test_replicas_are_scheduled_pods_and_the_unschedulable_ones_are_not_coming() -> None:
    scheduled, pending = _pod("r1"), _pod("r2", ready=False)
    pending["spec"] = {}
    pending["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}
    live, views = pp.replicas([scheduled, pending])
    assert [r.name for r in live] == ["r1"] and set(views) == {"r1", "r2"}
    assert pp.coming([scheduled, pending], 2) == 1, "pending, not found unschedulable: on its way"
    pending["status"]["conditions"][0]["reason"] = "Unschedulable"
    assert pp.coming([scheduled, pending], 2) == 0, "no node can take it: not coming"
    assert pp.coming([scheduled], 3) == 2, "the Deployment has yet to create two"
    assert pp.coming([scheduled, _pod("r3", terminating=True)], 1) == 0


def test_a_second_model_of_one_triton_name_on_a_pool_is_refused_by_name_and_never_unloads_the_first() -> None:
    """Two TritonModels that load under one Triton name (spec.modelName) cannot share a tritonserver: the one there
    first keeps the name and its copy; the newcomer is not placed and says why; the first's record is not unloaded."""
    first = _body(python_model("a", pool="p", memory="1Gi", replicas=1))
    first["metadata"]["creationTimestamp"] = "2026-11-26T10:00:00Z"
    taker = _body(python_model("b", pool="p", memory="1Gi", replicas=1))
    taker["metadata"]["creationTimestamp"] = "2026-11-26T11:00:00Z"
    taker["spec"]["modelName"] = "a"
    members = pp.members("p", {"a": first, "b": taker})
    assert members["a"].problem is None
    assert members["b"].problem is not None and members["b"].problem[0] == pp.NAME_TAKEN
    assert "TritonModel a" in members["b"].problem[1] and "spec.modelName" in members["b"].problem[1]
    pool = TritonPool.model_validate(pool_document("p"))
    live = [PoolReplica("r1", "n1"), PoolReplica("r2", "n2")]
    placement = pp.placement_of(pool, live, members)
    assert "b" not in placement.copies or not placement.copies["b"]
    where = placement.copies["a"][0]
    digest = members["a"].digest
    assert digest is not None
    seen = {(where, "a"): pp.Seen(True, digest, "")}
    work = pp.work(placement, members, ["r1", "r2"], {where: {"a": digest}}, seen, {})
    assert work[where].unload == [] and work[where].load == [], work[where]
    status = pp.model_status(members["b"], "p", True, placement, set(), {}, NOW)
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", pp.NAME_TAKEN)


def test_each_replica_costs_what_its_copies_take_so_a_scale_down_removes_the_emptiest() -> None:
    _, _, _, placement = _world(copies=1)
    (where,) = placement.copies["a"]
    other = "r2" if where == "r1" else "r1"
    pods = [_pod(where), _pod(other)]
    cost = pp.POD_DELETION_COST
    costs = pp.deletion_costs(placement, pods)
    assert costs == {where: {cost: "1024"}, other: {cost: "0"}}, costs
    pods[0]["metadata"]["annotations"] = {cost: "1024"}
    assert pp.deletion_costs(placement, pods) == {other: {cost: "0"}}, "written once: only a change is written"
    assert pp.deletion_costs(placement, [_pod("not-placed-anywhere")]) == {}


def test_a_leaving_replica_is_marked_at_the_lowest_cost_and_the_mark_comes_off_when_it_no_longer_leaves() -> None:
    _, _, _, placement = _world(copies=1)
    (where,) = placement.copies["a"]
    other = "r2" if where == "r1" else "r1"
    cost, mark = pp.POD_DELETION_COST, ANNOTATION_LEAVING
    pods = [_pod(where), _pod(other)]
    assert pp.deletion_costs(placement, pods, {where}) == {where: {cost: "-1", mark: "true"}, other: {cost: "0"}}
    pods[0]["metadata"]["annotations"] = {cost: "-1", mark: "true"}
    assert pp.deletion_costs(placement, pods, {where}) == {other: {cost: "0"}}, "marked once"
    assert pp.deletion_costs(placement, pods) == {where: {cost: "1024", mark: None}, other: {cost: "0"}}


def test_a_pooled_models_status_restates_its_hpas_scaling_active() -> None:
    members, _, _, placement = _world(copies=1)
    hpa = {"metadata": {"name": "a"}, "status": {"conditions": [
        {"type": "ScalingActive", "status": "False", "reason": "FailedGetObjectMetric", "message": "no metrics"}]}}
    status = pp.model_status(members["a"], "p", True, placement, set(), {}, NOW, hpa=hpa)
    active = next(c for c in status.conditions if c.type == "ScalingActive")
    assert (active.status, active.reason) == ("False", "FailedGetObjectMetric")
    assert "HorizontalPodAutoscaler a: no metrics" in active.message
    without = pp.model_status(members["a"], "p", True, placement, set(), {}, NOW)
    assert not any(c.type == "ScalingActive" for c in without.conditions), "no autoscaling, no condition"


def test_members_kept_in_a_memo_are_parsed_and_rendered_again_only_when_what_they_read_changes() -> None:
    ens = {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": "ens"},
           "spec": {"platform": "ensemble", "pool": "p", "maxBatchSize": 4,
                    "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
                    "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
                    "ensemble": {"steps": [{"model": "a", "inputMap": {"INPUT": "IN"},
                                            "outputMap": {"OUTPUT": "OUT"}}]}}}
    bodies = {"a": _body(python_model("a", pool="p", memory="1Gi")), "ens": _body(ens),
              "b": _body(python_model("b", pool="p", memory="1Gi"))}
    memo = pp.Memo()
    first = pp.members("p", bodies, memo)
    assert first == pp.members("p", bodies)  # the same answer as without a memo
    # Our own status write (status, resourceVersion) changes nothing parsed or rendered: the same objects.
    bodies["a"] = {**bodies["a"], "status": {"placement": ["r1"]},
                   "metadata": {**bodies["a"]["metadata"], "resourceVersion": "7"}}
    again = pp.members("p", bodies, memo)
    assert again["a"].model is first["a"].model and again["a"].request is first["a"].request
    assert again["a"].body is bodies["a"]  # the body is today's: its status is read (the placement recorded)
    # A step's spec changes: it and the ensemble over it render again; the model that reaches neither does not.
    changed = python_model("a", pool="p", memory="1Gi")
    changed["spec"]["source"] = {"inline": {"model.py": "# changed"}}
    bodies["a"] = _body(changed, generation=2)
    third = pp.members("p", bodies, memo)
    assert third == pp.members("p", bodies)
    assert third["a"].digest != first["a"].digest and third["ens"].digest != first["ens"].digest
    assert third["b"].request is first["b"].request
    # A model that leaves the pool leaves the memo.
    del bodies["b"]
    pp.members("p", bodies, memo)
    assert set(memo.parsed) == set(memo.rendered) == {"a", "ens"}


# -- a load in flight when the operator stopped (a previous operator's, recorded in the pool's status) -------------


def test_a_restarted_operator_waits_for_a_load_in_flight_at_the_desired_digest_instead_of_sending_it_again() -> None:
    members, _, _, placement = _world(copies=1)
    (r,) = placement.copies["a"]
    digest = members["a"].digest
    sent = pp.InFlight(digest, NOW - dt.timedelta(seconds=10))
    loading = {"a": pp.Seen(False, None, "not READY")}
    seen = {(r, "a"): loading["a"]}
    waiting = pp.awaited(placement, members, {r: {"a": sent}}, seen, {(r, "a"): True}, NOW)
    assert waiting == {(r, "a"): sent}
    assert not pp.work(placement, members, [r], {}, seen, {}, waiting)[r].load, "sent again"
    assert [ld.member for ld in pp.work(placement, members, [r], {}, seen, {})[r].load] == ["a"], \
        "without the record, the copy not READY is loaded (what a restart did before)"
    # Once READY at the digest, there is nothing to wait for.
    assert pp.awaited(placement, members, {r: {"a": sent}}, {(r, "a"): pp.Seen(True, digest)}, {}, NOW) == {}


def test_a_recorded_load_is_sent_again_when_triton_never_got_it_or_it_is_at_another_digest_or_too_old() -> None:
    members, _, _, placement = _world(copies=1)
    (r,) = placement.copies["a"]
    digest = members["a"].digest
    seen = {(r, "a"): pp.Seen(False, None, "not READY")}
    fresh = pp.InFlight(digest, NOW - dt.timedelta(seconds=10))
    # never received (the operator stopped between recording it and sending it)
    assert pp.awaited(placement, members, {r: {"a": fresh}}, seen, {(r, "a"): False}, NOW) == {}
    # an older config's load: the desired one is sent (Triton runs it after the one in flight)
    old = pp.InFlight("0" * 12, NOW - dt.timedelta(seconds=10))
    assert pp.awaited(placement, members, {r: {"a": old}}, seen, {(r, "a"): True}, NOW) == {}
    # received but unanswered for longer than the bound: failed, or slow (a second load waits behind it)
    stale = pp.InFlight(digest, NOW - dt.timedelta(seconds=pp.IN_FLIGHT_SECONDS))
    assert pp.awaited(placement, members, {r: {"a": stale}}, seen, {(r, "a"): True}, NOW) == {}
    # Triton did not answer the question: not known to be absent, so waited for
    assert pp.awaited(placement, members, {r: {"a": fresh}}, seen, {(r, "a"): None}, NOW) == {(r, "a"): fresh}


def test_the_loads_in_flight_are_recorded_in_the_pool_status_and_read_back() -> None:
    members, pool, live, placement = _world(copies=1)
    (r,) = placement.copies["a"]
    pods = {x.name: pp.ReplicaPod(x.name, "u", "198.18.0.9", x.node, True, False) for x in live}
    sent = pp.InFlight(members["a"].digest, NOW)
    status = pp.pool_status(pool, _body(pool_document("p")), live, pods, placement, {}, 1, 0, "s", NOW,
                            {r: {"a": sent}})
    row = next(row for row in status["replicaModels"] if row["pod"] == r)
    assert row["loading"] == {"a": {"digest": members["a"].digest, "since": "2026-11-26T12:00:00Z"}}
    assert pp.recorded_loading({"status": status}) == {r: {"a": sent}}
    TritonPool.model_validate({**pool_document("p"), "status": status})  # the CRD's schema holds it


def test_a_pool_that_opens_an_admin_api_says_so_in_its_status_and_at_admission() -> None:
    """issue 39 H1: a pool's `spec.server.unrestrictedApis` opens those Triton APIs on every replica, for every model
    it holds: AdminApisRestricted=False on the pool, and an admission warning; a pool that opens none has no such
    condition, and its replicas restrict every admin category."""
    from triton_operator.api.pool import TritonPool
    from triton_operator.render.pool import render_pool_deployment
    from triton_operator.validate.admission import review_pool

    _, pool, live, placement = _world()
    pods = {r.name: pp.ReplicaPod.of(_pod(r.name)) for r in live}
    body = pool_document("p", server={"unrestrictedApis": ["logging"]})
    opened = TritonPool.model_validate(body)
    status = pp.pool_status(opened, _body(body), live, pods, placement, {}, 0, 0, "x=y", NOW)
    cond = {c["type"]: c for c in status["conditions"]}["AdminApisRestricted"]
    assert (cond["status"], cond["reason"]) == ("False", "OpenedInSpec") and "logging" in cond["message"], cond
    closed = pp.pool_status(pool, _body(pool_document("p")), live, pods, placement, {}, 0, 0, "x=y", NOW)
    assert "AdminApisRestricted" not in {c["type"] for c in closed["conditions"]}
    assert any("unrestrictedApis" in w for w in review_pool({**body, "metadata": {"name": "p"}}, None).warnings)
    args = render_pool_deployment(opened, "uid", "ns")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert any(a.startswith("--http-restricted-api=model-repository,shared-memory,trace:") for a in args), args
    args = render_pool_deployment(pool, "uid", "ns")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert any(a.startswith("--grpc-restricted-protocol=model-repository,shared-memory,logging,trace:") for a in args)


@pytest.mark.parametrize(("case", "counts", "ready", "progressing", "degraded"), [
    ("every replica Ready, every copy serving", (2, 0, 0, 0),
     ("True", "AllReplicasServing"), ("False", "Settled"), ("False", "AsExpected")),
    ("a replica not Ready yet", (1, 0, 0, 0), ("False", "NotAllServing"), ("True", "Loading"), ("False", "AsExpected")),
    ("copies loading", (2, 3, 0, 0), ("False", "NotAllServing"), ("True", "Loading"), ("False", "AsExpected")),
    ("a load failed", (2, 1, 1, 0), ("False", "NotAllServing"), ("False", "Loading"), ("True", pp.LOAD_FAILED)),
    ("short of capacity, a load failed too", (2, 0, 1, 1),
     ("False", "NotAllServing"), ("False", "Loading"), ("True", "InsufficientPoolCapacity")),
])
def test_a_pools_conditions_come_from_its_chains_of_policies(case: str, counts: tuple[int, int, int, int],
                                                             ready: tuple[str, str], progressing: tuple[str, str],
                                                             degraded: tuple[str, str]) -> None:
    seen = pp.Replicas(counts[0], 2, *counts[1:], "why", 1)
    got = [(c["status"], c["reason"]) for chain in (pp.POOL_READY, pp.POOL_PROGRESSING, pp.POOL_DEGRADED)
           for c in [pp._first(chain, seen)]]
    assert got == [ready, progressing, degraded], case


def test_a_replica_leaving_mid_round_takes_out_only_its_own_endpoints_before_the_round_has_observed_anything() -> None:
    """Issue 41 (a CI rehearsal at 2fadfd5, e2e/test_pool.py): a pool pod that turned not Ready while its round still
    awaited its first answers (nothing observed yet) had every model's slices rewritten from that nothing: the models
    served on healthy replicas lost every endpoint for 0.4 s. The pod event takes replicas out of what the slices
    list as ready (`listed_ready`), and changes nothing else."""
    import asyncio

    from triton_operator.controller.cache import Cache
    from triton_operator.controller.pool import PoolReconciler, _Live
    from triton_operator.render.pool import render_endpoint_slices

    members, pool, _, _ = _world()
    rnd = pp.round_of("ns", pool, pool_document("p"), members,
                      [_pod("r1", ip="198.18.0.9"), _pod("r2", ip="198.18.0.10", node="n2")], None)
    placement, pods = rnd.placement, dict(rnd.pods)
    assert set(placement.copies["a"]) == {"r1", "r2"}
    applied: list[dict[str, Any]] = []

    class Kube:
        def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
            applied.append(obj)
            return obj

        def get(self, *_: Any) -> None:  # no Endpoints left from a selector (`_sweep_left_endpoints`)
            return None

        def list(self, *_: Any) -> list[dict[str, Any]]:  # nor any slice of Kubernetes'
            return []

    cache = Cache()
    cache.put_model(dict(members["a"].body))  # as the watch reported it
    pools = PoolReconciler(Kube(), cache)  # type: ignore[arg-type]
    model = members["a"].model
    assert model is not None
    listed = render_endpoint_slices(model, "uid-a", "ns", list(placement.copies["a"]), pods, {"r1", "r2"})
    assert pp.listed_ready(listed) == {"r1", "r2"} and pp.listed_ready([None]) == set()
    for s in listed:
        pools._applied[("EndpointSlice", "ns", s["metadata"]["name"])] = s
    st = _Live(rnd, {"r1": {"a": members["a"].digest or ""}, "r2": {"a": members["a"].digest or ""}}, {}, frozenset())
    rnd.pods["r1"] = pp.ReplicaPod.of(_pod("r1", ready=False, ip="198.18.0.9"))  # its tritonserver stopped answering
    asyncio.run(pools._slices_now(st))
    ready = {e["targetRef"]["name"]: e["conditions"]["ready"]
             for o in applied if o["kind"] == "EndpointSlice" for e in o["endpoints"]}
    assert ready == {"r1": False, "r2": True}, ready
    applied.clear()
    asyncio.run(pools._slices_now(st))  # nothing else changed: nothing written again
    assert not [o for o in applied if o["kind"] == "EndpointSlice"], applied


def test_a_model_deleted_or_moved_while_its_pools_round_runs_gets_no_service_slice_or_load_from_that_round() -> None:
    """Issue 41 (the pool's benchmark): pooled models deleted while a long round loaded others had their Services and
    slices applied again by that round (the API server made each Service anew, the garbage collector took it again).
    The round's members are its snapshot; what it writes and loads for one is checked against the watch's cache."""
    import asyncio

    from triton_operator.controller.cache import Cache
    from triton_operator.controller.pool import PoolReconciler, _Live

    members, pool, _, _ = _world()
    rnd = pp.round_of("ns", pool, pool_document("p"), members,
                      [_pod("r1", ip="198.18.0.9"), _pod("r2", ip="198.18.0.10", node="n2")], None)
    applied: list[dict[str, Any]] = []

    class Kube:
        def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
            applied.append(obj)
            return obj

        def get(self, *_: Any) -> None:
            return None

        def list(self, *_: Any) -> list[dict[str, Any]]:
            return []

    cache = Cache()
    pools = PoolReconciler(Kube(), cache)  # type: ignore[arg-type]
    body = dict(members["a"].body)
    digest = members["a"].digest or ""
    cache.put_model(body)
    st = _Live(rnd, {"r1": {}, "r2": {}}, {}, frozenset())
    asyncio.run(pools._listed(rnd, st, "r1", "a", digest))
    assert {o["kind"] for o in applied} == {"Service", "EndpointSlice"}, "a member's copy listed: its traffic written"
    for gone in (None, {**body, "spec": {**body["spec"], "pool": "q"}},
                 {**body, "metadata": {**body["metadata"], "uid": "uid-a-again"}}):
        applied.clear()
        cache.put_model(body, deleted=True)
        if gone is not None:
            cache.put_model(gone)
        asyncio.run(pools._listed(rnd, st, "r2", "a", digest))
        assert applied == [], (gone, applied)
        work = pp.ReplicaWork("r2", [], [pp.Load("a")])
        assert asyncio.run(pools._carry_out(rnd, work, st, 0.0)) is False and not pools._sent, "nothing loaded"


def test_after_a_restart_the_sweep_of_what_kubernetes_left_lists_each_namespace_once_not_each_service() -> None:
    """Issue 41: a new leader's first round asked, for every pooled model, a GET of its Endpoints and a LIST of its
    slices (400 calls at 200 models) before any load. A Service without a selector before the round's apply is looked
    up in one listing per namespace; one that has just lost its selector (a model moving onto the pool) is asked
    about on its own."""
    import asyncio

    from triton_operator.api.pool import ENDPOINTS_CONTROLLER, LABEL_ENDPOINTS_MANAGED_BY
    from triton_operator.controller.cache import Cache
    from triton_operator.controller.pool import PoolReconciler
    from triton_operator.render.pool import LABEL_SERVICE_NAME, LABEL_SLICE_MANAGED_BY

    calls: list[tuple[str, ...]] = []

    def left(kind: str, name: str, service: str) -> dict[str, Any]:
        labels = ({LABEL_ENDPOINTS_MANAGED_BY: ENDPOINTS_CONTROLLER, "serving.triton-operator.dev/model": service}
                  if kind == "Endpoints" else
                  {LABEL_SLICE_MANAGED_BY: "endpointslice-controller.k8s.io", LABEL_SERVICE_NAME: service})
        return {"kind": kind, "metadata": {"name": name, "namespace": "ns", "labels": labels}}

    class Kube:
        def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
            calls.append(("get", kind, name))
            return left("Endpoints", name, name) if name in ("m3", "moved") else None

        def list(self, api_version: str, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
            calls.append(("list", kind, selector))
            if kind == "Endpoints":
                return [left("Endpoints", "m3", "m3")]
            return [left("EndpointSlice", f"{s}-x1", s) for s in ("m3", "own") if f"={s}," in selector
                    or "kubernetes.io/service-name=" not in selector]

        def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
            calls.append(("delete", kind, name))

    pools = PoolReconciler(Kube(), Cache())  # type: ignore[arg-type]
    names = [f"m{i}" for i in range(1, 6)]
    for name in [*names, "moved"]:
        pools._applied[("Service", "ns", name)] = {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": {}}
    for name in names:
        asyncio.run(pools._sweep_left_endpoints("ns", name))
    namespace_wide = [c[1] for c in calls if c[0] == "list" and "service-name=" not in c[2]]
    assert namespace_wide == ["Endpoints", "EndpointSlice"], calls
    on_its_own = [c[1:] for c in calls if c[0] == "get" or "service-name=" in c[2]]
    assert [c[0] for c in on_its_own] == ["Endpoints", "EndpointSlice"] and "m3" in on_its_own[1][1], \
        "only m3, which had leftovers, asked about on its own"
    assert sorted(c[1:] for c in calls if c[0] == "delete") == [("EndpointSlice", "m3-x1"), ("Endpoints", "m3")]
    calls.clear()
    for name in names:  # swept: nothing more, ever, in this process
        asyncio.run(pools._sweep_left_endpoints("ns", name))
    assert calls == []
    pools._moving.add(("ns", "moved"))  # its selector taken away since the namespace was listed (below)
    asyncio.run(pools._sweep_left_endpoints("ns", "moved"))
    assert [c[:2] for c in calls] == [("get", "Endpoints"), ("delete", "Endpoints"), ("list", "EndpointSlice")], calls
    assert not pools._moving


def test_a_service_whose_selector_the_pool_takes_away_is_noted_as_moving_one_already_without_is_not() -> None:
    """What `_sweep_left_endpoints` asks about on its own: the Service of a model that had its own Deployment (the
    cache holds it with a selector) or that this process knows nothing of; not one the pool applied before."""
    import asyncio

    from triton_operator.controller.cache import Cache
    from triton_operator.controller.pool import PoolReconciler

    members, *_ = _world()
    model = members["a"].model
    assert model is not None

    class Kube:
        def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
            return obj

    cache = Cache()
    pools = PoolReconciler(Kube(), cache)  # type: ignore[arg-type]
    own = {"kind": "Service", "metadata": {"name": "a", "namespace": "ns", "uid": "s1"},
           "spec": {"selector": {"serving.triton-operator.dev/model": "a"}}}
    cache.put_child(own)
    asyncio.run(pools._apply_service(model, "uid-a", "ns"))
    assert pools._moving == {("ns", "a")}, "its own Deployment's Service had a selector"
    pools._moving.clear()
    asyncio.run(pools._apply_service(model, "uid-a", "ns"))  # applied by the pool: no selector now
    assert not pools._moving
    fresh = PoolReconciler(Kube(), Cache())  # type: ignore[arg-type]
    asyncio.run(fresh._apply_service(model, "uid-a", "ns"))
    assert fresh._moving == {("ns", "a")}, "nothing known of it: asked about"


def test_a_pools_own_objects_a_pdb_only_above_one_replica_an_hpa_only_with_autoscaling_as_a_models() -> None:
    """The pool's children as `plan.pool.pool_children` says them: at 1 replica its PodDisruptionBudget goes (the
    TritonModel's planner deletes its own the same way); without `spec.autoscaling` its HPA goes."""
    from triton_operator.render.kubernetes import Options

    def kinds(children: pp.PoolChildren) -> tuple[list[str], list[tuple[str, str]]]:
        return [c["kind"] for c in children.apply], [(k.kind, name) for k, name, _ in children.delete]

    two = TritonPool.model_validate(pool_document("p"))
    assert kinds(pp.pool_children(two, "u", "ns", Options())) == (
        ["Deployment", "PodDisruptionBudget"], [("HorizontalPodAutoscaler", "p-pool")])
    one = TritonPool.model_validate(pool_document("p", replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 3}))
    assert kinds(pp.pool_children(one, "u", "ns", Options())) == (
        ["Deployment", "HorizontalPodAutoscaler"], [("PodDisruptionBudget", "p-pool")])
