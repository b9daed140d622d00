"""The pool's reconcile, its pure part: which models a TritonPool carries, where their copies go, what each replica
must load or unload this round, and the statuses and EndpointSlices that follow from what the replicas answered.

A round, as a TritonModel's (`plan.planner`): `controller.pool` gathers (the pool, its pods, the namespace's
TritonModels: `round_of` derives the replicas, the placement and the step graph from them; what each replica's Triton,
probe and sidecar answered: `fetch_asks` and `replica_fetches` decide what a sidecar is asked and what its answer
means), calls `plan_pool(world) -> PoolPlan` and carries the plan out; after the loads it gathers again, and
`plan_pool` gives the statuses and when to come back. A pooled model's conditions come from chains of small named
policies (MODEL_READY, MODEL_PROGRESSING, MODEL_DEGRADED), as a model's own do (`plan.status`). The step graph is
built once per round (`graph_of`). The design of the placement: `plan.placement`'s docstring.

A replica's record (`TritonPool.status.replicaModels[].loaded`) says what the operator loaded there and Triton said
READY, by Triton model name, with the digest. It is what a restarted operator reads back: request-loaded models are
not in Triton's repository index, so the record is how it finds a model to unload that is no longer placed there.
During an in-place update the recorded (previous) digest is still accepted on a replica, as a model's own replica
accepts its previous config during a Swap, until the new one is READY there.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from ..api import steps as step_graph
from ..api.kinds import HPA, LABEL_MODEL, PDB, Kind
from ..api.pod import GRPC_PORT, HTTP_PORT
from ..api.pool import ANNOTATION_LEAVING, TritonPool, format_bytes
from ..api.timestamps import parse_rfc3339, rfc3339
from ..api.v1alpha1 import Condition, TritonModel, TritonModelStatus
from ..render.kubernetes import Options
from ..render.modelconfig import render_repository
from ..render.pool import (
    LoadRequest,
    ReplicaPod,
    load_request,
    pool_deployment_name,
    pool_selector,
    render_pool_children,
    render_pool_hpa,
    render_pool_key_secret,
)
from .placement import INSUFFICIENT_CAPACITY, Placement, PoolReplica, place
from .status import (
    admin_apis_open,
    as_dict,
    condition,
    kstatus_conditions,
    scaling_active,
    status_changed,
    transitions,
)
from .upgrade import UPGRADE_UNSCHEDULABLE, UPGRADE_WAITING, Upgrade

POOL_NOT_FOUND = "PoolNotFound"
#: The pool's Progressing reason while its Deployment rolls its pods to a new template (`rollout`).
ROLLING_REPLICAS = "RollingReplicas"
ALL_COPIES_WARMED = "AllCopiesWarmed"
COPIES_LOADING = "CopiesLoading"
COPIES_UPDATING = "CopiesUpdating"
LOAD_FAILED = "ModelLoadFailed"
#: A uri model's files could not be fetched into a replica (a pin, a 404, a cap): the reason beside ModelLoadFailed,
#: as a model's own replicas say it. The controller begins such a failure's message with FETCH_FAILED_PREFIX.
SOURCE_FETCH_FAILED = "SourceFetchFailed"
FETCH_FAILED_PREFIX = "fetch failed: "
#: A copy Triton calls READY that fails its requests (a dead Python stub, requests failing in a row: the replica's
#: probe says so), out of its slices and reloaded: the reason the Deployment path's gate gives too.
MODEL_FAILING = "ModelFailing"
#: A broken copy is reloaded again, if it stays broken, after this many seconds, doubling, up to `HEAL_MAX_SECONDS`.
HEAL_SECONDS, HEAL_MAX_SECONDS = 10.0, 300.0
#: A failed load (or fetch) of a model on a replica is retried after this many seconds, doubling, up to
#: `HELD_MAX_SECONDS`.
HELD_SECONDS, HELD_MAX_SECONDS = 5.0, 300.0


def backoff_seconds(failures: int, first: float, most: float) -> float:
    """How long to wait after the `failures`-th failure in a row: `first`, doubling each time, up to `most`."""
    return min(first * 2.0 ** (failures - 1), most)
NAME_TAKEN = "TritonNameTaken"


@dataclass(frozen=True)
class Member:
    """A TritonModel on the pool: what loads it (None when it cannot be loaded, with the problem)."""

    name: str
    body: Mapping[str, Any]
    model: TritonModel | None
    request: LoadRequest | None
    digest: str | None
    problem: tuple[str, str] | None = None  # (reason, message)

    @property
    def triton_name(self) -> str:
        return self.model.triton_name if self.model is not None else self.name

    @property
    def generation(self) -> int:
        return int(self.body["metadata"].get("generation", 0))

    @property
    def drains(self) -> bool:
        """Whether an update of this model drains a replica before reloading it (rollout.mode Drain, a sequence
        batcher or a decoupled model: as for a model's own replicas, `plan.rollout`)."""
        if self.model is None:
            return False
        spec = self.model.spec
        return spec.rollout.mode == "Drain" or spec.sequence_batcher is not None or bool(spec.decoupled)

    @property
    def budget(self) -> int:
        return self.model.spec.rollout.max_unavailable if self.model is not None else 1


@dataclass(frozen=True)
class PoolChildren:
    """What a pool's round writes of the pool's own objects: its key Secret (created once, never applied over),
    what it applies (its Deployment, PodDisruptionBudget and HPA, as wanted), and what it deletes, with why."""

    secret: dict[str, Any] | None
    apply: list[dict[str, Any]]
    delete: list[tuple[Kind, str, str]]  # (kind, name, why)


def pool_children(pool: TritonPool, uid: str, namespace: str, options: Options) -> PoolChildren:
    """The pool's own objects: its HPA only with `spec.autoscaling`, its PodDisruptionBudget only with more than one
    replica (a TritonModel's own replicas follow the same rule, `plan.planner`); the others are deleted."""
    apply = render_pool_children(pool, uid, namespace, options)
    delete: list[tuple[Kind, str, str]] = []
    name = pool_deployment_name(pool)
    if pool.spec.replicas <= 1:
        delete.append((PDB, name, "spec.replicas is 1 or less"))
    if pool.spec.autoscaling is not None:
        apply.append(render_pool_hpa(pool, uid, namespace))
    else:
        delete.append((HPA, name, "spec.autoscaling is unset"))
    return PoolChildren(render_pool_key_secret(pool, uid, namespace, options), apply, delete)


def pooled(pool: str, bodies: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The names of the TritonModels (among a namespace's `bodies`) that name `pool`, sorted."""
    return sorted(name for name, b in bodies.items() if ((b.get("spec") or {}).get("pool")) == pool)


@dataclass
class Memo:
    """What `members` parsed and rendered in earlier rounds, by model name: a model is parsed again only when its body
    (all but its status and resourceVersion, which our own status writes change) changes, and rendered again only
    when it or a step it reaches does. Parsing and rendering every model of a pool every round took 16-90 ms at 40
    models and 80-280 ms at 200 (this machine, busy), before the round could load a model just applied."""

    parsed: dict[str, tuple[str, TritonModel | None, str]] = field(default_factory=dict)  # essence, model, error
    rendered: dict[str, tuple[tuple[tuple[str, str], ...], LoadRequest | None, str | None, tuple[str, str] | None]] = (
        field(default_factory=dict))  # the reached models' essences, request, digest, problem


def _essence(body: Mapping[str, Any]) -> str:
    """The part of a TritonModel's body that parsing and rendering read: all but its status (and the metadata that
    changes with every write of it)."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")}
    return json.dumps({**{k: v for k, v in body.items() if k != "status"}, "metadata": meta}, sort_keys=True,
                      separators=(",", ":"), default=str)


def members(pool: str, bodies: Mapping[str, Mapping[str, Any]], memo: Memo | None = None) -> dict[str, Member]:
    """Every model on `pool`, parsed and rendered (or as `memo` kept them, when nothing they read changed); one that
    does not parse, render or load from a request carries its problem instead (its Ready condition says it; the
    other models are not held back)."""
    memo = Memo() if memo is None else memo
    names = pooled(pool, bodies)
    essences = {name: _essence(bodies[name]) for name in names}
    parsed: dict[str, TritonModel] = {}
    out: dict[str, Member] = {}
    for name in names:
        hit = memo.parsed.get(name)
        if hit is None or hit[0] != essences[name]:
            try:
                hit = (essences[name], TritonModel.model_validate(bodies[name]), "")
            except ValidationError as exc:
                hit = (essences[name], None, str(exc)[:2000])
            memo.parsed[name] = hit
        if hit[1] is None:
            out[name] = Member(name, bodies[name], None, None, None, ("InvalidSpec", hit[2]))
        else:
            parsed[name] = hit[1]
    graph = step_graph.of_models(parsed)
    for name, model in parsed.items():
        reached = [n for n in step_graph.closure(name, graph)[0] if n in parsed]
        key = tuple((n, essences[n]) for n in reached)
        done = memo.rendered.get(name)
        if done is None or done[0] != key:
            try:
                rendered = render_repository([parsed[n] for n in reached])[name]
                done = (key, load_request(rendered), rendered.digest, None)
            except (ValueError, KeyError) as exc:
                reason = "UnsupportedSource" if "uri" in str(exc) else "InvalidSpec"
                done = (key, None, None, (reason, str(exc)[:2000]))
            memo.rendered[name] = done
        out[name] = Member(name, bodies[name], model, done[1], done[2], done[3])
    for kept in (memo.parsed, memo.rendered):  # models gone from the pool
        for name in set(kept) - set(names):
            del kept[name]
    for name, first in _name_taken(parsed, bodies).items():
        m = out[name]
        out[name] = replace(m, request=None, problem=(NAME_TAKEN, (
            f"Triton name {m.triton_name!r} is taken on pool {pool} by TritonModel {first} (there first): two models "
            "of one name cannot load into one tritonserver; set spec.modelName to another name, or another spec.pool")))
    return dict(sorted(out.items()))


def _name_taken(parsed: Mapping[str, TritonModel], bodies: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The models whose Triton name another model of the pool has too, each with the one that keeps it: the oldest
    (creationTimestamp, then name), so a model serving under that name is never displaced by a newcomer."""
    def age(name: str) -> tuple[str, str]:
        return str(bodies[name]["metadata"].get("creationTimestamp") or ""), name

    by_triton: dict[str, list[str]] = {}
    for name, model in parsed.items():
        by_triton.setdefault(model.triton_name, []).append(name)
    out: dict[str, str] = {}
    for names in by_triton.values():
        first, *rest = sorted(names, key=age)
        out.update(dict.fromkeys(rest, first))
    return out


def _running(pod: Mapping[str, Any], view: ReplicaPod) -> bool:
    return not view.terminating and (pod.get("status") or {}).get("phase") not in ("Failed", "Succeeded")


def replicas(pods: Sequence[Mapping[str, Any]]) -> tuple[list[PoolReplica], dict[str, ReplicaPod]]:
    """The pool's replicas that take copies (pods scheduled to a node, not terminating, not finished), and every
    pod's slice view. A pod not scheduled yet takes none: it may never be (no node with the GPUs it asks)."""
    views = {str(p["metadata"]["name"]): ReplicaPod.of(p) for p in pods}
    live = [PoolReplica(name, views[name].node) for name, p in sorted((str(p["metadata"]["name"]), p) for p in pods)
            if views[name].node is not None and _running(p, views[name])]
    return live, views


def coming(pods: Sequence[Mapping[str, Any]], wanted: int) -> int:
    """Replicas the pool may still get soon: pods not scheduled yet that the scheduler has not found unschedulable,
    and pods the Deployment has yet to create (fewer than `wanted` exist). A copy short of room while replicas are
    coming is waiting for them; with none coming, the pool is short of capacity."""
    running = [p for p in pods if _running(p, ReplicaPod.of(p))]
    pending = 0
    for p in running:
        if (p.get("spec") or {}).get("nodeName"):
            continue
        conds = (p.get("status") or {}).get("conditions") or ()
        if not any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds):
            pending += 1
    return pending + max(0, wanted - len(running))


def recorded(pool_body: Mapping[str, Any] | None) -> dict[str, dict[str, str]]:
    """What the pool's status says each replica has loaded: pod -> Triton model name -> digest."""
    rows = ((pool_body or {}).get("status") or {}).get("replicaModels") or ()
    return {str(r.get("pod")): dict(r.get("loaded") or {}) for r in rows if r.get("pod")}


#: How long a restarted operator waits for a load a previous one sent (`awaited`) before it sends it again. Loads that
#: take longer are sent a second time: Triton holds the second behind the first (its load/unload conflict wait) and,
#: with the same config and files, it loads nothing new (measured, 2.51: no second initialize). A load that failed
#: is sent again then, too: Triton's answers cannot tell a failed load from one under way (`triton.pool.heard_of`).
IN_FLIGHT_SECONDS = 120.0


@dataclass(frozen=True)
class InFlight:
    """A load sent to a replica and not answered yet, as the pool's status records it (`replicaModels[].loading`)."""

    digest: str
    since: dt.datetime


def recorded_loading(pool_body: Mapping[str, Any] | None) -> dict[str, dict[str, InFlight]]:
    """The loads the pool's status says are in flight: pod -> Triton model name -> the load."""
    out: dict[str, dict[str, InFlight]] = {}
    for row in ((pool_body or {}).get("status") or {}).get("replicaModels") or ():
        for name, load in (row.get("loading") or {}).items():
            try:
                since = parse_rfc3339(str((load or {}).get("since") or "") or None)
            except ValueError:
                continue
            if row.get("pod") and since is not None and (load or {}).get("digest"):
                out.setdefault(str(row["pod"]), {})[str(name)] = InFlight(str(load["digest"]), since)
    return out


def awaited(placement: Placement, members: Mapping[str, Member], in_flight: Mapping[str, Mapping[str, InFlight]],
            seen: Mapping[tuple[str, str], Seen], heard: Mapping[tuple[str, str], bool | None], now: dt.datetime,
            bound: float = IN_FLIGHT_SECONDS) -> dict[tuple[str, str], InFlight]:
    """The (replica, model) loads to wait for rather than send: sent by a previous operator (`in_flight`: recorded,
    and not sent by this one) at the model's desired digest, not READY at it yet, received by Triton (`heard`: False
    means it never reached it, the operator stopped before sending it), and sent less than `bound` seconds ago."""
    out: dict[tuple[str, str], InFlight] = {}
    for n, replicas in placement.copies.items():
        m = members.get(n)
        if m is None or m.digest is None:
            continue
        for r in replicas:
            load = in_flight.get(r, {}).get(m.triton_name)
            s = seen.get((r, n))
            if load is None or load.digest != m.digest or (s is not None and s.ready and s.digest == m.digest):
                continue
            if heard.get((r, n)) is False or (now - load.since).total_seconds() >= bound:
                continue
            out[(r, n)] = load
    return out


#: Read by the ReplicaSet controller on a scale-down: pods of a lower cost are deleted first (Kubernetes >= 1.22).
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def deletion_costs(placement: Placement, pods: Sequence[Mapping[str, Any]],
                   leaving: Collection[str] = frozenset()) -> dict[str, dict[str, str | None]]:
    """The pool pods whose annotations should change, with them: the pod-deletion-cost, the MiB their placed copies
    take, so that scaling the pool down removes the replica that holds least (its copies are placed again
    elsewhere); a `leaving` replica (`rollout`) marked ANNOTATION_LEAVING, at cost -1, below every other, so that the
    Deployment's rollout removes it and no other; the mark taken off a replica no longer leaving."""
    out: dict[str, dict[str, str | None]] = {}
    for pod in pods:
        name = str(pod["metadata"]["name"])
        annotations = pod["metadata"].get("annotations") or {}
        want: dict[str, str | None] = {}
        if name in leaving:
            want = {POD_DELETION_COST: "-1", ANNOTATION_LEAVING: "true"}
        else:
            if name in placement.used:
                want[POD_DELETION_COST] = str(min(placement.used[name] // 2**20, 2**31 - 1))
            if ANNOTATION_LEAVING in annotations:
                want[ANNOTATION_LEAVING] = None
        if want := {k: v for k, v in want.items() if annotations.get(k) != v}:
            out[name] = want
    return out


def placement_of(pool: TritonPool, live: Sequence[PoolReplica], members: Mapping[str, Member],
                 leaving: frozenset[str] = frozenset()) -> Placement:
    """Where the loadable members go, keeping each model's recorded `status.placement` where it still holds; the
    copies on `leaving` replicas placed elsewhere as well (`placement.place_demands`)."""
    models = [m.model for m in members.values() if m.model is not None and m.problem is None]
    previous = {m.name: list(((m.body.get("status") or {}).get("placement")) or ()) for m in members.values()}
    return place(pool, live, models, previous, leaving)


@dataclass(frozen=True)
class Rollout:
    """Where the pool's Deployment is in a rollout of a new pod template, as its pods show it (`rollout`)."""

    # Replicas of an older template marked (or marked this round) to go next: their copies are placed elsewhere too.
    leaving: frozenset[str] = frozenset()
    mark: str | None = None  # the replica marked leaving this round (none was): its copies are placed now
    # Replicas of the current template, up, whose handover is not done: their gate opens once no leaving replica
    # serves a copy that does not serve elsewhere (`handovers`).
    waiting: tuple[str, ...] = ()
    # A scale-down, not a new template: the Deployment keeps its replicas until the leaving ones' copies serve
    # elsewhere (`shrink`), then takes the pool's, and removes them (pod-deletion-cost -1).
    shrinking: bool = False

    def says(self) -> str:
        """The rollout in a sentence for the pool's Progressing condition ("" when none is under way)."""
        if self.shrinking:
            return (f"scaling down: {', '.join(sorted(self.leaving))} "
                    f"{'leaves' if len(self.leaving) == 1 else 'leave'} once its copies serve elsewhere")
        if self.leaving:
            return (f"rolling its pods to a new template: {', '.join(sorted(self.leaving))} leaves once its copies "
                    f"serve elsewhere, replaced by {', '.join(self.waiting) or 'a new replica'}")
        if self.waiting:
            return f"new replica {', '.join(self.waiting)} handed over once it is up"
        return ""


def rollout(live: Sequence[PoolReplica], pods: Mapping[str, ReplicaPod], template: str,
            records: Mapping[str, Mapping[str, str]], stuck: bool = False,
            replica_sets: Mapping[str, str] | None = None, wanted: int | None = None) -> Rollout:
    """The rollout's state. The Deployment rolls with maxSurge 1 and maxUnavailable 0: it creates a replica of the new
    template (LABEL_POOL_TEMPLATE `template`), waits until that pod is Ready, then deletes a replica of an older
    one, the one of lowest pod-deletion-cost, and so on. A pool pod's readiness gate (HANDOVER_CONDITION) holds
    it: while a replica of the new template is up (its tritonserver answers) and not handed over, and an older one
    is left, one older replica is marked leaving (the one that has least loaded, by the pool's record, then by
    name); its copies are placed on the other replicas as well, the new one among them, and loaded; once they
    serve there, the gate opens, the new pod turns Ready and the Deployment deletes the leaving one (cost -1).
    Every pooled model keeps a ready copy throughout, and its copies never drop below its `replicas` while the old
    replica drains. The mark is read back from the pods (ANNOTATION_LEAVING): a restarted operator goes on.

    `stuck`: the upgrade rollout's surge pod cannot be scheduled (every GPU in use). With two old replicas or more,
    one is marked leaving without a new one to wait for: once its copies serve on the others (`no_surge`), the
    Deployment rolls without a surge pod, deleting it first; its GPU goes to the new pod.

    With old replicas of more than one older template (a template changed again mid-rollout), the Deployment scales
    the oldest ReplicaSet down first (by its creationTimestamp, `replica_sets`: name -> creationTimestamp), whatever
    the pods' deletion costs: the leaving replica is one of that ReplicaSet's, and a mark on another is taken off.

    A scale-down hands over too: with every replica on the current template and more of them than `wanted` (the
    pool's spec.replicas), the ones the ReplicaSet will remove are marked leaving (those not Ready first, as it ranks
    them, then those that loaded least; a mark already written is kept), `shrinking`."""
    if not template:  # the Deployment's template is not known: no rollout is told
        return Rollout()
    if wanted is not None and len(live) > wanted and all(pods[r.name].template == template for r in live):
        rank = sorted((r.name for r in live), key=lambda r: (not pods[r].leaving, pods[r].ready,
                                                              len(records.get(r, {})), r))
        going = rank[:len(live) - wanted]
        return Rollout(frozenset(going), next((r for r in going if not pods[r].leaving), None), (), shrinking=True)
    old = oldest_first([r.name for r in live if pods[r.name].template != template], pods, replica_sets or {})
    waiting = tuple(r.name for r in live if pods[r.name].template == template and pods[r.name].up
                    and pods[r.name].ip and not pods[r.name].handed_over)
    leaving = frozenset(r for r in old if pods[r].leaving)
    if leaving or not old or not (waiting or (stuck and len(old) >= 2)):
        return Rollout(leaving, None, waiting)
    mark = min(old, key=lambda r: (len(records.get(r, {})), r))
    return Rollout(frozenset({mark}), mark, waiting)


def oldest_first(old: Sequence[str], pods: Mapping[str, ReplicaPod], replica_sets: Mapping[str, str]) -> list[str]:
    """The replicas of `old` that the Deployment removes first: those of the oldest ReplicaSet among theirs (by
    creationTimestamp, then name), when they belong to more than one and each one's age is known; else all of them."""
    owners = {pods[r].replica_set for r in old}
    if len(owners) < 2 or not all(o in replica_sets for o in owners):
        return list(old)
    oldest = min(owners, key=lambda o: (replica_sets[o], o))
    return [r for r in old if pods[r].replica_set == oldest]


def handovers(rnd: PoolRound, records: Mapping[str, Mapping[str, str]], seen: Mapping[tuple[str, str], Seen],
              broken: Collection[tuple[str, str]], failures: Mapping[str, Mapping[str, str]]) -> tuple[str, ...]:
    """The replicas whose handover gate opens now (`rollout`): every waiting one once no leaving replica serves a
    model whose copies elsewhere do not serve yet. A leaving replica marked this round waits for the next (its mark
    is written first: the Deployment must delete that one and no other). A copy elsewhere does not hold the gate
    where it cannot serve soon: its load failed, the replica's probe finds it broken, or its replica is not up; but
    each model served on a leaving replica must serve on one other at least."""
    ro = rnd.rollout
    if not ro.waiting:
        return ()
    if not ro.leaving:
        return ro.waiting
    if ro.mark is not None:
        return ()
    return ro.waiting if _served_elsewhere(rnd, records, seen, broken, failures) else ()


def shrink(rnd: PoolRound, records: Mapping[str, Mapping[str, str]], seen: Mapping[tuple[str, str], Seen],
           broken: Collection[tuple[str, str]], failures: Mapping[str, Mapping[str, str]]) -> bool:
    """Whether the pool's Deployment takes its lower spec.replicas now (`rollout`, `shrinking`): the leaving replicas
    were marked in an earlier round (their cost -1 written: the ReplicaSet removes them and no other), and each model
    they serve serves on another replica too; a model with no copy placed elsewhere (no room on the others) does not
    hold the scale-down: its copy goes with the replica, as it went before."""
    ro = rnd.rollout
    return ro.shrinking and ro.mark is None and _served_elsewhere(rnd, records, seen, broken, failures,
                                                                   unplaced_hold=False)


def no_surge(rnd: PoolRound, records: Mapping[str, Mapping[str, str]], seen: Mapping[tuple[str, str], Seen],
             broken: Collection[tuple[str, str]], failures: Mapping[str, Mapping[str, str]]) -> bool:
    """Whether the pool's upgrade rollout goes on without its surge pod now: the surge pod cannot be scheduled
    (`rnd.unschedulable`: every GPU in use), an old replica was marked leaving in an earlier round with no new one
    up (`rollout`, `stuck`), and each of its models serves on another replica. The Deployment then rolls with
    maxSurge 0 and maxUnavailable 1: it deletes the leaving replica (pod-deletion-cost -1), whose GPU the new pod
    takes, and each later old replica once a new one is handed over (the gate holds it Unready until then)."""
    ro = rnd.rollout
    return (rnd.unschedulable is not None and bool(ro.leaving) and ro.mark is None and not ro.waiting
            and _served_elsewhere(rnd, records, seen, broken, failures))


def _served_elsewhere(rnd: PoolRound, records: Mapping[str, Mapping[str, str]], seen: Mapping[tuple[str, str], Seen],
                      broken: Collection[tuple[str, str]], failures: Mapping[str, Mapping[str, str]],
                      unplaced_hold: bool = True) -> bool:
    """Whether every model served on a leaving replica serves on another one too, as do its other copies that can
    serve soon (`handovers`); with `unplaced_hold` False, a model placed on no other replica is passed over."""
    ro = rnd.rollout
    up = serving(rnd.placement, rnd.members, rnd.pods, records, seen, graph=rnd.graph, admitted=lambda p: p.up)
    for n, m in rnd.members.items():
        if m.model is None:
            continue
        placed = rnd.placement.copies.get(n, ())
        if not any(r in ro.leaving and r in up[n] for r in placed):
            continue
        staying = [r for r in placed if r not in ro.leaving]
        if not staying and not unplaced_hold:
            continue
        expected = [r for r in staying if r not in failures.get(n, {}) and (r, n) not in broken
                    and (pod := rnd.pods.get(r)) is not None and pod.up]
        if not any(r in up[n] for r in staying) or not all(r in up[n] for r in expected):
            return False
    return True


@dataclass(frozen=True)
class Load:
    """One load on a replica: the member, and whether its copy there is drained first (an update, Drain mode)."""

    member: str
    drain: bool = False
    heal: bool = False  # a copy the replica's probe found broken: unloaded, then loaded again (`to_heal`)
    cause: str = ""  # a heal's: why the probe found it broken (for the Event: the probe stops saying so once unloaded)

    @property
    def unload_first(self) -> bool:
        """A drained copy is unloaded before it is loaded again, and so is a broken one: a load of the config Triton
        holds changes nothing (`controller.heal`). A heal's unload is not waited for: Triton never finishes unloading
        a Python model whose stub is dead, and the load makes a new copy beside it."""
        return self.drain or self.heal


@dataclass
class ReplicaWork:
    """What one replica does this round: unloads (Triton names) then loads, steps before the ensembles using them."""

    replica: str
    unload: list[str] = field(default_factory=list)
    load: list[Load] = field(default_factory=list)


@dataclass(frozen=True)
class Seen:
    """What a replica's Triton answered for a model this round."""

    ready: bool
    digest: str | None
    message: str = ""
    answered: bool = True  # False: the question went unanswered (a timeout, a refused connection): nothing known


def as_last_seen(seen: Mapping[tuple[str, str], Seen], records: Mapping[str, Mapping[str, str]],
                 members: Mapping[str, Member], steady: Collection[str]) -> dict[tuple[str, str], Seen]:
    """`seen` with each unanswered question (a timeout: a replica slow under load, or busy loading other models)
    answered by the replica's record instead, on a `steady` replica: one whose tritonserver has answered every
    question of a round since it started (the same container: a restarted one holds nothing of its record, and
    stays unknown until it answers). A copy it served at the end of the last round still serves, at the digest
    recorded. A slow answer is not a missing model: read as one, it took the copies of a healthy replica out
    of their slices (issue 41: k5 and k6 lost every endpoint for 5.6 s while another replica restarted). What does take
    a copy out is the pod's readiness (its probe fails at once when tritonserver stops answering it) and the
    replica's probe finding the copy broken. Stays `answered=False`: nothing is loaded or unloaded on it."""
    out = dict(seen)
    for (r, n), s in seen.items():
        recorded = records.get(r, {}).get(members[n].triton_name) if n in members else None
        if not s.answered and recorded and r in steady:
            out[(r, n)] = Seen(True, recorded, f"{s.message}; serving {recorded} when last answered", answered=False)
    return out


@dataclass(frozen=True)
class StepGraph:
    """The members' ensemble steps, built once per round (`graph_of`): each member's closure (the models it reaches,
    itself included, and the step names that are not on the pool) is computed once, not once per question."""

    steps: step_graph.Steps
    reached: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]  # member -> (found, missing), both sorted

    def found(self, name: str) -> tuple[str, ...]:
        """The models `name` reaches through its steps (itself included), among the members."""
        hit = self.reached.get(name)
        return hit[0] if hit is not None else tuple(step_graph.closure(name, self.steps)[0])


def graph_of(members: Mapping[str, Member]) -> StepGraph:
    """The step graph of the members that parsed, with every member's closure."""
    steps = step_graph.of_models({n: m.model for n, m in members.items() if m.model is not None})
    reached: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for n in members:
        found, missing = step_graph.closure(n, steps)
        reached[n] = (tuple(found), tuple(missing))
    return StepGraph(steps, reached)


def order(names: Sequence[str], members: Mapping[str, Member], graph: StepGraph | None = None) -> list[str]:
    """`names` with each ensemble after the steps it uses."""
    graph = graph_of(members) if graph is None else graph
    return step_graph.order(sorted(names), graph.steps)


def serves(member: Member, seen: Seen | None, record: Mapping[str, str]) -> bool:
    """Whether a replica serves `member` as the gate wants: READY at the desired digest, or at the one recorded there
    (the config it served before, while an in-place update has not reached it yet)."""
    return bool(seen is not None and seen.ready and seen.digest is not None
                and seen.digest in {member.digest, record.get(member.triton_name)})


def listed_ready(slices: Iterable[Mapping[str, Any] | None]) -> set[str]:
    """The replicas (pod names) a model's EndpointSlices, as last applied, list as ready: where its clients are sent
    now. A pod event in the middle of a round takes replicas out of these, never recomputes them from what the round
    has observed so far (until its first answers arrive, nothing)."""
    out: set[str] = set()
    for s in slices:
        for e in (s or {}).get("endpoints") or ():
            name = (e.get("targetRef") or {}).get("name")
            if name and (e.get("conditions") or {}).get("ready"):
                out.add(str(name))
    return out


def to_heal(placement: Placement, members: Mapping[str, Member], broken: Mapping[tuple[str, str], str],
            held: Collection[tuple[str, str]] = frozenset(), graph: StepGraph | None = None) -> set[tuple[str, str]]:
    """The (replica, model) copies to reload: those the replica's probe found broken (`broken`, by member name) and
    placed there, but not back-off `held` ones. An ensemble whose reached step is broken too is not reloaded: its
    failures count on it and on the step, and loading the step loads the ensembles using it again (as
    `controller.heal` does for a model's own replicas); the step is."""
    graph = graph_of(members) if graph is None else graph
    out: set[tuple[str, str]] = set()
    for (r, n) in broken:
        if n not in members or (r not in placement.copies.get(n, ()) and n not in placement.loaded.get(r, ())):
            continue
        found = graph.found(n)
        if any((r, k) in broken for k in found if k != n) or (r, n) in held:
            continue
        out.add((r, n))
    return out


def failing_copies(placement: Placement, members: Mapping[str, Member], name: str,
                   broken: Mapping[tuple[str, str], str], graph: StepGraph | None = None) -> dict[str, str]:
    """The copies of `name` that do not serve for a broken model they load (it, or a step it reaches): pod -> why."""
    graph = graph_of(members) if graph is None else graph
    reached = {name, *graph.found(name)}
    copies = set(placement.copies.get(name, ()))
    return {r: why for (r, k), why in sorted(broken.items()) if r in copies and k in reached}


def work(placement: Placement, members: Mapping[str, Member], ready: Sequence[str],
         records: Mapping[str, Mapping[str, str]], seen: Mapping[tuple[str, str], Seen],
         held: Mapping[tuple[str, str], bool],
         awaiting: Collection[tuple[str, str]] = frozenset(),
         healing: Collection[tuple[str, str]] = frozenset(), graph: StepGraph | None = None) -> dict[str, ReplicaWork]:
    """Each Ready replica's work: unload what is recorded there and no longer placed; load what is placed there and
    not READY at its desired digest. An update of a copy that serves (at its recorded digest) waits for the model's
    budget (rollout.maxUnavailable less its copies not serving), so a model updates replica by replica. `held`:
    (replica, model) loads that failed lately and wait for their back-off; `awaiting`: loads a previous operator sent
    that are still in flight (`awaited`), not sent again; `healing`: broken copies to reload (`to_heal`), unloaded
    first (a load of the config Triton holds would change nothing: `controller.heal`)."""
    out = {r: ReplicaWork(r) for r in ready}
    names = {m.triton_name: n for n, m in members.items() if m.problem is None}  # a name's owner, not its taker
    for n, m in members.items():
        names.setdefault(m.triton_name, n)
    budget = {n: m.budget - sum(1 for r in placement.copies.get(n, ()) if r in out and
                                not serves(m, seen.get((r, n)), records.get(r, {}))) for n, m in members.items()}
    for r, w in out.items():
        placed = placement.loaded.get(r, frozenset())
        w.unload = sorted(t for t in records.get(r, {}) if names.get(t) not in placed)
        for n in order(sorted(placed), members, graph):
            m, s = members[n], seen.get((r, n))
            if (r, n) in healing and m.request is not None:
                w.load.append(Load(n, heal=True))
                continue
            if (m.request is None or (s is not None and s.ready and s.digest == m.digest) or held.get((r, n))
                    or (r, n) in awaiting):
                continue
            if s is not None and not s.answered:  # unknown, not absent: a load now could be a second one
                continue
            if serves(m, s, records.get(r, {})):  # serving its previous config: an update, in the budget
                if budget.get(n, 0) <= 0:
                    continue
                budget[n] -= 1
                w.load.append(Load(n, drain=m.drains))
            else:
                w.load.append(Load(n))
    return out


def serving(placement: Placement, members: Mapping[str, Member], pods: Mapping[str, ReplicaPod],
            records: Mapping[str, Mapping[str, str]], seen: Mapping[tuple[str, str], Seen],
            draining: frozenset[tuple[str, str]] = frozenset(),
            broken: Collection[tuple[str, str]] = frozenset(), graph: StepGraph | None = None,
            admitted: Callable[[ReplicaPod], bool] = lambda pod: pod.ready) -> dict[str, set[str]]:
    """Per model, the replicas of its placement where it serves: the pod Ready (`admitted`), the model and every step
    it reaches served there (`serves`), and none of them drained this round nor found broken by the replica's
    probe."""
    graph = graph_of(members) if graph is None else graph
    out: dict[str, set[str]] = {}
    for n in members:
        found, missing = graph.reached.get(n) or ((), ())
        reached = [*found, *missing] or [n]
        out[n] = {r for r in placement.copies.get(n, ()) if (pod := pods.get(r)) is not None and admitted(pod)
                  and all(k in members and (r, k) not in draining and (r, k) not in broken
                          and serves(members[k], seen.get((r, k)), records.get(r, {})) for k in reached)}
    return out


def current(members: Mapping[str, Member], serving_on: Mapping[str, set[str]],
            seen: Mapping[tuple[str, str], Seen]) -> dict[str, set[str]]:
    """Per model, the replicas among `serving_on` where it is READY at its desired digest (not a previous one)."""
    return {n: {r for r in rs if (s := seen.get((r, n))) is not None and s.digest == members[n].digest}
            for n, rs in serving_on.items()}


def _stamp(conds: list[dict[str, Any]], previous: Mapping[str, Any], now: dt.datetime) -> list[Condition]:
    prev = {c.get("type"): c for c in previous.get("conditions") or ()}
    for c in conds:
        old = prev.get(c["type"])
        held = old is not None and old.get("status") == c["status"] and old.get("lastTransitionTime")
        c["lastTransitionTime"] = old["lastTransitionTime"] if held and old is not None else rfc3339(now)
    return [Condition.model_validate(c) for c in conds]


def _failure_reason(failures: Mapping[str, str]) -> str:
    """SourceFetchFailed when every failure is a fetch's, else ModelLoadFailed."""
    return SOURCE_FETCH_FAILED if all(w.startswith(FETCH_FAILED_PREFIX) for w in failures.values()) else LOAD_FAILED


@dataclass(frozen=True)
class Copies:
    """What a pooled model's Ready, Progressing and Degraded are decided from: its member, whether its pool exists,
    the placement, the replicas whose endpoint is ready (`serving_on`) and those of them at the desired digest
    (`current`), the loads that failed (`failures`) and the copies its replicas' probes call broken (`failing`), by
    pod, and the replicas the pool may still get (`coming`)."""

    m: Member
    pool: str
    found: bool
    placement: Placement | None
    serving_on: Collection[str]
    failures: Mapping[str, str]
    current: Collection[str]
    coming: int = 0
    failing: Mapping[str, str] = field(default_factory=dict)

    @property
    def g(self) -> int:
        return self.m.generation

    @property
    def wanted(self) -> int:
        return self.m.model.spec.replicas if self.m.model is not None else 0

    @property
    def placed(self) -> int:
        return len(self.placement.copies.get(self.m.name, ())) if self.placement is not None else 0

    @property
    def short(self) -> bool:
        return self.placement is not None and self.m.name in self.placement.shortfalls

    @property
    def serves_all(self) -> bool:
        return len(self.serving_on) >= self.wanted

    @property
    def served(self) -> str:
        return f"{len(self.serving_on)}/{self.wanted} copies serve, warm, on pool {self.pool}"

    @property
    def pool_missing(self) -> str:
        return f"TritonPool {self.pool} does not exist in this namespace: create it, or set spec.pool to one that does"

    @property
    def waiting_for_replicas(self) -> str:
        assert self.placement is not None
        shortfall = self.placement.shortfalls[self.m.name]
        return f"{self.served}; waiting for the pool's replicas ({shortfall.replicas} run, {self.coming} on their way)"

    @property
    def short_of_capacity(self) -> str:
        assert self.placement is not None
        return f"{self.served}; {self.placement.shortfalls[self.m.name].message}"

    @property
    def healing(self) -> str:
        return (f"{self.served}; " + "; ".join(f"{r}: {why}" for r, why in sorted(self.failing.items()))
                + "; healing: out of its slices there, unloading and loading it again")[:2000]

    @property
    def failed(self) -> str:
        return (f"{self.served}; " + "; ".join(f"{r}: {why}" for r, why in sorted(self.failures.items())))[:2000]

    @property
    def updating(self) -> str:
        return f"{self.served}; {len(self.current)}/{self.wanted} at the desired config, the others reload in place one by one"


#: A pooled model's policy decides one condition or passes (None) to the next of its chain, as the model's own
#: (`plan.status`); each chain ends with one that always answers. The order is the precedence: a missing pool, a spec
#: that cannot load, the pool's replicas on their way, capacity short, broken copies healing, failed loads, then how
#: many copies serve.
CopiesPolicy = Callable[[Copies], dict[str, Any] | None]
_Seen = TypeVar("_Seen")


def _first(chain: Sequence[Callable[[_Seen], dict[str, Any] | None]], seen: _Seen) -> dict[str, Any]:
    for policy in chain:
        answer = policy(seen)
        if answer is not None:
            return answer
    raise AssertionError(f"no policy of {[p.__name__ for p in chain]} answered")  # each chain's last always does


def _settled(c: Copies) -> dict[str, Any]:
    return condition("Progressing", False, "Settled", "every copy is placed and serves", c.g)


def _as_expected(c: Copies) -> dict[str, Any]:
    return condition("Degraded", False, "AsExpected", "", c.g)


def ready_pool_not_found(c: Copies) -> dict[str, Any] | None:
    return None if c.found else condition("Ready", False, POOL_NOT_FOUND, c.pool_missing, c.g)


def ready_spec_problem(c: Copies) -> dict[str, Any] | None:
    return condition("Ready", False, *c.m.problem, c.g) if c.m.problem is not None else None


def ready_waiting_for_replicas(c: Copies) -> dict[str, Any] | None:
    return condition("Ready", False, COPIES_LOADING, c.waiting_for_replicas, c.g) if c.short and c.coming > 0 else None


def ready_short_of_capacity(c: Copies) -> dict[str, Any] | None:
    return condition("Ready", False, INSUFFICIENT_CAPACITY, c.short_of_capacity, c.g) if c.short else None


def ready_healing(c: Copies) -> dict[str, Any] | None:
    return condition("Ready", c.serves_all, MODEL_FAILING, c.healing, c.g) if c.failing else None


def ready_load_failed(c: Copies) -> dict[str, Any] | None:
    return condition("Ready", c.serves_all, _failure_reason(c.failures), c.failed, c.g) if c.failures else None


def ready_all_copies_warmed(c: Copies) -> dict[str, Any] | None:
    if len(c.current) < c.wanted or c.placed < c.wanted:
        return None
    return condition("Ready", True, ALL_COPIES_WARMED, c.served, c.g)


def ready_updating(c: Copies) -> dict[str, Any] | None:
    """An update under way: the previous config serves on the copies not at the desired one yet."""
    return condition("Ready", True, COPIES_UPDATING, c.updating, c.g) if c.serves_all and c.placed >= c.wanted else None


def not_ready_loading(c: Copies) -> dict[str, Any]:
    return condition("Ready", False, COPIES_LOADING, c.served, c.g)


MODEL_READY: tuple[CopiesPolicy, ...] = (
    ready_pool_not_found, ready_spec_problem, ready_waiting_for_replicas, ready_short_of_capacity, ready_healing,
    ready_load_failed, ready_all_copies_warmed, ready_updating, not_ready_loading,
)


def settled_cannot_load(c: Copies) -> dict[str, Any] | None:
    """No pool, or a spec that cannot load: nothing is on its way."""
    return _settled(c) if not c.found or c.m.problem is not None else None


def progressing_waiting_for_replicas(c: Copies) -> dict[str, Any] | None:
    if not (c.short and c.coming > 0):
        return None
    return condition("Progressing", True, COPIES_LOADING, c.waiting_for_replicas, c.g)


def settled_short_of_capacity(c: Copies) -> dict[str, Any] | None:
    return _settled(c) if c.short else None


def progressing_healing(c: Copies) -> dict[str, Any] | None:
    return condition("Progressing", True, "Healing", c.healing, c.g) if c.failing else None


def settled_load_failed(c: Copies) -> dict[str, Any] | None:
    return _settled(c) if c.failures else None


def settled_all_copies_warmed(c: Copies) -> dict[str, Any] | None:
    return _settled(c) if len(c.current) >= c.wanted and c.placed >= c.wanted else None


def progressing_updating(c: Copies) -> dict[str, Any] | None:
    if not (c.serves_all and c.placed >= c.wanted):
        return None
    return condition("Progressing", True, COPIES_UPDATING, c.updating, c.g)


def progressing_loading(c: Copies) -> dict[str, Any]:
    return condition("Progressing", True, COPIES_LOADING, c.served, c.g)


MODEL_PROGRESSING: tuple[CopiesPolicy, ...] = (
    settled_cannot_load, progressing_waiting_for_replicas, settled_short_of_capacity, progressing_healing,
    settled_load_failed, settled_all_copies_warmed, progressing_updating, progressing_loading,
)


def degraded_pool_not_found(c: Copies) -> dict[str, Any] | None:
    return None if c.found else condition("Degraded", True, POOL_NOT_FOUND, c.pool_missing, c.g)


def degraded_spec_problem(c: Copies) -> dict[str, Any] | None:
    return condition("Degraded", True, *c.m.problem, c.g) if c.m.problem is not None else None


def fine_waiting_for_replicas(c: Copies) -> dict[str, Any] | None:
    """Short of room while the pool's replicas are on their way: not in trouble (failures wait for them too)."""
    return _as_expected(c) if c.short and c.coming > 0 else None


def degraded_short_of_capacity(c: Copies) -> dict[str, Any] | None:
    return condition("Degraded", True, INSUFFICIENT_CAPACITY, c.short_of_capacity, c.g) if c.short else None


def degraded_healing(c: Copies) -> dict[str, Any] | None:
    return condition("Degraded", True, MODEL_FAILING, c.healing, c.g) if c.failing else None


def degraded_load_failed(c: Copies) -> dict[str, Any] | None:
    return condition("Degraded", True, _failure_reason(c.failures), c.failed, c.g) if c.failures else None


MODEL_DEGRADED: tuple[CopiesPolicy, ...] = (
    degraded_pool_not_found, degraded_spec_problem, fine_waiting_for_replicas, degraded_short_of_capacity,
    degraded_healing, degraded_load_failed, _as_expected,
)


def _model_ready(c: Copies) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Ready, Progressing and Degraded of a pooled model, each from its chain (MODEL_READY, MODEL_PROGRESSING,
    MODEL_DEGRADED)."""
    return _first(MODEL_READY, c), _first(MODEL_PROGRESSING, c), _first(MODEL_DEGRADED, c)


def model_status(m: Member, pool: str, found: bool, placement: Placement | None, serving_on: set[str],
                 failures: Mapping[str, str], now: dt.datetime, current: set[str] | None = None,
                 coming: int = 0, hpa: Mapping[str, Any] | None = None,
                 failing: Mapping[str, str] | None = None) -> TritonModelStatus:
    """A pooled model's whole status (conditions stamped against the stored ones). `current`: the serving replicas
    at the desired digest (None: all of `serving_on`); `coming`: replicas the pool may still get soon (`coming`: a
    copy short of room is InsufficientPoolCapacity only when none is)."""
    current = serving_on if current is None else current
    ready, progressing, degraded = _model_ready(Copies(m, pool, found, placement, serving_on, failures, current,
                                                       coming, failing or {}))
    conds = [ready, progressing, degraded, *kstatus_conditions(progressing, degraded, m.generation)]
    if hpa is not None:  # the HPA of its copies (spec.autoscaling): whether it can read its metric, as for any model
        conds.append(scaling_active(hpa, m.generation))
    copies = list(placement.copies.get(m.name, ())) if placement is not None else []
    return TritonModelStatus(
        observed_generation=m.generation,
        conditions=_stamp(conds, m.body.get("status") or {}, now),
        replicas=len(copies),
        ready_replicas=len(serving_on),
        warmed_replicas=len(current),
        config_digest=m.digest,
        placement=copies or None,
        # The scale subresource's selector, which an HPA requires: the model's label, on no pool replica (a pool's
        # replicas are its own HPA's), so that the HPAs of a pool and of its models never select the same pods.
        selector=f"{LABEL_MODEL}={m.name}",
    )


@dataclass(frozen=True)
class Replicas:
    """What a pool's Ready, Progressing and Degraded are decided from: its Ready replicas against spec.replicas, the
    copies placed that do not serve yet, the models whose loads failed, those short of capacity, and the sentence
    every condition says it with."""

    ready: int
    wanted: int
    behind: int
    failed: int
    short: int
    why: str
    g: int
    # The pool's Deployment in a rollout (`rollout`): what it does, "" when none is under way.
    rolling: str = ""
    # The pool's Deployment waits for an upgrade slot (`plan.upgrade`): why, "" when it does not.
    upgrade_waiting: str = ""
    # Its upgrade rollout cannot schedule its surge pod: the scheduler's message, "" when it can.
    upgrade_unschedulable: str = ""

    @property
    def serving(self) -> bool:
        return self.ready >= self.wanted and self.behind == 0 and self.failed == 0 and self.short == 0


#: A pool's policies, each deciding one condition or passing (None) to the next of its chain, as a model's.
ReplicasPolicy = Callable[[Replicas], dict[str, Any] | None]


def pool_all_serving(r: Replicas) -> dict[str, Any] | None:
    return condition("Ready", True, "AllReplicasServing", r.why, r.g) if r.serving else None


def pool_not_all_serving(r: Replicas) -> dict[str, Any]:
    return condition("Ready", False, "NotAllServing", r.why, r.g)


def pool_upgrade_waiting(r: Replicas) -> dict[str, Any] | None:
    """A new operator renders another pod template for this unchanged pool, and the bound on upgrade rollouts holds
    it: its replicas keep the template they run (a model's Deployment says the same, `plan.upgrade`)."""
    return condition("Progressing", True, UPGRADE_WAITING, f"{r.why}; {r.upgrade_waiting}", r.g) \
        if r.upgrade_waiting else None


def pool_upgrade_unschedulable(r: Replicas) -> dict[str, Any] | None:
    """Its upgrade rollout's surge pod waits for room (a GPU): its replicas keep serving, and it holds its slot."""
    return condition("Progressing", True, UPGRADE_UNSCHEDULABLE, f"{r.why}; {r.upgrade_unschedulable}", r.g) \
        if r.upgrade_unschedulable else None


def pool_rolling(r: Replicas) -> dict[str, Any] | None:
    return condition("Progressing", True, ROLLING_REPLICAS, f"{r.why}; {r.rolling}", r.g) if r.rolling else None


def pool_settled(r: Replicas) -> dict[str, Any] | None:
    return condition("Progressing", False, "Settled", r.why, r.g) if r.serving else None


def pool_stuck(r: Replicas) -> dict[str, Any] | None:
    """Loads failed or capacity short: no progress until something changes (Degraded says what)."""
    return condition("Progressing", False, "Loading", r.why, r.g) if r.failed or r.short else None


def pool_loading(r: Replicas) -> dict[str, Any]:
    return condition("Progressing", True, "Loading", r.why, r.g)


def pool_short_of_capacity(r: Replicas) -> dict[str, Any] | None:
    return condition("Degraded", True, INSUFFICIENT_CAPACITY, r.why, r.g) if r.short else None


def pool_load_failed(r: Replicas) -> dict[str, Any] | None:
    return condition("Degraded", True, LOAD_FAILED, r.why, r.g) if r.failed else None


def pool_as_expected(r: Replicas) -> dict[str, Any]:
    return condition("Degraded", False, "AsExpected", r.why, r.g)


POOL_READY: tuple[ReplicasPolicy, ...] = (pool_all_serving, pool_not_all_serving)
POOL_PROGRESSING: tuple[ReplicasPolicy, ...] = (pool_upgrade_waiting, pool_upgrade_unschedulable, pool_rolling,
                                                 pool_settled, pool_stuck, pool_loading)
POOL_DEGRADED: tuple[ReplicasPolicy, ...] = (pool_short_of_capacity, pool_load_failed, pool_as_expected)


def pool_status(pool: TritonPool, body: Mapping[str, Any], live: Sequence[PoolReplica],
                pods: Mapping[str, ReplicaPod], placement: Placement, records: Mapping[str, Mapping[str, str]],
                behind: int, failed: int, selector: str, now: dt.datetime,
                loading: Mapping[str, Mapping[str, InFlight]] | None = None, rolling: str = "",
                upgrade_waiting: str = "", upgrade_unschedulable: str = "") -> dict[str, Any]:
    """The pool's status: its replicas, what each carries and has loaded, capacity used and free, and conditions.
    `behind`: copies placed that do not serve yet; `failed`: models whose loads failed; `loading`: the loads in flight
    (`recorded_loading` reads them back)."""
    g = int(body["metadata"].get("generation", 0))
    ready = sum(1 for r in live if pods[r.name].ready)
    rows = []
    for r in live:
        row: dict[str, Any] = {"pod": r.name, "models": sorted(placement.loaded.get(r.name, ())),
                               "used": format_bytes(placement.used.get(r.name, 0)),
                               "free": format_bytes(placement.free(r.name))}
        if r.node:
            row["node"] = r.node
        if records.get(r.name):
            row["loaded"] = dict(sorted(records[r.name].items()))
        if (loading or {}).get(r.name):
            row["loading"] = {n: {"digest": ld.digest, "since": rfc3339(ld.since)}
                              for n, ld in sorted((loading or {})[r.name].items())}
        rows.append(row)
    used = sum(placement.used.get(r.name, 0) for r in live)
    total = placement.capacity * len(live)
    short = len(placement.shortfalls)
    why = (f"{ready}/{pool.spec.replicas} replicas Ready; {len(set(placement.copies) - set(placement.shortfalls))} "
           f"models placed, {behind} copies loading, {failed} failing, {short} short of capacity")
    seen = Replicas(ready, pool.spec.replicas, behind, failed, short, why, g, rolling, upgrade_waiting,
                    upgrade_unschedulable)
    progressing, degraded = _first(POOL_PROGRESSING, seen), _first(POOL_DEGRADED, seen)
    conds = [_first(POOL_READY, seen), progressing, degraded, *kstatus_conditions(progressing, degraded, g)]
    if pool.spec.server.unrestricted_apis:
        conds.append(admin_apis_open(pool.spec.server.unrestricted_apis, g))
    return {
        "observedGeneration": g,
        "conditions": [c.model_dump(by_alias=True, exclude_none=True)
                       for c in _stamp(conds, body.get("status") or {}, now)],
        "replicas": len(live), "readyReplicas": ready,
        "models": len([n for n, c in placement.copies.items() if c]),
        "selector": selector,
        "capacityPerReplica": format_bytes(placement.capacity),
        "placementStrategy": pool.spec.placement_strategy,
        "used": format_bytes(used), "free": format_bytes(max(total - used, 0)),
        # What the pool's autoscaler reads (`plan.autoscaling.pool_demand`).
        "unplaced": format_bytes(sum((s.wanted - s.placed) * s.needed for s in placement.shortfalls.values())),
        "mostCopies": max([len(c) for c in placement.copies.values()]
                          + [s.wanted for s in placement.shortfalls.values()], default=0),
        "replicaModels": rows,
    }


# -- one round, planned whole: the controller gathers a `PoolWorld`, `plan_pool(world)` decides, the controller
# carries the `PoolPlan` out; after its loads it gathers again and plans once more, for the statuses and the wake-up.

#: While a pool is not settled (copies loading, a load backing off), it reconciles again this often; once settled,
#: every `SETTLED_SECONDS` still: a model that fails inside a replica changes no Kubernetes object.
REVISIT_SECONDS, SETTLED_SECONDS = 5.0, 15.0
#: While a replica's sidecar fetches a uri model, the pool comes back this often to load it once it is on disk.
FETCHING_SECONDS = 1.0
#: The longest drain of a copy whose model is no longer on the pool (deleted, or moved): a model's own
#: rollout.drainTimeoutSeconds otherwise.
DRAIN_SECONDS = 30.0


@dataclass(frozen=True)
class PoolRound:
    """What a round derives from the pool, its members and its pods before it asks any replica anything: the live
    replicas, each pod's slice view, the placement, the Ready replicas (those asked, and given work), the replicas on
    their way, the step graph and the pods whose deletion cost changes. Derived again each round (`round_of`)."""

    namespace: str
    pool: TritonPool
    body: Mapping[str, Any]  # the pool as read, status included
    members: Mapping[str, Member]
    # Each pod's slice view. A pod event during the round updates it (`controller.pool.pod_changed`), so that the
    # round's later slice writes see the pod as it is then.
    pods: dict[str, ReplicaPod]
    live: Sequence[PoolReplica]
    placement: Placement
    # Live replicas whose tritonserver answers (`ReplicaPod.up`), with an IP, as the round started: those asked and
    # given loads. Their models' traffic goes by the pod's Ready, which a handover gate may still hold (`rollout`).
    ready: Sequence[str]
    coming: int  # replicas the pool may still get soon (`coming`)
    graph: StepGraph
    key: str | None  # the pool's key, for the replicas' restricted APIs
    # pod -> the annotations to change: its pod-deletion-cost, its leaving mark (`deletion_costs`)
    costs: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    rollout: Rollout = field(default_factory=Rollout)
    upgrade: Upgrade | None = None  # what the bound on upgrade rollouts decided for the pool's Deployment this round
    # Why the pool's upgrade rollout cannot schedule its surge pod (`plan.upgrade.unschedulable`), if it cannot.
    unschedulable: str | None = None

    def address(self, replica: str) -> str:
        return f"{self.pods[replica].ip}:{HTTP_PORT}"

    def grpc_address(self, replica: str) -> str:
        """Where the replica's Triton takes loads and unloads (`triton.repository`)."""
        return f"{self.pods[replica].ip}:{GRPC_PORT}"


def round_of(namespace: str, pool: TritonPool, body: Mapping[str, Any], members: Mapping[str, Member],
             pods: Sequence[Mapping[str, Any]], key: str | None, template: str = "",
             upgrade: Upgrade | None = None, unschedulable: str | None = None,
             replica_sets: Mapping[str, str] | None = None) -> PoolRound:
    """The round's basis, from the pool's pods as listed; `template`: the LABEL_POOL_TEMPLATE of the pod template
    the pool's Deployment has (`rollout`); `upgrade`: what the bound on upgrade rollouts decided for it;
    `replica_sets`: the creationTimestamp of the ReplicaSets owning its pods, when they are more than one."""
    live, views = replicas(pods)
    ro = rollout(live, views, template, recorded(body), stuck=unschedulable is not None, replica_sets=replica_sets,
                 wanted=pool.spec.replicas)
    placement = placement_of(pool, live, members, ro.leaving)
    ready = [r.name for r in live if views[r.name].up and views[r.name].ip]
    return PoolRound(namespace, pool, body, members, views, live, placement, ready,
                     coming(pods, pool.spec.replicas), graph_of(members), key,
                     deletion_costs(placement, pods, ro.leaving), ro, upgrade, unschedulable)


def triton_asks(rnd: PoolRound, ready: Sequence[str]) -> dict[str, list[str]]:
    """Per Ready replica with models placed there: the members whose state its Triton is asked (those with a digest)."""
    return {r: names for r in ready if (names := [n for n in sorted(rnd.placement.loaded.get(r, ()))
                                                  if n in rnd.members and rnd.members[n].digest])}


@dataclass(frozen=True)
class Answered:
    """Which replicas answered the round's questions (`answered_after`)."""

    containers: dict[str, str]  # replica -> the tritonserver container that last answered every question of a round
    silent: list[str]  # replicas that left a question unanswered this time, sorted
    steady: set[str]  # those of them whose record stands for them (`as_last_seen`): the same container answered before


def answered_after(rnd: PoolRound, asked: Collection[str], seen: Mapping[tuple[str, str], Seen],
                   containers: Mapping[str, str]) -> Answered:
    """After asking the replicas `asked`: each that answered every question is known by its tritonserver container
    now (`containers`, by replica, kept between rounds, dropped for replicas gone); one that left a question
    unanswered is steady when the same container answered a whole round before (a restarted one holds nothing of its
    record)."""
    silent = sorted({r for (r, _), s in seen.items() if not s.answered})
    out = {r: c for r, c in containers.items() if r in rnd.pods}
    for r in asked:
        if r not in silent and rnd.pods[r].triton:
            out[r] = rnd.pods[r].triton
    steady = {r for r in silent if rnd.pods[r].triton and out.get(r) == rnd.pods[r].triton}
    return Answered(out, silent, steady)


def previous_loads(rnd: PoolRound, ready: Collection[str], sent: Collection[tuple[str, str, str]]
                   ) -> dict[str, dict[str, InFlight]]:
    """The loads the pool's status records in flight on Ready replicas that this process did not send (`sent`:
    (replica, Triton name, digest)): a previous operator's."""
    return {r: {t: ld for t, ld in loads.items() if (r, t, ld.digest) not in sent}
            for r, loads in recorded_loading(rnd.body).items() if r in ready}


def heard_asks(rnd: PoolRound, theirs: Mapping[str, Mapping[str, InFlight]],
               seen: Mapping[tuple[str, str], Seen]) -> list[tuple[str, str]]:
    """The (replica, member) of a previous operator's loads to ask Triton about (`triton.pool.heard_of`): those of a
    member that are not READY at the load's digest."""
    names = {m.triton_name: n for n, m in rnd.members.items()}
    return [(r, names[t]) for r, loads in theirs.items() for t in loads if t in names
            and not ((s := seen.get((r, names[t]))) is not None and s.ready and s.digest == loads[t].digest)]


@dataclass(frozen=True)
class Carried:
    """What the round's carrying out did: whether a replica had work, and whether loads were left for the next
    round (`controller.pool.ROUND_LOAD_SECONDS`)."""

    busy: bool
    cut: bool


@dataclass(frozen=True)
class PoolWorld:
    """What the controller gathered for one plan of a round: the round's basis and what the replicas, their probes
    and sidecars answered. Keys (replica, model) name members; records and in-flight loads name Triton names."""

    round: PoolRound
    now: dt.datetime
    # What each replica was told to load and served, by Triton name: the pool's status (`recorded`) before the
    # round's loads, the round's own (`records_after`) after them.
    records: Mapping[str, Mapping[str, str]]
    seen: Mapping[tuple[str, str], Seen]  # what the Ready replicas' Tritons serve of what is placed there
    # The loads a previous operator sent (recorded in flight, not sent by this process), and whether each replica's
    # Triton has heard of them (`triton.pool.heard_of`).
    in_flight: Mapping[str, Mapping[str, InFlight]] = field(default_factory=dict)
    heard: Mapping[tuple[str, str], bool | None] = field(default_factory=dict)
    broken: Mapping[tuple[str, str], str] = field(default_factory=dict)  # what the replicas' probes call broken, why
    heals_held: Collection[tuple[str, str]] = frozenset()  # broken copies whose heal backs off
    held: Mapping[tuple[str, str], bool] = field(default_factory=dict)  # failed loads: True while backing off
    failures: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # member -> pod -> a failed load's why
    unfetched: Collection[tuple[str, str]] = frozenset()  # uri models whose files are not on the replica yet
    fetching: bool = False  # a sidecar fetches files for a load of this pool
    sliced: Collection[str] = frozenset()  # the models that have an EndpointSlice of ours
    # The statuses as stored now, by member (absent: as its body was read), and the pool's (None: as it was read):
    # a status is written, and its changed conditions told as Events, only where it differs from them.
    stored: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    pool_stored: Mapping[str, Any] | None = None
    hpas: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)  # a model's HPA (spec.autoscaling)
    carried: Carried | None = None  # after the round's loads: what it did (None: before them)


@dataclass(frozen=True)
class PoolPlan:
    """What a round does, in this order: write the slices and statuses; drain `drains`; on each replica, its
    unloads then its loads (`work`); then, planned again after them, the statuses, and come back after `wake`."""

    work: Mapping[str, ReplicaWork]  # per Ready replica: unloads, then loads (steps first)
    waiting: Mapping[tuple[str, str], InFlight]  # a previous operator's loads, waited for rather than sent
    healing: frozenset[tuple[str, str]]  # broken copies reloaded (unloaded first), each `Load` with its cause
    draining: frozenset[tuple[str, str]]  # copies out of their slices before the loads: drained and healed
    # (replica, Triton name) -> how long, at most, to wait until no request reaches the copy (`drain_timeouts`)
    drains: Mapping[tuple[str, str], float]
    loading: Mapping[str, Mapping[str, InFlight]]  # the loads in flight to record in the pool's status
    serving: Mapping[str, set[str]]  # per model, the replicas its slices list ready
    services_only: frozenset[str]  # models that get only their Service now: no slice yet, no copy serving
    statuses: Mapping[str, TritonModelStatus]  # every member's status
    pool_status: dict[str, Any]
    model_writes: Mapping[str, StatusWrite]  # the members' statuses that change, with their Events
    pool_write: StatusWrite | None  # the pool's, if it changes
    settled: bool  # every placed copy serves at its desired digest and no load failed
    wake: float  # seconds until the next round, unless something changes first
    handovers: tuple[str, ...] = ()  # the replicas whose handover gate opens now (`handovers`)
    no_surge: bool = False  # the upgrade rollout goes on without its surge pod, which cannot be scheduled (`no_surge`)
    shrink: bool = False  # the Deployment takes the pool's lower spec.replicas now: the leaving replicas handed over

    @property
    def busy(self) -> bool:
        return any(w.load or w.unload for w in self.work.values())


def records_after(rnd: PoolRound, records: Mapping[str, Mapping[str, str]],
                  seen: Mapping[tuple[str, str], Seen]) -> dict[str, dict[str, str]]:
    """The replicas' records after the round: on a Ready replica, what it serves of what is placed there (a
    replica that is not Ready keeps its record: its models are reloaded once it is back). Replicas gone drop."""
    out: dict[str, dict[str, str]] = {}
    for r in rnd.live:
        if r.name not in rnd.ready:
            out[r.name] = dict(records.get(r.name, {}))
            continue
        out[r.name] = {rnd.members[n].triton_name: s.digest for (rr, n), s in seen.items()
                       if rr == r.name and s.ready and s.digest}
    return out


def slices(rnd: PoolRound, records: Mapping[str, Mapping[str, str]], seen: Mapping[tuple[str, str], Seen],
           draining: frozenset[tuple[str, str]], broken: Collection[tuple[str, str]],
           replica: str) -> dict[str, set[str]]:
    """Mid-round, a copy on `replica` has just turned READY: the slices to write again (the models with a copy there:
    the model's, and an ensemble's using it), as `serving` lists them, by model with the replicas listed ready."""
    on = serving(rnd.placement, rnd.members, rnd.pods, records, seen, draining, broken, rnd.graph)
    return {n: on[n] for n, m in rnd.members.items()
            if m.model is not None and replica in rnd.placement.copies.get(n, ())}


def slices_left(rnd: PoolRound, listed: Mapping[str, Collection[str]]) -> dict[str, set[str]]:
    """Mid-round, a replica has stopped being Ready (or goes): every model's slices to write again, each keeping the
    replicas its slices list as ready now (`listed`, by member name, each from `listed_ready`) less those whose pod
    is no longer Ready (`rnd.pods` as the pod events left it). Only out, never recomputed from what the round has
    observed so far: until its first answers arrive that is nothing, and the models served on healthy replicas lost
    every endpoint for 0.4 s (a CI run, issue 41)."""
    return {n: {r for r in listed.get(n, ()) if (pod := rnd.pods.get(r)) is not None and pod.ready}
            for n, m in rnd.members.items() if m.model is not None}


def drain_timeouts(members: Mapping[str, Member], copies: Collection[tuple[str, str]]
                   ) -> dict[tuple[str, str], float]:
    """Each drained copy (replica, Triton name) with its longest drain: its model's rollout.drainTimeoutSeconds, or
    DRAIN_SECONDS for a model no longer on the pool."""
    owners = {m.triton_name: m.model for m in members.values() if m.model is not None}
    return {(r, t): float(owner.spec.rollout.drain_timeout_seconds) if (owner := owners.get(t)) is not None
            else DRAIN_SECONDS for r, t in sorted(copies)}


def loading_records(members: Mapping[str, Member], *loads: Mapping[tuple[str, str], InFlight]
                    ) -> dict[str, dict[str, InFlight]]:
    """The loads in flight to record, by replica and Triton name (a later mapping's load wins)."""
    out: dict[str, dict[str, InFlight]] = {}
    for each in loads:
        for (r, n), ld in each.items():
            out.setdefault(r, {})[members[n].triton_name] = ld
    return out


def wake_after(settled: bool, carried: Carried, fetching: bool, pending: bool) -> float:
    """When to come back: at once when loads were left over, soon while a sidecar fetches, after SETTLED_SECONDS once
    all serves and nothing was done nor is awaited, else after REVISIT_SECONDS."""
    if carried.cut:
        return 0.0
    if fetching:
        return FETCHING_SECONDS
    return SETTLED_SECONDS if settled and not carried.busy and not pending else REVISIT_SECONDS


@dataclass(frozen=True)
class StatusWrite:
    """A status that changes: the merge patch that writes it, and the conditions whose status or reason change with
    it (`plan.status.transitions`: each a log line and an Event of `event_type`)."""

    patch: dict[str, Any]
    changed: tuple[dict[str, Any], ...]


def event_type(c: Mapping[str, Any]) -> str:
    """Normal for a condition that turns good (Ready or Progressing True, Degraded False), else Warning."""
    return "Normal" if (c["type"] != "Degraded") == (c["status"] == "True") else "Warning"


def model_write(stored: Mapping[str, Any] | None, status: TritonModelStatus) -> StatusWrite | None:
    """The write of a TritonModel's status over `stored`, or None when it would change nothing."""
    if not status_changed(stored, status):
        return None
    desired = as_dict(status)
    return StatusWrite({k: None for k in stored or {} if k not in desired} | desired,
                       tuple(transitions(stored, status)))


def pool_write(stored: Mapping[str, Any] | None, status: dict[str, Any]) -> StatusWrite | None:
    """The write of a TritonPool's status over `stored`, or None when it would change nothing."""
    if dict(stored or {}) == status:
        return None
    return StatusWrite({k: None for k in stored or {} if k not in status} | status,
                       tuple(transitions(stored, status)))


@dataclass(frozen=True)
class _Published:
    serving: dict[str, set[str]]
    services_only: frozenset[str]
    statuses: dict[str, TritonModelStatus]
    pool_status: dict[str, Any]
    settled: bool
    model_writes: dict[str, StatusWrite]
    pool_write: StatusWrite | None


def _published(world: PoolWorld, draining: frozenset[tuple[str, str]],
               loading: Mapping[str, Mapping[str, InFlight]]) -> _Published:
    """Each model's slices and status and the pool's status. Before the loads, a model with no slices yet and no
    copy serving gets only its Service (clients need it by the time a slice lists a copy); its slices come with its
    first ready copy (`controller.pool._listed`) or at the round's end."""
    rnd, before_loads = world.round, world.carried is None
    on = serving(rnd.placement, rnd.members, rnd.pods, world.records, world.seen, draining, world.broken, rnd.graph)
    now_current = current(rnd.members, on, world.seen)
    behind, failed, statuses, services_only = 0, 0, {}, set()
    for name, m in rnd.members.items():
        if m.model is None:
            statuses[name] = model_status(m, rnd.pool.name, True, rnd.placement, set(), {}, world.now)
            continue
        failures = world.failures.get(name, {})
        failed += bool(failures)
        behind += len(rnd.placement.copies.get(name, ())) - len(now_current[name])
        if before_loads and not on[name] and name not in world.sliced:
            services_only.add(name)
        hpa = world.hpas.get(name) if m.model.spec.autoscaling is not None else None
        statuses[name] = model_status(m, rnd.pool.name, True, rnd.placement, on[name], failures, world.now,
                                      now_current[name], rnd.coming, hpa,
                                      failing_copies(rnd.placement, rnd.members, name, world.broken, rnd.graph))
    selector = ",".join(f"{k}={v}" for k, v in pool_selector(rnd.pool).items())
    status = pool_status(rnd.pool, rnd.body, rnd.live, rnd.pods, rnd.placement, world.records, behind, failed,
                         selector, world.now, loading, rnd.rollout.says(),
                         rnd.upgrade.message if rnd.upgrade is not None and not rnd.upgrade.started else "",
                         rnd.unschedulable or "")
    writes = {n: w for n, s in statuses.items() if (w := model_write(
        world.stored.get(n, rnd.members[n].body.get("status") or {}), s)) is not None}
    pool_stored = world.pool_stored if world.pool_stored is not None else rnd.body.get("status") or {}
    return _Published(on, frozenset(services_only), statuses, status, behind == 0 and failed == 0, writes,
                      pool_write(pool_stored, status))


def plan_pool(world: PoolWorld) -> PoolPlan:
    """Every decision of a pool round. Before the loads (`world.carried` None): each Ready replica's unloads and
    loads (`work`), what leaves the slices first and what is drained, the loads to record in flight, and the slices
    and statuses to write before any load. After them: no work (the next round decides), the statuses, the previous
    operator's loads still awaited, and when to come back."""
    rnd = world.round
    waiting = awaited(rnd.placement, rnd.members, world.in_flight, world.seen, world.heard, world.now)
    todo: dict[str, ReplicaWork] = {}
    healing: set[tuple[str, str]] = set()
    if world.carried is None:
        healing = to_heal(rnd.placement, rnd.members, world.broken, world.heals_held, rnd.graph)
        todo = work(rnd.placement, rnd.members, rnd.ready, world.records, world.seen,
                    {**world.held, **dict.fromkeys(world.unfetched, True)}, waiting, healing, rnd.graph)
        for r, w in todo.items():
            w.load = [replace(ld, cause=world.broken[(r, ld.member)]) if ld.heal else ld for ld in w.load]
    loads = [(r, ld) for r, w in todo.items() for ld in w.load]
    # Out of the slices before their loads: the copies drained, and those healed (the probe stops calling a copy
    # broken once it is unloaded, before it is READY again).
    draining = frozenset((r, ld.member) for r, ld in loads if ld.drain or ld.heal)
    # Drained before Triton lets go of them: the copies updated in Drain mode, and those about to be unloaded (no
    # longer placed there, or their model gone): kube-proxy sends them requests until it syncs, and an unloaded copy
    # answers them 404. A broken copy is not drained: its requests fail anyway.
    drains = drain_timeouts(rnd.members, frozenset((r, rnd.members[ld.member].triton_name) for r, ld in loads
                                                   if ld.drain) | frozenset((r, t) for r, w in todo.items()
                                                                            for t in w.unload))
    sending = {(r, ld.member): InFlight(rnd.members[ld.member].digest or "", world.now) for r, ld in loads}
    loading = loading_records(rnd.members, waiting, sending)
    out = _published(world, draining, loading)
    carried = world.carried or Carried(busy=any(w.load or w.unload for w in todo.values()), cut=False)
    handed = handovers(rnd, world.records, world.seen, world.broken, world.failures)
    # A rollout not done keeps the pool coming back: the Deployment's next pod, the next leaving replica.
    rolling = bool(rnd.rollout.leaving)
    return PoolPlan(todo, waiting, frozenset(healing), draining, drains, loading, out.serving, out.services_only,
                    out.statuses, out.pool_status, out.model_writes, out.pool_write, out.settled,
                    wake_after(out.settled and not rolling, carried, world.fetching, bool(waiting)), handed,
                    no_surge(rnd, world.records, world.seen, world.broken, world.failures),
                    shrink(rnd, world.records, world.seen, world.broken, world.failures))


# -- a uri model's files on a replica: what its fetch-server sidecar is asked, and what to do with its answer

#: What a round does for one uri model wanted on a replica, from what the sidecar holds (`replica_fetches`).
ON_DISK = "OnDisk"  # its files at the desired digest are there: it loads this round
UNDER_WAY = "UnderWay"  # the sidecar fetches them: the load waits
FETCH_FAILED = "FetchFailed"  # a failed attempt not counted yet: held, with the sidecar's message
BACKING_OFF = "BackingOff"  # a failure's back-off runs: neither fetched nor loaded
FETCH = "Fetch"  # ask the sidecar to fetch them (it may answer that they are there already)


class HeldFiles(Protocol):
    """What a replica's sidecar says of one model (`triton.fetcher.Held`)."""

    @property
    def digest(self) -> str | None: ...
    @property
    def fetching(self) -> str | None: ...
    @property
    def failed_digest(self) -> str | None: ...
    @property
    def failed_attempt(self) -> int: ...


def fetch_asks(rnd: PoolRound, seen: Mapping[tuple[str, str], Seen],
               known: Mapping[str, Collection[str] | None]) -> dict[str, list[str]]:
    """Per Ready replica whose sidecar is asked this round: the uri members placed there that are not READY at their
    desired digest. A replica is not asked when it wants none and its sidecar was last seen holding nothing (`known`:
    what each sidecar held when last asked; None, never asked by this process)."""
    out: dict[str, list[str]] = {}
    for r in rnd.ready:
        wanted = [n for n in sorted(rnd.placement.loaded.get(r, frozenset())) if n in rnd.members
                  and (m := rnd.members[n]).request is not None and m.request.fetch is not None
                  and m.digest is not None and not ((s := seen.get((r, n))) is not None and s.ready
                                                    and s.digest == m.digest)]
        k = known.get(r)
        if wanted or k is None or k:
            out[r] = wanted
    return out


@dataclass(frozen=True)
class ReplicaFetches:
    """What a round does with a replica's sidecar: the files to delete (by Triton name), then a step per wanted
    member, in order."""

    forget: tuple[str, ...]
    steps: tuple[tuple[str, str], ...]  # (member, ON_DISK | UNDER_WAY | FETCH_FAILED | BACKING_OFF | FETCH)


def replica_fetches(rnd: PoolRound, replica: str, wanted: Sequence[str], held: Mapping[str, HeldFiles],
                    records: Mapping[str, Mapping[str, str]], counted: Mapping[str, int],
                    backing_off: Collection[str]) -> ReplicaFetches:
    """From what the sidecar holds (`held`, by Triton name): the files of models neither placed on the replica nor
    recorded there are deleted; each wanted member's files are on disk, on their way, failed anew (an attempt other
    than the one `counted` for the member), backing off, or to fetch."""
    placed = rnd.placement.loaded.get(replica, frozenset())
    keep = {rnd.members[n].triton_name for n in placed if n in rnd.members} | set(records.get(replica, {}))
    steps: list[tuple[str, str]] = []
    for n in wanted:
        m = rnd.members[n]
        h = held.get(m.triton_name)
        if h is not None and h.digest == m.digest:
            steps.append((n, ON_DISK))
        elif h is not None and h.fetching == m.digest:
            steps.append((n, UNDER_WAY))
        elif h is not None and h.failed_digest == m.digest and counted.get(n) != h.failed_attempt:
            steps.append((n, FETCH_FAILED))
        else:
            steps.append((n, BACKING_OFF if n in backing_off else FETCH))
    return ReplicaFetches(tuple(sorted(set(held) - keep)), tuple(steps))
