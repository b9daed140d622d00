"""The pool's reconcile, its pure part: which models a TritonPool carries, where their copies go, what each replica
must load or unload this round, and the statuses and EndpointSlices that follow from what the replicas answered.

`controller.pool` gathers (the pool, its pods, the namespace's TritonModels), asks each replica's Triton
(`triton.pool`) and carries out what these functions decide. The design: `plan.placement`'s docstring.

A replica's record (`TritonPool.status.replicaModels[].loaded`) says what the operator loaded there and Triton said
READY, by Triton model name, with the digest. It is what a restarted operator reads back: request-loaded models are
not in Triton's repository index, so the record is how it finds a model to unload that is no longer placed there.
During an in-place update the recorded (previous) digest is still accepted on a replica, as a model's own replica
accepts its previous config during a Swap, until the new one is READY there.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from ..api import steps as step_graph
from ..api.kinds import LABEL_MODEL
from ..api.pool import TritonPool, format_bytes
from ..api.timestamps import parse_rfc3339, rfc3339
from ..api.v1alpha1 import Condition, TritonModel, TritonModelStatus
from ..render.modelconfig import render_repository
from ..render.pool import LoadRequest, ReplicaPod, load_request
from .placement import INSUFFICIENT_CAPACITY, Placement, PoolReplica, place
from .status import admin_apis_open, condition, kstatus_conditions, scaling_active

POOL_NOT_FOUND = "PoolNotFound"
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


def deletion_costs(placement: Placement, pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The pool pods whose pod-deletion-cost should change, with the cost: the MiB their placed copies take, so that
    scaling the pool down removes the replica that holds least (its copies are placed again elsewhere)."""
    out: dict[str, str] = {}
    for pod in pods:
        name = str(pod["metadata"]["name"])
        if name not in placement.used:
            continue
        cost = str(min(placement.used[name] // 2**20, 2**31 - 1))
        if ((pod["metadata"].get("annotations") or {}).get(POD_DELETION_COST)) != cost:
            out[name] = cost
    return out


def placement_of(pool: TritonPool, live: Sequence[PoolReplica], members: Mapping[str, Member]) -> Placement:
    """Where the loadable members go, keeping each model's recorded `status.placement` where it still holds."""
    models = [m.model for m in members.values() if m.model is not None and m.problem is None]
    previous = {m.name: list(((m.body.get("status") or {}).get("placement")) or ()) for m in members.values()}
    return place(pool, live, models, previous)


@dataclass(frozen=True)
class Load:
    """One load on a replica: the member, and whether its copy there is drained first (an update, Drain mode)."""

    member: str
    drain: bool = False
    heal: bool = False  # a copy the replica's probe found broken: unloaded, then loaded again (`to_heal`)


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


def order(names: Sequence[str], members: Mapping[str, Member]) -> list[str]:
    """`names` with each ensemble after the steps it uses."""
    graph = step_graph.of_models({n: m.model for n, m in members.items() if m.model is not None})
    return step_graph.order(sorted(names), graph)


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
            held: Collection[tuple[str, str]] = frozenset()) -> set[tuple[str, str]]:
    """The (replica, model) copies to reload: those the replica's probe found broken (`broken`, by member name) and
    placed there, but not back-off `held` ones. An ensemble whose reached step is broken too is not reloaded: its
    failures count on it and on the step, and loading the step loads the ensembles using it again (as
    `controller.heal` does for a model's own replicas); the step is."""
    graph = step_graph.of_models({n: m.model for n, m in members.items() if m.model is not None})
    out: set[tuple[str, str]] = set()
    for (r, n) in broken:
        if n not in members or (r not in placement.copies.get(n, ()) and n not in placement.loaded.get(r, ())):
            continue
        found, _ = step_graph.closure(n, graph)
        if any((r, k) in broken for k in found if k != n) or (r, n) in held:
            continue
        out.add((r, n))
    return out


def failing_copies(placement: Placement, members: Mapping[str, Member], name: str,
                   broken: Mapping[tuple[str, str], str]) -> dict[str, str]:
    """The copies of `name` that do not serve for a broken model they load (it, or a step it reaches): pod -> why."""
    graph = step_graph.of_models({n: m.model for n, m in members.items() if m.model is not None})
    reached = {name, *step_graph.closure(name, graph)[0]}
    copies = set(placement.copies.get(name, ()))
    return {r: why for (r, k), why in sorted(broken.items()) if r in copies and k in reached}


def work(placement: Placement, members: Mapping[str, Member], ready: Sequence[str],
         records: Mapping[str, Mapping[str, str]], seen: Mapping[tuple[str, str], Seen],
         held: Mapping[tuple[str, str], bool],
         awaiting: Collection[tuple[str, str]] = frozenset(),
         healing: Collection[tuple[str, str]] = frozenset()) -> dict[str, ReplicaWork]:
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
        for n in order(sorted(placed), members):
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
            broken: Collection[tuple[str, str]] = frozenset()) -> dict[str, set[str]]:
    """Per model, the replicas of its placement where it serves: the pod Ready, the model and every step it reaches
    served there (`serves`), and none of them drained this round nor found broken by the replica's probe."""
    graph = step_graph.of_models({n: m.model for n, m in members.items() if m.model is not None})
    out: dict[str, set[str]] = {}
    for n in members:
        found, missing = step_graph.closure(n, graph)
        reached = [*found, *missing] or [n]
        out[n] = {r for r in placement.copies.get(n, ()) if (pod := pods.get(r)) is not None and pod.ready
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


def _model_ready(m: Member, pool: str, found: bool, placement: Placement | None, serving_on: set[str],
                 failures: Mapping[str, str], current: set[str],
                 coming: int, failing: Mapping[str, str] | None = None
                 ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Ready, Progressing and Degraded of a pooled model (`serving_on`: the replicas whose endpoint is ready;
    `current`: those of them at the desired digest)."""
    g = m.generation
    wanted = m.model.spec.replicas if m.model is not None else 0
    copies = placement.copies.get(m.name, ()) if placement is not None else ()
    shortfall = placement.shortfalls.get(m.name) if placement is not None else None
    settled = condition("Progressing", False, "Settled", "every copy is placed and serves", g)
    fine = condition("Degraded", False, "AsExpected", "", g)
    if not found:
        msg = f"TritonPool {pool} does not exist in this namespace: create it, or set spec.pool to one that does"
        return condition("Ready", False, POOL_NOT_FOUND, msg, g), settled, condition("Degraded", True, POOL_NOT_FOUND, msg, g)
    if m.problem is not None:
        reason, msg = m.problem
        return condition("Ready", False, reason, msg, g), settled, condition("Degraded", True, reason, msg, g)
    served = f"{len(serving_on)}/{wanted} copies serve, warm, on pool {pool}"
    if shortfall is not None and coming > 0:  # the pool is not all there yet
        msg = f"{served}; waiting for the pool's replicas ({shortfall.replicas} run, {coming} on their way)"
        return (condition("Ready", False, COPIES_LOADING, msg, g), condition("Progressing", True, COPIES_LOADING, msg, g),
                fine)
    if shortfall is not None:
        msg = f"{served}; {shortfall.message}"
        return (condition("Ready", False, INSUFFICIENT_CAPACITY, msg, g), settled,
                condition("Degraded", True, INSUFFICIENT_CAPACITY, msg, g))
    if failing:
        msg = (f"{served}; " + "; ".join(f"{r}: {why}" for r, why in sorted(failing.items()))
               + "; healing: out of its slices there, unloading and loading it again")[:2000]
        return (condition("Ready", len(serving_on) >= wanted, MODEL_FAILING, msg, g),
                condition("Progressing", True, "Healing", msg, g), condition("Degraded", True, MODEL_FAILING, msg, g))
    if failures:
        msg = f"{served}; " + "; ".join(f"{r}: {why}" for r, why in sorted(failures.items()))
        reason = _failure_reason(failures)
        return (condition("Ready", len(serving_on) >= wanted, reason, msg[:2000], g), settled,
                condition("Degraded", True, reason, msg[:2000], g))
    if len(current) >= wanted and len(copies) >= wanted:
        return condition("Ready", True, ALL_COPIES_WARMED, served, g), settled, fine
    if len(serving_on) >= wanted and len(copies) >= wanted:  # an update under way: the previous config serves
        msg = f"{served}; {len(current)}/{wanted} at the desired config, the others reload in place one by one"
        return (condition("Ready", True, COPIES_UPDATING, msg, g), condition("Progressing", True, COPIES_UPDATING, msg, g),
                fine)
    return (condition("Ready", False, COPIES_LOADING, served, g),
            condition("Progressing", True, COPIES_LOADING, served, g), fine)


def model_status(m: Member, pool: str, found: bool, placement: Placement | None, serving_on: set[str],
                 failures: Mapping[str, str], now: dt.datetime, current: set[str] | None = None,
                 coming: int = 0, hpa: Mapping[str, Any] | None = None,
                 failing: Mapping[str, str] | None = None) -> TritonModelStatus:
    """A pooled model's whole status (conditions stamped against the stored ones). `current`: the serving replicas
    at the desired digest (None: all of `serving_on`); `coming`: replicas the pool may still get soon (`coming`: a
    copy short of room is InsufficientPoolCapacity only when none is)."""
    current = serving_on if current is None else current
    ready, progressing, degraded = _model_ready(m, pool, found, placement, serving_on, failures, current, coming,
                                                failing)
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


def pool_status(pool: TritonPool, body: Mapping[str, Any], live: Sequence[PoolReplica],
                pods: Mapping[str, ReplicaPod], placement: Placement, records: Mapping[str, Mapping[str, str]],
                behind: int, failed: int, selector: str, now: dt.datetime,
                loading: Mapping[str, Mapping[str, InFlight]] | None = None) -> dict[str, Any]:
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
    fine = ready >= pool.spec.replicas and behind == 0 and failed == 0 and short == 0
    why = (f"{ready}/{pool.spec.replicas} replicas Ready; {len(set(placement.copies) - set(placement.shortfalls))} "
           f"models placed, {behind} copies loading, {failed} failing, {short} short of capacity")
    progressing = condition("Progressing", not fine and failed == 0 and short == 0,
                        "Settled" if fine else "Loading", why, g)
    degraded = condition("Degraded", failed > 0 or short > 0,
                     INSUFFICIENT_CAPACITY if short else (LOAD_FAILED if failed else "AsExpected"), why, g)
    conds = [condition("Ready", fine, "AllReplicasServing" if fine else "NotAllServing", why, g), progressing, degraded,
             *kstatus_conditions(progressing, degraded, g)]
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
