"""Autoscaling on a pool (issue 29, item 5): a pooled model's HPA of its copies and a pool's HPA of its replicas, as
rendered; the figures they read (a pooled model's copies that serve, a pool's demand from its status); and the
custom metrics API serving a pool's demand (aiohttp's test server on 127.0.0.1, the API server behind it a fake
that answers reviews and GETs: `tests/test_custom_metrics.py`'s way).

The HPAs scaling for real, in the real kube-controller-manager, against the operator's real metrics:
e2e/test_pool_autoscaling.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from tests.documents import pool_document, python_model
from triton_operator.api.kinds import LABEL_MODEL
from triton_operator.api.pool import LABEL_POOL, TritonPool
from triton_operator.api.v1alpha1 import API_VERSION, TritonModel, quantity_value
from triton_operator.plan import pool as pp
from triton_operator.plan.autoscaling import pool_demand
from triton_operator.plan.placement import PoolReplica
from triton_operator.render.autoscaling import (
    COPIES_INFLIGHT,
    COPIES_QUEUE_TIME,
    POOL_DEMAND,
    RATE,
    quantity,
)
from triton_operator.render.pool import render_model_hpa, render_pool_hpa
from triton_operator.servers.custom_metrics import PREFIX, SERVED, CustomMetricsApi, pooled_copies

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
GIB = 1 << 30


def _model(**autoscaling: Any) -> TritonModel:
    return TritonModel.model_validate(python_model("m", pool="p", memory="1Gi", autoscaling={
        "minReplicas": 1, "maxReplicas": 3, **autoscaling}))


# -- the HPAs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("target", "metric", "value"), [
    ({"queueTimeMilliseconds": 20}, COPIES_QUEUE_TIME, "20"),
    ({"inflightRequests": 2.5}, COPIES_INFLIGHT, "2500m"),
    ({"inferencesPerSecond": 100}, RATE, "100"),
])
def test_a_pooled_models_hpa_scales_its_copies_on_an_average_of_its_total(target: dict[str, float], metric: str,
                                                                           value: str) -> None:
    hpa = render_model_hpa(_model(target=target, behavior={"scaleDown": {"stabilizationWindowSeconds": 5}}),
                           "uid-m", "ns")
    ref = {"apiVersion": API_VERSION, "kind": "TritonModel", "name": "m"}
    assert hpa["metadata"]["name"] == "m" and hpa["metadata"]["namespace"] == "ns"
    # Labelled with its pool: the pool's reconcile applies it, and the watch hands its events to that reconcile.
    assert hpa["metadata"]["labels"][LABEL_POOL] == "p" and hpa["metadata"]["labels"][LABEL_MODEL] == "m"
    assert hpa["metadata"]["ownerReferences"][0] == {"apiVersion": API_VERSION, "kind": "TritonModel",
                                                     "name": "m", "uid": "uid-m", "controller": True,
                                                     "blockOwnerDeletion": True}
    assert hpa["spec"] == {
        "scaleTargetRef": ref, "minReplicas": 1, "maxReplicas": 3,
        "metrics": [{"type": "Object", "object": {"describedObject": ref, "metric": {"name": metric},
                                                  "target": {"type": "AverageValue", "averageValue": value}}}],
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 5}},
    }


def test_the_pools_hpa_is_named_as_its_deployment_and_keeps_the_free_fraction_per_replica() -> None:
    pool = TritonPool.model_validate(pool_document("p", autoscaling={"minReplicas": 2, "maxReplicas": 5,
                                                                     "targetFreeFraction": 0.25}))
    hpa = render_pool_hpa(pool, "uid-p", "ns")
    ref = {"apiVersion": API_VERSION, "kind": "TritonPool", "name": "p"}
    assert hpa["metadata"]["name"] == "p-pool", "apart from a pooled model's HPA, which is named after the model"
    assert hpa["metadata"]["labels"][LABEL_POOL] == "p" and LABEL_MODEL not in hpa["metadata"]["labels"]
    assert hpa["metadata"]["ownerReferences"][0]["kind"] == "TritonPool"
    assert hpa["spec"] == {
        "scaleTargetRef": ref, "minReplicas": 2, "maxReplicas": 5,
        "metrics": [{"type": "Object", "object": {"describedObject": ref, "metric": {"name": POOL_DEMAND},
                                                  "target": {"type": "AverageValue", "averageValue": str(3 * GIB)}}}],
    }


def _hpa_desired(usage: str, average_target: str, status_replicas: int, tolerance: float = 0.1) -> int:
    """The HPA controller's replica count for an Object metric with an AverageValue target (Kubernetes'
    GetObjectPerPodMetricReplicas, in milli-units): the total over the target, unless within the tolerance."""
    usage_m, target_m = int(quantity_value(usage) * 1000), int(quantity_value(average_target) * 1000)
    ratio = usage_m / (target_m * status_replicas)
    return status_replicas if abs(1 - ratio) <= tolerance else math.ceil(usage_m / target_m)


def test_a_pooled_models_queue_time_asks_for_what_a_value_target_over_its_copies_would() -> None:
    """A model's own HPA: desired = ready replicas x measured / target. A pooled model's: its queue time times the
    copies measured, over the target: the same figure with every placed copy measured."""
    target = render_model_hpa(_model(target={"queueTimeMilliseconds": 20}), "u", "ns")["spec"]["metrics"][0]
    average = target["object"]["target"]["averageValue"]
    for copies, queue_ms in ((1, 50.0), (2, 35.0), (3, 4.0), (2, 21.0)):
        value_target = copies if abs(1 - queue_ms / 20) <= 0.1 else math.ceil(copies * queue_ms / 20)
        assert _hpa_desired(quantity(queue_ms * copies), average, copies) == value_target, (copies, queue_ms)


# -- what the metrics are computed from ---------------------------------------------------------------------------


def _endpoint(pod: str, ip: str, ready: bool) -> dict[str, Any]:
    return {"addresses": [ip], "conditions": {"ready": ready, "serving": ready, "terminating": False},
            "targetRef": {"kind": "Pod", "namespace": "ns", "name": pod, "uid": f"u-{pod}"}}


def test_a_pooled_models_replicas_are_its_placed_copies_that_its_slices_list_ready() -> None:
    body = {"metadata": {"name": "m"}, "spec": {"pool": "p", "modelName": "m_in_triton"},
            "status": {"placement": ["r1", "r2", "r3"]}}
    slices = [{"endpoints": [_endpoint("r1", "198.18.0.1", True), _endpoint("r2", "198.18.0.2", False),
                             _endpoint("r9", "198.18.0.9", True)]},  # r9: not placed (a slice behind the status)
              {"endpoints": [_endpoint("r1", "198.18.0.1", True)]}]
    copies = pooled_copies(body, slices)
    assert [(c.name, c.uid, c.ip, c.triton_name, c.warmed) for c in copies] == [
        ("r1", "u-r1", "198.18.0.1", "m_in_triton", True),
        ("r2", "u-r2", "198.18.0.2", "m_in_triton", False),  # placed, listed, not ready: not counted
    ]  # r3: placed, no endpoint yet (no IP): nothing to read
    assert pooled_copies({**body, "status": {}}, slices) == []


def _world(copies: int) -> tuple[Any, ...]:
    bodies = {n: {**python_model(n, pool="p", memory="3Gi", replicas=copies),
                  "metadata": {"name": n, "namespace": "ns", "uid": f"uid-{n}", "generation": 1}} for n in "ab"}
    members = pp.members("p", bodies)
    pool = TritonPool.model_validate(pool_document("p"))  # 2 replicas of 4Gi
    live = [PoolReplica("r1", "n1"), PoolReplica("r2", "n2")]
    return members, pool, live, pp.placement_of(pool, live, members)


def _pool_status(copies: int) -> dict[str, Any]:
    _, pool, live, placement = _world(copies)
    pods = {r.name: pp.ReplicaPod.of({"metadata": {"name": r.name, "uid": r.name}, "spec": {"nodeName": r.node},
                                      "status": {"podIP": "198.18.0.1",
                                                 "conditions": [{"type": "Ready", "status": "True"}]}})
            for r in live}
    return pp.pool_status(pool, {"metadata": {"generation": 1}}, live, pods, placement, {}, 0, 0, "x=y", NOW)


def test_the_pool_status_says_what_fits_no_replica_and_the_most_copies_a_model_wants() -> None:
    fits = _pool_status(copies=1)  # a on one replica, b on the other: 3Gi of 4Gi each
    assert (fits["used"], fits["unplaced"], fits["mostCopies"]) == ("6Gi", "0", 1)
    short = _pool_status(copies=2)  # two copies each of 3Gi on replicas of 4Gi: one copy per replica fits
    assert (short["used"], short["unplaced"], short["mostCopies"]) == ("6Gi", "6Gi", 2)


def test_a_pool_demands_what_is_placed_and_what_fits_nowhere_and_a_replica_per_copy_of_its_widest_model() -> None:
    target = 3 * GIB
    assert pool_demand({}, target) is None, "no figure before the operator wrote the status"
    assert pool_demand(_pool_status(copies=1), target) == 6 * GIB
    assert pool_demand(_pool_status(copies=2), target) == 12 * GIB
    # Small models of 3 copies on 2 replicas: little memory, yet 3 replicas' worth of demand.
    assert pool_demand({"used": "256Mi", "unplaced": "128Mi", "mostCopies": 3}, target) == 9 * GIB
    # What the pool's HPA asks for with those figures, 2 replicas of 4Gi kept a quarter free (3Gi each).
    assert _hpa_desired(quantity(12 * GIB), quantity(target), 2) == 4
    assert _hpa_desired(quantity(9 * GIB), quantity(target), 2) == 3
    assert _hpa_desired(quantity(6 * GIB), quantity(target), 2) == 2


def test_a_pooled_models_status_selects_no_pod_of_the_pool() -> None:
    """The HPA requires a selector on the scale subresource, and refuses to scale when two HPAs' selectors match the
    same pods: a pooled model's is its own label, which no pool replica carries (they are the pool's HPA's)."""
    members, _, _, placement = _world(1)
    status = pp.model_status(members["a"], "p", True, placement, set(), {}, NOW)
    assert status.selector == f"{LABEL_MODEL}=a"
    assert status.replicas == 1, "the scale subresource's status.replicas: the copies placed"


# -- the custom metrics API ---------------------------------------------------------------------------------------


POOLS = f"{PREFIX}/namespaces/ns/tritonpools.serving.triton-operator.dev"


class FakeKube:
    """Every review allowed; TritonPools: `pools` (name -> body)."""

    def __init__(self, pools: dict[str, dict[str, Any]]) -> None:
        self.pools = pools

    def review(self, group_version: str, plural: str, spec: dict[str, Any]) -> dict[str, Any]:
        if plural == "tokenreviews":
            return {"authenticated": True, "user": {"username": "hpa"}}
        return {"allowed": True}

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert kind == "TritonPool", kind
        return self.pools.get(name)

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str | None = None) -> list[dict]:
        assert kind == "TritonPool", kind
        return list(self.pools.values())


def _get_all(kube: FakeKube, paths: list[str]) -> list[tuple[int, dict[str, Any]]]:
    async def run() -> list[tuple[int, dict[str, Any]]]:
        api = CustomMetricsApi(kube, lambda ns: True)  # type: ignore[arg-type]
        app = web.Application()
        api.routes(app)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with ClientSession() as session:
                out = []
                for path in paths:
                    async with session.get(str(server.make_url(path)), headers={"Authorization": "Bearer t"}) as r:
                        out.append((r.status, await r.json()))
                return out
        finally:
            await api.stop()
            await server.close()

    return asyncio.run(run())


def test_the_api_serves_a_pools_demand_from_its_status_and_lists_it() -> None:
    scaled = pool_document("p", autoscaling={"maxReplicas": 4, "targetFreeFraction": 0.25})
    pools = {"p": {**scaled, "status": {"used": "6Gi", "unplaced": "6Gi", "mostCopies": 2}},
             "fresh": pool_document("fresh")}  # no status yet
    (discovery, one, everyone, fresh, missing, wrong) = _get_all(FakeKube(pools), [
        PREFIX, f"{POOLS}/p/{POOL_DEMAND}", f"{POOLS}/*/{POOL_DEMAND}", f"{POOLS}/fresh/{POOL_DEMAND}",
        f"{POOLS}/nope/{POOL_DEMAND}", f"{POOLS}/p/{COPIES_QUEUE_TIME}"])
    names = {r["name"] for r in discovery[1]["resources"]}
    assert f"tritonpools.serving.triton-operator.dev/{POOL_DEMAND}" in names
    assert {f"tritonmodels.serving.triton-operator.dev/{m}" for m in (COPIES_QUEUE_TIME, COPIES_INFLIGHT)} <= names
    assert len(names) == sum(len(m) for m in SERVED.values())
    assert one[0] == 200, one
    (item,) = one[1]["items"]
    assert item["describedObject"] == {"kind": "TritonPool", "namespace": "ns", "name": "p",
                                       "apiVersion": API_VERSION}
    assert item["metric"]["name"] == POOL_DEMAND and quantity_value(item["value"]) == 12 * GIB
    assert [i["describedObject"]["name"] for i in everyone[1]["items"]] == ["p"], "no figure for a fresh pool"
    assert fresh[0] == 404 and "not written its status" in fresh[1]["message"], fresh
    assert missing[0] == 404, missing
    assert wrong[0] == 404 and POOL_DEMAND in wrong[1]["message"], wrong
