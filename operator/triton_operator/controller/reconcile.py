"""The one level-triggered reconcile of a TritonModel: gather, plan (pure), carry out.

Watch events (kopf `on.event`) keep `Cache` current for TritonModels, the children
we own and their replicas. `Reconciler.reconcile` gathers a `plan.World` from the
cache, lets `plan.plan` decide (what to apply, delete, the status, the Events) and
carries that out: server-side apply with one field manager, a status merge patch
only when it changed. A second reconcile of an unchanged object writes nothing.
kopf keeps no progress annotations for us: every handler is an event handler.
`Reconciler.resync` drops from the cache what the API no longer has: deletions a
restarted watch never reported.

The bound on upgrade rollouts (`plan.upgrade`) is decided by the planner from a count the cache keeps
(`Children.upgrading`: the Deployments the operator sees in an unfinished upgrade rollout), so a restarted
operator counts again from the Deployments themselves. Before its first start of one, a process LISTs the
Deployments of the namespaces it serves (`upgrade_scopes`): right after a start, the Deployment watch may not have
delivered them all, and the count would be short. The one state of the process's own is a reservation
(`_reserved`): between the plan that starts an upgrade rollout and the apply's answer in the cache, the Deployment
counts as rolling, so that two reconciles at once cannot both take the last slot. The check and the reservation run
with no `await` between them, on the one event loop every reconcile runs on: no other reconcile can interleave, which
is the lock. A model that waits is reconciled again when a slot frees (`_wake_waiting`), and by the drift loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from ..api import steps as step_graph
from ..api.kinds import CONFIG_MAP, DEPLOYMENT, HPA, LABEL_MODEL, OWNED_SELECTOR, PDB, REPLICA_SET, TRITON_MODEL, WATCHED
from ..api.pool import LABEL_POOL
from ..api.timestamps import utc_now
from ..plan.planner import ApiFailure, Plan, World, differs, plan, steps_to_revisit
from ..plan.upgrade import UPGRADE_STARTED, DeploymentKey, Upgrades, draining, unschedulable
from ..platform.kube import Kube
from ..render.kubernetes import Options
from . import metrics
from .cache import Cache, lean
from .errors import api_failure
from .workqueue import WorkQueue

log = logging.getLogger("triton_operator.reconcile")

#: Reconciles under way at once. Each holds its plan (the rendered children) while its API calls wait for one of
#: the default executor's few threads (6 on 2 cores), so with a thousand models created at once nearly all of them
#: were in memory together: peak RSS at 1000 models fell from 247 to 189 MB with 16 or 64 (bench.scale, issue 17).
#: Well above the threads, so that they stay busy, and so that a few reconciles stuck on a slow API server leave
#: room for the rest.
MAX_CONCURRENT_RECONCILES = 64


class Reconciler:
    def __init__(self, kube: Kube, cache: Cache, options: Options | None = None,
                 max_concurrent: int = MAX_CONCURRENT_RECONCILES, max_upgrade_rollouts: int = 0) -> None:
        self.kube = kube
        self.cache = cache
        self.options = options or Options()
        #: At most this many Deployments in an upgrade rollout at once (`plan.upgrade`); 0: no bound.
        self.max_upgrade_rollouts = max_upgrade_rollouts
        #: The namespaces whose Deployments count against the bound (None: every namespace), LISTed once per process.
        self.upgrade_scopes: list[str | None] = [None]
        self._upgrades_listed = False
        self._listing = asyncio.Lock()
        self._reserved: set[DeploymentKey] = set()
        # The pools' Deployments whose upgrade rollout cannot schedule its surge pod, or whose replaced pods still
        # terminate: what `_stuck` and `_draining` find for a model's, told by the pools' rounds (`report_pool`), which
        # list their pods (this cache holds none of a pool's).
        self.pools_stuck: frozenset[DeploymentKey] = frozenset()
        self.pools_draining: frozenset[DeploymentKey] = frozenset()
        self._waiting: set[DeploymentKey] = set()
        #: One worker per model, bursts of events coalesced into one reconcile, at most `max_concurrent` at once; a
        #: failed one backs off, cut short only by a new generation or the model's deletion (`_generation`).
        self.queue = WorkQueue(self._run, "TritonModel", log, slots=max_concurrent, version=self._generation)
        #: Called with (namespace, pool) for a pooled model, which the pool's reconcile serves.
        self.on_pooled: Callable[[str, str], None] | None = None
        #: Awaited with (namespace, model) for a model on no pool: the pool's objects of a model that left one go.
        self.on_unpooled: Callable[[str, str], Awaitable[None]] | None = None

    # -- scheduling: the work queue (`controller.workqueue`), shared with the pools

    def request(self, namespace: str, name: str) -> None:
        self.queue.request(namespace, name)

    async def _run(self, namespace: str, name: str) -> None:
        try:
            await self.reconcile(namespace, name)
        except Exception as exc:
            metrics.RECONCILE_ERRORS.labels(reason=type(exc).__name__).inc()
            raise

    def _generation(self, namespace: str, name: str) -> tuple[str, int] | None:
        body = self.cache.model(namespace, name)
        return None if body is None else (body["metadata"].get("uid", ""), int(body["metadata"].get("generation", 0)))

    async def resync(self) -> list[dict[str, Any]]:
        """Drops from the cache what the API no longer has, and reconciles whom that concerns; returns the pods dropped.

        After a watch restarts (a "410 Gone" resource version, e.g. once the API server restarted), kopf lists
        again and reports what it finds, never what was deleted in between. A TritonModel left in the cache gets
        its garbage-collected children re-created on every reconcile, a child or pod left there hides that it is
        gone. Metadata-only LISTs of each namespace the cache knows, compared by uid, find them.
        """
        namespaces = ({ns for ns, models in self.cache.models.items() if models}
                      | {ns for _, ns, _ in self.cache.children}
                      | {ns for (ns, _), pods in self.cache.pods.items() if pods})
        pods: list[dict[str, Any]] = []
        for namespace in sorted(namespaces):
            since = time.monotonic()
            listed = {k.kind: await asyncio.to_thread(self.kube.list_uids, k.api_version, k.kind, namespace, k.selector)
                      for k in WATCHED}
            for body in self.cache.sweep(namespace, listed, since):
                meta = body["metadata"]
                log.info("Forgot %s deleted while a watch was down namespace=%s name=%s",
                         body.get("kind", "object"), namespace, meta["name"])
                if body.get("kind") == "TritonModel":
                    for dep in self.dependents(namespace, meta["name"]):
                        self.request(namespace, dep)
                    self.model_changed(namespace, body, None)
                    continue
                if body.get("kind") == "Pod":
                    pods.append(body)
                owner = (meta.get("labels") or {}).get(LABEL_MODEL)
                if owner:
                    self.request(namespace, owner)
        return pods

    def dependents(self, namespace: str, name: str) -> list[str]:
        """Ensembles in the namespace whose steps use `name`."""
        return step_graph.dependents(name, self.cache.ensembles.get(namespace, {}))

    def model_changed(self, namespace: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        """Reconciles the step models whose status.servedBy this change of a model (None: absent) may change:
        an ensemble created, deleted, scaled or given other steps."""
        for step in steps_to_revisit(old, new, self.cache.models.get(namespace, {})):
            self.request(namespace, step)

    # -- the reconcile

    async def reconcile(self, namespace: str, name: str) -> None:
        self._wake_waiting()
        body = self.cache.model(namespace, name)
        if body is None:
            return  # deleted: owner references garbage-collect the children
        pool = ((body.get("spec") or {}).get("pool"))
        if pool:  # a pooled model: its pool's reconcile places, loads and gates it (`controller.pool`)
            await self._drop_own_replicas(namespace, name)
            if self.on_pooled is not None:
                self.on_pooled(namespace, pool)
            return
        if self.on_unpooled is not None:
            await self.on_unpooled(namespace, name)
        start = time.monotonic()
        try:
            await self._reconcile(body)
            metrics.RECONCILES.labels(result="ok").inc()
        except Exception:
            metrics.RECONCILES.labels(result="error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - start)

    async def _drop_own_replicas(self, namespace: str, name: str) -> None:
        """A model moved onto a pool: the Deployment, repository ConfigMaps, PodDisruptionBudget and HPA of its own go
        (its Service stays, applied again by the pool without a selector; the pool applies the HPA of a pooled
        model's copies, labelled with the pool: the own one, on the own Deployment's metric, would scale the copies
        on a metric no pool replica has, and the pool's rounds never see it to delete it)."""
        for (kind, child), obj in self.cache.children.of_model(namespace, name).items():
            if kind not in (DEPLOYMENT.kind, CONFIG_MAP.kind, PDB.kind, HPA.kind) or LABEL_POOL in (obj["metadata"].get("labels") or {}):
                continue
            await asyncio.to_thread(self.kube.delete, obj["apiVersion"], kind, namespace, child)
            self.cache.children.pop((kind, namespace, child), None)
            log.info("Deleted %s namespace=%s name=%s owner=TritonModel/%s reason=%r", kind, namespace, child, name,
                     "the model runs on a pool now")

    def gather(self, body: dict[str, Any]) -> World:
        """The planner's view of one model, from the cache."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        children = self.cache.children.of_model(namespace, name)
        return World(
            body=body,
            models=self.cache.models.get(namespace, {}),
            ensembles=self.cache.ensembles.get(namespace, {}),
            children=children,
            pods=list(self.cache.pods.get((namespace, name), {}).values()),
            now=utc_now(),
            options=self.options,
            upgrades=self._upgrades(),
        )

    # The bound shared with the pools' Deployments (`controller.pool.UpgradeSlots`).

    def upgrade_slots(self) -> Upgrades:
        return self._upgrades()

    def reserve_upgrade(self, key: DeploymentKey) -> None:
        self._reserved.add(key)

    def release_upgrade(self, key: DeploymentKey) -> None:
        self._reserved.discard(key)
        self._wake_waiting()

    async def list_upgrades(self) -> None:
        await self._list_upgrades()

    def report_pool(self, key: DeploymentKey, stuck: bool, drains: bool) -> None:
        """A pool's round found its Deployment's upgrade rollout unable to schedule its surge pod (`stuck`), or its
        replaced pods still terminating (`drains`); a change wakes the models waiting for a slot."""
        before = (self.pools_stuck, self.pools_draining)
        self.pools_stuck = self.pools_stuck - {key} | ({key} if stuck else set())
        self.pools_draining = self.pools_draining - {key} | ({key} if drains else set())
        if (self.pools_stuck, self.pools_draining) != before:
            self._wake_waiting()

    def _upgrades(self) -> Upgrades:
        return Upgrades(self.max_upgrade_rollouts,
                        frozenset(self.cache.children.upgrading | self._reserved | self._draining()
                                  | self.pools_draining), self._stuck() | self.pools_stuck)

    def _stuck(self) -> frozenset[DeploymentKey]:
        """The unfinished upgrade rollouts whose new pod cannot be scheduled (`plan.upgrade.unschedulable`): while
        one is, no other starts. Only the Deployments in an upgrade rollout are decoded."""
        if not self.max_upgrade_rollouts:
            return frozenset()
        return frozenset(key for key in self.cache.children.upgrading
                         if (DEPLOYMENT.kind, *key) in self.cache.children
                         and unschedulable(self.cache.children[(DEPLOYMENT.kind, *key)],
                                           self.cache.pods.get(key, {}).values()))

    def _draining(self) -> set[DeploymentKey]:
        """The finished upgrade rollouts whose replaced pods still terminate (`plan.upgrade.draining`): they keep their
        slot until the pods are gone (a pod's deletion reconciles its model, which wakes the waiting). Only the models
        with a terminating pod have their Deployment decoded."""
        if not self.max_upgrade_rollouts:
            return set()
        out = set()
        for (namespace, model), pods in self.cache.pods.items():
            key = (DEPLOYMENT.kind, namespace, model)
            if any(p["metadata"].get("deletionTimestamp") for p in pods.values()) and key in self.cache.children \
                    and draining(self.cache.children[key], pods.values()):
                out.add((namespace, model))
        return out

    def _wake_waiting(self) -> None:
        """Reconciles the models whose upgrade rollout waits, while the count is under the bound: a slot freed (a
        rollout finished, a Deployment went), and no upgrade rollout's new pod waits for room (`_stuck`: its pod's
        scheduling reconciles its model, which wakes them). Those that find no slot wait again."""
        upgrades = self._upgrades() if self._waiting else None
        if upgrades is not None and len(upgrades.rolling) < self.max_upgrade_rollouts and not upgrades.stuck:
            # Each asked once: its next plan says whether it waits again (`_bounded`). Kept, they would be asked
            # again by every reconcile, their own included, and one that is gone would be asked for ever.
            waiting, self._waiting = self._waiting, set()
            for key in sorted(waiting):
                self.request(*key)

    async def _list_upgrades(self) -> None:
        """Once per process, before its first upgrade rollout starts: the Deployments of the namespaces served, so
        that the count does not miss those the watch has not delivered yet (a newer one it has delivered stays)."""
        async with self._listing:
            if self._upgrades_listed:
                return
            for scope in self.upgrade_scopes:
                listed, _ = await asyncio.to_thread(self.kube.list_versioned, DEPLOYMENT.api_version, DEPLOYMENT.kind,
                                                    scope, OWNED_SELECTOR)  # models' and pools' Deployments
                for dep in listed:
                    meta = dep["metadata"]
                    self.cache.children.setdefault((DEPLOYMENT.kind, meta["namespace"], meta["name"]), lean(dep))
            self._upgrades_listed = True

    async def _bounded(self, body: dict[str, Any], world: World, decided: Plan) -> Plan:
        """The plan to carry out under the bound on upgrade rollouts: one that starts an upgrade rollout is made
        again over the count as it is now, and its Deployment reserved, in one step (no `await` in between)."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if decided.upgrade is not None and decided.upgrade.started and self.max_upgrade_rollouts:
            await self._list_upgrades()
            decided = plan(replace(self.gather(body), replicasets=world.replicasets))
        if decided.upgrade is not None and decided.upgrade.started:
            self._reserved.add(key)
        if decided.upgrade is not None and not decided.upgrade.started:
            self._waiting.add(key)
        else:
            self._waiting.discard(key)
        metrics.UPGRADE_WAITING.set(len(self._waiting))
        metrics.UPGRADE_ROLLOUTS.set(len(self._upgrades().rolling))
        return decided

    async def _read(self, world: World, decided: Plan) -> World:
        """Carries out a plan's reads: the model's objects of a kind, listed live."""
        namespace, name = world.body["metadata"]["namespace"], world.body["metadata"]["name"]
        replicasets = world.replicasets
        for r in decided.reads:
            assert r.kind == REPLICA_SET.kind, r  # the one kind the planner reads
            replicasets = await asyncio.to_thread(self.kube.list, r.api_version, r.kind, namespace,
                                                  f"{LABEL_MODEL}={name}")
        return replace(world, replicasets=replicasets)

    async def _prime_pods(self, body: dict[str, Any]) -> None:
        """Right after the operator starts, the pod watch may not have delivered this model's pods yet: a status
        planned from an empty cache would flip a serving model to Ready=False. A model with no status yet has
        nothing to flip, and its pods arrive on the watch."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if (namespace, name) in self.cache.primed:
            return
        listed: list[dict[str, Any]] = []
        if body.get("status"):
            listed = await asyncio.to_thread(self.kube.list, "v1", "Pod", namespace, f"{LABEL_MODEL}={name}")
            # The live pod template too: an in-place change keeps it (`plan.rollout.in_place_deployment`), and a
            # plan made without it would roll the Deployment.
            if (DEPLOYMENT.kind, namespace, name) not in self.cache.children:
                dep = await asyncio.to_thread(self.kube.get, DEPLOYMENT.api_version, DEPLOYMENT.kind, namespace, name)
                if dep is not None and (dep["metadata"].get("labels") or {}).get(LABEL_MODEL) == name:
                    self.cache.put_child(dep)
        self.cache.prime_pods(namespace, name, listed)

    async def _reconcile(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        await self._prime_pods(body)
        world = self.gather(body)
        decided = plan(world)
        if decided.reads:  # old repository ConfigMaps: which ReplicaSets still use them?
            world = await self._read(world, decided)
            decided = plan(world)
        decided = await self._bounded(body, world, decided)
        failure: ApiFailure | None = None
        refused: Exception | None = None
        try:
            await self._carry_out(namespace, name, decided)
        except Exception as exc:
            failure = api_failure(exc)
            if failure is None or not failure.persistent:
                raise  # retried soon: nothing to tell the user yet
            refused = exc  # reported on the status (the planner's api_problem), then retried with backoff (the worker)
        finally:
            self._reserved.discard((namespace, name))  # the cache holds the applied Deployment now, or none started
        if refused is None and decided.upgrade is not None and decided.upgrade.started:
            log.info("Started upgrade rollout of Deployment namespace=%s name=%s owner=TritonModel/%s", namespace, name, name)
            metrics.UPGRADE_STARTS.inc()
            await asyncio.to_thread(self.kube.event, body, UPGRADE_STARTED, decided.upgrade.message, "Normal")
        # The status, planned again over what the writes left in the cache (the API server's answers).
        after = plan(replace(self.gather(body), replicasets=world.replicasets, api_error=failure))
        await self._write_status(body, after)
        for dep in self.dependents(namespace, name):
            self.request(namespace, dep)
        if refused is not None:
            raise refused

    async def _carry_out(self, namespace: str, name: str, decided: Plan) -> None:
        """The plan's creates (one found there already is done), its applies (a `verify` one only if the object read now
        differs), in order, then its deletes."""
        for obj in decided.create:
            created = await asyncio.to_thread(self.kube.create_if_absent, obj)
            log.info("%s %s namespace=%s name=%s owner=TritonModel/%s", "Created" if created else "Found",
                     obj["kind"], namespace, obj["metadata"]["name"], name)
        for a in decided.apply:
            child = a.obj
            key = (child["kind"], namespace, child["metadata"]["name"])
            if a.verify:
                existing = await asyncio.to_thread(self.kube.get, child["apiVersion"], child["kind"], namespace, key[2])
                if existing is not None:  # the watch has not delivered it yet (operator start)
                    existing = self.cache.children.setdefault(key, lean(existing))
                if not differs(existing, child):
                    continue
            applied = await asyncio.to_thread(self.kube.apply, child)
            self.cache.put_child(applied)
            log.info("Applied %s namespace=%s name=%s owner=TritonModel/%s", child["kind"], namespace, key[2], name)
        for d in decided.delete:
            await asyncio.to_thread(self.kube.delete, d.api_version, d.kind, namespace, d.name)
            self.cache.children.pop((d.kind, namespace, d.name), None)
            log.info("Deleted %s namespace=%s name=%s owner=TritonModel/%s reason=%r", d.kind, namespace, d.name,
                     name, d.why)
        for p in decided.pods:
            answer = await asyncio.to_thread(self.kube.patch_pod_annotations, namespace, p.name, p.annotations)
            if answer is not None:
                self.cache.put_pod(lean(answer))
            log.info("Annotated Pod namespace=%s name=%s owner=TritonModel/%s reason=%r", namespace, p.name, name,
                     p.why)

    async def _write_status(self, body: dict[str, Any], decided: Plan) -> None:
        """The plan's status patch, then its Events (only once the status they describe is stored)."""
        if decided.status_patch is None:
            return
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        updated = await asyncio.to_thread(self.kube.patch_custom_status, TRITON_MODEL.group, TRITON_MODEL.version,
                                          TRITON_MODEL.plural, namespace, name, decided.status_patch)
        if updated is None:  # deleted: its DELETED event is on its way, or a restarted watch lost it
            if self.cache.forget_model(namespace, name, meta["uid"]):
                log.info("Forgot TritonModel gone when its status was written namespace=%s name=%s", namespace, name)
            return
        if not self.cache.answered_model(updated):  # deleted since: its DELETED event came before this answer
            return
        for e in decided.events:
            log.info("Changed TritonModel condition namespace=%s name=%s type=%s status=%s reason=%s",
                     namespace, name, e.condition, e.status, e.reason)
            await asyncio.to_thread(self.kube.event, body, e.reason, e.message, e.type)
