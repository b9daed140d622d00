"""The operator's view of the cluster: the latest TritonModels, children and replicas the watches delivered.

Kept current by the kopf event handlers (`controller.operator`) and by the reconcile's own writes; read by
`Reconciler.gather`. `Cache.sweep` drops what a LIST no longer shows (deletions a restarted watch never
reported). Bodies are kept without metadata.managedFields.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..api.kinds import DEPLOYMENT, LABEL_MODEL
from ..plan.upgrade import DeploymentKey, in_upgrade_rollout
from . import metrics


def lean(body: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy without metadata.managedFields: nothing here reads them, and on objects written with
    server-side apply they roughly double the metadata (about 30 MB of peak RSS at 1000 models)."""
    out = dict(body)
    meta = out.get("metadata")
    if meta and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return out


def _older(body: Mapping[str, Any], cached: Mapping[str, Any] | None) -> bool:
    """Whether `body` is an older version of the same object than `cached`: a watch event delivered after the
    answer to our own write of it (etcd's resourceVersions are numbers that grow; anything else is not compared)."""
    if cached is None or cached["metadata"].get("uid") != body["metadata"].get("uid"):
        return False
    new, old = body["metadata"].get("resourceVersion", ""), cached["metadata"].get("resourceVersion", "")
    return new.isdigit() and old.isdigit() and int(new) < int(old)


ChildKey = tuple[str, str, str]  # (kind, namespace, name)
K = TypeVar("K")


class Bodies(MutableMapping[K, dict[str, Any]]):
    """Object bodies by key, each kept as compact JSON and decoded when read, with their uids indexed.

    A TritonModel, a Deployment or a repository ConfigMap is a few kB of JSON but several times that as Python
    objects, and decoded JSON was the operator's largest allocation after its modules (tracemalloc at 1000
    models, issue 17: the cached TritonModels alone held 24 MiB). A body is read a few times per reconcile of its
    model; a read returns a fresh copy, so a caller cannot change the cache by accident. `uid` answers without
    decoding (the resync's sweep asks it of everything)."""

    def __init__(self) -> None:
        self._bodies: dict[K, bytes] = {}
        self._uids: dict[K, str | None] = {}

    def __getitem__(self, key: K) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self._bodies[key])
        return body

    def __setitem__(self, key: K, body: dict[str, Any]) -> None:
        self._bodies[key] = json.dumps(body, separators=(",", ":")).encode()
        self._uids[key] = body["metadata"].get("uid")

    def __delitem__(self, key: K) -> None:
        del self._bodies[key]
        self._uids.pop(key, None)

    def __iter__(self) -> Iterator[K]:
        return iter(self._bodies)

    def __len__(self) -> int:
        return len(self._bodies)

    def __contains__(self, key: object) -> bool:
        return key in self._bodies

    def uid(self, key: K) -> str | None:
        """The object's metadata.uid, without decoding its body."""
        return self._uids[key]


class Children(Bodies[ChildKey]):
    """The cached children by (kind, namespace, name), also indexed by (namespace, owning model label).

    A reconcile reads one model's children: scanning every cached child for it made each reconcile cost O(all
    children), a quarter of the operator's CPU at 1000 models (py-spy, issue 17). Every way of changing the mapping
    keeps the index: they all go through item assignment and `del`. So does `upgrading`: the Deployments in an
    unfinished upgrade rollout (`plan.upgrade`), the count the bound on them is read from, kept as each is stored.
    Kept as JSON (`Bodies`): in one run of the
    scale benchmark at 1000 models this took the operator's peak RSS from 280 to 263 MB.
    """

    def __init__(self) -> None:
        super().__init__()
        self._owners: dict[ChildKey, tuple[str, str]] = {}
        self._by_model: dict[tuple[str, str], set[ChildKey]] = defaultdict(set)
        self.upgrading: set[DeploymentKey] = set()

    def __setitem__(self, key: ChildKey, body: dict[str, Any]) -> None:
        self._unindex(key)
        super().__setitem__(key, body)
        if key[0] == DEPLOYMENT.kind and in_upgrade_rollout(body):
            self.upgrading.add((key[1], key[2]))
        model = (body["metadata"].get("labels") or {}).get(LABEL_MODEL)
        if model:
            self._owners[key] = (key[1], model)
            self._by_model[(key[1], model)].add(key)

    def __delitem__(self, key: ChildKey) -> None:
        self._unindex(key)
        super().__delitem__(key)

    def _unindex(self, key: ChildKey) -> None:
        if key[0] == DEPLOYMENT.kind:
            self.upgrading.discard((key[1], key[2]))
        owner = self._owners.pop(key, None)
        if owner is not None:
            keys = self._by_model.get(owner)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_model[owner]

    def of_model(self, namespace: str, model: str) -> dict[tuple[str, str], dict[str, Any]]:
        """The children labelled as `model`'s in `namespace`, by (kind, name)."""
        keys = sorted(self._by_model.get((namespace, model), ()))  # a stable order for the planner
        return {(kind, name): self[(kind, ns, name)] for kind, ns, name in keys}


@dataclass
class Cache:
    """Latest bodies seen on the watches (without managedFields), by namespace."""

    models: dict[str, Bodies[str]] = field(default_factory=lambda: defaultdict(Bodies))
    # The models with spec.ensemble among `models`: who uses a model as a step is asked on every reconcile, and
    # scanning the whole namespace for it cost about a tenth of the operator's CPU at 1000 models (issue 17).
    ensembles: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: defaultdict(dict))
    children: Children = field(default_factory=Children)  # (kind, ns, name)
    pods: dict[tuple[str, str], dict[str, dict[str, Any]]] = field(default_factory=lambda: defaultdict(dict))
    # (ns, model) whose pods were listed once; uids deleted before that list, which it must not revive
    primed: set[tuple[str, str]] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    # uid -> time.monotonic() when the cached body was last observed (a watch event, a write's answer, a LIST)
    seen: dict[str, float] = field(default_factory=dict)
    # namespaces whose TritonModels were listed once (`prime_models`); while such a LIST is under way, the uids of
    # the namespace's TritonModels deleted meanwhile (the LIST may still show them)
    models_primed: set[str] = field(default_factory=set)
    models_listing: dict[str, set[str]] = field(default_factory=dict)

    def _observed(self, body: Mapping[str, Any], deleted: bool) -> None:
        uid = body["metadata"].get("uid")
        if not uid:
            return
        if deleted:
            self.seen.pop(uid, None)
        else:
            self.seen[uid] = time.monotonic()

    def model(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The cached TritonModel (a fresh copy), or None."""
        models = self.models.get(namespace)
        return models.get(name) if models is not None else None

    def put_model(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        self._observed(body, deleted)
        self.ensembles[ns].pop(name, None)
        metrics.observe_model(body, deleted)  # the model's gauges follow what is cached, and go with it
        if deleted:
            self.models[ns].pop(name, None)
            if ns in self.models_listing:
                self.models_listing[ns].add(body["metadata"].get("uid") or "")
        else:
            lean_body = lean(body)
            self.models[ns][name] = lean_body
            spec = body.get("spec")
            if isinstance(spec, Mapping) and spec.get("ensemble"):
                self.ensembles[ns][name] = lean_body

    def answered_model(self, body: Mapping[str, Any]) -> bool:
        """The API server's answer to our own write of a TritonModel (its status): kept over the same object as cached,
        unless the cache holds a newer version (the watch delivered a later write first). Returns whether the object
        is still there: False when the cache no longer holds it (or holds another of its name). An answer never
        brings back a model that is not cached: the watch may have reported it deleted while the write was on its
        way (the answer came after the DELETED event), and a model revived so stayed a member of its pool until the
        next resync, its Service and slices applied again every round (seen in the pool's benchmark: 50 pooled models
        deleted, the rounds still counted 51 models and applied 31 Services over 35 s, each taken again by the
        garbage collector)."""
        meta = body["metadata"]
        cached = self.model(meta["namespace"], meta["name"])
        if cached is None or cached["metadata"].get("uid") != meta.get("uid"):
            return False
        if not _older(body, cached):
            self.put_model(body)
        return True

    def prime_models(self, namespace: str, listed: list[dict[str, Any]]) -> None:
        """Merge a LIST of the namespace's TritonModels under what the watch has delivered (which is as new or newer),
        leaving out those deleted while it was under way (`models_listing`, set by the caller before the LIST): a
        decision over all the models of a namespace (a pool's round: what to unload) must not be taken on the part
        of them the watch's first listing has delivered so far."""
        deleted = self.models_listing.get(namespace, set())
        for body in listed:
            meta = body["metadata"]
            if meta.get("uid") not in deleted and meta["name"] not in self.models[namespace]:
                self.put_model(body)
        self.models_primed.add(namespace)

    def put_child(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        key = (body["kind"], body["metadata"]["namespace"], body["metadata"]["name"])
        self._observed(body, deleted)
        if deleted:
            self.children.pop(key, None)
        else:
            self.children[key] = lean(body)

    def put_pod(self, body: Mapping[str, Any], deleted: bool = False) -> str | None:
        meta = body["metadata"]
        model: str | None = (meta.get("labels") or {}).get(LABEL_MODEL)
        if not model:
            return None
        key = (meta["namespace"], model)
        bucket = self.pods[key]
        self._observed(body, deleted)
        if deleted:
            bucket.pop(meta["name"], None)
            if key not in self.primed:
                self.gone.add(meta["uid"])
        elif not _older(body, bucket.get(meta["name"])):
            bucket[meta["name"]] = lean(body)
        return model

    def prime_pods(self, namespace: str, model: str, listed: list[dict[str, Any]]) -> None:
        """Merge a LIST of the model's pods under what the watch has delivered (which is as new or newer)."""
        bucket = self.pods[(namespace, model)]
        for pod in listed:
            if pod["metadata"]["uid"] not in self.gone and pod["metadata"]["name"] not in bucket:
                bucket[pod["metadata"]["name"]] = lean(pod)
                self._observed(pod, deleted=False)
        self.primed.add((namespace, model))

    def forget_model(self, namespace: str, name: str, uid: str) -> bool:
        """Drop the model if the cache still holds this uid under its name (not a newer object of that name)."""
        models = self.models.get(namespace)
        if models is None or name not in models or models.uid(name) != uid:
            return False
        self.put_model(models[name], deleted=True)
        return True

    def sweep(self, namespace: str, listed: Mapping[str, set[str]], since: float) -> list[dict[str, Any]]:
        """Drops and returns the cached objects of `namespace` the API no longer has.

        `listed` holds, per kind of `api.kinds.WATCHED`, the uids LISTs returned that were sent at `since`
        (time.monotonic()). An object missing from them was deleted, unless it was observed after `since`:
        then it may be newer than the LIST, and stays.
        """
        def gone(uid: str | None, kind: str) -> bool:
            return uid not in listed[kind] and self.seen.get(uid or "", 0.0) < since

        dropped: list[dict[str, Any]] = []
        models = self.models.get(namespace)
        for name in list(models or ()):
            if models is not None and gone(models.uid(name), "TritonModel"):
                body = models[name]
                dropped.append(body)
                self.put_model(body, deleted=True)
        for key in list(self.children):
            kind, ns, _ = key
            if ns == namespace and gone(self.children.uid(key), kind):
                body = self.children[key]
                dropped.append(body)
                self.put_child(body, deleted=True)
        for (ns, _), bucket in list(self.pods.items()):
            if ns != namespace:
                continue
            for body in list(bucket.values()):
                if gone(body["metadata"].get("uid"), "Pod"):
                    dropped.append({**body, "kind": "Pod"})
                    self.put_pod(body, deleted=True)
        return dropped
