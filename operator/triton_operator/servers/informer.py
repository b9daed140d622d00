"""The TritonModels the admission webhook reads, in every operator replica: a list and a watch of its own.

The reconcile's cache (`controller.cache`) is fed by kopf's watches, which run in the leader alone, while
every replica answers admission reviews. So each replica lists and watches TritonModels itself, as
controller-runtime's cached client does for a webhook: one list+watch per watched namespace when the
namespaces are named (the chart's RBAC is then a Role in each), else one across every namespace (cluster-wide
RBAC), keeping the watched ones. A watch goes on from its last resourceVersion (bookmarks keep it recent) and
lists again after a 410 Gone or an error, backing off from 1 s to 30 s.

What a review needs is kept: apiVersion, kind, metadata (name, namespace, uid, resourceVersion) and spec, as
compact JSON, with each model's step names indexed, so that a review decodes only the models it reaches.

Each watch runs in a thread of its own (a blocking read of the stream, with `Kube`'s credentials), not in
asyncio's default executor, whose few threads the operator's API calls share.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import urllib3

from ..api.steps import steps_of
from ..api.v1alpha1 import API_VERSION, KIND
from ..platform.kube import Kube
from . import metrics

log = logging.getLogger("triton_operator.informer")

#: How long one watch request lasts (the API server ends it; the next one goes on from its resourceVersion).
WATCH_SECONDS = 300
FIRST_BACKOFF, MAX_BACKOFF = 1.0, 30.0


def _kept(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
            "spec": body.get("spec")}


class _Namespace:
    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}
        self.steps: dict[str, tuple[str, ...]] = {}
        self.uids: dict[str, str] = {}
        self.pooled: dict[str, tuple[str, str]] = {}  # a pooled model's (pool, Triton name)

    def put(self, body: Mapping[str, Any]) -> None:
        name = body["metadata"]["name"]
        self.bodies[name] = json.dumps(_kept(body), separators=(",", ":")).encode()
        self.steps[name] = tuple(steps_of(body))
        self.uids[name] = str(body["metadata"].get("uid") or "")
        self.pooled.pop(name, None)
        if (found := pool_and_triton_name(body)) is not None:
            self.pooled[name] = found

    def drop(self, name: str) -> None:
        self.bodies.pop(name, None)
        self.steps.pop(name, None)
        self.uids.pop(name, None)
        self.pooled.pop(name, None)


def pool_and_triton_name(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """A TritonModel body's pool and the name it loads under in Triton (spec.modelName, else its name); None when it
    is not pooled."""
    spec = body.get("spec") or {}
    pool, triton = spec.get("pool"), spec.get("modelName") or body["metadata"].get("name")
    return (pool, str(triton)) if isinstance(pool, str) and pool else None


class ModelStore:
    """The TritonModels seen, by namespace; written by the watch threads, read by the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._namespaces: dict[str, _Namespace] = {}

    def replace(self, scope: str | None, items: Iterable[Mapping[str, Any]]) -> None:
        """What a LIST of `scope` (a namespace; None: every namespace) returned, in place of what was kept."""
        fresh: dict[str, _Namespace] = {}
        for body in items:
            fresh.setdefault(body["metadata"]["namespace"], _Namespace()).put(body)
        with self._lock:
            if scope is None:
                self._namespaces = fresh
            else:
                self._namespaces[scope] = fresh.get(scope) or _Namespace()
            self._count()

    def put(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        meta = body["metadata"]
        with self._lock:
            ns = self._namespaces.setdefault(meta["namespace"], _Namespace())
            if deleted:
                ns.drop(meta["name"])
            else:
                ns.put(body)
            self._count()

    def _count(self) -> None:
        metrics.WEBHOOK_MODELS.set(sum(len(ns.bodies) for ns in self._namespaces.values()))

    def graph(self, namespace: str) -> dict[str, tuple[str, ...]]:
        """Every kept model of the namespace and the names its ensemble steps use."""
        with self._lock:
            ns = self._namespaces.get(namespace)
            return dict(ns.steps) if ns else {}

    def on_pool(self, namespace: str, pool: str) -> dict[str, str]:
        """The kept models of the namespace on `pool`, with the Triton name each loads under."""
        with self._lock:
            ns = self._namespaces.get(namespace)
            return {n: t for n, (p, t) in ns.pooled.items() if p == pool} if ns else {}

    def body(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            ns = self._namespaces.get(namespace)
            raw = ns.bodies.get(name) if ns else None
        return None if raw is None else dict(json.loads(raw))

    def uid(self, namespace: str, name: str) -> str | None:
        with self._lock:
            ns = self._namespaces.get(namespace)
            return ns.uids.get(name) if ns else None


class ModelInformer:
    """Lists and watches the TritonModels of `namespaces` (None: every namespace, keeping those `watched` says)."""

    def __init__(self, kube: Kube, namespaces: list[str] | None, watched: Callable[[str], bool]) -> None:
        self.kube = kube
        self.scopes: list[str | None] = list(namespaces) if namespaces else [None]
        self.watched = watched
        self.store = ModelStore()
        self._stop = threading.Event()
        self._synced: dict[str | None, threading.Event] = {s: threading.Event() for s in self.scopes}
        self._responses: dict[str | None, urllib3.BaseHTTPResponse] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for scope in self.scopes:
            t = threading.Thread(target=self._run, args=(scope,), name=f"informer-{scope or 'all'}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for resp in list(self._responses.values()):
            resp.shutdown()  # unblocks the thread's read

    def synced(self) -> bool:
        """Whether every scope has been listed once (from then on the store answers, however recent)."""
        return all(e.is_set() for e in self._synced.values())

    async def wait_synced(self, timeout: float) -> bool:
        if self.synced() or timeout <= 0:
            return self.synced()
        return await asyncio.to_thread(lambda: all(e.wait(timeout) for e in self._synced.values()))

    def _run(self, scope: str | None) -> None:
        backoff = FIRST_BACKOFF
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    items, version = self.kube.list_versioned(API_VERSION, KIND, scope)
                    self.store.replace(scope, (i for i in items if self.watched(i["metadata"]["namespace"])))
                    if not self._synced[scope].is_set():
                        log.info("Listed TritonModels for the webhook namespace=%s count=%d", scope or "*",
                                 len(items))
                    self._synced[scope].set()
                version = self._watch(scope, version)
                backoff = FIRST_BACKOFF
            except Exception as exc:  # noqa: BLE001 - the API server may be away: list again after a while
                if self._stop.is_set():
                    return
                log.warning("Watching TritonModels for the webhook failed namespace=%s error=%r; listing again in "
                            "%.0fs", scope or "*", exc, backoff)
                version = ""
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _watch(self, scope: str | None, version: str) -> str:
        """One watch request; the resourceVersion to go on from ("" to list again)."""
        def opened(resp: urllib3.BaseHTTPResponse) -> None:
            self._responses[scope] = resp
            if self._stop.is_set():
                resp.shutdown()

        try:
            for event in self.kube.watch(API_VERSION, KIND, scope, version, WATCH_SECONDS, opened):
                kind, body = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if body.get("code") == 410:  # too old: what changed since is gone, list again
                        return ""
                    raise RuntimeError(f"watch error: {body.get('message')}")
                version = str((body.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK" or not self.watched(body["metadata"]["namespace"]):
                    continue
                self.store.put(body, deleted=kind == "DELETED")
        finally:
            self._responses.pop(scope, None)
        return version
