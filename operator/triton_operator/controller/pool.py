"""The one level-triggered reconcile of a TritonPool: its replicas, where its models go, their loads, their traffic.

Each round (`PoolReconciler.reconcile`) gathers, plans purely and carries out, as a TritonModel's does
(`plan.planner`): apply the pool's Deployment, PodDisruptionBudget and key Secret; list its pods live;
`plan.pool.round_of` derives the live and Ready replicas and the placement (keeping each model's recorded one); ask
each Ready replica's Triton what it serves, the pool's record which loads a previous operator left in flight, and the
sidecars what files they hold (`plan.pool.fetch_asks`, `replica_fetches`); then `plan.pool.plan_pool(world)` says
what to load and unload where, what leaves the slices first and is drained, which loads to record in flight, and
every slice and status. The controller writes the placement and the loads in flight down (the models' and the pool's
statuses) before any load, so that a restarted operator finds them; drains; carries each replica's work out (an
update replica by replica, a copy listed in its slices as soon as it is READY); asks again, and writes what
`plan_pool` says of the world after the loads, with when to come back. A round holds the members it began with;
before it writes a model's Service or slices, or loads it, it asks the watch's cache whether that model is still the
same one on this pool (`_still_member`): one deleted or moved meanwhile gets nothing more from it.

What `PoolReconciler` keeps between rounds, and why each is safe to lose (an operator restart, a new leader):
- `pools`, `_applied`: the watch's TritonPools and the answers to our last applies, caches of the API server that
  the watches fill again (an apply compares with them, and applies when it does not know).
- `_memo`: each pool's members as last parsed and rendered, by the body's essence: a pure memo.
- `queue`: the work queue (`controller.workqueue`, the TritonModels' too): one worker per pool, events coalesced
  into one round.
- `_live`: the round under way (a pod event rewrites its slices at once); it lives one round.
- `_held`: the back-off of a failed load or fetch, by (replica, model, digest), with its message (the status'
  ModelLoadFailed). A restart retries at once; the load fails again and says so again.
- `_fetch_failures`: the sidecar's failed attempt already counted, so that one failed attempt is held once. Lost, the
  sidecar's last failure is counted once more.
- `_sidecar_names`: what each sidecar held when last asked, so that one known empty, with nothing to fetch, is not
  asked every round. Absent: asked.
- `_sent`: the loads this process sent in the round: a load recorded in flight and not among them is a previous
  operator's, waited for (`plan.pool.awaited`). Emptied when a round ends (one that failed midway leaves its own, so
  that the next does not wait for them); empty after a restart, rightly.
- `_broken`, `_watchers`: what each Ready replica's probe calls broken, read by one long poll per replica; the
  polls start again on the next round.
- `_heals`: a heal's back-off; lost, a copy still broken is healed at once.
- `_answered`: the tritonserver container that last answered a whole round, per replica; a restarted operator
  trusts no record of a replica until it has answered once (`plan.pool.as_last_seen`).
- `_swept`: the pooled models' Services (by uid) already cleared of the Endpoints and EndpointSlices Kubernetes'
  controllers left from their selector (`_sweep_left_endpoints`); `_left_in`: per namespace, the Services that had
  such leftovers when this process first listed them (one LIST of each kind); `_moving`, the Services whose selector
  this process's apply took away, not swept yet, each looked at on its own (a GET, a LIST). Lost, the namespace is
  listed again once, and a Service whose selector is already gone is found in that listing.
The placement is in the models' statuses, what each replica was told to load and what is in flight in the pool's
status, what each replica serves in its Triton, what each holds on disk in its sidecar. A pool reconciles again
every few seconds while it is not settled, and on every event of the pool, its pods or its models.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from pydantic import ValidationError

from ..api.kinds import DEPLOYMENT, ENDPOINT_SLICE, ENDPOINTS, HPA, LABEL_MODEL, TRITON_MODEL, TRITON_POOL, Kind
from ..api.pod import PROBE_PORT
from ..api.pool import (
    ENDPOINTS_CONTROLLER,
    HANDOVER_CONDITION,
    KUBERNETES_SLICE_MANAGERS,
    LABEL_ENDPOINTS_MANAGED_BY,
    LABEL_POOL,
    LABEL_POOL_TEMPLATE,
    TritonPool,
)
from ..api.timestamps import rfc3339, utc_now
from ..api.v1alpha1 import TritonModel, quantity_bytes
from ..plan import pool as pool_plan
from ..plan.planner import differs
from ..plan.pool import FETCH_FAILED_PREFIX
from ..plan.upgrade import (
    NO_SURGE,
    ROLLING_WITHOUT_SURGE,
    UPGRADE_STARTED,
    DeploymentKey,
    Upgrade,
    Upgrades,
    bound_deployment,
    draining,
    in_upgrade_rollout,
    source_digest,
    unschedulable,
)
from ..platform.kube import Kube
from ..render.kubernetes import Options
from ..render.pool import (
    LABEL_SERVICE_NAME,
    LABEL_SLICE_MANAGED_BY,
    POOL_DEPLOYMENT_SUFFIX,
    ReplicaPod,
    pool_deployment_name,
    pool_key,
    render_endpoint_slices,
    render_model_hpa,
    render_model_service,
)
from ..triton import fetcher as triton_fetcher
from ..triton import pool as triton_pool
from ..triton.probe import probe_news
from ..triton.reload import requests_seen
from . import metrics
from .cache import Cache, lean
from .heal import TRITONSERVER
from .tasks import detached
from .workqueue import WorkQueue

log = logging.getLogger("triton_operator.pool")

#: A round stops starting loads on a replica after this many seconds (once it has done one), publishes what is served
#: and comes back at once: a model loaded early in a long queue of loads is listed without waiting for the rest
#: (bench/pool: 200 models, 50 per replica, were all listed at the end of the one round that loaded them).
ROUND_LOAD_SECONDS = 5.0
#: How many models' writes (Service, slices, HPA, status) a round's publish has under way at once.
PUBLISH_CONCURRENCY = 8
#: How long a read of a pool replica's probe (`GET /status?since=N&wait=S`) is held for news.
HEALTH_WAIT_SECONDS = 3.0


class UpgradeSlots(Protocol):
    """The bound on upgrade rollouts, kept by the TritonModels' reconciler (`controller.reconcile`), which a pool's
    Deployment shares."""

    def upgrade_slots(self) -> Upgrades: ...
    def reserve_upgrade(self, key: DeploymentKey) -> None: ...
    def release_upgrade(self, key: DeploymentKey) -> None: ...
    async def list_upgrades(self) -> None: ...
    def report_pool(self, key: DeploymentKey, stuck: bool, drains: bool) -> None: ...


@dataclass
class _Held:
    failures: int
    until: float
    message: str


@dataclass
class _Live:
    """A round under way: what it knows so far, for the slices a pod event rewrites meanwhile."""

    rnd: pool_plan.PoolRound
    records: dict[str, dict[str, str]]
    seen: dict[tuple[str, str], pool_plan.Seen]
    draining: frozenset[tuple[str, str]]
    handed: set[str] = field(default_factory=set)  # the replicas whose handover gate this round opened


class PoolReconciler:
    def __init__(self, kube: Kube, cache: Cache, options: Options | None = None) -> None:
        self.kube = kube
        self.cache = cache
        self.options = options or Options()
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}  # the watch's TritonPools
        self._put_at: dict[tuple[str, str], float] = {}  # when each was last put (monotonic): `resync`'s race guard
        self._applied: dict[tuple[str, str, str], dict[str, Any]] = {}  # our last applies' answers
        self.slots: UpgradeSlots | None = None  # the bound on upgrade rollouts (`_bounded`); None: no bound
        self._held: dict[tuple[str, str, str, str, str], _Held] = {}  # (ns, pool, replica, model, digest)
        # One worker per pool, bursts of events coalesced into one round, a round coming back when it says; a failed
        # one backs off, cut short by any request; a pool neither known nor named by a model lets its worker go.
        self.queue = WorkQueue(self._measured, "TritonPool", log, wanted=lambda ns, name: self._wanted((ns, name)))
        self._live: dict[tuple[str, str], _Live] = {}  # the rounds under way
        self._memo: dict[tuple[str, str], pool_plan.Memo] = {}  # each pool's members as last parsed and rendered
        self._fetch_failures: dict[tuple[str, str, str, str, str], int] = {}  # held key -> the sidecar's attempt seen
        # (ns, pool, replica) -> the models its sidecar was last seen holding (absent: not asked yet by this process)
        self._sidecar_names: dict[tuple[str, str, str], set[str]] = {}
        # The loads this process has sent, answered or not: a recorded load not among them is a previous operator's.
        self._sent: set[tuple[str, str, str, str, str]] = set()  # (ns, pool, replica, Triton name, digest)
        # Self-healing (issue 33 on a pool): what each replica's probe finds broken (Triton name -> why), read by a
        # long poll per Ready replica (`_watch_health`); the heals' back-off.
        self._broken: dict[tuple[str, str, str], dict[str, str]] = {}  # (ns, pool, pod)
        self._watchers: dict[tuple[str, str, str], tuple[str, asyncio.Task[None]]] = {}  # (ns, pool, pod) -> (ip, task)
        self._heals: dict[tuple[str, str, str, str], _Held] = {}  # (ns, pool, pod, model)
        # (ns, pool, pod) -> the tritonserver container that last answered every question of a round: a question it
        # leaves unanswered later is answered by its record (`pool_plan.as_last_seen`); another container's is not.
        # A cache: a restarted operator trusts no record until each replica has answered once.
        self._answered: dict[tuple[str, str, str], str] = {}
        self._swept: set[str] = set()  # Service uids
        self._left_in: dict[str, set[str]] = {}  # namespace -> the Services Kubernetes left endpoints of, listed once
        self._left_lock = asyncio.Lock()
        self._moving: set[tuple[str, str]] = set()  # (ns, Service) whose selector our apply took away, not swept yet

    # -- scheduling: the work queue (`controller.workqueue`), shared with the TritonModels

    def put_pool(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        metrics.observe_pool(body, deleted)  # the pool's gauge follows what is kept, and goes with it
        if deleted:
            self.pools.pop(key, None)
            self._put_at.pop(key, None)
        else:
            self.pools[key] = lean(body)
            self._put_at[key] = time.monotonic()

    async def resync(self) -> None:
        """Drops the TritonPools a LIST no longer shows: deleted while a watch was down (kopf lists again after a
        restarted watch and reports what it finds, never what went; `Reconciler.resync` does the same for models).
        Kept, such a pool's round would apply its garbage-collected Deployment and Services again, and its gauge would
        stay. A pool put since its namespace's LIST began (created meanwhile) is kept."""
        for namespace in sorted({ns for ns, _ in self.pools}):
            since = time.monotonic()
            uids = await asyncio.to_thread(self.kube.list_uids, TRITON_POOL.api_version, TRITON_POOL.kind, namespace)
            for key, body in list(self.pools.items()):
                if key[0] != namespace or body["metadata"].get("uid") in uids or self._put_at.get(key, 0.0) >= since:
                    continue
                log.info("Forgot TritonPool deleted while a watch was down namespace=%s name=%s", namespace, key[1])
                self.put_pool(body, deleted=True)
                self.request(namespace, key[1])  # its models say PoolNotFound; a pool no model names lets its worker go

    def request(self, namespace: str, name: str) -> None:
        self.queue.request(namespace, name)

    def request_all(self) -> None:
        """Every pool known, and every pool a model names (a missing one: its models say PoolNotFound)."""
        wanted = set(self.pools)
        for namespace, models in list(self.cache.models.items()):
            for name in list(models):
                pool = ((models[name].get("spec") or {}).get("pool"))
                if pool:
                    wanted.add((namespace, pool))
        for namespace, name in sorted(wanted):
            self.request(namespace, name)

    async def _measured(self, namespace: str, name: str) -> float | None:
        """A round, counted and timed (`metrics.POOL_ROUNDS`, `POOL_ROUND_SECONDS`)."""
        started = time.monotonic()
        try:
            again = await self.reconcile(namespace, name)
        except Exception:
            metrics.POOL_ROUNDS.labels(result="error").inc()
            raise
        else:
            metrics.POOL_ROUNDS.labels(result="ok").inc()
            return again
        finally:
            metrics.POOL_ROUND_SECONDS.observe(time.monotonic() - started)

    def _wanted(self, key: tuple[str, str]) -> bool:
        return key in self.pools or bool(pool_plan.pooled(key[1], self._bodies(key[0])))

    def _bodies(self, namespace: str) -> dict[str, dict[str, Any]]:
        models = self.cache.models.get(namespace)
        return {} if models is None else {name: models[name] for name in list(models)}

    # -- the round

    async def _prime(self, namespace: str) -> None:
        """The namespace's TritonModels listed once per operator process, before its first pool round: the watch
        delivers its first listing one object at a time, and a round that saw only part of the models unloaded the
        others' copies as no longer placed (and loaded them again a round later: seen after a leader's restart,
        e2e/test_pool.py)."""
        if namespace in self.cache.models_primed:
            return
        self.cache.models_listing.setdefault(namespace, set())
        try:
            listed = await asyncio.to_thread(self.kube.list, TRITON_MODEL.api_version, TRITON_MODEL.kind, namespace)
            self.cache.prime_models(namespace, listed)
        finally:
            self.cache.models_listing.pop(namespace, None)

    async def reconcile(self, namespace: str, name: str) -> float | None:
        """One round; returns in how many seconds to come back (None: when something changes)."""
        await self._prime(namespace)
        members = pool_plan.members(name, self._bodies(namespace), self._memo.setdefault((namespace, name),
                                                                                         pool_plan.Memo()))
        body = self.pools.get((namespace, name))
        if body is None and members:  # the pool's watch may not have delivered it yet (the operator starting)
            body = await asyncio.to_thread(self.kube.get, TRITON_POOL.api_version, TRITON_POOL.kind, namespace, name)
            if body is not None:
                self.put_pool(body)
        if body is None:
            if self.slots is not None:  # a pool deleted mid-rollout holds no slot
                self.slots.report_pool((namespace, f"{name}{POOL_DEPLOYMENT_SUFFIX}"), False, False)
            await self._orphans(namespace, name, members)
            return None
        try:
            pool = TritonPool.model_validate(body)
        except ValidationError as exc:
            log.warning("Skipped invalid TritonPool namespace=%s name=%s error=%s", namespace, name, exc)
            return None
        uid = body["metadata"]["uid"]
        template, upgrade = await self._apply_children(namespace, pool, uid, body)
        pods = await asyncio.to_thread(self.kube.list, "v1", "Pod", namespace, f"{LABEL_POOL}={name}")
        unscheduled = self._report_upgrade(namespace, pool, pods)
        rnd = pool_plan.round_of(namespace, pool, body, members, pods, pool_key(pool, uid, namespace, self.options),
                                 template, upgrade, unscheduled, await self._replica_sets(namespace, name, pods, template))
        if rnd.rollout.mark is not None:
            log.info("Rollout: replica leaves next pool=%s/%s pod=%s replacedBy=%s", namespace, name,
                     rnd.rollout.mark, ",".join(rnd.rollout.waiting))
        # Beside the round, not before it: a new model's placement changes its replica's cost, and that write held
        # the model's load back.
        costs = asyncio.ensure_future(self._deletion_costs(namespace, rnd.costs))
        live_state = _Live(rnd, pool_plan.recorded(body), {}, frozenset())
        self._live[(namespace, name)] = live_state
        try:
            return await self._round(rnd, live_state)
        finally:
            self._live.pop((namespace, name), None)
            await costs

    async def _replica_sets(self, namespace: str, name: str, pods: list[dict[str, Any]],
                            template: str) -> dict[str, str]:
        """The creationTimestamp of each ReplicaSet of the pool's, read only while its live pods of an older template
        than `template` (the Deployment's) belong to more than one (`plan.pool.oldest_first`): the Deployment scales
        the oldest down first, and a rollout's leaving replica must be one of its pods."""
        views = [ReplicaPod.of(p) for p in pods]
        owners = {v.replica_set for v in views if v.replica_set and not v.terminating and v.template != template}
        if not template or len(owners) < 2:
            return {}
        try:
            listed = await asyncio.to_thread(self.kube.list, "apps/v1", "ReplicaSet", namespace, f"{LABEL_POOL}={name}")
        except Exception as exc:  # noqa: BLE001 - without them any old replica may be marked, as before
            log.warning("Failed to list ReplicaSets pool=%s/%s error=%r", namespace, name, exc)
            return {}
        return {str(rs["metadata"]["name"]): str(rs["metadata"].get("creationTimestamp") or "") for rs in listed}

    async def _deletion_costs(self, namespace: str, costs: Mapping[str, Mapping[str, str | None]]) -> None:
        """Each replica's pod-deletion-cost (what its placed copies take, so a scale-down removes the emptiest) and
        leaving mark (`plan.pool.rollout`)."""
        for name, wanted in costs.items():
            try:
                await asyncio.to_thread(self.kube.patch_pod_annotations, namespace, name, wanted)
            except Exception as exc:  # noqa: BLE001 - the pod may be gone; the next round writes it again
                log.warning("Failed to annotate pod=%s/%s annotations=%s error=%r", namespace, name, dict(wanted), exc)

    def _report_upgrade(self, namespace: str, pool: TritonPool, pods: list[dict[str, Any]]) -> str | None:
        """Tells the bound on upgrade rollouts (`slots`) whether the pool's Deployment, in an upgrade rollout, cannot
        schedule its surge pod (then no other upgrade rollout starts: its pods would wait for the same room) or still
        has replaced pods terminating (it keeps its slot until they are gone), as a model's Deployment does
        (`plan.upgrade.unschedulable`, `draining`); returns why it cannot schedule, if it cannot."""
        key = (namespace, pool_deployment_name(pool))
        deployment = self.cache.children.get((DEPLOYMENT.kind, *key))
        why = unschedulable(deployment, pods, owner="pool")
        if self.slots is not None:
            self.slots.report_pool(key, why is not None, deployment is not None and draining(deployment, pods))
        return why

    @staticmethod
    def _handing_over(rnd: pool_plan.PoolRound, world: pool_plan.PoolWorld) -> pool_plan.PoolPlan:
        """The round's plan, where it opens handover gates planned again with those replicas Ready: their copies are
        in the slices it publishes before the gates open. Published after, the Deployment deleted the leaving replica
        (a moment after the new one turned Ready) before the slices listed the new one: a model on the leaving
        replica alone had no ready endpoint for 30 ms (e2e/test_pool_rollout.py)."""
        plan = pool_plan.plan_pool(world)
        if not plan.handovers:
            return plan
        for r in plan.handovers:
            view = rnd.pods[r]
            rnd.pods[r] = replace(view, ready=view.up, handed_over=True)
        return pool_plan.plan_pool(world)

    def _holding(self, rnd: pool_plan.PoolRound) -> bool:
        """Whether the pool's Deployment, as last seen, keeps more replicas than the pool asks for (`_bounded`)."""
        live = self.cache.children.get((DEPLOYMENT.kind, rnd.namespace, pool_deployment_name(rnd.pool)))
        replicas = (live or {}).get("spec", {}).get("replicas")
        return isinstance(replicas, int) and replicas > rnd.pool.spec.replicas

    async def _without_surge(self, rnd: pool_plan.PoolRound) -> None:
        """The upgrade rollout goes on without its surge pod (`plan.pool.no_surge`): the Deployment applied again
        with maxSurge 0 and maxUnavailable 1, once (the live strategy is read back after that)."""
        key = (DEPLOYMENT.kind, rnd.namespace, pool_deployment_name(rnd.pool))
        live = self.cache.children.get(key)
        if live is None or (live.get("spec") or {}).get("strategy") == NO_SURGE:
            return
        await self._apply_children(rnd.namespace, rnd.pool, rnd.body["metadata"]["uid"], rnd.body, no_surge=True)
        if (self.cache.children.get(key) or {}).get("spec", {}).get("strategy") != NO_SURGE:
            return  # not an upgrade rollout of two replicas or more any more: the rendered strategy stays
        leaving = ", ".join(sorted(rnd.rollout.leaving))
        message = (f"the upgrade rollout's surge pod cannot be scheduled ({rnd.unschedulable}); {leaving}, whose "
                   "copies serve on the other replicas now, goes first and its GPU goes to the new pod: the rollout "
                   "goes on one replica at a time without a surge pod")[:1024]
        log.info("Rolling without a surge pod pool=%s/%s leaving=%s", rnd.namespace, rnd.pool.name, leaving)
        await asyncio.to_thread(self.kube.event, dict(rnd.body), ROLLING_WITHOUT_SURGE, message, "Normal")

    async def _hand_over(self, rnd: pool_plan.PoolRound, st: _Live, replicas: Sequence[str]) -> None:
        """Opens the handover gate of `replicas` (`plan.pool.handovers`): their pods turn Ready, and in a rollout the
        Deployment deletes the leaving replica, whose copies serve elsewhere now."""
        for r in replicas:
            if r in st.handed:
                continue
            leaving = sorted(rnd.rollout.leaving)
            message = (f"the copies of {', '.join(leaving)}, which it replaces, serve elsewhere" if leaving
                       else "it replaces no replica that serves copies")
            cond = {"type": HANDOVER_CONDITION, "status": "True", "reason": "HandedOver", "message": message,
                    "lastTransitionTime": rfc3339(utc_now())}
            try:
                await asyncio.to_thread(self.kube.patch_pod_condition, rnd.namespace, r, cond)
            except Exception as exc:  # noqa: BLE001 - the pod may be gone; the next round opens it again
                log.warning("Failed to open the handover gate pod=%s/%s error=%r", rnd.namespace, r, exc)
                continue
            st.handed.add(r)
            log.info("Handover gate opened pool=%s/%s pod=%s reason=%r", rnd.namespace, rnd.pool.name, r, message)

    async def _round(self, rnd: pool_plan.PoolRound, st: _Live) -> float:
        """Gather, plan (`plan.pool.plan_pool`), carry out; then gather and plan again for the statuses and the
        wake-up."""
        ready = list(rnd.ready)
        self._watch(rnd, ready)
        st.seen = await self._observe(rnd, ready, st.records)
        in_flight, heard = await self._in_flight(rnd, ready, st.seen)
        # A uri model's files on the replica's disk first (its sidecar fetches them meanwhile): until they are, its
        # load there waits, as a held one does, and its served copy is neither drained nor unloaded.
        unfetched, fetching = await self._fetch_phase(rnd, ready, st.records, st.seen)
        plan = self._handing_over(rnd, self._world(rnd, st, in_flight=in_flight, heard=heard,
                                                   unfetched=frozenset(unfetched), fetching=fetching))
        # The placement and the slices without what is about to be drained or unloaded, and the loads about to be
        # sent (a restarted operator waits for them), before any load.
        st.draining = plan.draining
        await self._publish(rnd, plan)
        await self._hand_over(rnd, st, plan.handovers)
        if plan.drains:
            await self._drain(rnd, plan.drains)
        busy = [w for w in plan.work.values() if w.load or w.unload]
        deadline = time.monotonic() + ROUND_LOAD_SECONDS
        cut = await asyncio.gather(*(self._carry_out(rnd, w, st, deadline) for w in busy))
        if busy:
            st.seen = await self._observe(rnd, ready, st.records)
        st.records = pool_plan.records_after(rnd, st.records, st.seen)
        st.draining = frozenset()
        after = self._handing_over(rnd, self._world(rnd, st, in_flight=in_flight, heard=heard, fetching=fetching,
                                                    carried=pool_plan.Carried(bool(busy), any(cut))))
        await self._publish(rnd, after)
        await self._hand_over(rnd, st, after.handovers)
        if after.no_surge:
            await self._without_surge(rnd)
        if after.shrink or (not rnd.rollout.shrinking and self._holding(rnd)):
            # Handed over, or nothing to hand over (the replicas beyond the count not running yet, a rollout under
            # way): the Deployment takes the pool's count.
            log.info("Scaling down pool=%s/%s leaving=%s replicas=%d", rnd.namespace, rnd.pool.name,
                     ",".join(sorted(rnd.rollout.leaving)) or "-", rnd.pool.spec.replicas)
            await self._apply_children(rnd.namespace, rnd.pool, rnd.body["metadata"]["uid"], rnd.body, shrink=True)
        self._sent = {k for k in self._sent if k[:2] != (rnd.namespace, rnd.pool.name)}  # answered, and unrecorded
        return after.wake

    def _world(self, rnd: pool_plan.PoolRound, st: _Live, **answers: Any) -> pool_plan.PoolWorld:
        """The world of one plan: the round, what its replicas answered (`answers`, `st`), and what this process's
        caches say now (the probes' broken copies, the back-offs, the slices it wrote, the models' HPAs)."""
        models = {n: m.model for n, m in rnd.members.items() if m.model is not None}
        return pool_plan.PoolWorld(
            rnd, utc_now(), st.records, st.seen, broken=self._broken_copies(rnd), heals_held=self._heals_held(rnd),
            held=self._held_now(rnd), failures={n: self._failures(rnd, n) for n in models},
            stored={n: (self.cache.model(rnd.namespace, n) or m.body).get("status") or {}
                    for n, m in rnd.members.items()},
            pool_stored=self.pools.get((rnd.namespace, rnd.pool.name), rnd.body).get("status") or {},
            sliced=frozenset(n for n, model in models.items() if self._sliced(rnd.namespace, model.name)),
            hpas={n: self.cache.children.get((HPA.kind, rnd.namespace, model.name)) for n, model in models.items()
                  if model.spec.autoscaling is not None},
            **answers)

    async def _in_flight(self, rnd: pool_plan.PoolRound, ready: list[str], seen: Mapping[tuple[str, str], pool_plan.Seen]
                         ) -> tuple[dict[str, dict[str, pool_plan.InFlight]], dict[tuple[str, str], bool | None]]:
        """The loads the pool's status records in flight that this process did not send (a previous operator's), and
        for each on a Ready replica and not READY there, whether its Triton has received it (`triton.pool.heard_of`)."""
        theirs = pool_plan.previous_loads(rnd, ready, {k[2:] for k in self._sent
                                                       if k[:2] == (rnd.namespace, rnd.pool.name)})
        asks = pool_plan.heard_asks(rnd, theirs, seen)
        answers = await asyncio.gather(*(triton_pool.heard_of(rnd.address(r), rnd.members[n].triton_name)
                                         for r, n in asks))
        heard = dict(zip(asks, answers, strict=True))
        for (r, n), h in heard.items():
            ld = theirs[r][rnd.members[n].triton_name]
            log.info("Found a load in flight from a previous operator namespace=%s pool=%s pod=%s model=%s digest=%s "
                     "since=%s heard=%s", rnd.namespace, rnd.pool.name, r, n, ld.digest, ld.since.isoformat(), h)
        return theirs, heard

    def pod_changed(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """A pool pod's event. While a round of its pool runs (a load can take minutes), a replica that stops being
        Ready, or goes, leaves every model's slices at once (`_slices_now`), not when the round ends; the round's
        own later writes see the pod as it is now."""
        meta = pod["metadata"]
        pool = (meta.get("labels") or {}).get(LABEL_POOL)
        st = self._live.get((meta["namespace"], str(pool)))
        if st is None or meta["name"] not in st.rnd.pods:
            return
        view = ReplicaPod.of(pod)
        if deleted:
            view = ReplicaPod(view.name, view.uid, view.ip, view.node, False, True)
        before = st.rnd.pods[meta["name"]]
        st.rnd.pods[meta["name"]] = view
        if (before.ready and not view.ready) or (view.terminating and not before.terminating):
            detached(self._slices_now(st), name=f"pool-slices-{meta['namespace']}/{pool}")

    async def _slices_now(self, st: _Live) -> None:
        """Every model's slices without the replicas that are no longer Ready (`plan.pool.slices_left`): each keeps
        the replicas its slices, as last applied, list as ready (`listed_ready`), less those."""
        rnd = st.rnd
        listed = {n: pool_plan.listed_ready(self._applied.get(("EndpointSlice", rnd.namespace, f"{m.model.name}-{f}"))
                                            for f in ("ipv4", "ipv6"))
                  for n, m in rnd.members.items() if m.model is not None}
        for name, on in pool_plan.slices_left(rnd, listed).items():
            await self._traffic(rnd.namespace, rnd.members[name], list(rnd.placement.copies.get(name, ())), rnd.pods,
                                on)

    def observe_child(self, body: Mapping[str, Any], deleted: bool = False) -> str | None:
        """A watch event of an object the pool's rounds apply: kept to compare the next apply with (an edit by
        someone else is applied over); returns the pool to reconcile, if any."""
        meta = body["metadata"]
        key = (body["kind"], meta["namespace"], meta["name"])
        if deleted:
            self._applied.pop(key, None)
        else:
            self._applied[key] = lean(body)
        return (meta.get("labels") or {}).get(LABEL_POOL)

    async def unpooled(self, namespace: str, model: str) -> None:
        """A model on no pool (any longer): the EndpointSlices the pool wrote for it go, or kube-proxy would add their
        endpoints to those of its own Service's."""
        for key in [k for family in ("ipv4", "ipv6")  # the names render_endpoint_slices gives: two lookups, no scan
                    if (k := ("EndpointSlice", namespace, f"{model}-{family}")) in self._applied]:
            labels = self._applied[key].get("metadata", {}).get("labels") or {}
            if labels.get(LABEL_MODEL) != model:
                continue
            await asyncio.to_thread(self.kube.delete, "discovery.k8s.io/v1", "EndpointSlice", namespace, key[2])
            self._applied.pop(key, None)
            log.info("Deleted EndpointSlice namespace=%s name=%s owner=TritonModel/%s reason=%r", namespace, key[2],
                     model, "the model is on no pool")

    async def _apply(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Applies `obj` unless it is as last applied; returns the API server's answer (None: nothing applied)."""
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        if not differs(self._applied.get(key), obj):
            return None
        answer = self._applied[key] = lean(await asyncio.to_thread(self.kube.apply, obj))
        log.info("Applied %s namespace=%s name=%s", *key)
        return answer

    async def _delete(self, kind: Kind, namespace: str, name: str, why: str) -> None:
        """Deletes an object of ours the rounds applied or the watch reported (an HPA whose autoscaling is unset)."""
        key = (kind.kind, namespace, name)
        if key not in self._applied:
            return
        await asyncio.to_thread(self.kube.delete, kind.api_version, kind.kind, namespace, name)
        self._applied.pop(key, None)
        log.info("Deleted %s namespace=%s name=%s reason=%r", *key, why)

    async def _apply_children(self, namespace: str, pool: TritonPool, uid: str, body: Mapping[str, Any],
                              no_surge: bool = False, shrink: bool = False) -> tuple[str, Upgrade | None]:
        """The pool's own objects as `plan.pool.pool_children` says, its Deployment under the bound on upgrade rollouts
        (`_bounded`); returns the LABEL_POOL_TEMPLATE of the pod template its Deployment has now, and what the bound
        decided."""
        want = pool_plan.pool_children(pool, uid, namespace, self.options)
        secret = want.secret
        if secret is not None and ("Secret", namespace, secret["metadata"]["name"]) not in self._applied:
            created = await asyncio.to_thread(self.kube.create_if_absent, secret)
            self._applied[("Secret", namespace, secret["metadata"]["name"])] = {}
            if created:
                log.info("Created Secret namespace=%s name=%s owner=TritonPool/%s", namespace,
                         secret["metadata"]["name"], pool.name)
        upgrade: Upgrade | None = None
        template = ""
        for child in want.apply:
            if child["kind"] == DEPLOYMENT.kind:
                child, upgrade = await self._bounded(child, body, no_surge, shrink)
                template = str(child["spec"]["template"]["metadata"]["labels"].get(LABEL_POOL_TEMPLATE, ""))
            else:
                await self._apply(child)
        for kind, name, why in want.delete:
            await self._delete(kind, namespace, name, why)
        return template, upgrade

    async def _bounded(self, desired: dict[str, Any], body: Mapping[str, Any],
                       no_surge: bool = False, shrink: bool = False) -> tuple[dict[str, Any], Upgrade | None]:
        """Applies the pool's Deployment as `plan.upgrade.bound_deployment` says: a new pod template for a pool whose
        spec did not change (an operator upgrade) is an upgrade rollout, counted with the TritonModels' against
        the bound (`slots`, the models' reconciler), or waits for a slot with the live template. It keeps its surge
        pod (its replicas hand their copies over to it, `plan.pool.rollout`) unless `no_surge` (`plan.pool.no_surge`:
        the surge pod cannot be scheduled, and a leaving replica's copies serve elsewhere), or its live Deployment
        rolls without one already: read back from it, until the rollout ends. A scale-down (fewer replicas than the
        live Deployment's, its template unchanged) keeps the live replicas until `shrink` (`plan.pool.shrink`: the
        replicas that go hand their copies over first). A waiting pool is asked again every round (every
        SETTLED_SECONDS at least). Returns the Deployment as applied, and what the bound decided."""
        meta = desired["metadata"]
        key = (meta["namespace"], meta["name"])
        source = source_digest(body, {})
        if (DEPLOYMENT.kind, *key) not in self.cache.children:
            # Not delivered by the watch yet (a restarted operator): read, or the bound would take it for a new
            # Deployment and let its new template roll at once (e2e/test_upgrade_bound saw a pool roll beside a model
            # at the bound of 1).
            found = await asyncio.to_thread(self.kube.get, DEPLOYMENT.api_version, DEPLOYMENT.kind, *key)
            if found is not None:
                self.cache.put_child(found)

        def decide() -> tuple[dict[str, Any], Upgrade | None]:
            upgrades = self.slots.upgrade_slots() if self.slots is not None else Upgrades()
            live = self.cache.children.get((DEPLOYMENT.kind, *key))
            without = no_surge or (live is not None and (live.get("spec") or {}).get("strategy") == NO_SURGE
                                   and in_upgrade_rollout(live))
            out, upgrade = bound_deployment(desired, live, body, source, upgrades, utc_now(), no_surge=without)
            held = None if shrink or live is None else _held_replicas(live, out)
            if held is not None:
                out["spec"] = {**out["spec"], "replicas": held}
            return out, upgrade

        out, upgrade = decide()
        if upgrade is not None and upgrade.started and self.slots is not None:
            # Decided again over every Deployment listed once (a restarted operator's watch may not have delivered
            # them all: counted short, the pool started beside a model's rollout at the bound, e2e/test_upgrade_bound).
            await self.slots.list_upgrades()
            out, upgrade = decide()
        started = upgrade is not None and upgrade.started
        if started and self.slots is not None:
            self.slots.reserve_upgrade(key)  # no await since the count was read: the check and the reservation are one
        try:
            answer = await self._apply(out)
            if answer is not None:
                self.cache.put_child(answer)  # counted from the cache at once, not when the watch delivers it
        finally:
            if started and self.slots is not None:
                self.slots.release_upgrade(key)
        if started:
            assert upgrade is not None
            log.info("Started upgrade rollout of Deployment namespace=%s name=%s owner=TritonPool/%s", *key,
                     body["metadata"]["name"])
            metrics.UPGRADE_STARTS.inc()
            await asyncio.to_thread(self.kube.event, dict(body), UPGRADE_STARTED, upgrade.message, "Normal")
        return out, upgrade

    def _held_now(self, rnd: pool_plan.PoolRound) -> dict[tuple[str, str], bool]:
        now = time.monotonic()
        return {(r, m): h.until > now for (ns, p, r, m, _), h in self._held.items()
                if ns == rnd.namespace and p == rnd.pool.name}

    async def _observe(self, rnd: pool_plan.PoolRound, ready: list[str],
                       records: Mapping[str, Mapping[str, str]]) -> dict[tuple[str, str], pool_plan.Seen]:
        """What each Ready replica's Triton serves of each model placed there."""
        asks = pool_plan.triton_asks(rnd, ready)

        async def ask(r: str, names: list[str]) -> list[pool_plan.Seen]:  # one client per replica, asked at once
            answers = await triton_pool.served_all(rnd.address(r), [
                (m.triton_name, m.digest or "", records.get(r, {}).get(m.triton_name))
                for m in (rnd.members[n] for n in names)], rnd.key)
            return [pool_plan.Seen(s.ready, s.digest, s.message, answered=not s.unanswered) for s in answers]

        answers = await asyncio.gather(*(ask(r, names) for r, names in asks.items()))
        seen = {(r, n): s for (r, names), seen in zip(asks.items(), answers, strict=True)
                for n, s in zip(names, seen, strict=True)}
        pool = (rnd.namespace, rnd.pool.name)
        answered = pool_plan.answered_after(rnd, asks, seen, {k[2]: c for k, c in self._answered.items()
                                                              if k[:2] == pool})
        for key in [k for k in self._answered if k[:2] == pool]:
            del self._answered[key]
        self._answered.update({(*pool, r): c for r, c in answered.containers.items()})
        silent, steady = answered.silent, answered.steady
        if silent:  # what a slow replica served last stays listed (`as_last_seen`): say it, it explains a stale list
            log.info("Pool replica did not answer in time namespace=%s pool=%s pods=%s models=%d; the last record "
                     "stands for pods=%s", rnd.namespace, rnd.pool.name, ",".join(silent),
                     sum(not s.answered for s in seen.values()), ",".join(sorted(steady)) or "none")
        return pool_plan.as_last_seen(seen, records, rnd.members, steady)

    async def _drain(self, rnd: pool_plan.PoolRound, drains: Mapping[tuple[str, str], float]) -> None:
        """Waits, up to each copy's timeout (`plan.pool.drain_timeouts`), until no request reaches a drained copy, by
        (replica, Triton name), for a second (it left its slices: kube-proxy stops sending it new ones)."""
        async def quiet(r: str, t: str, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            last, failed = -1, 0
            while time.monotonic() < deadline:
                try:
                    count = await requests_seen(rnd.address(r), t)
                except Exception:  # noqa: BLE001 - asked again; a copy with no statistics three times serves nothing
                    failed += 1
                    if failed >= 3:
                        return
                else:
                    if count == last:
                        return
                    last, failed = count, 0
                await asyncio.sleep(1.0)

        await asyncio.gather(*(quiet(r, t, timeout) for (r, t), timeout in drains.items()))

    async def _carry_out(self, rnd: pool_plan.PoolRound, w: pool_plan.ReplicaWork, st: _Live, deadline: float) -> bool:
        """One replica's unloads, then its loads in order (steps first), until `deadline` once one is done; whether
        some were left for the next round. A copy that loads is listed in its slices at once (`_listed`)."""
        records = st.records
        address = rnd.address(w.replica)
        for name in w.unload:
            why = await triton_pool.unload(rnd.grpc_address(w.replica), name, rnd.key)
            metrics.POOL_LOADS.labels(verb="unload", result="error" if why else "ok").inc()
            log.info("Unloaded model from pool replica namespace=%s pool=%s pod=%s model=%s%s", rnd.namespace,
                     rnd.pool.name, w.replica, name, f" error={why!r}" if why else "")
            records.get(w.replica, {}).pop(name, None)
            known = self._sidecar_names.get((rnd.namespace, rnd.pool.name, w.replica))
            if not why and (known is None or name in known):  # an inline model: no files there
                await self._forget_files(rnd, w.replica, name)
        for i, ld in enumerate(w.load):
            if i and time.monotonic() > deadline:
                return True
            m = rnd.members[ld.member]
            assert m.request is not None and m.digest is not None
            if not self._still_member(rnd.namespace, m):  # deleted or moved since the round began: the next unloads
                continue
            if ld.unload_first:
                await triton_pool.unload(rnd.grpc_address(w.replica), m.triton_name, rnd.key)
            started = time.monotonic()
            self._sent.add((rnd.namespace, rnd.pool.name, w.replica, m.triton_name, m.digest))
            why = await triton_pool.load(rnd.grpc_address(w.replica), m.request.name, m.request.config, m.request.files,
                                         rnd.key)
            after = await triton_pool.served(address, m.triton_name, m.digest, None, rnd.key)
            held_key = (rnd.namespace, rnd.pool.name, w.replica, ld.member, m.digest)
            metrics.POOL_LOAD_SECONDS.observe(time.monotonic() - started)
            ok = after.ready and after.digest == m.digest
            metrics.POOL_LOADS.labels(verb="load", result="ok" if ok else "error").inc()
            if ld.heal:
                await self._healed(rnd, w.replica, ld, ok, why or after.message, time.monotonic() - started)
            if ok:
                self._held.pop(held_key, None)
                self._fetch_failures.pop(held_key, None)
                if m.request.fetch is not None:  # the digests before this one are served no more
                    with contextlib.suppress(triton_fetcher.FetcherError):
                        await triton_fetcher.prune(rnd.pods[w.replica].ip or "", rnd.key, m.triton_name)
                log.info("Loaded model into pool replica namespace=%s pool=%s pod=%s model=%s digest=%s "
                         "seconds=%.2f", rnd.namespace, rnd.pool.name, w.replica, ld.member, m.digest,
                         time.monotonic() - started)
                await self._listed(rnd, st, w.replica, ld.member, m.digest)
                continue
            held = self._hold(held_key, why or after.message)
            log.warning("Failed to load model into pool replica namespace=%s pool=%s pod=%s model=%s digest=%s "
                        "attempt=%d error=%r", rnd.namespace, rnd.pool.name, w.replica, ld.member, m.digest,
                        held.failures, held.message)
        return False

    def _hold(self, held_key: tuple[str, str, str, str, str], message: str) -> _Held:
        """A failed load (or fetch) of a model's digest on a replica: retried after a back-off that doubles."""
        held = self._held.get(held_key) or _Held(0, 0.0, "")
        held.failures += 1
        held.until = time.monotonic() + pool_plan.backoff_seconds(held.failures, pool_plan.HELD_SECONDS,
                                                                  pool_plan.HELD_MAX_SECONDS)
        held.message = message[:500]
        self._held[held_key] = held
        return held

    async def _fetch_phase(self, rnd: pool_plan.PoolRound, ready: list[str], records: Mapping[str, Mapping[str, str]],
                           seen: Mapping[tuple[str, str], pool_plan.Seen]) -> tuple[set[tuple[str, str]], bool]:
        """Each Ready replica's uri models that are not READY there at their desired digest: asked of its sidecar
        (it answers what it holds, so a restarted operator, or a new pod's empty volume, is seen as it is), fetched
        if not held (the sidecar fetches on its own: the round does not wait), a failure held with its message
        (`plan.pool.fetch_asks`, `replica_fetches`). Returns the (replica, model) loads whose files are not on disk
        yet, and whether a fetch is under way. The sidecar's files of models neither placed there nor loaded are
        deleted."""
        asks = pool_plan.fetch_asks(rnd, seen, {r: self._sidecar_names.get((rnd.namespace, rnd.pool.name, r))
                                                for r in ready})
        results = await asyncio.gather(*(self._fetches(rnd, r, asks[r], records) for r in ready if r in asks))
        return set().union(*(m for m, _ in results)), any(f for _, f in results)

    async def _fetches(self, rnd: pool_plan.PoolRound, r: str, wanted: list[str],
                       records: Mapping[str, Mapping[str, str]]) -> tuple[set[tuple[str, str]], bool]:
        """One replica's sidecar: asked what it holds, then what `plan.pool.replica_fetches` says carried out."""
        ip = rnd.pods[r].ip or ""
        try:
            held = await triton_fetcher.holdings(ip, rnd.key)
        except triton_fetcher.FetcherError as exc:
            for n in wanted:
                self._hold(self._held_key(rnd, r, n), str(exc))
            return {(r, n) for n in wanted}, False
        now = time.monotonic()
        keys = {n: self._held_key(rnd, r, n) for n in wanted}
        todo = pool_plan.replica_fetches(
            rnd, r, wanted, held, records,
            {n: self._fetch_failures[k] for n, k in keys.items() if k in self._fetch_failures},
            {n for n, k in keys.items() if (back := self._held.get(k)) is not None and back.until > now})
        left = set(held)
        for name in todo.forget:
            if await self._forget_files(rnd, r, name):
                left.discard(name)
        self._sidecar_names[(rnd.namespace, rnd.pool.name, r)] = left | {rnd.members[n].triton_name for n in wanted}
        missing = {(r, n) for n, step in todo.steps if step != pool_plan.ON_DISK}
        under_way = any(step == pool_plan.UNDER_WAY for _, step in todo.steps)
        for n, step in todo.steps:
            m = rnd.members[n]
            assert m.request is not None and m.request.fetch is not None and m.digest is not None
            if step == pool_plan.FETCH_FAILED:
                h = held[m.triton_name]
                self._fetch_failures[keys[n]] = h.failed_attempt
                held_now = self._hold(keys[n], f"{FETCH_FAILED_PREFIX}{h.failed_message}")
                log.warning("Failed to fetch model files into pool replica namespace=%s pool=%s pod=%s model=%s "
                            "digest=%s attempt=%d error=%r", rnd.namespace, rnd.pool.name, r, n, m.digest,
                            held_now.failures, h.failed_message)
            if step != pool_plan.FETCH:
                continue
            try:
                if await triton_fetcher.fetch(ip, rnd.key, m.triton_name, m.digest, m.request.fetch,
                                              quantity_bytes(rnd.pool.spec.server.repository_size_limit)):
                    missing.discard((r, n))
                    continue
                under_way = True
                log.info("Asked pool replica to fetch model files namespace=%s pool=%s pod=%s model=%s digest=%s",
                         rnd.namespace, rnd.pool.name, r, n, m.digest)
            except triton_fetcher.FetcherError as exc:
                self._hold(keys[n], str(exc))
        return missing, under_way

    def _held_key(self, rnd: pool_plan.PoolRound, replica: str, member: str) -> tuple[str, str, str, str, str]:
        return (rnd.namespace, rnd.pool.name, replica, member, rnd.members[member].digest or "")

    async def _forget_files(self, rnd: pool_plan.PoolRound, replica: str, name: str) -> bool:
        """Deletes a model's fetched files from the replica's volume (an inline model has none: nothing to do);
        whether the sidecar holds nothing of it now."""
        self._sidecar_names.pop((rnd.namespace, rnd.pool.name, replica), None)  # asked again next round
        try:
            status = await triton_fetcher.delete(rnd.pods[replica].ip or "", rnd.key, name)
        except triton_fetcher.FetcherError as exc:
            log.warning("Failed to delete fetched model files namespace=%s pool=%s pod=%s model=%s error=%r",
                        rnd.namespace, rnd.pool.name, replica, name, exc)
            return False
        if status == 200:
            log.info("Deleted fetched model files namespace=%s pool=%s pod=%s model=%s", rnd.namespace,
                     rnd.pool.name, replica, name)
        return status != 409  # a fetch of it under way: looked for again in a later round

    # -- self-healing: a copy Triton calls READY that fails (a dead Python stub), as the replica's probe reports it

    def _broken_copies(self, rnd: pool_plan.PoolRound) -> dict[tuple[str, str], str]:
        """(replica, member) -> why, of what the replicas' probes last reported broken (by Triton name)."""
        names = {m.triton_name: n for n, m in rnd.members.items() if m.problem is None}
        out: dict[tuple[str, str], str] = {}
        for (ns, pool, pod), broken in list(self._broken.items()):
            if (ns, pool) == (rnd.namespace, rnd.pool.name):
                out.update({(pod, names[t]): why for t, why in broken.items() if t in names})
        return out

    def _heals_held(self, rnd: pool_plan.PoolRound) -> set[tuple[str, str]]:
        now = time.monotonic()
        return {(r, n) for (ns, p, r, n), h in self._heals.items()
                if (ns, p) == (rnd.namespace, rnd.pool.name) and h.until > now}

    async def _healed(self, rnd: pool_plan.PoolRound, replica: str, ld: pool_plan.Load, ok: bool, why: str,
                      seconds: float) -> None:
        """A heal done: its back-off (a copy broken again soon waits longer), a log line and an Event on the model."""
        name, cause = ld.member, ld.cause or "it failed"
        key = (rnd.namespace, rnd.pool.name, replica, name)
        held = self._heals.get(key) or _Held(0, 0.0, "")
        held.failures += 1
        held.until = time.monotonic() + pool_plan.backoff_seconds(held.failures, pool_plan.HEAL_SECONDS,
                                                                  pool_plan.HEAL_MAX_SECONDS)
        self._heals[key] = held
        metrics.HEALS.labels(action="reload", result="ok" if ok else "failed").inc()
        if ok:
            log.info("Healed pooled model namespace=%s pool=%s pod=%s model=%s seconds=%.2f heal=%d", rnd.namespace,
                     rnd.pool.name, replica, name, seconds, held.failures)
            message = f"{replica}: {cause}: unloaded and loaded {name} again there in {seconds:.1f}s"
        else:
            log.warning("Failed to heal pooled model namespace=%s pool=%s pod=%s model=%s error=%r", rnd.namespace,
                        rnd.pool.name, replica, name, why)
            message = f"{replica}: {cause}: loading {name} again there failed: {why}"
        body = self.cache.model(rnd.namespace, name) or dict(rnd.members[name].body)
        try:
            await asyncio.to_thread(self.kube.event, body, "Healed" if ok else "HealFailed", message[:1024],
                                    "Normal" if ok else "Warning")
        except Exception as exc:  # noqa: BLE001 - news, not state: the heal itself is done
            log.warning("Failed to record Event reason=Healed model=%s/%s error=%r", rnd.namespace, name, exc)

    def _watch(self, rnd: pool_plan.PoolRound, ready: list[str]) -> None:
        """A long poll of each Ready replica's probe (`_watch_health`); those of replicas gone or not Ready stop."""
        wanted = {(rnd.namespace, rnd.pool.name, r): rnd.pods[r].ip for r in ready if rnd.pods[r].ip}
        for key, (ip, task) in list(self._watchers.items()):
            if key[:2] == (rnd.namespace, rnd.pool.name) and wanted.get(key) != ip:
                task.cancel()
                del self._watchers[key]
                self._broken.pop(key, None)
        for key, address in wanted.items():
            if key not in self._watchers and address:
                self._watchers[key] = (address, detached(self._watch_health(key, address, rnd.key),
                                                         name=f"pool-health-{'/'.join(key)}"))

    async def _watch_health(self, key: tuple[str, str, str], ip: str, replica_key: str | None) -> None:
        """Reads what the replica's probe finds broken as soon as it changes (`GET /status`, held until news, with
        the pool's key); on a change, the slices of the pool's models are written again at once and a round is asked
        for (it reloads the broken copies)."""
        version: int | None = None
        failures = 0
        while self._wanted(key[:2]):
            try:
                version, broken = await probe_news(ip, PROBE_PORT, since=version, wait=HEALTH_WAIT_SECONDS,
                                                   key=replica_key, timeout=2.0)
                failures = 0
            except (OSError, ValueError) as exc:  # TimeoutError, ConnectionError; an old probe answers 404
                failures += 1
                log.debug("Could not read the probe pod=%s/%s error=%r", key[0], key[2], exc)
                await asyncio.sleep(min(0.5 * failures, 5.0))
                continue
            broken.pop(TRITONSERVER, None)  # tritonserver itself: its pod's readiness says it, for every model
            if broken == self._broken.get(key, {}):
                continue
            before = self._broken.get(key, {})
            self._broken[key] = broken
            log.info("Read pool replica health namespace=%s pool=%s pod=%s broken=%s was=%s", key[0], key[1], key[2],
                     sorted(broken), sorted(before))
            # A round takes a broken copy out of its slices before it reloads it (its first write): the slices are
            # not rewritten here from the last round's state, which may be older than the models' specs.
            self.request(key[0], key[1])
        self._watchers.pop(key, None)
        self._broken.pop(key, None)

    def _failures(self, rnd: pool_plan.PoolRound, name: str) -> dict[str, str]:
        m = rnd.members[name]
        return {r: h.message for (ns, p, r, n, d), h in self._held.items()
                if ns == rnd.namespace and p == rnd.pool.name and n == name and d == m.digest}

    async def _listed(self, rnd: pool_plan.PoolRound, st: _Live, replica: str, name: str, digest: str) -> None:
        """A copy Triton has just said READY at its desired digest: recorded, and every slice that changes with it
        (the model's, an ensemble's using it) written now, not at the end of the round (bench/pool: the round's
        questions about every other model placed there cost 0.4 s before the slice was written)."""
        st.seen[(replica, name)] = pool_plan.Seen(True, digest)
        st.records.setdefault(replica, {})[rnd.members[name].triton_name] = digest
        st.draining = st.draining - {(replica, name)}
        for n, on in pool_plan.slices(rnd, st.records, st.seen, st.draining, self._broken_copies(rnd),
                                      replica).items():
            await self._traffic(rnd.namespace, rnd.members[n], list(rnd.placement.copies[n]), rnd.pods, on)

    async def _publish(self, rnd: pool_plan.PoolRound, plan: pool_plan.PoolPlan) -> None:
        """Writes what `plan` says: each model's Service, slices and HPA (its Service alone, before the loads, while it
        has no slice and no copy serving: its slices come with its first ready copy, `_listed`, or at the round's
        end) and status, then the pool's status. The models' writes go PUBLISH_CONCURRENCY models at a time (a model's
        traffic and its status side by side), the pool's after them all: a restarted operator finds no load recorded
        in flight for a model whose placement is not written. One after another, a new model's Service then status
        took 33 ms (p50) before its load on the warm pool of bench/pool_speed, and 200 new models' 8.7 s before
        any load."""
        gate = asyncio.Semaphore(PUBLISH_CONCURRENCY)

        async def traffic(name: str, m: pool_plan.Member) -> None:
            if m.model is not None and name in plan.services_only and self._still_member(rnd.namespace, m):
                await self._apply_service(m.model, m.body["metadata"]["uid"], rnd.namespace)
            elif m.model is not None:
                await self._traffic(rnd.namespace, m, list(rnd.placement.copies.get(name, ())), rnd.pods,
                                    plan.serving[name])

        async def one(name: str, m: pool_plan.Member) -> None:
            async with gate:
                write = plan.model_writes.get(name)
                await asyncio.gather(traffic(name, m), *([self._write_model_status(rnd.namespace, m, write)]
                                                         if write is not None else []))

        await asyncio.gather(*(one(name, m) for name, m in rnd.members.items()))
        if plan.pool_write is not None:
            await self._write_pool_status(rnd, plan.pool_write)

    def _sliced(self, namespace: str, model: str) -> bool:
        """Whether an EndpointSlice of ours for `model` exists (written by a round or reported by the watch)."""
        return any(("EndpointSlice", namespace, f"{model}-{family}") in self._applied for family in ("ipv4", "ipv6"))

    def _still_member(self, namespace: str, m: pool_plan.Member) -> bool:
        """Whether the watch still reports `m` as the same TritonModel on the same pool. A round holds the members it
        began with, and a load can take minutes: a model deleted (or moved off the pool) meanwhile must not have its
        Service and slices applied again, nor be loaded. A deleted model's Service, applied again, is created anew
        with an owner that is gone, and the garbage collector deletes it again (issue 41: pool benchmark)."""
        body = self.cache.model(namespace, m.name)
        return (body is not None and body["metadata"].get("uid") == m.body["metadata"].get("uid")
                and pool_of(body) == pool_of(m.body))

    async def _traffic(self, namespace: str, m: pool_plan.Member, placement: list[str],
                       pods: Mapping[str, ReplicaPod], serving: set[str]) -> None:
        assert m.model is not None
        if not self._still_member(namespace, m):
            return
        uid = m.body["metadata"]["uid"]
        await self._apply_service(m.model, uid, namespace)
        for s in render_endpoint_slices(m.model, uid, namespace, placement, pods, serving):
            await self._apply(s)
        # After our slices: a new model's first ready copy is listed without waiting for the sweep's questions.
        await self._sweep_left_endpoints(namespace, m.model.name)
        if m.model.spec.autoscaling is not None:
            await self._apply(render_model_hpa(m.model, uid, namespace))
        else:
            await self._delete(HPA, namespace, m.model.name, "spec.autoscaling is unset")

    async def _apply_service(self, model: TritonModel, uid: str, namespace: str) -> None:
        """A pooled model's Service (no selector). One that had a selector before, or that this process knows nothing
        of, is noted as moving (`_moving`): what Kubernetes left from its selector is asked about on its own."""
        key = ("Service", namespace, model.name)
        before = self._applied.get(key) or self.cache.children.get(key)
        if before is None or (before.get("spec") or {}).get("selector"):
            self._moving.add((namespace, model.name))
        await self._apply(render_model_service(model, uid, namespace))

    async def _sweep_left_endpoints(self, namespace: str, model: str) -> None:
        """Deletes what Kubernetes' controllers wrote for a pooled model's Service while it had a selector (the model
        had a Deployment of its own before it moved onto the pool): the Endpoints and the EndpointSlices.

        Once a Service has no selector, the endpoints and EndpointSlice controllers leave what they wrote as it was,
        listing the old replicas' addresses (kubernetes/kubernetes#118376, open; #103576: kept for compatibility);
        the EndpointSliceMirroring controller then mirrors that Endpoints into a slice of its own, and writes it
        again when it is deleted, for as long as the Endpoints is there (seen on the real node). kube-proxy takes
        the union of a Service's slices: an address there that is ready, or serving while terminating, is traffic
        past the gate, to a pod that is gone or to whatever pod gets its IP next. So the Endpoints goes first
        (managed by `endpoint-controller`, labelled with the model as its Service is), then every slice named after
        the Service and managed by `endpointslice-controller.k8s.io` or `endpointslicemirroring-controller.k8s.io`.
        Looked at once per Service (by uid) and process, and only once the Service, as applied, has no selector:
        before that, Kubernetes' controllers would write them again. A Service that had no selector before this
        apply either (not `_moving`: every pooled model's, after an operator restart) is looked up in the namespace's
        one listing (`_left_names`), not asked about on its own: 200 pooled models cost 400 API calls in a new
        leader's first round before. The chart's admission policy lets the operator delete only these, of its own
        Services."""
        service = self._applied.get(("Service", namespace, model))
        if service is None or (service.get("spec") or {}).get("selector"):
            return
        uid = str(service["metadata"].get("uid"))
        if uid in self._swept:
            return
        if (namespace, model) not in self._moving and model not in await self._left_names(namespace):
            self._swept.add(uid)
            return
        left = await asyncio.to_thread(self.kube.get, ENDPOINTS.api_version, ENDPOINTS.kind, namespace, model)
        labels = (left or {}).get("metadata", {}).get("labels") or {}
        if left is not None and labels.get(LABEL_ENDPOINTS_MANAGED_BY) == ENDPOINTS_CONTROLLER \
                and labels.get(LABEL_MODEL) == model:
            await asyncio.to_thread(self.kube.delete, ENDPOINTS.api_version, ENDPOINTS.kind, namespace, model)
            log.info("Deleted Endpoints namespace=%s name=%s owner=TritonModel/%s reason=%r", namespace, model, model,
                     "left by Kubernetes from the Service's selector; the model is on a pool now")
        selector = (f"{LABEL_SERVICE_NAME}={model},{LABEL_SLICE_MANAGED_BY} in "
                    f"({','.join(KUBERNETES_SLICE_MANAGERS)})")
        for found in await asyncio.to_thread(self.kube.list, ENDPOINT_SLICE.api_version, ENDPOINT_SLICE.kind,
                                             namespace, selector):
            name = found["metadata"]["name"]
            await asyncio.to_thread(self.kube.delete, ENDPOINT_SLICE.api_version, ENDPOINT_SLICE.kind, namespace, name)
            log.info("Deleted EndpointSlice namespace=%s name=%s owner=TritonModel/%s manager=%s reason=%r", namespace,
                     name, model, (found["metadata"].get("labels") or {}).get(LABEL_SLICE_MANAGED_BY),
                     "left by Kubernetes from the Service's selector; the model is on a pool now")
        self._swept.add(uid)
        self._moving.discard((namespace, model))

    async def _left_names(self, namespace: str) -> set[str]:
        """The Services of `namespace` with an Endpoints of Kubernetes' endpoints controller or a slice of its
        EndpointSlice (or mirroring) controllers, listed once per namespace and process: a Service without a selector
        since before that listing gets no new ones (those controllers leave it alone)."""
        async with self._left_lock:  # the round's publish sweeps several Services at once: one listing
            return await self._list_left(namespace)

    async def _list_left(self, namespace: str) -> set[str]:
        if namespace not in self._left_in:
            endpoints = await asyncio.to_thread(self.kube.list, ENDPOINTS.api_version, ENDPOINTS.kind, namespace,
                                                f"{LABEL_ENDPOINTS_MANAGED_BY}={ENDPOINTS_CONTROLLER},{LABEL_MODEL}")
            slices = await asyncio.to_thread(self.kube.list, ENDPOINT_SLICE.api_version, ENDPOINT_SLICE.kind,
                                             namespace, f"{LABEL_SLICE_MANAGED_BY} in "
                                                        f"({','.join(KUBERNETES_SLICE_MANAGERS)})")
            self._left_in[namespace] = ({e["metadata"]["name"] for e in endpoints}
                                        | {(s["metadata"].get("labels") or {}).get(LABEL_SERVICE_NAME, "")
                                           for s in slices})
        return self._left_in[namespace]

    async def _orphans(self, namespace: str, pool: str, members: Mapping[str, pool_plan.Member]) -> None:
        """The models of a pool that does not exist: PoolNotFound, and no endpoint."""
        now = utc_now()
        for m in members.values():
            if m.model is not None:
                await self._traffic(namespace, m, [], {}, set())
            current = self.cache.model(namespace, m.name)
            write = pool_plan.model_write((current or m.body).get("status") or {},
                                          pool_plan.model_status(m, pool, False, None, set(), {}, now))
            if write is not None:
                await self._write_model_status(namespace, m, write)

    async def _write_model_status(self, namespace: str, m: pool_plan.Member, write: pool_plan.StatusWrite) -> None:
        """Writes a TritonModel's status as `write` says; its Events are posted beside the round."""
        current = self.cache.model(namespace, m.name)
        updated = await asyncio.to_thread(self.kube.patch_custom_status, TRITON_MODEL.group, TRITON_MODEL.version,
                                          TRITON_MODEL.plural, namespace, m.name, write.patch)
        if updated is None or not self.cache.answered_model(updated):
            return  # deleted, or deleted since (its DELETED event came first): no Events for it
        body = current or dict(m.body)
        changed = list(write.changed)
        for c in changed:
            log.info("Changed TritonModel condition namespace=%s name=%s type=%s status=%s reason=%s",
                     namespace, m.name, c["type"], c["status"], c.get("reason"))
        if changed:  # posted beside the round, in order: an Event of a new model's placement held its load back
            detached(self._events(body, changed), name=f"pool-events-{namespace}/{m.name}")

    async def _events(self, body: Mapping[str, Any], changed: list[dict[str, Any]]) -> None:
        for c in changed:
            try:
                await asyncio.to_thread(self.kube.event, dict(body), c.get("reason") or "", c.get("message") or "",
                                        pool_plan.event_type(c))
            except Exception as exc:  # noqa: BLE001 - events are best effort (Kube.event logs an API error itself)
                log.warning("Failed to record Event object=%s/%s error=%r", body["metadata"].get("namespace"),
                            body["metadata"].get("name"), exc)

    async def _write_pool_status(self, rnd: pool_plan.PoolRound, write: pool_plan.StatusWrite) -> None:
        """Writes the pool's status as `write` says, and posts its Events."""
        key = (rnd.namespace, rnd.pool.name)
        updated = await asyncio.to_thread(self.kube.patch_custom_status, TRITON_POOL.group, TRITON_POOL.version,
                                          TRITON_POOL.plural, rnd.namespace, rnd.pool.name, write.patch)
        if updated is None:
            return
        if key in self.pools:
            self.put_pool(updated)
        for c in write.changed:
            log.info("Changed TritonPool condition namespace=%s name=%s type=%s status=%s reason=%s",
                     rnd.namespace, rnd.pool.name, c["type"], c["status"], c.get("reason"))
            await asyncio.to_thread(self.kube.event, dict(rnd.body), c.get("reason") or "", c.get("message") or "",
                                    pool_plan.event_type(c))


def pool_of(body: Mapping[str, Any] | None) -> str | None:
    """The pool a TritonModel body names, if any."""
    return ((body or {}).get("spec") or {}).get("pool") or None


def is_pooled(model: TritonModel | Mapping[str, Any]) -> bool:
    if isinstance(model, TritonModel):
        return model.spec.pool is not None
    return pool_of(model) is not None


def _held_replicas(live: Mapping[str, Any], out: Mapping[str, Any]) -> int | None:
    """The live Deployment's replicas, when the pool asks for fewer with the same pod template (a scale-down, not a
    rollout): kept until the replicas that go have handed their copies over (`plan.pool.shrink`); else None."""
    held, wanted = (live.get("spec") or {}).get("replicas"), (out.get("spec") or {}).get("replicas")
    if not isinstance(held, int) or not isinstance(wanted, int) or held <= wanted:
        return None
    return held if _template_label(live) == _template_label(out) else None


def _template_label(deployment: Mapping[str, Any]) -> str | None:
    """The LABEL_POOL_TEMPLATE of a pool Deployment's pod template."""
    template = (deployment.get("spec") or {}).get("template") or {}
    return ((template.get("metadata") or {}).get("labels") or {}).get(LABEL_POOL_TEMPLATE)
