"""Every decision of a TritonModel's reconcile, pure: `plan(world) -> Plan`.

The controller gathers a `World` (the model as read, its namespace's other TritonModels, the children and
replicas it has cached), calls `plan`, carries out what the `Plan` says and records what it wrote. In the
shape of cert-manager's controllers: gather, evaluate purely, write only what changed.

Two things the cache may not know yet are left to the execution, in a form that keeps the decision here:
- a child the cache lacks, of a model reconciled before (right after an operator start, before the watch
  delivered it): an `Apply` with `verify`, which the controller reads first and applies only if
  `differs(existing, desired)`; in apply order, as one reconcile always did;
- whether old repository ConfigMaps are still used: the plan `reads` the model's ReplicaSets, and the
  controller plans again with them before deleting anything.

The Secret of the model's repository key (`render.repository_key`) is created, never applied: the operator may not
read Secrets, so the plan asks for a create (`Plan.create`, before the applies: the Deployment names it) when the
live Deployment does not name it yet, or when a replica cannot start because it is missing; a 409 is success.

The status says too which ensembles serve the model (`status.servedBy`): those among the namespace's TritonModels
whose replicas load it as a step; a model at `replicas: 0` that they serve is Ready (`ServedByEnsembles`). Its
children stay at 0 replicas (`render.kubernetes`). `steps_to_revisit` tells the controller whose servedBy a
change of an ensemble may change.

A Deployment whose pod template changes while nothing of the user's did (a new operator version) is an upgrade
rollout, bounded operator-wide (`plan.upgrade`): the plan keeps its live template while `World.upgrades` is at the
bound, and says so (`Plan.upgrade`, the status' UpgradeRolloutWaiting). The Deployment's labels record what its
template was rendered from; its pod template never does.

The status is planned from the world as it is; the controller plans once more after carrying out the writes
(the cache then holds what the API server answered) and writes that plan's status. A plan carried out leaves
a world whose plan writes nothing (`Plan.writes_nothing`): the idempotence the unit tests check
property-wise, and what makes a second reconcile of an unchanged model write nothing.
"""

from __future__ import annotations

import datetime as dt
from collections import ChainMap
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from pydantic import ValidationError

from ..api import steps as step_graph
from ..api.kinds import CONFIG_MAP, DEPLOYMENT, HPA, LABEL_MODEL, PDB, REPLICA_SET
from ..api.pod import ANNOTATION_POD_DIGEST, repository_of
from ..api.v1alpha1 import TritonModel, TritonModelStatus
from ..render.kubernetes import Options, RepositoryTooLarge, render_children, render_key_secret, selector_string, unused_repositories
from ..render.modelconfig import render_repository
from ..render.repository_key import key_env, secret_missing
from ..validate.errors import from_pydantic
from ..validate.rules import check_models
from .compare import contains as contains  # noqa: PLC0414 - re-exported
from .compare import differs as differs  # noqa: PLC0414 - re-exported: the controllers compare with it
from .rollout import PodPatch, ReplicaRollout, in_place_deployment, patched, plan_replicas
from .status import (
    ADMIN_APIS_RESTRICTED,
    SCALING_ACTIVE,
    Observed,
    Problem,
    as_dict,
    compute_status,
    merge_patch,
    status_changed,
    transitions,
)
from .upgrade import Upgrade, Upgrades, bound_deployment, source_digest

#: Ready=False reasons that are a model on its way, not in trouble: their Events are Normal, not Warning.
ON_ITS_WAY = frozenset({"ReplicasWarming", "ReplicasJoining", "ReplicasStarting"})
#: HTTP statuses a retry can outlive: a timeout, a conflict with a concurrent write, throttling, the server's own.
TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})

ChildKey = tuple[str, str]  # (kind, name) within the model's namespace


@dataclass(frozen=True)
class ApiFailure:
    """The API server's answer to a call that failed (`controller.errors.api_failure` reads it off the exception)."""

    verb: str
    kind: str
    target: str  # namespace/name, or "" when the call did not say
    status: int
    reason: str
    message: str

    @property
    def persistent(self) -> bool:
        """A refusal that the same request will meet again, until someone changes something."""
        return 400 <= self.status < 500 and self.status not in TRANSIENT_STATUSES

    def describe(self) -> str:
        """One line for a condition: `apply Deployment ns/name: 403 Forbidden: <the API server's message>`."""
        what = " ".join(p for p in (self.verb, self.kind, self.target) if p)
        return f"{what}: {self.status} {self.reason}: {self.message}".strip()


def api_problem(failure: ApiFailure | None) -> Problem | None:
    """What the status says of a failed write: a refusal for good (a 403, a 422) is Degraded reason ApiError,
    naming the verb, the kind and the object; what a retry can outlive (a 503, a 409, throttling) is nothing."""
    if failure is None or not failure.persistent:
        return None
    return Problem("ApiError", failure.describe())


@dataclass(frozen=True)
class World:
    """What the controller gathered for one reconcile of `body`."""

    body: Mapping[str, Any]  # the TritonModel as read, status included
    # The namespace's TritonModels by name (the model itself among them): ensemble steps are looked up here.
    models: Mapping[str, Mapping[str, Any]]
    # The model's children, by (kind, name). A key mapped to None was read from the API and is not there.
    children: Mapping[ChildKey, Mapping[str, Any] | None]
    pods: Sequence[Mapping[str, Any]]  # the model's replicas
    now: dt.datetime
    options: Options = field(default_factory=Options)
    # The model's ReplicaSets, listed live; None when not listed (the plan asks when it needs them).
    replicasets: Sequence[Mapping[str, Any]] | None = None
    # How the API server answered the last plan's write that failed: a refusal for good (a 403, a 422) is
    # reported as Degraded (`api_problem`) and stops the plan's reads.
    api_error: ApiFailure | None = None
    # The ensembles among `models` (spec.ensemble set), when the caller keeps them apart: who uses this model as a
    # step is then found without a scan of the namespace. None: they are looked for in `models`.
    ensembles: Mapping[str, Mapping[str, Any]] | None = None
    # The bound on upgrade rollouts and the Deployments that count against it, cluster-wide (`plan.upgrade`).
    upgrades: Upgrades = field(default_factory=Upgrades)


@dataclass(frozen=True)
class Read:
    """What the planner must see before it decides what to delete: a LIST of the model's objects of a kind."""

    api_version: str
    kind: str


@dataclass(frozen=True)
class Apply:
    """A child to server-side apply. With `verify`, the cache does not know it: read it first, and apply only
    if `differs(existing, obj)` (it may exist, unchanged, from before an operator restart)."""

    obj: dict[str, Any]
    verify: bool = False


@dataclass(frozen=True)
class Delete:
    api_version: str
    kind: str
    name: str
    why: str


@dataclass(frozen=True)
class Event:
    """An Event on the TritonModel: one per condition whose status or reason changed."""

    type: str  # Normal or Warning
    reason: str
    message: str
    condition: str  # the condition it tells of, and its new status
    status: str


@dataclass(frozen=True)
class Plan:
    reads: tuple[Read, ...] = ()  # when not empty, the deletes are not decided yet: read these and plan again
    create: tuple[dict[str, Any], ...] = ()  # objects to create (one that exists already is fine), before the applies
    apply: tuple[Apply, ...] = ()  # server-side apply, in this order
    delete: tuple[Delete, ...] = ()  # after the applies
    pods: tuple[PodPatch, ...] = ()  # in-place reloads: annotations to set on replicas' pods, after the deletes
    status: TritonModelStatus | None = None  # None: the stored status is already right
    status_patch: dict[str, Any] | None = None  # the merge patch that writes `status`
    events: tuple[Event, ...] = ()  # after the status is written
    digest: str | None = None  # the desired config digest (None: nothing can be deployed)
    problem: Problem | None = None  # why nothing (new) is deployed
    # An upgrade rollout of the Deployment starts with this plan's apply, or waits for a slot (`plan.upgrade`).
    upgrade: Upgrade | None = None

    @property
    def writes_nothing(self) -> bool:
        """No child to apply or delete, no status to write, nothing to tell: the world is as the model wants it."""
        return not (self.create or self.apply or self.delete or self.pods or self.status is not None or self.events)

    @property
    def empty(self) -> bool:
        """Nothing to read either."""
        return self.writes_nothing and not self.reads


def _closure(root: TritonModel, models: Mapping[str, Mapping[str, Any]]) -> tuple[list[TritonModel], list[str], list[str]]:
    """The root and every model its ensemble steps reach (parsed); the missing step names; parse errors."""
    parsed: dict[str, TritonModel] = {root.name: root}
    errors: list[str] = []

    def steps(name: str) -> list[str] | None:
        if name not in parsed:
            body = models.get(name)
            if body is None:
                return None
            try:
                parsed[name] = TritonModel.model_validate(body)
            except ValidationError as exc:
                errors.extend(str(e) for e in from_pydantic(f"TritonModel/{name}", exc))
                return []
        m = parsed[name]
        return [s.model for s in m.spec.ensemble.steps] if m.spec.ensemble else []

    reached, missing = step_graph.closure(root.name, steps)
    return [parsed[n] for n in reached if n in parsed], missing, errors


def _desired(world: World, model: TritonModel) -> tuple[list[dict[str, Any]], str | None, Problem | None]:
    """The children the model wants, its config digest, or the problem that stops it being deployed."""
    namespace, name = world.body["metadata"]["namespace"], model.name
    closure, missing, step_errors = _closure(model, world.models)
    if missing:
        return [], None, Problem(
            "StepModelMissing",
            f"ensemble step model(s) {', '.join(sorted(set(missing)))} not found in namespace {namespace}; nothing is deployed")
    if step_errors:
        return [], None, Problem("InvalidStepModel", "; ".join(step_errors))
    errors = check_models([(f"TritonModel/{m.name}", m) for m in closure])
    if errors:
        own = [e for e in errors if e.model == f"TritonModel/{name}"]
        return [], None, Problem("InvalidSpec", "; ".join(f"{e.path}: {e.message}" for e in (own or errors))[:2000])
    try:
        rendered = render_repository(closure)
    except Exception as exc:  # noqa: BLE001 - a spec validation let through: say so on the status, retry nothing
        return [], None, render_failed(exc)
    digest = rendered[name].digest
    try:
        return render_children(model, rendered, world.body["metadata"]["uid"], namespace, world.options), digest, None
    except RepositoryTooLarge as exc:
        return [], digest, Problem("RepositoryTooLarge", str(exc))
    except Exception as exc:  # noqa: BLE001 - as above
        return [], digest, render_failed(exc)


def render_failed(exc: Exception) -> Problem:
    """A render that failed on a spec the checks passed: the operator's defect, not the user's. Degraded, reason
    RenderFailed, with what failed; the same spec fails the same way, so it is not retried until it changes."""
    return Problem("RenderFailed", f"the operator could not render this spec, which passed its checks "
                   f"({type(exc).__name__}: {exc}); nothing new is deployed until the spec changes. Please report it"[:2000])


def _replicas(body: Mapping[str, Any]) -> int:
    """spec.replicas of a TritonModel body as read (the CRD defaults it to 1); 0 when it is not a number."""
    value = (body.get("spec") or {}).get("replicas", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def ensembles_using(name: str, models: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """The ensembles among `models` whose replicas load `name` as a step, directly or through nested ensembles,
    with their spec.replicas. One being deleted is left out: its replicas are on their way out."""
    out: dict[str, int] = {}
    for user in step_graph.users(name, models):
        body = models[user]
        if (body.get("spec") or {}).get("platform") != "ensemble" or body["metadata"].get("deletionTimestamp"):
            continue
        out[user] = _replicas(body)
    return out


def steps_to_revisit(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
                     models: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The models whose status.servedBy a change of one model (`old` to `new`, None for absent) may change: every
    model its steps reach, before and after, when its steps, its replicas, its platform or whether it is being
    deleted changed. The controller reconciles them too; their own plans say what, if anything, changed."""
    def role(body: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
        if body is None:
            return None
        return (tuple(step_graph.steps_of(body)), _replicas(body), (body.get("spec") or {}).get("platform"),
                bool(body["metadata"].get("deletionTimestamp")))

    if role(old) == role(new):
        return []
    names: set[str] = set()
    for body in (old, new):
        if body is not None:
            reached, _ = step_graph.closure(step_graph.steps_of(body), step_graph.of_bodies(models))
            names.update(reached)
    for body in (old, new):
        if body is not None:
            names.discard(body["metadata"]["name"])
    return sorted(names)


def _key_secret(world: World, model: TritonModel, desired: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The model's key Secret, to create when nothing shows that it exists: the live Deployment does not name it (a
    new model, a new master key, a Deployment from before keys), or a replica says it is missing."""
    if not desired:
        return ()
    meta = world.body["metadata"]
    secret = render_key_secret(model, meta["uid"], meta["namespace"], world.options)
    if secret is None:
        return ()
    name = secret["metadata"]["name"]
    live = world.children.get((DEPLOYMENT.kind, model.name))
    containers = (((live or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or ()
    named = any(key_env(name) in (c.get("env") or ()) for c in containers)
    if named and not any(secret_missing(p, name) for p in world.pods):
        return ()
    return (secret,)


def _owned_by(body: Mapping[str, Any], name: str, uid: str) -> bool:
    meta = body["metadata"]
    return ((meta.get("labels") or {}).get(LABEL_MODEL) == name
            and any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or ()))


def _parsed(world: World) -> tuple[TritonModel | None, Problem | None]:
    """The TritonModel as read, or the problem that its spec does not parse."""
    try:
        return TritonModel.model_validate(world.body), None
    except ValidationError as exc:
        name = world.body["metadata"]["name"]
        return None, Problem("InvalidSpec", "; ".join(str(e) for e in from_pydantic(f"TritonModel/{name}", exc)))


def _in_place(world: World, model: TritonModel, desired: list[dict[str, Any]],
              digest: str) -> tuple[list[dict[str, Any]], ReplicaRollout]:
    """The children and the replicas' rollout when a new config is loaded into the running replicas (`plan.rollout`)."""
    # In place only where a replica can load the config: with no replica wanted, the Deployment takes the new
    # template at no cost (no pod to replace), and its template and ConfigMap name the desired config.
    if not (model.spec.warmup_gate.enabled and model.spec.rollout.strategy == "InPlace" and model.spec.replicas > 0):
        return desired, ReplicaRollout()
    desired = [in_place_deployment(c, world.children.get((DEPLOYMENT.kind, model.name))) if c["kind"] == DEPLOYMENT.kind
               else c for c in desired]
    want = next(c for c in desired if c["kind"] == DEPLOYMENT.kind)
    rollout = plan_replicas(
        world.pods, digest, next(c for c in desired if c["kind"] == CONFIG_MAP.kind)["metadata"]["name"],
        want["spec"]["template"]["metadata"]["annotations"][ANNOTATION_POD_DIGEST], model.spec.rollout,
        sequences=model.spec.sequence_batcher is not None, streams=model.spec.decoupled)
    return desired, rollout


def _bounded(world: World, desired: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Upgrade | None]:
    """The children with the Deployment as the bound on upgrade rollouts lets it be (`plan.upgrade`)."""
    upgrade: Upgrade | None = None
    out: list[dict[str, Any]] = []
    for c in desired:
        if c["kind"] == DEPLOYMENT.kind:
            live = world.children.get((DEPLOYMENT.kind, c["metadata"]["name"]))
            c, upgrade = bound_deployment(c, live, world.body, source_digest(world.body, world.models), world.upgrades,
                                          world.now)
        out.append(c)
    return out, upgrade


def _deletes(world: World, model: TritonModel | None, desired: list[dict[str, Any]],
             api_error: Problem | None) -> tuple[list[Read], list[Delete]]:
    """The children to delete, and what must be read before the repository ConfigMaps' deletes are decided."""
    meta = world.body["metadata"]
    name, uid = meta["name"], meta["uid"]
    reads: list[Read] = []
    delete: list[Delete] = []
    if desired:
        # Repository ConfigMaps no pod can need any more; the ReplicaSets say which ones still may.
        repository = next(c for c in desired if c["kind"] == CONFIG_MAP.kind)["metadata"]["name"]
        mine = [c for (kind, _), c in sorted(world.children.items()) if c is not None and kind == CONFIG_MAP.kind
                and _owned_by(c, name, uid)]
        deployment = next((c for c in desired if c["kind"] == DEPLOYMENT.kind), None)
        mounted = repository_of(deployment["spec"]["template"]) if deployment is not None else None
        if any(c["metadata"]["name"] not in (repository, mounted) for c in mine):
            if world.replicasets is None:
                if api_error is None:  # a refused write stops the reconcile: no deletes, no reads
                    reads.append(Read(REPLICA_SET.api_version, REPLICA_SET.kind))
            else:
                delete += [Delete(CONFIG_MAP.api_version, CONFIG_MAP.kind, unused, "no ReplicaSet uses it")
                           for unused in unused_repositories(mine, world.replicasets, repository, mounted)]
    if model is not None and model.spec.replicas <= 1 and world.children.get((PDB.kind, name)) is not None:
        delete.append(Delete(PDB.api_version, PDB.kind, name, "spec.replicas is 1 or less"))
    hpa = world.children.get((HPA.kind, name))
    if model is not None and model.spec.autoscaling is None and hpa is not None and _owned_by(hpa, name, uid):
        delete.append(Delete(HPA.api_version, HPA.kind, name, "spec.autoscaling is unset"))
    return reads, delete


def _events(stored: Mapping[str, Any], status: TritonModelStatus) -> tuple[Event, ...]:
    """An Event per condition whose status or reason changed: Warning for trouble, Normal for the rest."""
    return tuple(
        Event("Warning" if (c["type"] == "Degraded" and c["status"] == "True")
              or (c["type"] == "Ready" and c["status"] == "False" and c["reason"] not in ON_ITS_WAY)
              or (c["type"] in (SCALING_ACTIVE, ADMIN_APIS_RESTRICTED) and c["status"] == "False") else "Normal",
              c["reason"], f"{c['type']}={c['status']}: {c['message']}", c["type"], c["status"])
        for c in transitions(stored, status))


def plan(world: World) -> Plan:
    """What one reconcile of `world.body` does: the writes, the reads the deletes wait for, the status."""
    body = world.body
    meta = body["metadata"]
    name, uid = meta["name"], meta["uid"]
    stored = body.get("status") or {}
    api_error = api_problem(world.api_error)

    model, problem = _parsed(world)
    desired: list[dict[str, Any]] = []
    digest: str | None = None
    if model is not None:
        desired, digest, problem = _desired(world, model)
    rollout = ReplicaRollout()
    if model is not None and digest is not None and desired:
        desired, rollout = _in_place(world, model, desired, digest)
    upgrade: Upgrade | None = None
    if desired:
        desired, upgrade = _bounded(world, desired)

    # A child the cache lacks is verified first, if the model was reconciled before; a model with no status was
    # never reconciled: nothing of ours can exist, so its children are applied straight away (one left by a
    # first reconcile cut short is re-applied unchanged, a no-op for the server).
    create = _key_secret(world, model, desired) if model is not None else ()
    apply = tuple(
        Apply(c, verify=bool(stored)) if (c["kind"], c["metadata"]["name"]) not in world.children else Apply(c)
        for c in desired if differs(world.children.get((c["kind"], c["metadata"]["name"])), c))
    reads, delete = _deletes(world, model, desired, api_error)
    # The status, from the replicas as they are (the writes above change no pod at once).
    hpa = world.children.get((HPA.kind, name))
    observed = Observed(
        generation=int(meta.get("generation", 1)),
        desired_replicas=model.spec.replicas if model is not None else int((body.get("spec") or {}).get("replicas", 1)),
        digest=digest or stored.get("configDigest"),
        selector=f"{LABEL_MODEL}={name}" if model is None else selector_string(model),
        problem=problem,
        api_error=api_error,
        rollout_problem=rollout.problem,
        deployment=world.children.get((DEPLOYMENT.kind, name)),
        pods=world.pods,
        ensembles=ensembles_using(name, world.models if world.ensembles is None else world.ensembles),
        hpa=hpa if model is not None and model.spec.autoscaling is not None and hpa is not None
        and _owned_by(hpa, name, uid) else None,
        opened_apis=tuple(model.spec.server.unrestricted_apis or ()) if model is not None else (),
        upgrade_waiting=upgrade.message if upgrade is not None and not upgrade.started else None,
    )
    status = compute_status(observed, stored, world.now)
    if not status_changed(stored, status):
        return Plan(reads=tuple(reads), create=create, apply=apply, delete=tuple(delete), pods=rollout.patches,
                    digest=digest, problem=problem, upgrade=upgrade)
    return Plan(reads=tuple(reads), create=create, apply=apply, delete=tuple(delete), pods=rollout.patches,
                status=status, status_patch=merge_patch(stored, status), events=_events(stored, status), digest=digest,
                problem=problem, upgrade=upgrade)


def _set_over(existing: Any, desired: Any) -> Any:
    """`existing` with every field of `desired` set (objects merge; anything else, lists too, is replaced)."""
    if isinstance(existing, Mapping) and isinstance(desired, Mapping):
        return {**existing, **{k: _set_over(existing.get(k), v) for k, v in desired.items()}}
    return desired


def carried_out(world: World, done: Plan, applied: Mapping[ChildKey, Mapping[str, Any]] | None = None) -> World:
    """The world after `done` was carried out in full: what the controller's cache then holds.

    `applied` are the API server's answers to the applies (defaults: the applied objects, set over what was there,
    as a server-side apply sets its fields and keeps the server's own, e.g. a Deployment's status).
    """
    children: dict[ChildKey, Mapping[str, Any] | None] = dict(world.children)
    for a in done.apply:
        key = (a.obj["kind"], a.obj["metadata"]["name"])
        existing = children.get(key)
        children[key] = (applied or {}).get(key, _set_over(existing, a.obj) if existing is not None else a.obj)
    for d in done.delete:
        children.pop((d.kind, d.name), None)
    patches = {p.name: p for p in done.pods}
    pods = [patched(p, patches[p["metadata"]["name"]]) if p["metadata"]["name"] in patches else p for p in world.pods]
    body = world.body
    if done.status is not None:
        body = {**body, "status": as_dict(done.status)}
    # An overlay, not a copy: the cache's models decode on read (controller.cache.Bodies), and copying them all
    # here made each reconcile cost O(models in the namespace).
    # ChainMap writes only to its first map.
    models = ChainMap({body["metadata"]["name"]: body}, cast("MutableMapping[str, Mapping[str, Any]]", world.models))
    return replace(world, body=body, models=models, children=children, pods=pods, api_error=world.api_error)
