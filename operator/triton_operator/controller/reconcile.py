"""The one level-triggered reconcile of a TritonModel, and the in-memory view it reads from.

Watch events (kopf `on.event`) keep `Cache` current for TritonModels and the
children we own; `Reconciler.reconcile` renders the desired children, applies
only those that differ (server-side apply, one field manager), and writes
status only when it changed. A second reconcile of an unchanged object writes
nothing. kopf keeps no progress annotations for us: every handler is an event
handler or a timer. `Reconciler.resync` drops from the cache what the API no
longer has: deletions a restarted watch never reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..api.v1alpha1 import GROUP, PLURAL, VERSION, TritonModel
from ..render.kubernetes import (
    LABEL_MODEL,
    MANAGED_BY,
    Options,
    RepositoryTooLarge,
    render_children,
    selector_string,
    unused_repositories,
)
from ..render.modelconfig import render_repository
from ..validate.admission import steps_of
from ..validate.errors import from_pydantic
from ..validate.rules import check_models
from . import metrics
from .errors import api_failure, retry_after
from .kube import Kube, contains
from .status import Observed, Problem, compute_status, status_changed, transitions

log = logging.getLogger("triton_operator.reconcile")

CHILD_KINDS = ("ConfigMap", "Deployment", "Service", "PodDisruptionBudget")
#: What `Reconciler.resync` lists per namespace: kind -> (apiVersion, label selector), the watches' selectors.
RESYNC_KINDS = {
    "TritonModel": (f"{GROUP}/{VERSION}", None),
    "ConfigMap": ("v1", f"app.kubernetes.io/managed-by={MANAGED_BY}"),
    "Deployment": ("apps/v1", f"app.kubernetes.io/managed-by={MANAGED_BY}"),
    "Service": ("v1", f"app.kubernetes.io/managed-by={MANAGED_BY}"),
    "PodDisruptionBudget": ("policy/v1", f"app.kubernetes.io/managed-by={MANAGED_BY}"),
    "Pod": ("v1", LABEL_MODEL),
}


def _lean(body: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy without metadata.managedFields: nothing here reads them, and on objects written with
    server-side apply they roughly double the metadata (about 30 MB of peak RSS at 1000 models)."""
    out = dict(body)
    meta = out.get("metadata")
    if meta and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return out


@dataclass
class Cache:
    """Latest bodies seen on the watches (without managedFields), by namespace."""

    models: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: defaultdict(dict))
    children: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, ns, name)
    pods: dict[tuple[str, str], dict[str, dict[str, Any]]] = field(default_factory=lambda: defaultdict(dict))
    # (ns, model) whose pods were listed once; uids deleted before that list, which it must not revive
    primed: set[tuple[str, str]] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    # uid -> time.monotonic() when the cached body was last observed (a watch event, a write's answer, a LIST)
    seen: dict[str, float] = field(default_factory=dict)

    def _observed(self, body: Mapping[str, Any], deleted: bool) -> None:
        uid = body["metadata"].get("uid")
        if not uid:
            return
        if deleted:
            self.seen.pop(uid, None)
        else:
            self.seen[uid] = time.monotonic()

    def put_model(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        self._observed(body, deleted)
        if deleted:
            self.models[ns].pop(name, None)
        else:
            self.models[ns][name] = _lean(body)

    def put_child(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        key = (body["kind"], body["metadata"]["namespace"], body["metadata"]["name"])
        self._observed(body, deleted)
        if deleted:
            self.children.pop(key, None)
        else:
            self.children[key] = _lean(body)

    def put_pod(self, body: Mapping[str, Any], deleted: bool = False) -> str | None:
        meta = body["metadata"]
        model = (meta.get("labels") or {}).get(LABEL_MODEL)
        if not model:
            return None
        key = (meta["namespace"], model)
        bucket = self.pods[key]
        self._observed(body, deleted)
        if deleted:
            bucket.pop(meta["name"], None)
            if key not in self.primed:
                self.gone.add(meta["uid"])
        else:
            bucket[meta["name"]] = _lean(body)
        return model

    def prime_pods(self, namespace: str, model: str, listed: list[dict[str, Any]]) -> None:
        """Merge a LIST of the model's pods under what the watch has delivered (which is as new or newer)."""
        bucket = self.pods[(namespace, model)]
        for pod in listed:
            if pod["metadata"]["uid"] not in self.gone and pod["metadata"]["name"] not in bucket:
                bucket[pod["metadata"]["name"]] = _lean(pod)
                self._observed(pod, deleted=False)
        self.primed.add((namespace, model))

    def forget_model(self, namespace: str, name: str, uid: str) -> bool:
        """Drop the model if the cache still holds this uid under its name (not a newer object of that name)."""
        body = self.models.get(namespace, {}).get(name)
        if body is None or body["metadata"].get("uid") != uid:
            return False
        self.put_model(body, deleted=True)
        return True

    def sweep(self, namespace: str, listed: Mapping[str, set[str]], since: float) -> list[dict[str, Any]]:
        """Drops and returns the cached objects of `namespace` the API no longer has.

        `listed` holds, per kind of `RESYNC_KINDS`, the uids LISTs returned that were sent at `since`
        (time.monotonic()). An object missing from them was deleted, unless it was observed after `since`:
        then it may be newer than the LIST, and stays.
        """
        def stale(body: Mapping[str, Any], kind: str) -> bool:
            uid = body["metadata"].get("uid")
            return uid not in listed[kind] and self.seen.get(uid, 0.0) < since

        dropped: list[dict[str, Any]] = []
        for body in list(self.models.get(namespace, {}).values()):
            if stale(body, "TritonModel"):
                dropped.append(body)
                self.put_model(body, deleted=True)
        for (kind, ns, _), body in list(self.children.items()):
            if ns == namespace and stale(body, kind):
                dropped.append(body)
                self.put_child(body, deleted=True)
        for (ns, _), bucket in list(self.pods.items()):
            if ns != namespace:
                continue
            for body in list(bucket.values()):
                if stale(body, "Pod"):
                    dropped.append({**body, "kind": "Pod"})
                    self.put_pod(body, deleted=True)
        return dropped


class Reconciler:
    def __init__(self, kube: Kube, cache: Cache, options: Options = Options()) -> None:
        self.kube = kube
        self.cache = cache
        self.options = options
        self._dirty: dict[tuple[str, str], asyncio.Event] = {}
        self._workers: dict[tuple[str, str], asyncio.Task[None]] = {}

    # -- scheduling: one worker per object, coalescing bursts of events into one reconcile

    def request(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        ev = self._dirty.setdefault(key, asyncio.Event())
        ev.set()
        task = self._workers.get(key)
        if task is None or task.done():
            self._workers[key] = asyncio.create_task(self._worker(key), name=f"reconcile-{namespace}/{name}")

    async def _worker(self, key: tuple[str, str]) -> None:
        ev = self._dirty[key]
        failures = 0
        while ev.is_set():
            ev.clear()
            try:
                await self.reconcile(*key)
                failures = 0
            except Exception as exc:  # noqa: BLE001 - a failed reconcile is retried, never fatal
                failures += 1
                retry = retry_after(exc, failures)
                metrics.RECONCILE_ERRORS.labels(reason=type(exc).__name__).inc()
                if retry.failure is not None:
                    log.warning("Failed to reconcile TritonModel namespace=%s name=%s error=%r retry=%.0fs attempt=%d",
                                *key, retry.failure.describe(), retry.delay, failures)
                else:
                    log.exception("Failed to reconcile TritonModel namespace=%s name=%s retry=%.0fs attempt=%d",
                                  *key, retry.delay, failures)
                await self._back_off(key, retry.delay)
                ev.set()

    def _generation(self, key: tuple[str, str]) -> tuple[str, int] | None:
        body = self.cache.models.get(key[0], {}).get(key[1])
        return None if body is None else (body["metadata"].get("uid", ""), int(body["metadata"].get("generation", 0)))

    async def _back_off(self, key: tuple[str, str], delay: float) -> None:
        """Waits `delay` seconds before the next attempt; events meanwhile do not cut it short (pods change
        often), a change of the spec (a new generation: someone may have fixed it) or a deletion does."""
        generation = self._generation(key)
        ev = self._dirty[key]
        deadline = asyncio.get_running_loop().time() + delay
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            ev.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ev.wait(), left)
            if self._generation(key) != generation:
                return

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
            listed = {kind: await asyncio.to_thread(self.kube.list_uids, api_version, kind, namespace, selector)
                      for kind, (api_version, selector) in RESYNC_KINDS.items()}
            for body in self.cache.sweep(namespace, listed, since):
                meta = body["metadata"]
                log.info("Forgot %s deleted while a watch was down namespace=%s name=%s",
                         body.get("kind", "object"), namespace, meta["name"])
                if body.get("kind") == "TritonModel":
                    for dep in self.dependents(namespace, meta["name"]):
                        self.request(namespace, dep)
                    continue
                if body.get("kind") == "Pod":
                    pods.append(body)
                owner = (meta.get("labels") or {}).get(LABEL_MODEL)
                if owner:
                    self.request(namespace, owner)
        return pods

    def dependents(self, namespace: str, name: str) -> list[str]:
        """Ensembles in the namespace whose steps use `name`."""
        return [other for other, body in self.cache.models.get(namespace, {}).items() if name in steps_of(body)]

    # -- the reconcile

    async def reconcile(self, namespace: str, name: str) -> None:
        body = self.cache.models.get(namespace, {}).get(name)
        if body is None:
            return  # deleted: owner references garbage-collect the children
        start = time.monotonic()
        try:
            await self._reconcile(body)
            metrics.RECONCILES.labels(result="ok").inc()
        except Exception:
            metrics.RECONCILES.labels(result="error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - start)

    def _closure(self, namespace: str, root: TritonModel) -> tuple[list[TritonModel], list[str], list[str]]:
        """The root and every model its ensemble steps reach; plus missing step names and parse errors."""
        models = {root.name: root}
        missing: list[str] = []
        errors: list[str] = []
        todo = [root]
        while todo:
            m = todo.pop()
            for step in m.spec.ensemble.steps if m.spec.ensemble else ():
                if step.model in models:
                    continue
                body = self.cache.models.get(namespace, {}).get(step.model)
                if body is None:
                    missing.append(step.model)
                    continue
                try:
                    sm = TritonModel.model_validate(body)
                except ValidationError as exc:
                    errors.extend(str(e) for e in from_pydantic(f"TritonModel/{step.model}", exc))
                    continue
                models[sm.name] = sm
                todo.append(sm)
        return list(models.values()), sorted(set(missing)), errors

    async def _reconcile(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        generation = int(meta.get("generation", 1))
        problem: Problem | None = None
        digest: str | None = None
        model: TritonModel | None = None
        try:
            model = TritonModel.model_validate(body)
        except ValidationError as exc:
            problem = Problem("InvalidSpec", "; ".join(str(e) for e in from_pydantic(f"TritonModel/{name}", exc)))
        children: list[dict[str, Any]] = []
        if model is not None:
            closure, missing, step_errors = self._closure(namespace, model)
            if missing:
                problem = Problem(
                    "StepModelMissing",
                    f"ensemble step model(s) {', '.join(missing)} not found in namespace {namespace}; nothing is deployed",
                )
            elif step_errors:
                problem = Problem("InvalidStepModel", "; ".join(step_errors))
            else:
                errors = check_models([(f"TritonModel/{m.name}", m) for m in closure])
                own = [e for e in errors if e.model == f"TritonModel/{name}"]
                if errors:
                    problem = Problem("InvalidSpec", "; ".join(f"{e.path}: {e.message}" for e in (own or errors))[:2000])
            if problem is None:
                rendered = render_repository(closure)
                digest = rendered[name].digest
                try:
                    children = render_children(model, rendered, uid, namespace, self.options)
                except RepositoryTooLarge as exc:
                    problem = Problem("RepositoryTooLarge", str(exc))
        refused: Exception | None = None
        api_error: Problem | None = None
        try:
            await self._apply(body, model, children)
        except Exception as exc:
            failure = api_failure(exc)
            if failure is None or not failure.persistent:
                raise  # retried soon: nothing to tell the user yet
            refused = exc  # reported on the status, then retried with backoff (the worker)
            api_error = Problem("ApiError", failure.describe())
        await self._write_status(body, generation, model, digest, problem, api_error)
        for dep in self.dependents(namespace, name):
            self.request(namespace, dep)
        if refused is not None:
            raise refused

    async def _apply(self, body: dict[str, Any], model: TritonModel | None, children: list[dict[str, Any]]) -> None:
        """Applies the children that differ from the cluster's, and deletes the ones no longer wanted."""
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        # A model with no status was never reconciled: there is nothing of ours to GET, so apply straight away
        # (a child left by a first reconcile that was cut short is re-applied unchanged, a no-op for the server).
        reconciled_before = bool(body.get("status"))
        for child in children:
            key = (child["kind"], namespace, child["metadata"]["name"])
            existing = self.cache.children.get(key)
            if existing is None and reconciled_before:
                existing = await asyncio.to_thread(self.kube.get, child["apiVersion"], child["kind"], namespace, key[2])
                if existing is not None:  # the watch has not delivered it yet (operator start): status reads it
                    existing = self.cache.children.setdefault(key, _lean(existing))
            if existing is not None and contains(existing, child):
                continue
            applied = await asyncio.to_thread(self.kube.apply, child)
            self.cache.put_child(applied)
            log.info("Applied %s namespace=%s name=%s owner=TritonModel/%s", child["kind"], namespace, key[2], name)
        if children:
            repository = next(c for c in children if c["kind"] == "ConfigMap")["metadata"]["name"]
            await self._collect_repositories(namespace, name, uid, repository)
        if model is not None and model.spec.replicas <= 1:
            stale = self.cache.children.get(("PodDisruptionBudget", namespace, name))
            if stale is not None:
                await asyncio.to_thread(self.kube.delete, "policy/v1", "PodDisruptionBudget", namespace, name)
                self.cache.children.pop(("PodDisruptionBudget", namespace, name), None)

    async def _collect_repositories(self, namespace: str, name: str, uid: str, desired: str) -> None:
        """Deletes the model's repository ConfigMaps no pod can need any more (`unused_repositories`).

        Level-based: the ReplicaSets are listed live, and only when the cache holds a ConfigMap of the model other
        than the desired one (a model that did not change costs no request). A ReplicaSet scaled down later is
        noticed on a pod event or the next drift round.
        """
        mine = [body for (kind, ns, _), body in self.cache.children.items()
                if kind == "ConfigMap" and ns == namespace and (body["metadata"].get("labels") or {}).get(LABEL_MODEL) == name
                and any(ref.get("uid") == uid for ref in body["metadata"].get("ownerReferences") or ())]
        if all(body["metadata"]["name"] == desired for body in mine):
            return
        replicasets = await asyncio.to_thread(self.kube.list, "apps/v1", "ReplicaSet", namespace, f"{LABEL_MODEL}={name}")
        for unused in unused_repositories(mine, replicasets, desired):
            await asyncio.to_thread(self.kube.delete, "v1", "ConfigMap", namespace, unused)
            self.cache.children.pop(("ConfigMap", namespace, unused), None)
            log.info("Deleted repository ConfigMap no ReplicaSet uses namespace=%s name=%s owner=TritonModel/%s",
                     namespace, unused, name)

    async def _write_status(
        self, body: dict[str, Any], generation: int, model: TritonModel | None, digest: str | None,
        problem: Problem | None, api_error: Problem | None = None,
    ) -> None:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        replicas = model.spec.replicas if model is not None else int((body.get("spec") or {}).get("replicas", 1))
        sel = f"{LABEL_MODEL}={name}" if model is None else selector_string(model)
        if (namespace, name) not in self.cache.primed:
            # Right after the operator starts, the pod watch may not have delivered this model's pods yet:
            # a status computed from an empty cache would flip a serving model to Ready=False. A model with
            # no status yet has nothing to flip, and its pods arrive on the watch.
            listed: list[dict[str, Any]] = []
            if body.get("status"):
                listed = await asyncio.to_thread(self.kube.list, "v1", "Pod", namespace, f"{LABEL_MODEL}={name}")
            self.cache.prime_pods(namespace, name, listed)
        obs = Observed(
            generation=generation,
            desired_replicas=replicas,
            digest=digest or (body.get("status") or {}).get("configDigest"),
            selector=sel,
            problem=problem,
            api_error=api_error,
            deployment=self.cache.children.get(("Deployment", namespace, name)),
            pods=list(self.cache.pods.get((namespace, name), {}).values()),
        )
        old = body.get("status") or {}
        new = compute_status(obs, old)
        if not status_changed(old, new):
            return
        patch = dict(new)
        for k in old:
            if k not in patch:
                patch[k] = None  # merge patch: drop fields we no longer report
        updated = await asyncio.to_thread(self.kube.patch_custom_status, GROUP, VERSION, PLURAL, namespace, name, patch)
        if updated is None:  # deleted: its DELETED event is on its way, or a restarted watch lost it
            if self.cache.forget_model(namespace, name, meta["uid"]):
                log.info("Forgot TritonModel gone when its status was written namespace=%s name=%s", namespace, name)
            return
        self.cache.put_model(updated)
        for c in transitions(old, new):
            warn = (c["type"] == "Degraded" and c["status"] == "True") or (
                c["type"] == "Ready" and c["status"] == "False" and c["reason"] not in ("ReplicasWarming", "ReplicasJoining", "ReplicasStarting")
            )
            log.info(
                "Changed TritonModel condition namespace=%s name=%s type=%s status=%s reason=%s",
                namespace, name, c["type"], c["status"], c["reason"],
            )
            await asyncio.to_thread(
                self.kube.event, body, c["reason"], f"{c['type']}={c['status']}: {c['message']}", "Warning" if warn else "Normal"
            )
