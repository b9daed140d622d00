"""The gauges of the objects the leader caches (`controller.metrics`, issue 43): each TritonModel's Ready condition and
queue-time autoscaling target, each TritonPool's unplaced memory. Set from every body the cache takes, and gone the
moment it drops one, whichever way: a DELETED event, the resync's sweep, `forget_model`; never brought back by the
late answer to a write. Read from prometheus-client's registry, as the scrape reads them."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import REGISTRY

from triton_operator.api.kinds import WATCHED
from triton_operator.controller import metrics
from triton_operator.controller.cache import Cache
from triton_operator.controller.pool import PoolReconciler

NS = "gauges-ns"  # a namespace of this file's own: the registry is the process's


def _ready(name: str, ns: str = NS) -> float | None:
    return REGISTRY.get_sample_value("triton_operator_model_ready", {"object_namespace": ns, "tritonmodel": name})


def _target(name: str, ns: str = NS) -> float | None:
    return REGISTRY.get_sample_value("triton_operator_model_queue_time_target_seconds",
                                     {"object_namespace": ns, "tritonmodel": name})


def _unplaced(name: str, ns: str = NS) -> float | None:
    return REGISTRY.get_sample_value("triton_operator_pool_unplaced_bytes", {"object_namespace": ns, "tritonpool": name})


def _model(name: str, uid: str, rv: str = "1", ready: str | None = None, target: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "TritonModel", "metadata": {"name": name, "namespace": NS, "uid": uid,
                                                                "resourceVersion": rv}, "spec": {}}
    if target is not None:
        body["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 3, "target": target}
    if ready is not None:
        body["status"] = {"conditions": [{"type": "Progressing", "status": "True"},
                                         {"type": "Ready", "status": ready, "reason": "Why"}]}
    return body


def test_a_models_ready_gauge_follows_its_condition_and_goes_with_the_model() -> None:
    cache = Cache()
    cache.put_model(_model("m", "um"))
    assert _ready("m") == 0.0, "no status yet: not Ready"
    cache.put_model(_model("m", "um", "2", ready="True"))
    assert _ready("m") == 1.0
    cache.put_model(_model("m", "um", "3", ready="Unknown"))
    assert _ready("m") == 0.0
    cache.put_model(_model("m", "um", "4", ready="False"), deleted=True)
    assert _ready("m") is None


def test_the_queue_time_target_is_exported_only_while_the_model_autoscales_on_it() -> None:
    cache = Cache()
    cache.put_model(_model("q", "uq", target={"queueTimeMilliseconds": 250}))
    assert _target("q") == 0.25
    cache.put_model(_model("q", "uq", "2", target={"queueTimeMilliseconds": 7.5}))
    assert _target("q") == 0.0075
    cache.put_model(_model("q", "uq", "3", target={"inflightRequests": 2}))
    assert _target("q") is None and _ready("q") == 0.0
    cache.put_model(_model("q", "uq", "4", target={"queueTimeMilliseconds": 40}))
    cache.put_model(_model("q", "uq", "5"))  # autoscaling removed
    assert _target("q") is None
    cache.put_model(_model("q", "uq", "6", target={"queueTimeMilliseconds": 40}))
    cache.put_model(_model("q", "uq", "6", target={"queueTimeMilliseconds": 40}), deleted=True)
    assert _target("q") is None and _ready("q") is None


def test_a_model_the_sweep_or_forget_drops_loses_its_series_and_a_late_answer_does_not_bring_it_back() -> None:
    cache = Cache()
    cache.put_model(_model("kept", "uk", ready="True"))
    cache.put_model(_model("swept", "us", ready="True", target={"queueTimeMilliseconds": 10}))
    cache.put_model(_model("forgotten", "uf", ready="False"))
    listed: dict[str, set[str]] = {k.kind: set() for k in WATCHED} | {"TritonModel": {"uk", "uf"}}
    dropped = cache.sweep(NS, listed, time.monotonic())
    assert [d["metadata"]["name"] for d in dropped] == ["swept"]
    assert _ready("swept") is None and _target("swept") is None and _ready("kept") == 1.0
    assert cache.forget_model(NS, "forgotten", "uf") and _ready("forgotten") is None
    # the answer to a status write sent before the deletion, arriving after it
    assert not cache.answered_model(_model("forgotten", "uf", "9", ready="True"))
    assert _ready("forgotten") is None


def test_a_pools_unplaced_gauge_follows_its_status_and_goes_with_the_pool() -> None:
    pools = PoolReconciler(object(), Cache())  # type: ignore[arg-type]  # put_pool talks to no API server

    def pool(status: dict[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "TritonPool", "metadata": {"name": "p", "namespace": NS, "uid": "up"}}
        return body | ({"status": status} if status is not None else {})

    pools.put_pool(pool(None))
    assert _unplaced("p") is None, "no status written yet: no figure"
    pools.put_pool(pool({"unplaced": "256Mi", "used": "0"}))
    assert _unplaced("p") == 256 * 2**20
    pools.put_pool(pool({"unplaced": "0"}))
    assert _unplaced("p") == 0.0
    pools.put_pool(pool({"unplaced": "lots"}))
    assert _unplaced("p") is None, "not a quantity: no figure rather than a wrong one"
    pools.put_pool(pool({"unplaced": "1536Mi"}))
    pools.put_pool(pool({"unplaced": "1536Mi"}), deleted=True)
    assert _unplaced("p") is None


def test_a_new_cache_starts_without_series() -> None:
    """A replica that starts again in the same process (tests do) exports what its new cache holds, nothing older."""
    Cache().put_model(_model("old", "uo", ready="True"))
    assert _ready("old") == 1.0
    metrics.forget_objects()
    assert _ready("old") is None
    families = {f.name for f in REGISTRY.collect()}
    assert {"triton_operator_model_ready", "triton_operator_model_queue_time_target_seconds",
            "triton_operator_pool_unplaced_bytes"} <= families, "the families are served empty"


def test_a_pool_deleted_while_the_watch_was_down_is_forgotten_at_the_resync_with_its_gauge() -> None:
    """`PoolReconciler.resync`: a pool the LIST no longer shows is dropped (its round requested: its models say
    PoolNotFound) and its gauge goes; one the LIST shows stays, and so does one created while the LIST was under way."""
    import asyncio

    def pool(name: str) -> dict[str, Any]:
        return {"kind": "TritonPool", "metadata": {"name": name, "namespace": NS, "uid": f"u-{name}"},
                "status": {"unplaced": "64Mi"}}

    class Kube:
        def list_uids(self, api_version: str, kind: str, namespace: str, label_selector: str | None = None) -> set[str]:
            assert (api_version, kind, namespace) == ("serving.triton-operator.dev/v1alpha1", "TritonPool", NS)
            pools.put_pool(pool("new"))  # the watch delivers a new pool while this LIST is under way
            return {"u-kept"}

    pools = PoolReconciler(Kube(), Cache())  # type: ignore[arg-type]
    requested: list[tuple[str, str]] = []
    pools.request = lambda namespace, name: requested.append((namespace, name))  # type: ignore[method-assign]
    pools.put_pool(pool("kept"))
    pools.put_pool(pool("gone"))
    asyncio.run(pools.resync())
    assert sorted(name for _, name in pools.pools) == ["kept", "new"]
    assert requested == [(NS, "gone")]
    assert _unplaced("gone") is None and _unplaced("kept") == 64 * 2**20
