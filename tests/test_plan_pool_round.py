"""A pool round planned whole (issue 41 item 1): `plan_pool(world) -> PoolPlan`, world in, plan out. The controller
gathers the world (the pool, its members and pods, what each replica's Triton, probe and sidecar answered) and carries
the plan out; these tests are the decisions alone."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests.documents import pool_document, python_model
from triton_operator.api import pool as pp_api
from triton_operator.api.pool import TritonPool
from triton_operator.plan import pool as pp
from triton_operator.plan.upgrade import UPGRADE_UNSCHEDULABLE, UPGRADE_WAITING, Upgrade

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)


def _body(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "metadata": {**doc["metadata"], "namespace": "ns", "uid": f"uid-{doc['metadata']['name']}",
                                "generation": 1}}


def _pod(name: str, ip: str | None, ready: bool = True, node: str = "n1") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": {"name": name, "uid": f"u-{name}"}, "spec": {"nodeName": node}, "status": status}


def _round(**spec: Any) -> pp.PoolRound:
    """Model a (2 copies, 1Gi, `spec` over that) on pool p's two Ready replicas r1 and r2."""
    members = pp.members("p", {"a": _body(python_model("a", pool="p", memory="1Gi", replicas=2, **spec))})
    pool_body = _body(pool_document("p"))
    pods = [_pod("r1", "198.18.0.1"), _pod("r2", "198.18.0.2", node="n2")]
    return pp.round_of("ns", TritonPool.model_validate(pool_body), pool_body, members, pods, None)


def _world(rnd: pp.PoolRound, **kw: Any) -> pp.PoolWorld:
    return pp.PoolWorld(**{"round": rnd, "now": NOW, "records": {}, "seen": {}, **kw})


def _digest(rnd: pp.PoolRound) -> str:
    return rnd.members["a"].digest or ""


def _serves(rnd: pp.PoolRound, digest: str | None = None) -> dict[str, Any]:
    """The world where both copies are READY at `digest` (the desired one by default), recorded so."""
    d = digest or _digest(rnd)
    return {"records": {r: {"a": d} for r in ("r1", "r2")}, "seen": {(r, "a"): pp.Seen(True, d) for r in ("r1", "r2")}}


def _loads(plan: pp.PoolPlan) -> dict[str, list[tuple[str, bool, bool]]]:
    """Per replica with loads: (member, drained first, healed)."""
    return {r: [(ld.member, ld.drain, ld.heal) for ld in w.load] for r, w in plan.work.items() if w.load}


def _ready(plan: pp.PoolPlan, name: str = "a") -> tuple[str, str]:
    c = next(c for c in plan.statuses[name].conditions or () if c.type == "Ready")
    return c.status, c.reason


def test_a_round_derives_its_ready_replicas_placement_graph_and_deletion_costs_from_the_pods() -> None:
    members = pp.members("p", {"a": _body(python_model("a", pool="p", memory="1Gi", replicas=2))})
    pool_body = _body(pool_document("p", replicas=3))
    pods = [_pod("r1", "198.18.0.1"), _pod("r2", None), _pod("r3", "198.18.0.3", ready=False)]
    rnd = pp.round_of("ns", TritonPool.model_validate(pool_body), pool_body, members, pods, "k")
    assert [r.name for r in rnd.live] == ["r1", "r2", "r3"] and list(rnd.ready) == ["r1"], "Ready with an IP"
    assert len(rnd.placement.copies["a"]) == 2 and rnd.graph.found("a") == ("a",)
    assert rnd.costs == {r: {pp.POD_DELETION_COST: "1024" if r in rnd.placement.copies["a"] else "0"}
                         for r in ("r1", "r2", "r3")}, \
        "the MiB each replica's copies take"
    assert rnd.address("r1") == "198.18.0.1:8000" and rnd.coming == 0


@pytest.mark.parametrize(("case", "world", "loads", "unloads", "drains", "draining", "ready"), [
    ("fresh replicas load what is placed there", {},
     {"r1": [("a", False, False)], "r2": [("a", False, False)]}, {}, {}, set(), ("False", pp.COPIES_LOADING)),
    ("copies serving the desired digest: nothing to do", _serves,
     {}, {}, {}, set(), ("True", pp.ALL_COPIES_WARMED)),
    ("what is recorded and no longer placed is drained, then unloaded",
     lambda rnd: {**_serves(rnd), "records": {"r1": {"a": _digest(rnd), "gone": "x"}, "r2": {"a": _digest(rnd)}}},
     {}, {"r1": ["gone"]}, {("r1", "gone"): pp.DRAIN_SECONDS}, set(), ("True", pp.ALL_COPIES_WARMED)),
    ("a broken copy leaves its slices and is reloaded, not drained",
     lambda rnd: {**_serves(rnd), "broken": {("r1", "a"): "stub dead"}},
     {"r1": [("a", False, True)]}, {}, {}, {("r1", "a")}, ("False", pp.MODEL_FAILING)),
    ("a broken copy whose heal backs off stays out and waits",
     lambda rnd: {**_serves(rnd), "broken": {("r1", "a"): "stub dead"}, "heals_held": {("r1", "a")}},
     {}, {}, {}, set(), ("False", pp.MODEL_FAILING)),
    ("a held load and one whose files are not fetched yet wait",
     lambda rnd: {"held": {("r1", "a"): True}, "unfetched": {("r2", "a")}},
     {}, {}, {}, set(), ("False", pp.COPIES_LOADING)),
    ("a load whose back-off is over is sent", lambda rnd: {"held": {("r1", "a"): False}},
     {"r1": [("a", False, False)], "r2": [("a", False, False)]}, {}, {}, set(), ("False", pp.COPIES_LOADING)),
    ("an unanswered question loads nothing", lambda rnd: {"seen": {(r, "a"): pp.Seen(False, None, answered=False)
                                                                   for r in ("r1", "r2")}},
     {}, {}, {}, set(), ("False", pp.COPIES_LOADING)),
])
def test_a_round_before_its_loads_plans_each_replicas_work_and_what_leaves_the_slices_first(
        case: str, world: Any, loads: dict[str, Any], unloads: dict[str, list[str]], drains: dict[Any, float],
        draining: set[Any], ready: tuple[str, str]) -> None:
    rnd = _round()
    plan = pp.plan_pool(_world(rnd, **(world(rnd) if callable(world) else world)))
    assert _loads(plan) == loads, case
    assert {r: w.unload for r, w in plan.work.items() if w.unload} == unloads, case
    assert (plan.drains, plan.draining, _ready(plan)) == (drains, draining, ready), case
    assert plan.loading == {r: {"a": pp.InFlight(_digest(rnd), NOW)} for r in loads}, "the loads sent, recorded"
    assert all(ld.cause == ("stub dead" if ld.heal else "") for w in plan.work.values() for ld in w.load), \
        "a heal carries its cause, for its Event"


def test_a_drain_mode_update_goes_one_copy_at_a_time_out_of_its_slices_and_drained_first() -> None:
    rnd = _round(rollout={"mode": "Drain", "drainTimeoutSeconds": 45})
    plan = pp.plan_pool(_world(rnd, **_serves(rnd, "old")))
    ((replica, loads),) = _loads(plan).items()
    assert loads == [("a", True, False)], "maxUnavailable 1: one copy, drained"
    other = ({"r1", "r2"} - {replica}).pop()
    assert plan.draining == {(replica, "a")} and plan.drains == {(replica, "a"): 45.0}, "its own drain timeout"
    assert plan.serving["a"] == {other}, "the other copy serves its previous config meanwhile"


def test_a_previous_operators_load_in_flight_is_awaited_and_stays_recorded() -> None:
    rnd = _round()
    sent = pp.InFlight(_digest(rnd), NOW - dt.timedelta(seconds=10))
    plan = pp.plan_pool(_world(rnd, in_flight={"r1": {"a": sent}}, heard={("r1", "a"): True},
                               seen={(r, "a"): pp.Seen(False, None) for r in ("r1", "r2")}))
    assert _loads(plan) == {"r2": [("a", False, False)]} and plan.waiting == {("r1", "a"): sent}
    assert plan.loading == {"r1": {"a": sent}, "r2": {"a": pp.InFlight(_digest(rnd), NOW)}}
    rows = {row["pod"]: row for row in plan.pool_status["replicaModels"]}
    assert rows["r1"]["loading"]["a"]["since"] == "2026-11-26T11:59:50Z"


def test_before_its_loads_a_model_with_no_slice_and_no_copy_serving_gets_only_its_service() -> None:
    rnd = _round()
    assert pp.plan_pool(_world(rnd)).services_only == {"a"}
    assert pp.plan_pool(_world(rnd, sliced={"a"})).services_only == frozenset(), "its slices exist: written"
    assert pp.plan_pool(_world(rnd, carried=pp.Carried(True, False))).services_only == frozenset(), "the round's end"


def test_a_failed_load_says_so_and_the_pool_is_not_settled() -> None:
    rnd = _round()
    plan = pp.plan_pool(_world(rnd, **_serves(rnd), failures={"a": {"r1": "load failed: boom"}}))
    assert _ready(plan) == ("True", pp.LOAD_FAILED) and not plan.settled
    degraded = next(c for c in plan.pool_status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", pp.LOAD_FAILED)


@pytest.mark.parametrize(("case", "world", "carried", "wake"), [
    ("loads left for the next round: at once", {}, pp.Carried(True, True), 0.0),
    ("a sidecar fetching: soon", {"fetching": True}, pp.Carried(False, False), pp.FETCHING_SECONDS),
    ("copies still loading", {}, pp.Carried(False, False), pp.REVISIT_SECONDS),
    ("all serves, but the round loaded", _serves, pp.Carried(True, False), pp.REVISIT_SECONDS),
    ("all serves, nothing done", _serves, pp.Carried(False, False), pp.SETTLED_SECONDS),
])
def test_after_its_loads_a_round_plans_no_work_and_says_when_to_come_back(case: str, world: Any, carried: pp.Carried,
                                                                           wake: float) -> None:
    rnd = _round()
    plan = pp.plan_pool(_world(rnd, carried=carried, **(world(rnd) if callable(world) else world)))
    assert not plan.work and not plan.draining and not plan.drains, "what is left is the next round's"
    assert plan.wake == wake, case


def test_after_its_loads_a_previous_operators_load_still_in_flight_is_pending_and_recorded() -> None:
    rnd = _round()
    sent = pp.InFlight(_digest(rnd), NOW - dt.timedelta(seconds=10))
    world = _world(rnd, in_flight={"r1": {"a": sent}}, heard={("r1", "a"): True}, carried=pp.Carried(False, False),
                   seen={("r1", "a"): pp.Seen(False, None), ("r2", "a"): pp.Seen(True, _digest(rnd))})
    plan = pp.plan_pool(world)
    assert plan.loading == {"r1": {"a": sent}} and plan.wake == pp.REVISIT_SECONDS
    done = pp.plan_pool(replace(world, **_serves(rnd)))
    assert done.loading == {} and done.wake == pp.SETTLED_SECONDS


def test_the_records_after_a_round_are_what_ready_replicas_serve_and_a_replica_not_ready_keeps_its_own() -> None:
    members = pp.members("p", {"a": _body(python_model("a", pool="p", memory="1Gi", replicas=2))})
    pool_body = _body(pool_document("p"))
    pods = [_pod("r1", "198.18.0.1"), _pod("r2", "198.18.0.2", ready=False, node="n2")]
    rnd = pp.round_of("ns", TritonPool.model_validate(pool_body), pool_body, members, pods, None)
    d = members["a"].digest or ""
    records = {"r1": {"a": "old", "gone": "x"}, "r2": {"a": "old"}, "r9": {"a": d}}
    after = pp.records_after(rnd, records, {("r1", "a"): pp.Seen(True, d)})
    assert after == {"r1": {"a": d}, "r2": {"a": "old"}}, "r9 is gone; r2 is reloaded once it is back"


# -- a uri model's files: what the sidecar is asked and what its answer means --------------------------------------


def _uri_round() -> tuple[pp.PoolRound, str, str]:
    """Model u (one copy, from a uri) and model a (2 copies, inline) on r1 and r2; u's replica and its digest."""
    u = python_model("u", pool="p", memory="1Gi", replicas=1)
    u["spec"]["source"] = {"uri": "https://example.invalid/m.tgz", "sha256": "0" * 64}
    bodies = {"u": _body(u), "a": _body(python_model("a", pool="p", memory="1Gi", replicas=2))}
    pool_body = _body(pool_document("p"))
    rnd = pp.round_of("ns", TritonPool.model_validate(pool_body), pool_body, pp.members("p", bodies),
                      [_pod("r1", "198.18.0.1"), _pod("r2", "198.18.0.2", node="n2")], None)
    (replica,) = rnd.placement.copies["u"]
    return rnd, replica, rnd.members["u"].digest or ""


def test_a_sidecar_is_asked_for_the_uri_models_not_served_and_once_more_when_it_may_hold_files() -> None:
    rnd, r, d = _uri_round()
    other = ({"r1", "r2"} - {r}).pop()
    assert pp.fetch_asks(rnd, {}, {}) == {r: ["u"], other: []}, "never asked: both, to learn what they hold"
    assert pp.fetch_asks(rnd, {}, {r: set(), other: set()}) == {r: ["u"]}, "a sidecar known empty, wanting none"
    assert pp.fetch_asks(rnd, {}, {r: set(), other: {"old"}}) == {r: ["u"], other: []}, "it holds files to delete"
    assert pp.fetch_asks(rnd, {(r, "u"): pp.Seen(True, d)}, {r: set(), other: set()}) == {}, "served: not wanted"


@dataclass(frozen=True)
class _Held:
    digest: str | None = None
    fetching: str | None = None
    failed_digest: str | None = None
    failed_attempt: int = 0


@pytest.mark.parametrize(("case", "held", "counted", "backing_off", "step"), [
    ("nothing held: fetch", {}, {}, set(), pp.FETCH),
    ("on disk at the desired digest", {"u": _Held(digest="D")}, {}, set(), pp.ON_DISK),
    ("another digest on disk: fetch the desired one", {"u": _Held(digest="old")}, {}, set(), pp.FETCH),
    ("under way", {"u": _Held(fetching="D")}, {}, set(), pp.UNDER_WAY),
    ("a new failed attempt", {"u": _Held(failed_digest="D", failed_attempt=2)}, {"u": 1}, set(), pp.FETCH_FAILED),
    ("a failure counted, backing off", {"u": _Held(failed_digest="D", failed_attempt=2)}, {"u": 2}, {"u"},
     pp.BACKING_OFF),
    ("a failure counted, its back-off over: fetch again", {"u": _Held(failed_digest="D", failed_attempt=2)}, {"u": 2},
     set(), pp.FETCH),
    ("an older digest's failure is not this one's", {"u": _Held(failed_digest="old", failed_attempt=5)}, {}, set(),
     pp.FETCH),
])
def test_what_a_sidecar_holds_decides_each_wanted_models_step(case: str, held: dict[str, _Held],
                                                              counted: dict[str, int], backing_off: set[str],
                                                              step: str) -> None:
    rnd, r, d = _uri_round()
    held = {n: _Held(*(d if v == "D" else v for v in (h.digest, h.fetching, h.failed_digest)), h.failed_attempt)
            for n, h in held.items()}
    todo = pp.replica_fetches(rnd, r, ["u"], held, {}, counted, backing_off)
    assert todo.steps == (("u", step),), case
    assert todo.forget == (), "u is placed there: its files stay"


def test_a_sidecars_files_of_models_neither_placed_nor_recorded_there_are_deleted() -> None:
    rnd, r, _ = _uri_round()
    held = {"u": _Held(), "gone": _Held(digest="x"), "kept": _Held(digest="y"), "a": _Held()}
    todo = pp.replica_fetches(rnd, r, [], held, {r: {"kept": "y"}}, {}, set())
    assert todo.forget == ("gone",), "a recorded model's files stay until it is unloaded"


# -- what the replicas are asked, and what their silence means ------------------------------------------------------


def _with_containers(rnd: pp.PoolRound, **containers: str) -> pp.PoolRound:
    """`rnd` whose replicas run these tritonserver containers (by pod)."""
    return replace(rnd, pods={r: replace(v, triton=containers.get(r, "")) for r, v in rnd.pods.items()})


def test_each_ready_replicas_triton_is_asked_about_the_members_placed_there() -> None:
    rnd = _round()
    assert pp.triton_asks(rnd, ["r1", "r2"]) == {"r1": ["a"], "r2": ["a"]}
    assert pp.triton_asks(rnd, ["r1"]) == {"r1": ["a"]}, "a replica not Ready is not asked"


@pytest.mark.parametrize(("case", "before", "containers", "silent", "steady", "after"), [
    ("every question answered: each replica known by its container", {}, {"r1": "c1", "r2": "c2"}, set(), set(),
     {"r1": "c1", "r2": "c2"}),
    ("a silent replica whose container answered a whole round before: its record stands", {"r2": "c2"},
     {"r1": "c1", "r2": "c2"}, {"r2"}, {"r2"}, {"r1": "c1", "r2": "c2"}),
    ("a silent replica restarted since: nothing stands for it", {"r2": "c2"}, {"r1": "c1", "r2": "c2-new"}, {"r2"},
     set(), {"r1": "c1", "r2": "c2"}),
    ("a silent replica never heard whole (an operator restarted): nothing stands", {}, {"r1": "c1", "r2": "c2"},
     {"r2"}, set(), {"r1": "c1"}),
    ("a replica gone is forgotten", {"r9": "c9"}, {"r1": "c1", "r2": "c2"}, set(), set(), {"r1": "c1", "r2": "c2"}),
])
def test_a_replica_that_leaves_a_question_unanswered_is_steady_only_if_the_same_container_answered_before(
        case: str, before: dict[str, str], containers: dict[str, str], silent: set[str], steady: set[str],
        after: dict[str, str]) -> None:
    rnd = _with_containers(_round(), **containers)
    seen = {(r, "a"): pp.Seen(False, None, answered=r not in silent) for r in ("r1", "r2")}
    answered = pp.answered_after(rnd, ["r1", "r2"], seen, before)
    assert (set(answered.silent), answered.steady, answered.containers) == (silent, steady, after), case


def test_a_previous_operators_loads_are_those_recorded_and_not_sent_here_and_triton_is_asked_of_the_unready() -> None:
    rnd = _round()
    d = _digest(rnd)
    since = NOW - dt.timedelta(seconds=5)
    body = {**rnd.body, "status": {"replicaModels": [
        {"pod": r, "loading": {"a": {"digest": d, "since": "2026-11-26T11:59:55Z"}}} for r in ("r1", "r2", "r9")]}}
    rnd = replace(rnd, body=body)
    theirs = pp.previous_loads(rnd, ["r1", "r2"], {("r2", "a", d)})
    assert theirs == {"r1": {"a": pp.InFlight(d, since)}, "r2": {}}, "r2's was sent by this process; r9 is not Ready"
    assert pp.heard_asks(rnd, theirs, {}) == [("r1", "a")]
    assert pp.heard_asks(rnd, theirs, {("r1", "a"): pp.Seen(True, d)}) == [], "READY at its digest: nothing to ask"


# -- the statuses written and the Events told ----------------------------------------------------------------------


def test_a_status_is_written_only_where_it_changes_and_a_plan_over_what_it_wrote_writes_nothing() -> None:
    rnd = _round()
    world = _world(rnd, **_serves(rnd), carried=pp.Carried(False, False))
    first = pp.plan_pool(world)
    assert set(first.model_writes) == {"a"} and first.pool_write is not None, "nothing stored yet"
    told = [(c["type"], c["reason"], pp.event_type(c)) for c in first.model_writes["a"].changed]
    assert told == [("Ready", pp.ALL_COPIES_WARMED, "Normal")], "a first status tells its Ready alone"
    stored = {n: w.patch for n, w in first.model_writes.items()}
    again = pp.plan_pool(replace(world, stored=stored, pool_stored=first.pool_write.patch))
    assert again.model_writes == {} and again.pool_write is None, "the second plan writes nothing"
    # A copy stops serving: a's status changes, and its Ready turns False with a Warning.
    gone = pp.plan_pool(replace(world, stored=stored, pool_stored=first.pool_write.patch,
                                seen={**world.seen, ("r2", "a"): pp.Seen(False, None)}))
    told = [(c["type"], c["status"], pp.event_type(c)) for c in gone.model_writes["a"].changed]
    assert ("Ready", "False", "Warning") in told and gone.pool_write is not None


def test_a_status_patch_removes_what_is_no_longer_reported() -> None:
    rnd = _round()
    plan = pp.plan_pool(_world(rnd, **_serves(rnd), stored={"a": {"servedBy": ["e"], "replicas": 2}},
                               pool_stored={"unplaced": "1Gi", "oldField": 1}))
    assert plan.model_writes["a"].patch["servedBy"] is None and plan.model_writes["a"].patch["replicas"] == 2
    assert plan.pool_write is not None and plan.pool_write.patch["oldField"] is None


def test_a_back_off_doubles_up_to_its_most() -> None:
    assert [pp.backoff_seconds(n, pp.HELD_SECONDS, pp.HELD_MAX_SECONDS) for n in (1, 2, 3, 7, 8, 20)] == \
        [5.0, 10.0, 20.0, 300.0, 300.0, 300.0]


def _two_models() -> pp.PoolRound:
    """Models a (2 copies) and u (1 copy) on pool p's two Ready replicas r1 and r2."""
    u = python_model("u", pool="p", memory="1Gi", replicas=1)
    bodies = {"u": _body(u), "a": _body(python_model("a", pool="p", memory="1Gi", replicas=2))}
    pool_body = _body(pool_document("p"))
    return pp.round_of("ns", TritonPool.model_validate(pool_body), pool_body, pp.members("p", bodies),
                       [_pod("r1", "198.18.0.1"), _pod("r2", "198.18.0.2", node="n2")], None)


def test_mid_round_a_copy_just_listed_rewrites_the_slices_of_the_models_with_a_copy_on_its_replica() -> None:
    rnd = _two_models()
    (r,) = rnd.placement.copies["u"]
    other = ({"r1", "r2"} - {r}).pop()
    seen = {(k, n): pp.Seen(True, m.digest) for n, m in rnd.members.items() for k in rnd.placement.copies[n]}
    assert pp.slices(rnd, {}, seen, frozenset(), {}, r) == {"a": {"r1", "r2"}, "u": {r}}
    assert pp.slices(rnd, {}, seen, frozenset({(other, "a")}), {}, other) == {"a": {r}}, "u has no copy there"


def test_mid_round_a_replica_leaving_before_anything_is_observed_takes_out_only_its_own_endpoints() -> None:
    """Issue 41 (a CI rehearsal at 2fadfd5, e2e/test_pool.py): a pool pod turned not Ready while its round still
    awaited its first answers. Every model's slices were recomputed from what the round had observed so far (nothing),
    so the models served on the healthy replica lost every endpoint for 0.4 s. They keep what their slices list as
    ready, less the pod that left."""
    from triton_operator.render.pool import render_endpoint_slices

    rnd = _two_models()
    (r,) = rnd.placement.copies["u"]
    leaving = ({"r1", "r2"} - {r}).pop()  # u is on the healthy replica alone
    listed = {n: pp.listed_ready(render_endpoint_slices(m.model, f"uid-{n}", "ns", list(rnd.placement.copies[n]),
                                                        rnd.pods, set(rnd.placement.copies[n])))
              for n, m in rnd.members.items() if m.model is not None}
    assert listed == {"a": {"r1", "r2"}, "u": {r}}, "every copy serving, as the slices were last applied"
    rnd.pods[leaving] = pp.ReplicaPod.of(_pod(leaving, f"198.18.0.{leaving[1]}", ready=False))  # the pod event
    assert pp.serving(rnd.placement, rnd.members, rnd.pods, {}, {}, frozenset(), {}, rnd.graph) == \
        {"a": set(), "u": set()}, "recomputed from nothing observed: what emptied them"
    assert pp.slices_left(rnd, listed) == {"a": {r}, "u": {r}}
    assert pp.slices_left(rnd, {"a": {leaving}}) == {"a": set(), "u": set()}, "only out, never in"


# -- a plan carried out leaves a world whose plan does nothing ----------------------------------------------------


def _carried_out(world: pp.PoolWorld, plan: pp.PoolPlan) -> pp.PoolWorld:
    """`world` after `plan`'s work as Triton would take it (each load READY at its digest, each unload gone), its
    status writes stored, and the round's records kept; then planned after the loads, and those writes stored too."""
    rnd = world.round
    seen = dict(world.seen)
    records = {r: dict(v) for r, v in world.records.items()}
    for r, w in plan.work.items():
        for t in w.unload:
            records.get(r, {}).pop(t, None)
        for ld in w.load:
            seen[(r, ld.member)] = pp.Seen(True, rnd.members[ld.member].digest)
    stored = {**world.stored, **{n: w.patch for n, w in plan.model_writes.items()}}
    pool_stored = plan.pool_write.patch if plan.pool_write is not None else world.pool_stored
    after = replace(world, seen=seen, records=pp.records_after(rnd, records, seen), stored=stored,
                    pool_stored=pool_stored, carried=pp.Carried(plan.busy, False))
    done = pp.plan_pool(after)
    return replace(after, carried=None, stored={**stored, **{n: w.patch for n, w in done.model_writes.items()}},
                   pool_stored=done.pool_write.patch if done.pool_write is not None else pool_stored)


@pytest.mark.parametrize("case", ["fresh replicas", "an update of copies serving", "a copy to unload", "a heal"])
def test_a_round_carried_out_leaves_a_world_whose_next_round_loads_nothing_and_writes_nothing(case: str) -> None:
    rnd = _round()
    start = {"fresh replicas": {}, "an update of copies serving": _serves(rnd, "old"),
             "a copy to unload": {**_serves(rnd), "records": {"r1": {"a": _digest(rnd), "gone": "x"},
                                                              "r2": {"a": _digest(rnd)}}},
             "a heal": {**_serves(rnd), "broken": {("r1", "a"): "stub dead"}}}[case]
    world, busy = _world(rnd, **start), []
    while len(busy) < 4 and (not busy or busy[-1]):
        plan = pp.plan_pool(world)
        busy.append(plan.busy)
        world = _carried_out(world, plan)
        if case == "a heal":
            world = replace(world, broken={}, heals_held={("r1", "a")})  # unloaded and loaded again: not broken
    rounds = len(busy)
    final = pp.plan_pool(world)
    assert not final.busy and final.model_writes == {} and final.pool_write is None, (case, rounds)
    assert final.settled and final.serving["a"] == {"r1", "r2"} and rounds <= 3, case


# -- a rollout of the pool's pod template (`plan.pool.rollout`): a replica leaves only once its copies serve elsewhere

NEW, OLD = "new-template", "old-template"


def _replica(name: str, ip: str, template: str, node: str = "n1", up: bool = True, handed_over: bool = False,
             leaving: bool = False, replica_set: str = "") -> dict[str, Any]:
    """A pool pod of `template`: its containers Ready when `up`, Ready only once its handover gate is open (a pod of
    an older template, NEW's only carry the gate: OLD's are Ready when up)."""
    gated = template == NEW
    ready = up and (handed_over or not gated)
    conditions = [{"type": "ContainersReady", "status": str(up)}, {"type": "Ready", "status": str(ready)}]
    if handed_over:
        conditions.append({"type": pp_api.HANDOVER_CONDITION, "status": "True"})
    meta: dict[str, Any] = {"name": name, "uid": f"u-{name}", "labels": {pp_api.LABEL_POOL_TEMPLATE: template}}
    if leaving:
        meta["annotations"] = {pp_api.ANNOTATION_LEAVING: "true", pp.POD_DELETION_COST: "-1"}
    if replica_set:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replica_set,
                                    "uid": f"u-{replica_set}", "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": node},
            "status": {"phase": "Running", "podIP": ip, "conditions": conditions}}


def _rolling(*pods: dict[str, Any], placed: dict[str, list[str]], records: dict[str, dict[str, str]] | None = None,
             replicas: int = 2, stuck: str | None = None, replica_sets: dict[str, str] | None = None,
             per_replica: str = "4Gi") -> pp.PoolRound:
    """Models a, b (1 copy of 1Gi each, placed as `placed` says) on pool p of `replicas` whose Deployment's template
    is NEW, with `pods`."""
    docs = {}
    for n in ("a", "b"):
        doc = _body(python_model(n, pool="p", memory="1Gi", replicas=1))
        doc["status"] = {"placement": placed.get(n, [])}
        docs[n] = doc
    pool_body = _body(pool_document("p", replicas=replicas, capacity={"memoryPerReplica": per_replica}))
    pool_body["status"] = {"replicaModels": [{"pod": r, "loaded": loaded} for r, loaded in (records or {}).items()]}
    return pp.round_of("ns", TritonPool.model_validate(pool_body), pool_body, pp.members("p", docs), list(pods),
                       None, NEW, unschedulable=stuck, replica_sets=replica_sets)


def _seen_on(rnd: pp.PoolRound, *where: tuple[str, str]) -> dict[str, Any]:
    """The world where each (replica, model) of `where` is READY at the model's desired digest."""
    seen = {(r, n): pp.Seen(True, rnd.members[n].digest) for r, n in where}
    records: dict[str, dict[str, str]] = {}
    for r, n in where:
        records.setdefault(r, {})[n] = rnd.members[n].digest or ""
    return {"seen": seen, "records": records}


def test_a_new_replica_up_beside_old_ones_marks_the_emptiest_leaving_and_its_gate_waits_a_round() -> None:
    rnd = _rolling(_replica("r1", "198.18.0.1", OLD), _replica("r2", "198.18.0.2", OLD, node="n2"),
                   _replica("r3", "198.18.0.3", NEW), placed={"a": ["r1"], "b": ["r2"]},
                   records={"r1": {"a": "d"}, "r2": {"b": "d", "c": "d"}})
    assert rnd.rollout.leaving == {"r1"} and rnd.rollout.mark == "r1", "r1 has loaded least, by the pool's record"
    assert rnd.rollout.waiting == ("r3",)
    assert rnd.costs["r1"] == {pp.POD_DELETION_COST: "-1", pp_api.ANNOTATION_LEAVING: "true"}, \
        "the Deployment deletes the lowest cost first: the leaving replica, and no other"
    assert rnd.placement.copies["a"][0] == "r1" and len(rnd.placement.copies["a"]) == 2, \
        "a's copy stays on r1, serving until r1 goes, and is placed once more elsewhere"
    assert rnd.placement.copies["b"] == ("r2",), "a model on a replica that stays is not moved"
    assert list(rnd.ready) == ["r1", "r2", "r3"], "r3 takes loads before it is Ready: its tritonserver answers"
    plan = pp.plan_pool(_world(rnd, **_seen_on(rnd, ("r1", "a"), ("r2", "b"), (rnd.placement.copies["a"][1], "a"))))
    assert plan.handovers == (), "not in the round that marks r1: its mark is written first"


def test_the_gate_opens_once_every_copy_of_the_leaving_replica_serves_elsewhere() -> None:
    pods = (_replica("r1", "198.18.0.1", OLD, leaving=True), _replica("r2", "198.18.0.2", OLD, node="n2"),
            _replica("r3", "198.18.0.3", NEW, node="n2"))
    rnd = _rolling(*pods, placed={"a": ["r1"], "b": ["r2"]})
    assert rnd.rollout.leaving == {"r1"} and rnd.rollout.mark is None, "the mark read back from the pod"
    moved = rnd.placement.copies["a"][1]
    assert moved == "r3", "spread: the emptiest replica, off r1's node"
    plan = pp.plan_pool(_world(rnd, **_seen_on(rnd, ("r1", "a"), ("r2", "b"))))
    assert [ld.member for ld in plan.work[moved].load] == ["a"], "a loads on its new replica"
    assert plan.handovers == (), "a serves on r1 alone: r1 may not go yet"
    after = pp.plan_pool(_world(rnd, carried=pp.Carried(True, False),
                                **_seen_on(rnd, ("r1", "a"), ("r2", "b"), (moved, "a"))))
    assert after.handovers == ("r3",), "a serves elsewhere now: r3 turns Ready, and the Deployment deletes r1"
    assert after.serving["a"] == {"r1"}, "r3's copy takes traffic once r3 is Ready, not before"


def test_a_copy_that_failed_elsewhere_does_not_hold_the_gate_but_a_model_must_serve_somewhere_else() -> None:
    pods = (_replica("r1", "198.18.0.1", OLD, leaving=True), _replica("r2", "198.18.0.2", OLD, node="n2"),
            _replica("r3", "198.18.0.3", NEW, node="n2"))
    rnd = _rolling(*pods, placed={"a": ["r1"], "b": ["r2"]})
    moved = rnd.placement.copies["a"][1]
    failed = {"a": {moved: "load failed: boom"}}
    plan = pp.plan_pool(_world(rnd, carried=pp.Carried(True, False), failures=failed,
                               **_seen_on(rnd, ("r1", "a"), ("r2", "b"))))
    assert plan.handovers == (), "a would serve nowhere once r1 goes"


def test_with_no_replica_of_an_older_template_a_new_replica_is_handed_over_at_once() -> None:
    rnd = _rolling(_replica("r1", "198.18.0.1", NEW, handed_over=True), _replica("r2", "198.18.0.2", NEW),
                   placed={"a": ["r1"], "b": ["r2"]})
    assert rnd.rollout.leaving == frozenset() and rnd.rollout.waiting == ("r2",)
    assert pp.plan_pool(_world(rnd)).handovers == ("r2",), "a scale-up, a replaced pod: nothing to hand over"


def test_a_replica_of_the_new_template_not_up_yet_marks_nothing() -> None:
    rnd = _rolling(_replica("r1", "198.18.0.1", OLD), _replica("r2", "198.18.0.2", OLD),
                   _replica("r3", "198.18.0.3", NEW, up=False), placed={"a": ["r1"], "b": ["r2"]})
    assert rnd.rollout == pp.Rollout(frozenset(), None, ()), "its tritonserver does not answer yet: no copy to move"
    assert rnd.placement.copies == {"a": ("r1",), "b": ("r2",)}


def test_a_pool_waiting_for_an_upgrade_slot_and_a_pool_rolling_say_so_on_progressing() -> None:
    rnd = replace(_round(), upgrade=Upgrade(False, "2 of at most 2 Deployments are in an upgrade rollout"))
    plan = pp.plan_pool(_world(rnd, **_serves(rnd)))
    progressing = next(c for c in plan.pool_status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", UPGRADE_WAITING), progressing
    assert "2 of at most 2" in progressing["message"]
    rolling = _rolling(_replica("r1", "198.18.0.1", OLD, leaving=True), _replica("r2", "198.18.0.2", OLD, node="n2"),
                       _replica("r3", "198.18.0.3", NEW, node="n2"), placed={"a": ["r1"], "b": ["r2"]})
    plan = pp.plan_pool(_world(rolling))
    progressing = next(c for c in plan.pool_status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", pp.ROLLING_REPLICAS), progressing
    assert "r1 leaves once its copies serve elsewhere, replaced by r3" in progressing["message"]


def test_a_pool_whose_upgrade_rollout_cannot_schedule_its_surge_pod_says_so_on_progressing() -> None:
    why = ("the upgrade rollout's new pod p-pool-x cannot be scheduled: 0/2 nodes are available: 2 Insufficient "
           "nvidia.com/gpu. Its other replicas keep serving; the pool holds its upgrade slot until there is room")
    rnd = replace(_round(), unschedulable=why)
    progressing = next(c for c in pp.plan_pool(_world(rnd, **_serves(rnd))).pool_status["conditions"]
                       if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", UPGRADE_UNSCHEDULABLE), progressing
    assert "Insufficient nvidia.com/gpu" in progressing["message"] and "the pool holds" in progressing["message"]


STUCK = "the upgrade rollout's new pod p-pool-x cannot be scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu"


def test_a_surge_pod_that_cannot_be_scheduled_marks_an_old_replica_leaving_with_no_new_one_up() -> None:
    rnd = _rolling(_replica("r1", "198.18.0.1", OLD), _replica("r2", "198.18.0.2", OLD, node="n2"),
                   placed={"a": ["r1"], "b": ["r2"]}, records={"r1": {"a": "d"}, "r2": {"b": "d", "c": "d"}},
                   stuck=STUCK)
    assert rnd.rollout == pp.Rollout(frozenset({"r1"}), "r1", ()), "r1 has loaded least: it goes first"
    assert rnd.costs["r1"] == {pp.POD_DELETION_COST: "-1", pp_api.ANNOTATION_LEAVING: "true"}
    assert rnd.placement.copies["a"] == ("r1", "r2"), "a's copy is placed on r2 too, the one replica that stays"
    world = _seen_on(rnd, ("r1", "a"), ("r2", "b"), ("r2", "a"))
    assert not pp.plan_pool(_world(rnd, **world)).no_surge, "not in the round that marks r1: its mark is written first"


def test_once_the_leaving_replicas_copies_serve_elsewhere_the_rollout_goes_on_without_its_surge_pod() -> None:
    pods = (_replica("r1", "198.18.0.1", OLD, leaving=True), _replica("r2", "198.18.0.2", OLD, node="n2"))
    rnd = _rolling(*pods, placed={"a": ["r1"], "b": ["r2"]}, stuck=STUCK)
    assert rnd.rollout == pp.Rollout(frozenset({"r1"}), None, ()), "the mark read back from the pod"
    plan = pp.plan_pool(_world(rnd, **_seen_on(rnd, ("r1", "a"), ("r2", "b"))))
    assert [ld.member for ld in plan.work["r2"].load] == ["a"], "a loads on r2"
    assert not plan.no_surge, "a serves on r1 alone: r1 may not go yet"
    after = pp.plan_pool(_world(rnd, carried=pp.Carried(True, False),
                                **_seen_on(rnd, ("r1", "a"), ("r2", "b"), ("r2", "a"))))
    assert after.no_surge, "a serves on r2 too: the Deployment may delete r1 and give its GPU to the new pod"
    assert after.handovers == (), "no new replica to hand over to yet"
    scheduled = _rolling(*pods, placed={"a": ["r1"], "b": ["r2"]})
    assert not pp.plan_pool(_world(scheduled, carried=pp.Carried(True, False), **_seen_on(
        scheduled, ("r1", "a"), ("r2", "b"), ("r2", "a")))).no_surge, "a surge pod that can be scheduled is kept"


def test_a_pool_of_one_old_replica_keeps_waiting_for_room_for_its_surge_pod() -> None:
    rnd = _rolling(_replica("r1", "198.18.0.1", OLD), placed={"a": ["r1"], "b": ["r1"]}, replicas=1, stuck=STUCK)
    assert rnd.rollout == pp.Rollout(frozenset(), None, ()), "its copies would have nowhere else to serve"
    assert not pp.plan_pool(_world(rnd, **_seen_on(rnd, ("r1", "a"), ("r1", "b")))).no_surge


def test_with_two_older_templates_the_leaving_replica_is_one_of_the_oldest_replicasets() -> None:
    """The Deployment scales its oldest ReplicaSet down first, whatever the pods' deletion costs: r2 has loaded
    least, but r1's ReplicaSet is older, so r1 leaves; a mark left on r2 by an earlier round is taken off."""
    ages = {"p-pool-a": "2026-11-30T01:00:00Z", "p-pool-b": "2026-11-30T02:00:00Z", "p-pool-c": "2026-11-30T03:00:00Z"}
    pods = (_replica("r1", "198.18.0.1", OLD, replica_set="p-pool-a"),
            _replica("r2", "198.18.0.2", "older-too", node="n2", leaving=True, replica_set="p-pool-b"),
            _replica("r3", "198.18.0.3", NEW, replica_set="p-pool-c"))
    rnd = _rolling(*pods, placed={"a": ["r1"], "b": ["r2"]}, records={"r1": {"a": "d", "c": "d"}, "r2": {"b": "d"}},
                   replica_sets=ages)
    assert rnd.rollout == pp.Rollout(frozenset({"r1"}), "r1", ("r3",)), rnd.rollout
    assert rnd.costs["r1"] == {pp.POD_DELETION_COST: "-1", pp_api.ANNOTATION_LEAVING: "true"}
    assert rnd.costs["r2"].get(pp_api.ANNOTATION_LEAVING, "kept") is None, "r2's mark is taken off"
    unknown = _rolling(*pods, placed={"a": ["r1"], "b": ["r2"]}, records={"r1": {"a": "d", "c": "d"}, "r2": {"b": "d"}})
    assert unknown.rollout.leaving == {"r2"}, "the ReplicaSets' ages unknown: any old replica's mark holds, as before"


def test_a_scale_down_marks_the_replica_that_loaded_least_and_goes_on_once_its_copies_serve_elsewhere() -> None:
    """Three replicas of the current template, the pool scaled to 2: r1 (a's copy only) is marked leaving; its copy
    is placed on another replica too; the Deployment takes the lower count only in a later round (the mark written
    first) and once a serves elsewhere."""
    pods = (_replica("r1", "198.18.0.1", NEW, handed_over=True), _replica("r2", "198.18.0.2", NEW, handed_over=True),
            _replica("r3", "198.18.0.3", NEW, node="n2", handed_over=True))
    records = {"r1": {"a": "d"}, "r2": {"b": "d", "c": "d"}, "r3": {"b": "d", "c": "d"}}
    rnd = _rolling(*pods, placed={"a": ["r1"], "b": ["r2"]}, records=records)
    assert rnd.rollout == pp.Rollout(frozenset({"r1"}), "r1", (), shrinking=True), rnd.rollout
    assert rnd.costs["r1"] == {pp.POD_DELETION_COST: "-1", pp_api.ANNOTATION_LEAVING: "true"}
    assert "r1" in rnd.placement.copies["a"] and len(rnd.placement.copies["a"]) == 2, rnd.placement.copies
    moved = next(r for r in rnd.placement.copies["a"] if r != "r1")
    served = _seen_on(rnd, ("r1", "a"), ("r2", "b"), (moved, "a"))
    assert not pp.plan_pool(_world(rnd, **served)).shrink, "not in the round that marks r1: its cost is written first"
    marked = _rolling(_replica("r1", "198.18.0.1", NEW, handed_over=True, leaving=True), *pods[1:],
                      placed={"a": ["r1"], "b": ["r2"]}, records=records)
    assert marked.rollout == pp.Rollout(frozenset({"r1"}), None, (), shrinking=True), "the mark read back"
    plan = pp.plan_pool(_world(marked, **_seen_on(marked, ("r1", "a"), ("r2", "b"))))
    assert not plan.shrink, "a serves on r1 alone: the Deployment keeps its 3 replicas"
    assert "scaling down: r1 leaves once its copies serve elsewhere" in next(
        c for c in plan.pool_status["conditions"] if c["type"] == "Progressing")["message"]
    moved = next(r for r in marked.placement.copies["a"] if r != "r1")
    after = pp.plan_pool(_world(marked, carried=pp.Carried(True, False),
                                **_seen_on(marked, ("r1", "a"), ("r2", "b"), (moved, "a"))))
    assert after.shrink, "a serves elsewhere: the Deployment may take 2 replicas and remove r1"


def test_a_scale_down_is_not_held_by_a_copy_with_no_room_elsewhere_and_a_pool_at_its_size_marks_nothing() -> None:
    pods = (_replica("r1", "198.18.0.1", NEW, handed_over=True, leaving=True),
            _replica("r2", "198.18.0.2", NEW, handed_over=True))
    rnd = _rolling(*pods, placed={"a": ["r1"], "b": ["r2"]}, replicas=1, per_replica="1Gi")
    assert rnd.rollout.shrinking and rnd.rollout.leaving == {"r1"}
    assert rnd.placement.copies["a"] == ("r1",), "r2 (1Gi of 1Gi used by b) has no room for a"
    assert pp.plan_pool(_world(rnd, **_seen_on(rnd, ("r1", "a"), ("r2", "b")))).shrink, \
        "a fits nowhere else: its copy goes with r1, as before, rather than the scale-down waiting for ever"
    steady = _rolling(*pods, placed={"a": ["r1"], "b": ["r2"]}, replicas=2)
    assert steady.rollout == pp.Rollout(), "as many replicas as wanted: nothing leaves"
    assert steady.costs["r1"].get(pp_api.ANNOTATION_LEAVING, "kept") is None, "an old mark is taken off"


def test_a_pool_deployment_keeps_its_replicas_through_a_scale_down_only_with_an_unchanged_template() -> None:
    from triton_operator.controller.pool import _held_replicas

    def deployment(replicas: int, template: str) -> dict[str, Any]:
        return {"spec": {"replicas": replicas, "template": {"metadata": {"labels": {
            pp_api.LABEL_POOL_TEMPLATE: template}}}}}
    assert _held_replicas(deployment(3, NEW), deployment(2, NEW)) == 3, "a scale-down: held until handed over"
    assert _held_replicas(deployment(3, OLD), deployment(2, NEW)) is None, "a new template: the rollout scales it"
    assert _held_replicas(deployment(2, NEW), deployment(3, NEW)) is None, "a scale-up: at once"
    assert _held_replicas(deployment(2, NEW), deployment(2, NEW)) is None
