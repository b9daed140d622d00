"""The world the planner's tests are written in: TritonModel bodies (`_body`), a `World` around one (`_world`), and a
small in-memory API server (`_Api`) that stands in for the cluster only to carry plans out; `_settle` does what
`Reconciler._reconcile` does with a plan. Used by tests/test_planner.py and tests/test_rollout.py."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from triton_operator.plan.planner import Plan, World, carried_out, differs, plan

NS = "team-a"
UID = "00000000-0000-0000-0000-00000000000a"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _body(name: str = "m", uid: str = UID, *, status: dict[str, Any] | None = None, generation: int = 1,
          **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "serving.triton-operator.dev/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "generation": generation},
        "spec": {"backend": "python", "source": {"inline": {"model.py": "pass\n"}}, **spec},
    }
    if status is not None:
        body["status"] = status
    return body


def _world(body: Mapping[str, Any], *, models: Mapping[str, Mapping[str, Any]] | None = None,
           children: Mapping[tuple[str, str], Any] | None = None, pods: list[dict[str, Any]] | None = None,
           now: dt.datetime = T0, **kw: Any) -> World:
    return World(body=body, models={body["metadata"]["name"]: body, **(models or {})}, children=children or {},
                 pods=pods or [], now=now, **kw)


class _Api:
    """Objects by (kind, name), as a server-side apply leaves them: what was applied plus server fields."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.writes += 1
        key = (obj["kind"], obj["metadata"]["name"])
        stored = copy.deepcopy(dict(obj))
        stored["metadata"] = {**stored["metadata"], "uid": f"uid-{key[0]}-{key[1]}", "resourceVersion": str(self.writes)}
        stored.setdefault("status", {})  # the server adds fields the desired object never names
        self.objects[key] = stored
        return stored

    def delete(self, kind: str, name: str) -> None:
        self.writes += 1
        self.objects.pop((kind, name), None)


def _settle(world: World, api: _Api, cache: dict[tuple[str, str], Any]) -> tuple[World, Plan]:
    """What `Reconciler._reconcile` does: plan, do the reads it asks for (from `api`) and plan again; carry the
    applies out (a `verify` one read from `api` first, applied only if it differs) and the deletes; plan once
    more over the result for the status. Returns the world the cache then shows, and the status plan."""
    decided = plan(world)
    if decided.reads:
        world = replace(world, replicasets=[o for (k, _), o in api.objects.items() if k == "ReplicaSet"])
        decided = plan(world)
    children = dict(world.children)
    for a in decided.apply:
        key = (a.obj["kind"], a.obj["metadata"]["name"])
        if a.verify:
            children[key] = api.objects.get(key)
            if not differs(children[key], a.obj):
                continue
        children[key] = api.apply(a.obj)
    for d in decided.delete:
        api.delete(d.kind, d.name)
        children.pop((d.kind, d.name), None)
    after = plan(replace(world, children=children))
    settled = carried_out(replace(world, children=children), replace(after, apply=(), delete=()))
    cache.clear()
    cache.update({k: v for k, v in settled.children.items() if v is not None})
    return replace(settled, replicasets=None), replace(after, apply=decided.apply, delete=decided.delete)


def _conditions(decided: Plan) -> dict[str, Any]:
    assert decided.status is not None
    return {c.type: c for c in decided.status.conditions or ()}
