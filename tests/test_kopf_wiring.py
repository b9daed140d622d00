"""The kopf wiring in `controller.operator`: what it registers, and the diff base it replaces."""

from __future__ import annotations

import kopf
from kopf._cogs.structs import diffs

from triton_operator.api.kinds import CHILDREN
from triton_operator.controller.operator import NoEssence, build_registry


def test_every_handler_is_an_event_handler_so_no_diff_base_is_needed() -> None:
    """NoEssence is safe only while no handler reads kopf's diff: on.create/on.update/on.field handlers (changing)
    and daemons or timers (spawning, which also put a finalizer on every object) would."""
    registry = build_registry(60.0)
    watching = list(registry._watching.get_all_handlers())
    # TritonModels, each child kind, their pods; TritonPools, their pods, pooled models' EndpointSlices
    assert len(watching) == len(CHILDREN) + 2 + 3
    assert not list(registry._changing.get_all_handlers())
    assert not list(registry._spawning.get_all_handlers())


def test_the_essence_is_empty_so_kopf_copies_nothing_and_every_diff_is_empty() -> None:
    storage = NoEssence()
    body = kopf.Body({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "annotations": {"x": "1"}},
                      "data": {"k": "v" * 1000}})
    old, new = storage.fetch(body=body), storage.build(body=body)
    assert old == {} and new == {}
    assert not diffs.diff(old, new)
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=new)
    assert not patch  # nothing written on the object
