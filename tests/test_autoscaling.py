"""Autoscaling (issue 16): spec.autoscaling, the HPA it renders, the window metrics and Triton's counters.

The metrics API itself, the HPA controller and the scaling run on the real node (e2e/test_autoscaling.py).
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from multidict import CIMultiDict

from tests.timing import scaled
from tests.triton_helpers import SLOW, models_from_yaml, serve, tensor
from triton_operator.api.crd import crd
from triton_operator.api.v1alpha1 import API_VERSION, TritonModel
from triton_operator.plan.autoscaling import Counters, Sample, delta, model_metrics, replica_metrics, trim
from triton_operator.plan.planner import World, plan
from triton_operator.plan.upgrade import Upgrades, bound_deployment, source_digest
from triton_operator.render.autoscaling import COPIES_INFLIGHT, COPIES_QUEUE_TIME, INFLIGHT, QUEUE_TIME, RATE, quantity
from triton_operator.render.kubernetes import Options, render_children
from triton_operator.render.modelconfig import render_repository
from triton_operator.servers.custom_metrics import FrontProxy
from triton_operator.triton.stats import model_counters
from triton_operator.validate import Document, check_documents

MS = 1_000_000


def _body(autoscaling: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "TritonModel",
                            "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": 1},
                            "spec": {"backend": "python", "source": {"inline": {"model.py": "pass\n"}}, **spec}}
    if autoscaling is not None:
        body["spec"]["autoscaling"] = autoscaling
    return body


def _children(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    model = TritonModel.model_validate(body)
    return {c["kind"]: c for c in render_children(model, render_repository([model]), "u1", "ns", Options())}


# -- the spec and the HPA it renders ----------------------------------------------------------------------------


def test_a_queue_time_target_renders_an_hpa_of_the_tritonmodel_on_its_own_object_metric() -> None:
    behavior = {"scaleDown": {"stabilizationWindowSeconds": 10}}
    hpa = _children(_body({"minReplicas": 1, "maxReplicas": 3, "target": {"queueTimeMilliseconds": 20},
                           "behavior": behavior}))["HorizontalPodAutoscaler"]
    ref = {"apiVersion": API_VERSION, "kind": "TritonModel", "name": "m"}
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "u1" and hpa["metadata"]["ownerReferences"][0]["controller"]
    assert hpa["spec"] == {
        "scaleTargetRef": ref, "minReplicas": 1, "maxReplicas": 3, "behavior": behavior,
        "metrics": [{"type": "Object", "object": {"describedObject": ref, "metric": {"name": QUEUE_TIME},
                                                  "target": {"type": "Value", "value": "20"}}}]}


def test_the_rate_target_is_per_replica_and_fractions_stay_exact() -> None:
    hpa = _children(_body({"maxReplicas": 4, "target": {"inferencesPerSecond": 12.5}}))["HorizontalPodAutoscaler"]
    assert hpa["spec"]["minReplicas"] == 1 and "behavior" not in hpa["spec"]
    assert hpa["spec"]["metrics"][0]["object"]["metric"] == {"name": RATE}
    assert hpa["spec"]["metrics"][0]["object"]["target"] == {"type": "AverageValue", "averageValue": "12500m"}
    inflight = _children(_body({"maxReplicas": 4, "target": {"inflightRequests": 2}}))["HorizontalPodAutoscaler"]
    assert inflight["spec"]["metrics"][0]["object"]["target"] == {"type": "Value", "value": "2"}
    assert [quantity(v) for v in (0, 0.0004, 0.25, 3, 1234.5678, 1500, 2000, 12.5, 3_000_000)] == [
        "0", "0", "250m", "3", "1234568m", "1500", "2k", "12500m", "3M"]


def test_without_autoscaling_no_hpa_and_one_left_over_is_deleted() -> None:
    assert "HorizontalPodAutoscaler" not in _children(_body())
    with_hpa = _body({"maxReplicas": 3, "target": {"queueTimeMilliseconds": 20}})
    hpa = _children(with_hpa)["HorizontalPodAutoscaler"]
    world = World(body=_body(), models={"m": _body()}, children={("HorizontalPodAutoscaler", "m"): hpa}, pods=(),
                  now=dt.datetime.now(dt.UTC))
    deletes = [(d.kind, d.name) for d in plan(world).delete]
    assert ("HorizontalPodAutoscaler", "m") in deletes
    theirs = copy.deepcopy(hpa)
    theirs["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    world = World(body=_body(), models={"m": _body()}, children={("HorizontalPodAutoscaler", "m"): theirs}, pods=(),
                  now=dt.datetime.now(dt.UTC))
    assert ("HorizontalPodAutoscaler", "m") not in [(d.kind, d.name) for d in plan(world).delete]


@pytest.mark.parametrize(("autoscaling", "path", "says"), [
    ({"minReplicas": 4, "maxReplicas": 2, "target": {"queueTimeMilliseconds": 20}}, "spec.autoscaling.minReplicas",
     "must be <= maxReplicas (2), got 4"),
    ({"maxReplicas": 2, "target": {"queueTimeMilliseconds": 20, "inflightRequests": 2}}, "spec.autoscaling.target",
     "set exactly one of"),
    ({"maxReplicas": 2, "target": {}}, "spec.autoscaling.target", "got none"),
])
def test_render_refuses_a_bad_autoscaling_block_naming_the_field(autoscaling: dict, path: str, says: str) -> None:
    errors = check_documents([Document("m.yaml#0", _body(autoscaling))]).errors
    assert [(e.path, says in e.message) for e in errors] == [(path, True)], errors


def test_the_crd_refuses_the_same_at_apply() -> None:
    props = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    auto = props["autoscaling"]
    assert "self.minReplicas <= self.maxReplicas" in [r["rule"] for r in auto["x-kubernetes-validations"]]
    assert auto["required"] == ["maxReplicas", "target"]
    assert ".size() == 1" in auto["properties"]["target"]["x-kubernetes-validations"][0]["rule"]
    assert auto["properties"]["behavior"]["x-kubernetes-preserve-unknown-fields"] is True


# -- the window -------------------------------------------------------------------------------------------------


def _s(at: float, requests: int, queue_ms: float, request_ms: float) -> Sample:
    return Sample(at, Counters(requests=requests, request_ns=int(request_ms * MS), queued=requests,
                               queue_ns=int(queue_ms * MS)))


def test_the_model_metrics_combine_every_replicas_window() -> None:
    # Replica a: 100 requests in 10 s, 30 ms queued each, 50 ms in Triton each. Replica b: 300, 10 ms, 20 ms.
    a = [_s(0, 0, 0, 0), _s(10, 100, 3000, 5000)]
    b = [_s(0, 1000, 99, 99), _s(10, 1300, 99 + 3000, 99 + 6000)]
    da, db = delta(a, 10), delta(b, 10)
    assert da is not None and db is not None
    assert replica_metrics(da) == pytest.approx({QUEUE_TIME: 30.0, INFLIGHT: 0.5, RATE: 10.0})
    assert replica_metrics(db) == pytest.approx({QUEUE_TIME: 10.0, INFLIGHT: 0.6, RATE: 30.0})
    # Queue time: per request over both (6000 ms / 400); in flight: the mean per replica; rate: the total.
    # And for a pooled model's HPA, the first two times the replicas measured (the queue time) or summed (in flight).
    assert model_metrics([da, db]) == pytest.approx({QUEUE_TIME: 15.0, INFLIGHT: 0.55, RATE: 40.0,
                                                     COPIES_QUEUE_TIME: 30.0, COPIES_INFLIGHT: 1.1})
    assert model_metrics([]) is None


def test_the_window_slides_and_a_restarted_replica_counts_only_since_its_restart() -> None:
    samples = [_s(0, 0, 0, 0), _s(20, 1000, 100_000, 100_000), _s(40, 1010, 100_010, 100_020),
               _s(50, 1020, 100_020, 100_040)]
    d = delta(samples, now=50, window=30)  # from the sample at 20 (the one just before the window) to 50
    assert d is not None and (d.seconds, d.counters.requests) == (30, 20)
    assert trim(samples, now=50, window=30) == samples[1:]
    restarted = [*samples, _s(52, 5, 50, 60), _s(54, 15, 150, 160)]  # the counters start again after 50
    d = delta(restarted, now=54, window=30)
    assert d is not None and (d.seconds, d.counters.requests, d.counters.queue_ns) == (2, 10, 100 * MS)
    assert delta(restarted[:1], now=0) is None and delta([], now=0) is None
    idle = delta([_s(0, 5, 5, 5), _s(10, 5, 5, 5)], now=10)
    assert idle is not None and replica_metrics(idle) == {QUEUE_TIME: 0.0, INFLIGHT: 0.0, RATE: 0.0}


# -- who may ask ------------------------------------------------------------------------------------------------


def test_the_front_proxy_headers_count_only_from_an_allowed_certificate_name() -> None:
    proxy = FrontProxy.from_configmap({
        "requestheader-client-ca-file": "PEM", "requestheader-allowed-names": '["front-proxy-client"]',
        "requestheader-username-headers": '["X-Remote-User"]', "requestheader-group-headers": '["X-Remote-Group"]',
        "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]'})
    headers = CIMultiDict([("X-Remote-User", "system:serviceaccount:kube-system:horizontal-pod-autoscaler"),
                           ("X-Remote-Group", "system:serviceaccounts"), ("X-Remote-Group", "system:serviceaccounts:kube-system"),
                           ("X-Remote-Extra-Authentication.kubernetes.io%2fpod-name", "p")])
    user = proxy.user("front-proxy-client", headers)
    assert user is not None and user.name == "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
    assert user.groups == ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated")
    assert user.extra == (("authentication.kubernetes.io/pod-name", ("p",)),)
    assert proxy.user("kubelet", headers) is None, "a certificate of the same CA with another name"
    nobody = CIMultiDict([("X-Remote-Group", "system:masters")])
    assert proxy.user("front-proxy-client", nobody) is None, "no user header: nobody to vouch for"


# -- Triton's counters, from a real tritonserver ----------------------------------------------------------------

@pytest.mark.triton
def test_triton_counters_show_the_queue_time_and_the_concurrency_of_a_loaded_model(tmp_path: Path) -> None:
    with serve(models_from_yaml(SLOW), tmp_path / "repo") as served:
        address = served.server.http_url
        before = asyncio.run(model_counters(address, "slow"))
        start = time.monotonic()

        def call(_: int) -> None:
            served.client.infer("slow", [tensor("SECONDS", np.array([0.02], dtype=np.float32))])

        with ThreadPoolExecutor(max_workers=4) as pool:  # 4 at once on one instance of 20 ms: they queue
            list(pool.map(call, range(80)))
        seconds = time.monotonic() - start
        # Triton counts a request once it has released it, a moment after its response went out: a read right after
        # the last answer may miss it (CI saw 79 of 80 once, on a loaded machine).
        deadline = time.monotonic() + scaled(5)
        after = asyncio.run(model_counters(address, "slow"))
        while (after - before).requests < 80 and time.monotonic() < deadline:
            time.sleep(0.05)
            after = asyncio.run(model_counters(address, "slow"))
    d = after - before
    got = replica_metrics(delta([Sample(0, before), Sample(seconds, after)], seconds) or pytest.fail("no delta"))
    assert d.requests == 80 and d.queued == 80, d
    # 4 requests at once on one instance: each waits for about 3 others (60 ms); Triton holds ~4 at any moment.
    assert got[QUEUE_TIME] > 20, got
    assert 2.5 < got[INFLIGHT] <= 4.5, got
    assert got[RATE] == pytest.approx(80 / seconds)


def test_millicores_are_a_resource_quantity_and_reach_the_container() -> None:
    """A CPU request such as `200m` (what a CPU-utilisation HPA divides by) was refused by the schema before."""
    body = _body(server={"resources": {"requests": {"cpu": "200m", "memory": "1.5Gi"}, "limits": {"cpu": "2"}}})
    assert not check_documents([Document("m.yaml#0", body)]).errors
    pod = _children(body)["Deployment"]["spec"]["template"]["spec"]
    triton = next(c for c in pod["containers"] if c["name"] == "tritonserver")
    assert triton["resources"]["requests"] == {"cpu": "200m", "memory": "1.5Gi"}
    assert triton["resources"]["limits"]["cpu"] == "2"
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["server"]
    pattern = schema["properties"]["resources"]["properties"]["requests"]["additionalProperties"]["pattern"]
    assert all(re.match(pattern, q) for q in ("200m", "2", "8Gi", "1.5G", "100k"))
    assert not any(re.match(pattern, q) for q in ("200 m", "-1", "1x", "m"))


def test_an_hpa_as_the_api_server_stores_it_is_not_applied_again() -> None:
    """The API server fills in behavior's defaults and writes quantities canonically: a converged model's reconcile
    must find nothing to write (else it would apply the HPA on every round)."""
    body = _body({"maxReplicas": 3, "target": {"inferencesPerSecond": 2000},
                  "behavior": {"scaleDown": {"stabilizationWindowSeconds": 20}}})
    children = _children(body)
    stored = copy.deepcopy(children["HorizontalPodAutoscaler"])
    stored["metadata"].update({"uid": "h1", "resourceVersion": "7", "managedFields": [{"manager": "triton-operator"}]})
    stored["spec"]["behavior"] = {
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15}, {"type": "Percent", "value": 100, "periodSeconds": 15}]},
        "scaleDown": {"stabilizationWindowSeconds": 20, "selectPolicy": "Max",
                      "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}}
    assert stored["spec"]["metrics"][0]["object"]["target"]["averageValue"] == "2k", "the API server's own text"
    stored["status"] = {"currentReplicas": 1, "desiredReplicas": 1}
    # The Deployment as the operator applied it: with its record of what it was rendered from (`plan.upgrade`).
    now = dt.datetime.now(dt.UTC)
    children["Deployment"], _ = bound_deployment(children["Deployment"], None, body, source_digest(body, {"m": body}),
                                                 Upgrades(), now)
    world = World(body=body, models={"m": body}, children={(c["kind"], c["metadata"]["name"]): (
        stored if c["kind"] == "HorizontalPodAutoscaler" else c) for c in children.values()}, pods=(), now=now)
    assert [a.obj["kind"] for a in plan(world).apply] == [], "a converged model applies nothing"


def test_an_hpa_status_update_alone_asks_for_no_reconcile() -> None:
    from triton_operator.controller.operator import status_only

    hpa = _children(_body({"maxReplicas": 3, "target": {"queueTimeMilliseconds": 20}}))["HorizontalPodAutoscaler"]
    hpa["metadata"]["generation"] = 1
    synced = copy.deepcopy(hpa) | {"status": {"currentReplicas": 2, "desiredReplicas": 3}}
    assert status_only(hpa, synced, "MODIFIED"), "the HPA controller's sync: nothing the plan reads"
    edited = copy.deepcopy(synced)
    edited["metadata"]["generation"] = 2  # someone changed its spec: the reconcile puts ours back
    assert not status_only(hpa, edited, "MODIFIED")
    assert not status_only(hpa, synced, "DELETED") and not status_only(None, synced, "ADDED")
    deployment = _children(_body())["Deployment"]
    assert not status_only(deployment, copy.deepcopy(deployment) | {"status": {"readyReplicas": 1}}, "MODIFIED")


def test_a_change_of_the_hpas_scaling_active_asks_for_a_reconcile() -> None:
    """The model's status restates the HPA's ScalingActive: a sync that flips it is news, one that keeps it is not."""
    from triton_operator.controller.operator import status_only

    hpa = _children(_body({"maxReplicas": 3, "target": {"queueTimeMilliseconds": 20}}))["HorizontalPodAutoscaler"]
    hpa["metadata"]["generation"] = 1
    active = copy.deepcopy(hpa) | {"status": {"conditions": [
        {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound", "message": "ok"}]}}
    failing = copy.deepcopy(hpa) | {"status": {"conditions": [
        {"type": "ScalingActive", "status": "False", "reason": "FailedGetObjectMetric", "message": "not found"}]}}
    assert not status_only(hpa, active, "MODIFIED"), "its first ScalingActive"
    assert not status_only(active, failing, "MODIFIED"), "the metric went away"
    again = copy.deepcopy(failing)
    again["status"]["conditions"][0]["message"] = "not found, still"
    assert status_only(failing, again, "MODIFIED"), "the same verdict, another sync: no reconcile"


def _world_with_hpa(hpa_status: dict[str, Any] | None, stored: dict[str, Any] | None = None) -> World:
    body = _body({"maxReplicas": 3, "target": {"queueTimeMilliseconds": 20}})
    body["metadata"]["generation"] = 1
    if stored is not None:
        body["status"] = stored
    children = _children(body)
    hpa = copy.deepcopy(children["HorizontalPodAutoscaler"])
    if hpa_status is not None:
        hpa["status"] = hpa_status
    return World(body=body, models={"m": body}, children={(c["kind"], c["metadata"]["name"]): (
        hpa if c["kind"] == "HorizontalPodAutoscaler" else c) for c in children.values()}, pods=(),
        now=dt.datetime.now(dt.UTC))


def test_the_models_status_says_whether_its_hpa_can_read_the_metric() -> None:
    """No server for the metric (the chart's custom metrics API off, no adapter rules): the HPA says so in its own
    status only; the TritonModel restates it as ScalingActive, and a Warning Event when it turns False."""
    def scaling(world: World) -> dict[str, Any]:
        done = plan(world)
        assert done.status is not None
        (c,) = [c for c in done.status.model_dump(by_alias=True)["conditions"] if c["type"] == "ScalingActive"]
        return c

    waiting = scaling(_world_with_hpa(None))
    assert (waiting["status"], waiting["reason"]) == ("Unknown", "AwaitingHPA")
    missing = {"conditions": [{"type": "ScalingActive", "status": "False", "reason": "FailedGetObjectMetric",
                               "message": "the HPA was unable to compute the replica count: unable to get metric "
                                          "triton_queue_time_ms: the server could not find the requested resource"}]}
    done = plan(_world_with_hpa(missing))
    assert done.status is not None
    first = scaling(_world_with_hpa(missing))
    assert (first["status"], first["reason"]) == ("False", "FailedGetObjectMetric")
    assert first["message"].startswith("HorizontalPodAutoscaler m: the HPA was unable") and "triton_queue_time_ms" in \
        first["message"]
    stored = done.status_patch | {"conditions": [
        c | {"status": "True", "reason": "ValidMetricFound"} if c["type"] == "ScalingActive" else c
        for c in done.status_patch["conditions"]]}
    turned = plan(_world_with_hpa(missing, stored))
    (event,) = [e for e in turned.events if e.reason == "FailedGetObjectMetric"]
    assert event.type == "Warning", event
    without = _body()
    world = World(body=without, models={"m": without}, children={}, pods=(), now=dt.datetime.now(dt.UTC))
    conds = plan(world).status
    assert conds is not None and "ScalingActive" not in {c.type for c in conds.conditions}
