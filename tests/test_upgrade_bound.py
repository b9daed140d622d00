"""The bound on upgrade rollouts (`plan.upgrade`): an operator that renders another pod template for unchanged
TritonModels rolls at most N of their Deployments at once; a change of the user's own rolls at once, as always.

The pure decision over plain dicts, in the planner's world (`tests.planner_world`); an operator upgrade is played by
planning with other `Options` (a longer preStop sleep: another pod template for the same spec). Then the controller's
part in a narrow test with a stand-in for the API server: the count in the cache, and the reservation that keeps two
reconciles at once from both taking the last slot."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tests.documents import pool_document
from tests.planner_world import NS, _Api, _body, _conditions, _settle, _world
from triton_operator.api.kinds import LABEL_MODEL
from triton_operator.api.pool import TritonPool
from triton_operator.controller.cache import Cache, Children
from triton_operator.controller.reconcile import Reconciler
from triton_operator.plan.planner import Plan, World, carried_out, plan
from triton_operator.plan.upgrade import (
    LABEL_GENERATION,
    LABEL_SOURCE,
    LABEL_STARTED,
    NO_SURGE,
    RECORD,
    UPGRADE_STARTED,
    UPGRADE_UNSCHEDULABLE,
    UPGRADE_WAITING,
    Upgrades,
    bound_deployment,
    draining,
    rollout_finished,
    source_digest,
    unschedulable,
    upgrade_rollouts,
)
from triton_operator.render.kubernetes import Options
from triton_operator.render.pool import render_pool_deployment

OLD = Options()
STARTED = "1767225600"  # a record's start: 2026-01-01T00:00:00Z in Unix seconds
#: What the API server takes as a label's value: at most 63 characters, alphanumerics, `-`, `_` and `.` between.
LABEL_VALUE = re.compile(r"(?=.{0,63}$)([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
NEW = Options(pre_stop_sleep_seconds=OLD.pre_stop_sleep_seconds + 2)  # the new operator's pod template


def _finished(dep: Mapping[str, Any]) -> dict[str, Any]:
    """The Deployment once its controller rolled it out: every replica updated and available."""
    n = dep["spec"]["replicas"]
    meta = {**dep["metadata"], "generation": 2, "namespace": dep["metadata"].get("namespace", NS)}
    return {**dep, "metadata": meta, "status": {"observedGeneration": 2, "replicas": n, "updatedReplicas": n,
                                                 "availableReplicas": n, "readyReplicas": n}}


def _rolling(dep: Mapping[str, Any]) -> dict[str, Any]:
    """The Deployment mid-rollout: one replica of the new template, the old ones still there."""
    out = _finished(dep)
    n = out["spec"]["replicas"]
    out["status"] = {**out["status"], "updatedReplicas": 1, "replicas": n + 1, "availableReplicas": n}
    return out


def _settled(name: str = "m", **spec: Any) -> World:
    """Model `name` settled by an operator of options OLD, its Deployment rolled out."""
    world, _ = _settle(_world(_body(name, f"uid-{name}", **spec), options=OLD), _Api(), {})
    key = ("Deployment", name)
    return replace(world, children={**world.children, key: _finished(world.children[key])})


def _upgraded(world: World, *rolling: str, limit: int = 2) -> World:
    """`world` as an operator of options NEW sees it, with the Deployments `rolling` (names in NS) counted."""
    return replace(world, options=NEW, upgrades=Upgrades(limit, frozenset((NS, n) for n in rolling)),
                   now=world.now + dt.timedelta(minutes=5))


def _deployment(decided: Plan) -> dict[str, Any] | None:
    return next((a.obj for a in decided.apply if a.obj["kind"] == "Deployment"), None)


def _live(world: World, name: str = "m") -> dict[str, Any]:
    dep = world.children[("Deployment", name)]
    assert dep is not None
    return dict(dep)


def _changed(world: World, **spec: Any) -> World:
    """The user changed the model's spec by `spec`: a generation later."""
    body = copy.deepcopy(dict(world.body))
    body["spec"] = {**body["spec"], **spec}
    body["metadata"]["generation"] += 1
    return replace(world, body=body, models={**world.models, body["metadata"]["name"]: body})


def test_the_upgrade_is_played_by_another_pod_template_for_the_same_spec() -> None:
    world = _settled()
    assert plan(replace(world, options=OLD)).apply == (), "settled"
    dep = _deployment(plan(_upgraded(world, limit=0)))
    assert dep is not None and dep["spec"]["template"] != _live(world)["spec"]["template"]


def test_below_the_bound_an_upgrade_rollout_starts_and_is_marked_on_the_deployment_metadata_only() -> None:
    world = _upgraded(_settled(), "other", limit=2)
    decided = plan(world)
    dep = _deployment(decided)
    assert dep is not None
    assert decided.upgrade is not None and decided.upgrade.started
    assert "1 of at most 2" in decided.upgrade.message
    assert dep["metadata"]["labels"][LABEL_STARTED] == str(int(world.now.timestamp()))
    assert dep["metadata"]["labels"][LABEL_GENERATION] == "1"
    assert dep["spec"]["template"]["spec"] != _live(world)["spec"]["template"]["spec"], "the new template"
    template = dep["spec"]["template"]["metadata"]
    assert not set(RECORD) & {*template["labels"], *template["annotations"], *dep["spec"]["selector"]["matchLabels"]}, (
        "nothing on the pod template or the selector")
    assert not set(RECORD) & set(dep["metadata"].get("annotations") or {}), "nothing in the annotations"
    for k in RECORD:
        assert LABEL_VALUE.fullmatch(dep["metadata"]["labels"][k]), (k, dep["metadata"]["labels"][k])
    # Carried out, the next plan keeps the mark (it counts until the rollout finishes) and writes nothing.
    again = plan(carried_out(world, decided))
    assert again.upgrade is None and _deployment(again) is None


def test_at_the_bound_the_deployment_keeps_its_template_and_the_model_says_it_waits() -> None:
    settled = _settled(replicas=2)
    world = _upgraded(settled, "a", "b", limit=2)
    decided = plan(world)
    assert decided.upgrade is not None and not decided.upgrade.started
    assert _deployment(decided) is None, "its template stays, and its record says the same spec: no write"
    progressing = _conditions(decided)["Progressing"]
    assert (progressing.status, progressing.reason) == ("True", UPGRADE_WAITING)
    assert "2 of at most 2" in progressing.message
    assert [e.reason for e in decided.events] == [UPGRADE_WAITING]
    # While it waits, planning again over the result writes nothing.
    waiting = carried_out(world, decided)
    again = plan(waiting)
    assert again.writes_nothing and again.upgrade is not None and not again.upgrade.started
    # A slot frees: it starts.
    freed = plan(replace(waiting, upgrades=Upgrades(2, frozenset({(NS, "a")}))))
    assert freed.upgrade is not None and freed.upgrade.started
    new = _deployment(freed)
    assert new is not None and new["spec"]["template"] != _live(world)["spec"]["template"]
    assert _conditions(freed)["Progressing"].reason != UPGRADE_WAITING


def test_zero_means_no_bound() -> None:
    decided = plan(_upgraded(_settled(), *"abcdefgh", limit=0))
    assert decided.upgrade is not None and decided.upgrade.started
    assert "no bound" in decided.upgrade.message


def test_a_deployment_already_in_an_upgrade_rollout_keeps_its_slot_and_start_for_a_newer_template() -> None:
    settled = _settled()
    marked = _rolling(_live(settled))
    marked["metadata"]["labels"] = {**marked["metadata"]["labels"], LABEL_STARTED: STARTED}
    world = _upgraded(replace(settled, children={**settled.children, ("Deployment", "m"): marked}), "m", "other", limit=2)
    decided = plan(world)
    assert decided.upgrade is not None and decided.upgrade.started, "it holds one of the two slots already"
    dep = _deployment(decided)
    assert dep is not None and dep["metadata"]["labels"][LABEL_STARTED] == STARTED


def test_only_unfinished_upgrade_rollouts_count() -> None:
    dep = _live(_settled())
    marked = {**dep, "metadata": {**dep["metadata"], "labels": {**dep["metadata"]["labels"], LABEL_STARTED: STARTED}}}

    def named(d: Mapping[str, Any], name: str) -> dict[str, Any]:
        return {**d, "metadata": {**d["metadata"], "name": name}}

    unseen = _finished(marked)
    unseen["metadata"]["generation"] = 3  # the Deployment controller has not seen the latest spec yet
    assert not rollout_finished(unseen)
    assert rollout_finished(_finished(marked))
    deployments = [
        named(_rolling(marked), "upgrading"),
        named(unseen, "upgrading-unseen"),
        named(_finished(marked), "upgraded"),  # finished: its slot is free, though the mark stays
        named(_rolling(dep), "user-rollout"),  # rolling, but not an upgrade rollout
        {**named(_rolling(marked), "not-a-deployment"), "kind": "ReplicaSet"},
    ]
    assert upgrade_rollouts(deployments) == {(NS, "upgrading"), (NS, "upgrading-unseen")}


def test_a_change_of_the_users_spec_rolls_at_once_at_the_bound_and_frees_a_slot_it_held() -> None:
    settled = _settled()
    marked = _rolling(_live(settled))
    marked["metadata"]["labels"] = {**marked["metadata"]["labels"], LABEL_STARTED: STARTED}
    world = _upgraded(replace(settled, children={**settled.children, ("Deployment", "m"): marked}), "a", "b", limit=2)
    decided = plan(_changed(world, server={"args": ["--log-verbose=1"]}))
    dep = _deployment(decided)
    assert decided.upgrade is None
    assert dep is not None and dep["spec"]["template"] != marked["spec"]["template"]
    assert LABEL_STARTED not in dep["metadata"]["labels"], "left out: server-side apply removes it"
    assert dep["metadata"]["labels"][LABEL_GENERATION] == "2"


def test_a_change_of_the_users_spec_that_reloads_in_place_writes_only_the_record_labels_of_the_deployment() -> None:
    """The API server bumps a Deployment's metadata.generation on a change of its spec or of its annotations, not of
    its labels: the record there keeps a config change, which the replicas reload in place, from moving it."""
    world = _settled()
    live = _live(world)
    decided = plan(_changed(world, maxBatchSize=8))
    dep = _deployment(decided)
    assert decided.upgrade is None
    assert dep is not None, "the record says another spec"
    assert dep["metadata"]["labels"][LABEL_SOURCE] != live["metadata"]["labels"][LABEL_SOURCE]
    assert dep["metadata"]["labels"][LABEL_GENERATION] == "2"
    assert dep["spec"] == {k: live["spec"][k] for k in dep["spec"]}, "the same spec: selector, replicas, template"
    assert dep["metadata"].get("annotations") == live["metadata"].get("annotations"), "the same annotations"


def test_a_scale_is_no_change_of_the_spec_it_waits_but_takes_its_replicas() -> None:
    world = _upgraded(_settled(replicas=2), "a", "b", limit=2)
    decided = plan(_changed(world, replicas=3))  # an HPA's or kubectl scale's write: a new generation too
    dep = _deployment(decided)
    assert decided.upgrade is not None and not decided.upgrade.started
    assert dep is not None and dep["spec"]["replicas"] == 3
    assert dep["spec"]["template"] == _live(world)["spec"]["template"]
    live = _live(world)["metadata"]["labels"]
    assert {k: dep["metadata"]["labels"].get(k) for k in RECORD} == {k: live.get(k) for k in RECORD}, (
        "the record stays as the live template's")


def test_a_change_of_an_ensemble_step_is_the_users_and_is_not_bounded() -> None:
    step = _body("step", "uid-step", replicas=0)
    ensemble = {"platform": "ensemble", "ensemble": {"steps": [{"model": "step"}]}}
    models = {"step": step}
    assert source_digest(_body("e"), models) == source_digest(_body("e", replicas=5), models), "replicas left out"
    changed = {"step": {**step, "spec": {**step["spec"], "parameters": {"p": "1"}}}}
    assert source_digest(_body("e", **ensemble), models) != source_digest(_body("e", **ensemble), changed)
    assert source_digest(_body("e"), models) == source_digest(_body("e"), changed), "not a step of a plain model"


def _without_record(world: World, *, observed: int | None) -> World:
    """`world` as an operator from before the record left it: no record on the Deployment; the model's
    status.observedGeneration is `observed`."""
    dep = _live(world)
    dep["metadata"]["labels"] = {k: v for k, v in dep["metadata"]["labels"].items() if k not in RECORD}
    body = copy.deepcopy(dict(world.body))
    body["status"]["observedGeneration"] = observed
    return replace(world, body=body, models={**world.models, "m": body}, children={**world.children, ("Deployment", "m"): dep})


def test_a_deployment_of_an_older_operator_counts_as_unchanged_when_the_status_saw_the_spec() -> None:
    world = _upgraded(_settled(), "a", "b", limit=2)
    waits = plan(_without_record(world, observed=1))
    assert waits.upgrade is not None and not waits.upgrade.started, "the older operator reconciled generation 1"
    assert _deployment(waits) is None, "no write while it waits: not even the record (its start writes it)"
    newer = _changed(_without_record(world, observed=1), server={"args": ["--log-verbose=1"]})
    rolls = plan(newer)
    assert rolls.upgrade is None, "generation 2 was never reconciled: the user's change"
    assert _deployment(rolls) is not None


def test_no_bound_on_a_deployment_without_replicas_nor_on_a_new_one() -> None:
    assert plan(_upgraded(_settled(replicas=0), "a", "b")).upgrade is None
    fresh = _upgraded(_world(_body(), options=OLD), "a", "b")
    assert plan(fresh).upgrade is None


def test_a_restarted_operator_counts_again_from_the_deployments_it_sees() -> None:
    first = _upgraded(_settled("m"), limit=1)
    started = _deployment(plan(first))
    assert started is not None
    # A new process: nothing of the old one's but the Deployments. One of them is mid-upgrade, its mark on it.
    seen = [_rolling(started), _live(_settled("other"), "other")]
    counted = upgrade_rollouts(seen)
    assert counted == {(NS, "m")}
    other = _upgraded(_settled("other"), limit=1)
    waits = plan(replace(other, upgrades=Upgrades(1, counted)))
    assert waits.upgrade is not None and not waits.upgrade.started
    # m finished: the count read again is 0, and the other starts.
    goes = plan(replace(other, upgrades=Upgrades(1, upgrade_rollouts([_finished(started), seen[1]]))))
    assert goes.upgrade is not None and goes.upgrade.started


def test_the_cache_counts_the_deployments_in_an_upgrade_rollout_as_they_are_stored() -> None:
    children = Children()
    dep = _live(_settled())
    marked = {**dep, "metadata": {**dep["metadata"], "namespace": NS,
                                  "labels": {**dep["metadata"]["labels"], LABEL_STARTED: STARTED}}}
    key = ("Deployment", NS, "m")
    children[key] = _rolling(marked)
    assert children.upgrading == {(NS, "m")}
    children[key] = _finished(marked)
    assert children.upgrading == set(), "finished: the slot frees"
    children[key] = _rolling(marked)
    del children[key]
    assert children.upgrading == set(), "gone: the slot frees"


# -- the controller's part, with a stand-in for the API server ---------------------------------------------------


class _Kube:
    """What `Reconciler._reconcile` calls, in memory: applies are stored as sent; Events are recorded. Each call
    yields to the event loop first, as the real calls (in a thread) do."""

    def __init__(self, deployments: list[dict[str, Any]], models: list[dict[str, Any]]) -> None:
        self.deployments = deployments
        self.models = {m["metadata"]["name"]: m for m in models}
        self.applied: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        self.listed = 0

    def list(self, api_version: str, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        return []

    def list_versioned(self, api_version: str, kind: str, namespace: str | None,
                       label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        self.listed += 1
        return self.deployments, "1"

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        return None

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        return True

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj)
        return {**copy.deepcopy(obj), "status": {}}

    def patch_custom_status(self, group: str, version: str, plural: str, namespace: str, name: str,
                            status: dict[str, Any]) -> dict[str, Any]:
        body = self.models[name]
        body["status"] = _merged(body.get("status") or {}, status)
        return copy.deepcopy(body)

    def event(self, involved: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self.events.append((involved["metadata"]["name"], reason))


def _merged(old: Any, patch: Any) -> Any:
    """A JSON merge patch (RFC 7386) of `old`."""
    if not isinstance(patch, dict):
        return patch
    out = dict(old) if isinstance(old, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merged(out.get(k), v)
    return out


def _cached(cache: Cache, world: World) -> None:
    cache.put_model(world.body)
    cache.prime_pods(NS, world.body["metadata"]["name"], [])
    for child in world.children.values():
        if child is not None:
            cache.put_child({**child, "metadata": {**child["metadata"], "namespace": NS}})


def test_two_reconciles_at_once_do_not_both_take_the_last_slot_and_the_count_is_listed_first() -> None:
    """Limit 2; one Deployment the watch has not delivered yet is mid-upgrade (the LIST finds it): one slot is left
    for the two models reconciled at once. One starts (and says so in an Event), the other waits."""
    elsewhere = _rolling(_live(_settled("elsewhere"), "elsewhere"))
    elsewhere["metadata"] = {**elsewhere["metadata"], "namespace": "team-b",
                             "labels": {**elsewhere["metadata"]["labels"], LABEL_STARTED: STARTED}}
    worlds = [_settled(name) for name in ("m1", "m2")]
    kube = _Kube([elsewhere], [copy.deepcopy(dict(w.body)) for w in worlds])
    cache = Cache()
    for w in worlds:
        _cached(cache, w)
    rec = Reconciler(kube, cache, NEW, max_upgrade_rollouts=2)  # type: ignore[arg-type]

    async def both() -> None:
        await asyncio.gather(rec.reconcile(NS, "m1"), rec.reconcile(NS, "m2"))

    asyncio.run(both())
    assert kube.listed == 1, "listed once per process"
    rolled = [d["metadata"]["name"] for d in kube.applied
              if d["kind"] == "Deployment" and LABEL_STARTED in d["metadata"]["labels"]]
    assert len(rolled) == 1, kube.applied
    assert [e for e in kube.events if e[1] == UPGRADE_STARTED] == [(rolled[0], UPGRADE_STARTED)]
    assert cache.children.upgrading == {("team-b", "elsewhere"), (NS, rolled[0])}
    waiting = ({"m1", "m2"} - set(rolled)).pop()
    assert rec._waiting == {(NS, waiting)}
    assert (waiting, UPGRADE_WAITING) in kube.events, "the status' transition to UpgradeRolloutWaiting is an Event"
    assert rec._reserved == set(), "the reservation ends with the apply"

    # The rollout finishes (the watch delivers its Deployment): its model's reconcile wakes the waiting one, which
    # starts.
    done = next(d for d in kube.applied if d["metadata"]["name"] == rolled[0] and d["kind"] == "Deployment")
    cache.put_child(_finished(done))
    assert cache.children.upgrading == {("team-b", "elsewhere")}

    async def freed() -> None:
        await rec.reconcile(NS, rolled[0])
        assert set(rec.queue.workers) == {(NS, waiting)}, "the waiting model is reconciled again"
        await asyncio.wait_for(asyncio.gather(*rec.queue.workers.values()), 30)

    asyncio.run(freed())
    assert [e for e in kube.events if e[1] == UPGRADE_STARTED] == [(rolled[0], UPGRADE_STARTED), (waiting, UPGRADE_STARTED)]
    assert rec._waiting == set()


def test_a_waiting_model_that_is_gone_is_asked_once_not_for_ever() -> None:
    rec = Reconciler(_Kube([], []), Cache(), NEW, max_upgrade_rollouts=1)  # type: ignore[arg-type]
    rec._waiting = {(NS, "gone")}

    async def wake() -> None:
        rec.request(NS, "other")  # any reconcile, with a slot free, asks the waiting ones

        async def drained() -> None:
            while rec.queue.workers:
                await asyncio.gather(*list(rec.queue.workers.values()))

        await asyncio.wait_for(drained(), 5)  # asked for ever, the gone model's worker would never end

    asyncio.run(wake())
    assert rec._waiting == set()


def test_a_finished_upgrade_rollout_keeps_its_slot_while_a_pod_it_replaced_terminates() -> None:
    """The replaced pod holds its GPU until it is gone: freed at the rollout's end, the slot let the next model's surge
    pod go Pending as Unschedulable on a node with one GPU for the bound (e2e/test_upgrade.py, two such pods). A user's
    own rollout (no LABEL_STARTED) holds no slot, terminating pods or not."""
    dep = _live(_settled())
    marked = {**dep, "metadata": {**dep["metadata"], "namespace": NS,
                                  "labels": {**dep["metadata"]["labels"], LABEL_STARTED: STARTED}}}
    old = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "m-old", "namespace": NS, "uid": "u-old", "resourceVersion": "7", "labels": {LABEL_MODEL: "m"},
        "deletionTimestamp": "2026-01-01T00:00:30Z"}}
    cache = Cache()
    cache.put_model(_settled().body)
    cache.prime_pods(NS, "m", [])
    cache.put_child(_finished(marked))
    cache.put_pod(old)
    rec = Reconciler(_Kube([], []), cache, NEW, max_upgrade_rollouts=1)  # type: ignore[arg-type]
    assert cache.children.upgrading == set(), "the Deployment's rollout is finished"
    assert rec._upgrades().rolling == {(NS, "m")}, "the replaced pod still terminates: the slot is held"
    assert draining(marked, [old]) and not draining(dep, [old]) and not draining(marked, [])
    cache.put_pod(old, deleted=True)
    assert rec._upgrades().rolling == frozenset(), "the pod is gone: the slot frees"


#: The strategy every model Deployment is rendered with: a surge pod first, no replica down.
SURGE = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def _marked(world: World, dep: Mapping[str, Any]) -> World:
    """`world` with its Deployment `dep`, in NS."""
    dep = {**dep, "metadata": {**dep["metadata"], "namespace": NS}}
    return replace(world, children={**world.children, ("Deployment", dep["metadata"]["name"]): dep})


def test_an_upgrade_rollout_of_two_replicas_or_more_replaces_one_at_a_time_without_a_surge_pod() -> None:
    """On a cluster whose GPUs are all in use, a surge pod stays Pending: an upgrade rollout of a model that has a
    replica to spare rolls in the GPUs it holds. The strategy stays while the record's start does (no write at the
    rollout's end), a scale to 1 replica takes the surge back, and the user's own change rolls with the surge."""
    settled = _settled(replicas=2)
    assert _live(settled)["spec"]["strategy"] == SURGE, "as rendered"
    world = _upgraded(settled, limit=2)
    decided = plan(world)
    dep = _deployment(decided)
    assert dep is not None and decided.upgrade is not None and decided.upgrade.started
    assert dep["spec"]["strategy"] == NO_SURGE
    assert "one replica at a time, without a surge pod" in decided.upgrade.message
    assert dep["spec"]["template"] != _live(world)["spec"]["template"], "the new template, in the same write"
    # Carried out, mid-rollout and finished: the strategy stays, the Deployment is not written again.
    carried = carried_out(world, decided)
    applied = _live(carried)
    assert applied["spec"]["strategy"] == NO_SURGE
    for dep_now in (_rolling(applied), _finished(applied)):
        assert _deployment(plan(_marked(carried, dep_now))) is None
    # Scaled to 1 mid-rollout: maxUnavailable 1 would take its only replica down; the surge is back.
    scaled = plan(_changed(_marked(carried, _rolling(applied)), replicas=1))
    down = _deployment(scaled)
    assert down is not None and down["spec"]["replicas"] == 1 and down["spec"]["strategy"] == SURGE
    assert down["metadata"]["labels"][LABEL_STARTED] == applied["metadata"]["labels"][LABEL_STARTED]
    # The user's own change: rendered as ever (a surge), the start dropped.
    mine = _deployment(plan(_changed(_marked(carried, _finished(applied)), server={"args": ["--log-verbose=1"]})))
    assert mine is not None and mine["spec"]["strategy"] == SURGE and LABEL_STARTED not in mine["metadata"]["labels"]


def test_an_upgrade_rollout_of_one_replica_keeps_the_surge() -> None:
    """Without the surge, a 1-replica model would serve nothing from its old pod's drain until the new one is warm."""
    decided = plan(_upgraded(_settled(), limit=2))
    dep = _deployment(decided)
    assert dep is not None and decided.upgrade is not None and decided.upgrade.started
    assert dep["spec"]["strategy"] == SURGE
    assert "with a surge pod" in decided.upgrade.message


def test_a_marked_deployment_takes_the_strategy_alone_which_rolls_no_pod() -> None:
    """A Deployment whose upgrade rollout an operator from before this rule started (with the surge): the next plan
    writes its strategy alone. The strategy is not in the pod template, whose hash names the ReplicaSet: no pod
    rolls for it (the render goldens, tests/golden/children.json, hold it under the Deployment's spec)."""
    settled = _settled(replicas=3)
    live = _live(settled)
    marked = _finished({**live, "metadata": {**live["metadata"], "labels": {**live["metadata"]["labels"],
                                                                          LABEL_STARTED: STARTED}}})
    dep = _deployment(plan(_marked(settled, marked)))
    assert dep is not None and dep["spec"]["strategy"] == NO_SURGE
    assert dep["spec"]["template"] == marked["spec"]["template"], "the same pod template: no new ReplicaSet"
    assert {k: v for k, v in dep["spec"].items() if k != "strategy"} == \
        {k: v for k, v in marked["spec"].items() if k != "strategy"}


def _pod(name: str, *, pending: str | None = None, terminating: bool = False) -> dict[str, Any]:
    """A pod of model m: running, or Pending with the scheduler's message `pending`, or terminating."""
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": {LABEL_MODEL: "m"}}
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    status: dict[str, Any] = {"phase": "Running"}
    if pending is not None:
        status = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                      "reason": "Unschedulable", "message": pending}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {}, "status": status}


NO_GPU = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available."


def test_a_surge_pod_that_cannot_be_scheduled_is_said_on_the_status_not_held_in_silence() -> None:
    """A 1-replica model's upgrade rollout on a full cluster: its surge pod Pending as Unschedulable. Progressing says
    so, with the scheduler's words, and an Event; the model still serves on its old pod. Not while the Pending pod
    waits for the GPU a pod of its own model gives back (a no-surge replacement), nor in a user's own rollout."""
    settled = _settled()
    world = _upgraded(settled, limit=2)
    decided = plan(world)
    carried = carried_out(world, decided)
    rolling = _rolling(_live(carried))
    full = replace(_marked(carried, rolling), pods=[_pod("m-old"), _pod("m-new", pending=NO_GPU)])
    said = plan(full)
    progressing = _conditions(said)["Progressing"]
    assert (progressing.status, progressing.reason) == ("True", UPGRADE_UNSCHEDULABLE)
    assert "m-new" in progressing.message and "Insufficient nvidia.com/gpu" in progressing.message
    assert "the model holds its upgrade slot" in progressing.message
    pods = [_pod("m-old"), _pod("m-new", pending=NO_GPU)]
    assert "the pool holds its upgrade slot" in (unschedulable(rolling, pods, owner="pool") or ""), \
        "a pool's Deployment (controller.pool) says whose slot it is"
    assert UPGRADE_UNSCHEDULABLE in [e.reason for e in said.events]
    # The GPU it waits for is on its way back: a pod of the model terminates.
    on_its_way = plan(replace(full, pods=[*full.pods, _pod("m-older", terminating=True)]))
    assert _conditions(on_its_way)["Progressing"].reason != UPGRADE_UNSCHEDULABLE
    # The same Pending pod in a user's own rollout (no LABEL_STARTED): not an upgrade rollout.
    user = dict(rolling)
    user["metadata"] = {**rolling["metadata"], "labels": {k: v for k, v in rolling["metadata"]["labels"].items()
                                                          if k != LABEL_STARTED}}
    assert _conditions(plan(replace(full, children={**full.children, ("Deployment", "m"): user})))[
        "Progressing"].reason != UPGRADE_UNSCHEDULABLE
    # Scheduled: the condition goes.
    scheduled = plan(replace(full, pods=[_pod("m-old"), _pod("m-new")]))
    assert _conditions(scheduled)["Progressing"].reason != UPGRADE_UNSCHEDULABLE


def test_no_upgrade_rollout_starts_while_another_cannot_schedule_its_new_pod() -> None:
    """Below the bound too: a pod started now would wait for the same room, or take the GPU a no-surge replacement
    waits for (the scheduler gives a freed GPU to the pod Pending first). Unbounded (0), nothing waits."""
    settled = _settled(replicas=2)
    stuck = replace(_upgraded(settled, "a", limit=3), upgrades=Upgrades(3, frozenset({(NS, "a")}), frozenset({(NS, "a")})))
    decided = plan(stuck)
    assert decided.upgrade is not None and not decided.upgrade.started
    assert _deployment(decided) is None
    progressing = _conditions(decided)["Progressing"]
    assert progressing.reason == UPGRADE_WAITING and f"{NS}/a cannot schedule its new pod" in progressing.message
    freed = plan(replace(stuck, upgrades=Upgrades(3, frozenset({(NS, "a")}))))
    assert freed.upgrade is not None and freed.upgrade.started
    unbounded = plan(replace(stuck, upgrades=Upgrades(0, frozenset({(NS, "a")}), frozenset({(NS, "a")}))))
    assert unbounded.upgrade is not None and unbounded.upgrade.started
    # Its own rollout goes on (a newer template, say): it holds its slot.
    own = plan(replace(stuck, upgrades=Upgrades(3, frozenset({(NS, "m")}), frozenset({(NS, "m")}))))
    assert own.upgrade is not None and own.upgrade.started


def test_the_controller_counts_an_upgrade_rollout_whose_new_pod_cannot_be_scheduled_as_stuck() -> None:
    dep = _rolling(_live(_settled()))
    marked = {**dep, "metadata": {**dep["metadata"], "namespace": NS,
                                  "labels": {**dep["metadata"]["labels"], LABEL_STARTED: STARTED}}}
    pending = {**_pod("m-new", pending=NO_GPU), "metadata": {**_pod("m-new")["metadata"], "uid": "u-new",
                                                             "resourceVersion": "8"}}
    cache = Cache()
    cache.put_model(_settled().body)
    cache.prime_pods(NS, "m", [])
    cache.put_child(marked)
    cache.put_pod(pending)
    rec = Reconciler(_Kube([], []), cache, NEW, max_upgrade_rollouts=2)  # type: ignore[arg-type]
    assert rec._upgrades().stuck == {(NS, "m")}
    rec._waiting.add((NS, "waiting"))
    rec._wake_waiting()
    assert rec._waiting == {(NS, "waiting")}, "not asked while the pod waits for room: it would wait again"
    cache.put_pod({**pending, "metadata": {**pending["metadata"], "resourceVersion": "9"},
                   "status": {"phase": "Running"}})
    assert rec._upgrades().stuck == frozenset()
    assert not Reconciler(_Kube([], []), cache, NEW, max_upgrade_rollouts=0)._upgrades().stuck  # type: ignore[arg-type]


# -- a TritonPool's Deployment: the same bound, with its surge pod kept (its replicas hand their copies over to it)

def _pool_body() -> dict[str, Any]:
    body = pool_document("p", replicas=2)
    body["metadata"] = {**body["metadata"], "namespace": NS, "uid": "uid-p", "generation": 1}
    body["status"] = {"observedGeneration": 1}
    return body


def _pool_deployment(options: Options) -> dict[str, Any]:
    return render_pool_deployment(TritonPool.model_validate(_pool_body()), "uid-p", NS, options)


def test_a_pools_deployment_counts_against_the_same_bound_and_rolls_with_its_surge_pod() -> None:
    body, now = _pool_body(), dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
    source = source_digest(body, {})
    first, upgrade = bound_deployment(_pool_deployment(OLD), None, body, source, Upgrades(2), now, no_surge=False)
    assert upgrade is None and first["metadata"]["labels"][LABEL_SOURCE] == source, "a new Deployment: recorded"
    live = _finished(first)
    desired = _pool_deployment(NEW)
    assert desired["spec"]["template"] != live["spec"]["template"], "the new operator renders another template"

    held, upgrade = bound_deployment(desired, live, body, source, Upgrades(2, frozenset({(NS, "a"), (NS, "b")})),
                                     now, no_surge=False)
    assert upgrade is not None and not upgrade.started and "unchanged pool" in upgrade.message, upgrade
    assert held["spec"]["template"] == live["spec"]["template"], "at the bound: the live template, nothing rolls"

    out, upgrade = bound_deployment(desired, live, body, source, Upgrades(2, frozenset({(NS, "a")})), now,
                                    no_surge=False)
    assert upgrade is not None and upgrade.started and out["spec"]["template"] == desired["spec"]["template"]
    assert out["metadata"]["labels"][LABEL_STARTED] == str(int(now.timestamp()))
    assert out["spec"]["strategy"] == desired["spec"]["strategy"] != NO_SURGE, \
        "a pool keeps maxSurge 1: the leaving replica's copies go to the surge pod first (plan.pool.rollout)"
    assert "copies serve elsewhere" in upgrade.message

    changed = {**body, "spec": {**body["spec"], "server": {"podAnnotations": {"a": "b"}}},
               "metadata": {**body["metadata"], "generation": 2}}
    _, upgrade = bound_deployment(desired, live, changed, source_digest(changed, {}),
                                  Upgrades(2, frozenset({(NS, "a"), (NS, "b")})), now, no_surge=False)
    assert upgrade is None, "the user's own change to the pool rolls at once, as a model's does"


def test_a_pools_upgrade_rollout_that_cannot_schedule_its_surge_pod_or_still_drains_holds_the_bound() -> None:
    """The pools' rounds list their pods and tell the models' reconciler (`report_pool`), whose cache holds no pool
    pod: a pool's surge pod Pending for room stops any other upgrade rollout from starting, as a model's does, and
    its replaced replicas still terminating keep its slot."""
    rec = Reconciler(_Kube([], []), Cache(), NEW, max_upgrade_rollouts=2)  # type: ignore[arg-type]
    key = (NS, "p-pool")
    rec.report_pool(key, stuck=True, drains=False)
    assert rec.upgrade_slots().stuck == {key} and rec.upgrade_slots().rolling == set()
    rec.report_pool(key, stuck=False, drains=True)
    assert rec.upgrade_slots().stuck == set() and rec.upgrade_slots().rolling == {key}
    rec.report_pool(key, stuck=False, drains=False)
    assert rec.upgrade_slots() == Upgrades(2, frozenset(), frozenset()), "both told over: the slot is free"
