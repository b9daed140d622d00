"""In-place rollouts, pure: `plan.rollout` and how `plan.planner.plan` uses it.

A model is settled at one spec (its children as the API server stores them, `tests.planner_world._settle`) with
replicas made from its Deployment's pod template, then its spec changes; the plan says whether the Deployment
rolls or the replicas are told, by pod annotations, to load the new config in place.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from tests.planner_world import NS, _Api, _body, _conditions, _settle, _world
from triton_operator.api.pod import (
    ANNOTATION_DIGEST,
    ANNOTATION_DRAIN_SECONDS,
    ANNOTATION_LOADED,
    ANNOTATION_POD_DIGEST,
    ANNOTATION_PREVIOUS,
    ANNOTATION_RELOAD,
    ANNOTATION_RELOAD_FAILED,
    ANNOTATION_RELOAD_FROM,
    ANNOTATION_RELOAD_MESSAGE,
    WARMED_CONDITION,
    repository_of,
)
from triton_operator.plan.planner import Plan, World, carried_out, plan
from triton_operator.plan.rollout import INSTRUCTION, PodPatch, patched

#: A model whose own config has something to change in each of its parts (and files beside it).
BASE: dict[str, Any] = {
    "replicas": 3,
    "maxBatchSize": 8,
    "batcher": {"maxQueueDelayMicroseconds": 100},
    "instanceGroups": [{"kind": "CPU", "count": 1}],
    "parameters": {"threshold": "0.5"},
    "modelFiles": {"inline": {"labels.txt": "cat\ndog\n"}},
}
#: A change of the model's own config alone.
CONFIG_CHANGE: dict[str, Any] = {"batcher": {"maxQueueDelayMicroseconds": 500}}
NAMES = ("m-a", "m-b", "m-c")


def _model(**over: Any) -> dict[str, Any]:
    """A TritonModel whose spec is BASE with `over` (a None value removes a field)."""
    body = _body(**{**BASE, **over})
    body["spec"] = {k: v for k, v in body["spec"].items() if v is not None}
    return body


def _template(decided: Plan) -> dict[str, Any]:
    """The pod template of the Deployment `decided` applies."""
    template: dict[str, Any] = next(a.obj for a in decided.apply if a.obj["kind"] == "Deployment")["spec"]["template"]
    return template


def _live(world: World) -> dict[str, Any]:
    """The pod template of the Deployment the API server holds."""
    deployment = world.children[("Deployment", "m")]
    assert deployment is not None
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def _after(world: World, decided: Plan) -> dict[str, Any]:
    """The pod template the Deployment has once `decided` is carried out."""
    applied = any(a.obj["kind"] == "Deployment" for a in decided.apply)
    return _template(decided) if applied else _live(world)


def _repository(decided: Plan) -> str:
    """The name of the repository ConfigMap `decided` applies."""
    return str(next(a.obj for a in decided.apply if a.obj["kind"] == "ConfigMap")["metadata"]["name"])


def _pod(template: Mapping[str, Any], name: str, *, ready: bool = True, warm: bool = True,
         annotations: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """A replica made from `template`, its annotations changed by `annotations` (None removes one)."""
    ann = dict(template["metadata"]["annotations"])
    for k, v in (annotations or {}).items():
        if v is None:
            ann.pop(k, None)
        else:
            ann[k] = v
    gates = list(template["spec"].get("readinessGates") or ())
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if gates:
        conditions.append({"type": WARMED_CONDITION, "status": "True" if warm else "False",
                           "reason": "ModelWarmed" if warm else "ModelWarming",
                           "lastTransitionTime": "2026-01-01T00:00:05Z"})
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                     "labels": dict(template["metadata"]["labels"]), "annotations": ann},
        "spec": {"readinessGates": gates},
        "status": {"conditions": conditions,
                   "containerStatuses": [{"name": "tritonserver", "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}]},
    }


def _rolled_out(**spec: Any) -> World:
    """The model settled at `_model(**spec)`, each of its replicas Ready and warm at that config (listed out of
    name order: the plan sorts them)."""
    world, _ = _settle(_world(_model(**spec)), _Api(), {})
    n = world.body["spec"]["replicas"]
    return replace(world, pods=[_pod(_live(world), name) for name in reversed(NAMES[:n])])


def _changed(world: World, **spec: Any) -> World:
    """`world` once the model's spec changed by `spec` (a None value removes a field), a generation later."""
    body = copy.deepcopy(dict(world.body))
    body["spec"] = {k: v for k, v in {**body["spec"], **spec}.items() if v is not None}
    body["metadata"]["generation"] += 1
    return replace(world, body=body, models={**world.models, "m": body}, now=world.now + dt.timedelta(seconds=10))


def _with_pod(world: World, name: str, **kw: Any) -> World:
    """`world` with replica `name` made again from the live template, as `_pod(..., **kw)` says."""
    return replace(world, pods=[_pod(_live(world), name, **kw) if p["metadata"]["name"] == name else p
                                for p in world.pods])


def _told(decided: Plan) -> dict[str, Mapping[str, str | None]]:
    return {p.name: p.annotations for p in decided.pods}


def _assert_a_config_change_rolls_the_deployment(world: World) -> None:
    """CONFIG_CHANGE applied to `world` rolls the Deployment: its template names the new digest and the new
    repository ConfigMap, and no replica is told to reload."""
    old = _live(world)["metadata"]["annotations"][ANNOTATION_DIGEST]
    decided = plan(_changed(world, **CONFIG_CHANGE))
    template = _after(world, decided)
    assert template["metadata"]["annotations"][ANNOTATION_DIGEST] == decided.digest != old
    assert repository_of(template) == _repository(decided)
    assert decided.pods == ()


# -- the pod digest --------------------------------------------------------------------------------


@pytest.mark.parametrize("change", [
    {"batcher": {"maxQueueDelayMicroseconds": 500}},
    {"instanceGroups": [{"kind": "CPU", "count": 2}]},
    {"parameters": {"threshold": "0.9"}},
], ids=["batcher", "instanceGroups", "parameters"])
def test_a_change_of_the_models_own_config_keeps_the_pod_digest(change: dict[str, Any]) -> None:
    before, after = _template(plan(_world(_model()))), _template(plan(_world(_model(**change))))
    assert after["metadata"]["annotations"][ANNOTATION_DIGEST] != before["metadata"]["annotations"][ANNOTATION_DIGEST]
    assert after["metadata"]["annotations"][ANNOTATION_POD_DIGEST] == before["metadata"]["annotations"][ANNOTATION_POD_DIGEST]


VERSIONS = [{"version": v, "source": {"inline": {"model.py": f"pass  # {v}\n"}}} for v in (1, 2)]


@pytest.mark.parametrize(("before", "after"), [
    ({}, {"server": {"image": "nvcr.io/nvidia/tritonserver:25.01-py3"}}),
    ({}, {"server": {"args": ["--log-verbose=1"]}}),
    ({}, {"server": {"resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}}),
    ({}, {"source": {"inline": {"model.py": "pass  # v2\n"}}}),
    ({}, {"modelFiles": {"inline": {"labels.txt": "cat\ndog\nbird\n"}}}),
    ({"versions": VERSIONS, "source": None, "versionPolicy": {"latest": 1}},
     {"versions": VERSIONS, "source": None, "versionPolicy": {"latest": 2}}),
], ids=["server.image", "server.args", "server.resources", "source", "modelFiles", "versionPolicy"])
def test_a_change_beyond_the_models_own_config_changes_the_pod_digest(before: dict[str, Any], after: dict[str, Any]) -> None:
    old, new = _template(plan(_world(_model(**before)))), _template(plan(_world(_model(**after))))
    assert new["metadata"]["annotations"][ANNOTATION_POD_DIGEST] != old["metadata"]["annotations"][ANNOTATION_POD_DIGEST]


# -- the planner: InPlace keeps the pod template and tells replicas ------------------------------------


@pytest.mark.parametrize("max_unavailable", [1, 2])
def test_a_config_change_in_place_keeps_the_template_and_tells_max_unavailable_replicas_in_name_order(
        max_unavailable: int) -> None:
    world = _rolled_out(rollout={"maxUnavailable": max_unavailable})
    live = copy.deepcopy(_live(world))
    old, old_repository = live["metadata"]["annotations"][ANNOTATION_DIGEST], repository_of(live)
    decided = plan(_changed(world, **CONFIG_CHANGE))
    new, repository = decided.digest, _repository(decided)
    assert new and new != old and repository != old_repository, "the config changed: a new digest, a new ConfigMap"
    # The Deployment keeps its template: no new pod.
    template = _after(world, decided)
    assert template == live
    assert template["metadata"]["annotations"][ANNOTATION_DIGEST] == old
    assert repository_of(template) == old_repository
    # The replicas are told, the first `maxUnavailable` by name, to swap the new config in.
    told = _told(decided)
    assert sorted(told) == list(NAMES[:max_unavailable])
    for patch in told.values():
        assert {k: v for k, v in patch.items() if v is not None} == {
            ANNOTATION_DIGEST: new, ANNOTATION_RELOAD: "Swap", ANNOTATION_RELOAD_FROM: repository,
            ANNOTATION_PREVIOUS: old}
        assert patch[ANNOTATION_DRAIN_SECONDS] is None, "no drain timeout in a swap"


def test_with_no_replica_wanted_a_config_change_rolls_the_deployment() -> None:
    """replicas: 0 has no replica to load the config: the template (and its ConfigMap) take the new config."""
    world = _rolled_out(replicas=0)
    assert world.pods == []
    _assert_a_config_change_rolls_the_deployment(world)


def test_in_place_the_configmap_the_kept_template_mounts_is_never_collected() -> None:
    """The template still mounts the old config's ConfigMap: a pod the Deployment creates later needs it, even
    when no ReplicaSet has a replica now; the new config's ConfigMap stays too (the replicas load from it)."""
    world = _rolled_out()
    old_repository = repository_of(_live(world))
    changed = _changed(world, **CONFIG_CHANGE)
    first = plan(changed)
    new_repository = _repository(first)
    for replicasets in ([], None):  # none can create pods; not read yet
        settled = replace(carried_out(changed, first), replicasets=replicasets)
        decided = plan(settled)
        assert [d.name for d in decided.delete if d.kind == "ConfigMap"] == []
        assert decided.reads == (), "both ConfigMaps are needed: nothing to read the ReplicaSets for"
        assert {k[1] for k, c in settled.children.items() if k[0] == "ConfigMap" and c is not None} == {
            old_repository, new_repository}


def test_a_config_change_with_new_pods_rolls_the_deployment_and_tells_no_replica() -> None:
    _assert_a_config_change_rolls_the_deployment(_rolled_out(rollout={"strategy": "NewPods"}))


def test_a_pod_level_change_rolls_the_deployment_and_tells_no_replica() -> None:
    world = _rolled_out()
    live = _live(world)
    image = "nvcr.io/nvidia/tritonserver:25.01-py3"
    decided = plan(_changed(world, server={"image": image}))
    template = _after(world, decided)
    assert template["metadata"]["annotations"][ANNOTATION_POD_DIGEST] != live["metadata"]["annotations"][ANNOTATION_POD_DIGEST]
    assert template["spec"]["containers"][0]["image"] == image
    assert decided.pods == ()


def test_a_pod_level_change_with_a_config_change_rolls_the_deployment_to_the_new_config() -> None:
    world = _rolled_out()
    decided = plan(_changed(world, server={"args": ["--log-verbose=1"]}, **CONFIG_CHANGE))
    template = _after(world, decided)
    assert template["metadata"]["annotations"][ANNOTATION_DIGEST] == decided.digest
    assert repository_of(template) == _repository(decided)
    assert decided.pods == ()


def test_without_the_warmup_gate_a_config_change_rolls_the_deployment() -> None:
    _assert_a_config_change_rolls_the_deployment(_rolled_out(warmupGate={"enabled": False}))


# -- modes ------------------------------------------------------------------------------------------


def test_drain_mode_tells_replicas_to_drain_for_the_specs_timeout() -> None:
    world = _rolled_out(rollout={"mode": "Drain", "drainTimeoutSeconds": 45})
    decided = plan(_changed(world, **CONFIG_CHANGE))
    told = _told(decided)
    assert list(told) == ["m-a"]
    assert told["m-a"][ANNOTATION_RELOAD] == "Drain"
    assert told["m-a"][ANNOTATION_DRAIN_SECONDS] == "45"
    assert ANNOTATION_PREVIOUS in told["m-a"] and told["m-a"][ANNOTATION_PREVIOUS] is None, \
        "one copy in memory: no previous digest (removed, should one be left)"


def test_a_sequence_model_always_drains() -> None:
    world = _rolled_out(batcher=None, sequenceBatcher={"maxSequenceIdleMicroseconds": 1000}, rollout={"mode": "Swap"})
    decided = plan(_changed(world, sequenceBatcher={"maxSequenceIdleMicroseconds": 5000}))
    assert _after(world, decided) == _live(world), "in place"
    told = _told(decided)
    assert list(told) == ["m-a"]
    assert told["m-a"][ANNOTATION_RELOAD] == "Drain" and told["m-a"][ANNOTATION_PREVIOUS] is None
    assert told["m-a"][ANNOTATION_DRAIN_SECONDS] == "30", "the default drainTimeoutSeconds"


def test_a_decoupled_model_always_drains() -> None:
    """Its replica leaves the Service and reloads once its open streams end (controller.reload waits for them)."""
    world = _rolled_out(decoupled=True, rollout={"mode": "Swap"})
    decided = plan(_changed(world, **CONFIG_CHANGE))
    assert _after(world, decided) == _live(world), "in place"
    told = _told(decided)
    assert list(told) == ["m-a"]
    assert told["m-a"][ANNOTATION_RELOAD] == "Drain" and told["m-a"][ANNOTATION_PREVIOUS] is None


# -- the budget -------------------------------------------------------------------------------------


def test_a_replica_out_of_the_service_is_told_at_once_to_drain_and_counts_as_unavailable() -> None:
    world = _with_pod(_changed(_rolled_out(), **CONFIG_CHANGE), "m-a", ready=False, warm=False)
    told = _told(plan(world))
    assert sorted(told) == ["m-a"], "m-a is out of the Service: the budget of 1 is used, m-b and m-c wait"
    assert (told["m-a"][ANNOTATION_RELOAD], told["m-a"][ANNOTATION_DRAIN_SECONDS]) == ("Drain", "0")
    assert told["m-a"][ANNOTATION_PREVIOUS] is None
    # A budget of 2: m-a uses one, m-b (serving) takes the other.
    world2 = _with_pod(_changed(_rolled_out(rollout={"maxUnavailable": 2}), **CONFIG_CHANGE), "m-a", ready=False,
                       warm=False)
    told2 = _told(plan(world2))
    assert sorted(told2) == ["m-a", "m-b"] and told2["m-b"][ANNOTATION_RELOAD] == "Swap", told2


def test_the_next_replica_waits_until_the_reloaded_one_is_back_in_the_service() -> None:
    """Drain: a replica whose reload finished is out of the Service until its gate turns True and the kubelet
    has it Ready again; until then it is the one unavailable replica, and the next one is not told."""
    world = _changed(_rolled_out(rollout={"mode": "Drain"}), **CONFIG_CHANGE)
    first = plan(world)
    assert [p.name for p in first.pods] == ["m-a"]
    after = carried_out(world, first)
    done = PodPatch("m-a", {**dict.fromkeys(INSTRUCTION), ANNOTATION_LOADED: first.digest}, "reloaded")
    back_soon = [_pod(_live(world), "m-a", ready=False, warm=False, annotations=patched(p, done)["metadata"]["annotations"])
                 if p["metadata"]["name"] == "m-a" else p for p in after.pods]
    assert plan(replace(after, pods=back_soon)).pods == (), "m-a is not Ready yet: m-b waits"
    ready = [patched(p, done) if p["metadata"]["name"] == "m-a" else p for p in after.pods]
    assert [p.name for p in plan(replace(after, pods=ready)).pods] == ["m-b"]


def test_a_replica_still_reloading_counts_against_max_unavailable() -> None:
    world = _changed(_rolled_out(), **CONFIG_CHANGE)
    decided = plan(world)
    new, old = decided.digest, _live(world)["metadata"]["annotations"][ANNOTATION_DIGEST]
    assert new
    reloading = _with_pod(world, "m-a", annotations={
        ANNOTATION_DIGEST: new, ANNOTATION_RELOAD: "Swap", ANNOTATION_RELOAD_FROM: _repository(decided),
        ANNOTATION_PREVIOUS: old})
    assert plan(reloading).pods == (), "m-a reloads: no second replica is told"
    # Told to load a config no longer wanted: it is told again, in the budget it already has.
    older = _with_pod(world, "m-a", annotations={ANNOTATION_DIGEST: "0123456789abcdef", ANNOTATION_RELOAD: "Swap",
                                                   ANNOTATION_PREVIOUS: old})
    assert list(_told(plan(older))) == ["m-a"]
    assert _told(plan(older))["m-a"][ANNOTATION_DIGEST] == new


def test_a_plan_carried_out_tells_no_replica_again_until_one_finishes() -> None:
    world = _changed(_rolled_out(), **CONFIG_CHANGE)
    first = plan(world)
    assert [p.name for p in first.pods] == ["m-a"]
    after = carried_out(world, first)
    again = plan(after)
    assert again.pods == (), "m-a still reloads"
    assert not any(a.obj["kind"] == "Deployment" for a in again.apply)
    # The reloader finished on m-a: the instruction is gone, the gate says what is loaded. The next one is told.
    done = PodPatch("m-a", {**dict.fromkeys(INSTRUCTION), ANNOTATION_LOADED: first.digest}, "reloaded")
    pods = [patched(p, done) if p["metadata"]["name"] == "m-a" else p for p in after.pods]
    assert [p.name for p in plan(replace(after, pods=pods)).pods] == ["m-b"]


# -- a failed reload --------------------------------------------------------------------------------


def test_a_failed_reload_stops_the_rollout_and_a_revert_clears_it() -> None:
    settled = _rolled_out()
    old_spec = copy.deepcopy(settled.body["spec"])
    world = _changed(settled, **CONFIG_CHANGE)
    new = plan(world).digest
    assert new
    # m-a could not load the new config: the reloader put the old one back and recorded the failure.
    failed = _with_pod(world, "m-a", annotations={ANNOTATION_RELOAD_FAILED: new, ANNOTATION_RELOAD_MESSAGE: "boom"})
    decided = plan(failed)
    assert decided.pods == (), "the rollout stops: no replica is told"
    conds = _conditions(decided)
    assert (conds["Degraded"].status, conds["Degraded"].reason) == ("True", "ReloadFailed")
    assert "m-a" in (conds["Degraded"].message or "") and "boom" in (conds["Degraded"].message or "")
    assert (conds["Ready"].status, conds["Ready"].reason) == ("False", "ReloadFailed")
    assert (conds["Progressing"].status, conds["Progressing"].reason) == ("False", "RolloutStalled")
    # The spec reverted: the desired config is the template's again. The failure clears and m-a drops its record.
    stored = carried_out(failed, decided)
    reverted = plan(_changed(stored, **old_spec))
    assert reverted.digest == _live(world)["metadata"]["annotations"][ANNOTATION_DIGEST]
    conds = _conditions(reverted)
    assert (conds["Degraded"].status, conds["Degraded"].reason) == ("False", "AsExpected")
    assert (conds["Ready"].status, conds["Ready"].reason) == ("True", "AllReplicasWarmed")
    assert _told(reverted) == {"m-a": {ANNOTATION_RELOAD_FAILED: None, ANNOTATION_RELOAD_MESSAGE: None}}


# -- the status -------------------------------------------------------------------------------------


def test_a_replica_mid_swap_is_not_warmed_until_its_previous_digest_goes() -> None:
    world = _changed(_rolled_out(), **CONFIG_CHANGE)
    new, old = plan(world).digest, _live(world)["metadata"]["annotations"][ANNOTATION_DIGEST]
    assert new
    swapping = _with_pod(world, "m-a", annotations={
        ANNOTATION_DIGEST: new, ANNOTATION_PREVIOUS: old, ANNOTATION_RELOAD: "Swap", ANNOTATION_LOADED: old})
    status = plan(swapping).status
    assert status is not None and status.warmed_replicas == 0, "its gate approves both: not at the new config yet"
    states = {s.pod: s for s in status.replica_states or ()}
    # m-b has no loaded-digest annotation: its True gate says it serves the config it was created for.
    assert states["m-a"].config_digest == old and states["m-b"].config_digest == old
    swapped = _with_pod(world, "m-a", annotations={ANNOTATION_DIGEST: new, ANNOTATION_LOADED: new})
    status = plan(swapped).status
    assert status is not None and status.warmed_replicas == 1
    assert {s.pod: s.config_digest for s in status.replica_states or ()}["m-a"] == new
