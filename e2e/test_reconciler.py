"""The API-server tier (envtest style): the real `Reconciler` against a kube-apiserver and etcd, no nodes.

A control plane of the module's own (`LocalCluster(nodes=())`: etcd, kube-apiserver, controller-manager and
scheduler, so Deployments get ReplicaSets and Pending pods, and nothing runs). The test builds the operator's
`Reconciler` itself, feeds its cache with LISTs as the watches would, and calls `reconcile` directly: the
first call writes the children and the status, a second over an unchanged world writes nothing at all.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import LocalCluster
from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import apply_crds
from triton_operator.api.kinds import CHILDREN, LABEL_MODEL, POD
from triton_operator.controller.cache import Cache
from triton_operator.controller.reconcile import Reconciler
from triton_operator.platform import metrics
from triton_operator.platform.kube import Kube as OperatorKube

pytestmark = pytest.mark.cluster

NS = "envtest"
MODEL = {
    "apiVersion": "serving.triton-operator.dev/v1alpha1",
    "kind": "TritonModel",
    "metadata": {"name": "add-sub", "namespace": NS},
    "spec": {
        "backend": "python", "replicas": 2, "maxBatchSize": 8,
        "source": {"inline": {"model.py": "pass\n"}},
        "inputs": [{"name": "INPUT0", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUTPUT0", "dataType": "FP32", "dims": [4]}],
    },
}


@pytest.fixture(scope="module")
def apiserver() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="trop-envtest-") as root:
        cluster = LocalCluster(Path(root), nodes=(), kube_proxy=False)
        with cluster.running_fresh() as kubeconfig:
            apply_crds(kubeconfig, Kube(kubeconfig))
            yield kubeconfig


def _operator_kube(kubeconfig: Path) -> OperatorKube:
    return OperatorKube.from_environment(str(kubeconfig))


def _writes() -> dict[tuple[str, str], float]:
    """The operator's write counter (`triton_operator_api_writes_total`), per (kind, verb)."""
    out: dict[tuple[str, str], float] = {}
    for family in metrics.API_WRITES.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                out[(sample.labels["kind"], sample.labels["verb"])] = sample.value
    return out


def _delta(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[str, float]:
    return {f"{k[0]}/{k[1]}": v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def _refresh(cache: Cache, kube: OperatorKube) -> None:
    """What the watches deliver: the models, the children and the replicas, as they are now."""
    for body in kube.list("serving.triton-operator.dev/v1alpha1", "TritonModel", NS):
        cache.put_model({**body, "kind": "TritonModel", "apiVersion": "serving.triton-operator.dev/v1alpha1"})
    for k in CHILDREN:
        for body in kube.list(k.api_version, k.kind, NS, k.selector):
            cache.put_child({**body, "kind": k.kind, "apiVersion": k.api_version})
    for body in kube.list(POD.api_version, POD.kind, NS, LABEL_MODEL):
        cache.put_pod({**body, "kind": "Pod", "apiVersion": "v1"})


def test_the_reconciler_writes_the_children_once_and_then_nothing(apiserver: Path) -> None:
    kube, op = Kube(apiserver), _operator_kube(apiserver)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    kube.create(MODEL, NS)
    cache = Cache()
    reconciler = Reconciler(op, cache)

    async def reconcile() -> None:
        await reconciler.reconcile(NS, "add-sub")

    _refresh(cache, op)
    before = _writes()
    asyncio.run(reconcile())
    first = _delta(before, _writes())
    assert first == {"ConfigMap/apply": 1, "Deployment/apply": 1, "Service/apply": 1, "PodDisruptionBudget/apply": 1,
                     "TritonModel/patch-status": 1, "Event/create": 1}, first
    tm = kube.get("TritonModel", "add-sub", NS)
    assert tm["status"]["observedGeneration"] == 1 and tm["status"]["configDigest"]
    assert {c["type"]: c["reason"] for c in tm["status"]["conditions"]}["Ready"] == "ReplicasWarming"

    # The controller-manager makes the ReplicaSet and two pods, which stay Pending: no node.
    wait_for("two Pending replicas", lambda: len(kube.items("Pod", NS)) == 2, 60)
    wait_for("the Deployment's status to count them",
             lambda: (kube.get("Deployment", "add-sub", NS).get("status") or {}).get("replicas") == 2, 60)
    _refresh(cache, op)
    asyncio.run(reconcile())  # the world changed (two pods): the status says so
    tm = kube.get("TritonModel", "add-sub", NS)
    assert [s["state"] for s in tm["status"]["replicaStates"]] == ["Pending", "Pending"]

    _refresh(cache, op)
    before = _writes()
    asyncio.run(reconcile())
    assert _delta(before, _writes()) == {}, "a reconcile of an unchanged world must write nothing"

    # A child changed behind the operator's back is put back, and only that one.
    kube.patch("Service", "add-sub", {"spec": {"ports": [{"name": "http", "port": 8000, "targetPort": 9999}]}}, NS,
               type="strategic")
    _refresh(cache, op)
    before = _writes()
    asyncio.run(reconcile())
    assert _delta(before, _writes()) == {"Service/apply": 1}
    ports = {p["name"]: p["targetPort"] for p in kube.get("Service", "add-sub", NS)["spec"]["ports"]}
    assert ports["http"] == "http"


def test_a_render_failure_is_degraded_on_the_status_and_the_reconcile_ends(apiserver: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec the checks pass that the renderer still cannot render (the review's out-of-range integers did) was
    raised out of the reconcile: retried with back-off for ever, nothing on the TritonModel. Now the reconcile ends,
    the status says Degraded=True reason RenderFailed with the error, and a second reconcile writes nothing. The
    renderer is made to fail (no spec the API server admits does any more)."""
    from triton_operator.plan import planner

    def out_of_range(*_: object, **__: object) -> object:
        raise ValueError("Value out of range: 4294967296")

    kube, op = Kube(apiserver), _operator_kube(apiserver)
    if kube.get_or_none("Namespace", NS) is None:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    kube.create({**MODEL, "metadata": {"name": "unrenderable", "namespace": NS}}, NS)
    monkeypatch.setattr(planner, "render_repository", out_of_range)
    cache = Cache()
    reconciler = Reconciler(op, cache)
    _refresh(cache, op)
    before = _writes()
    asyncio.run(reconciler.reconcile(NS, "unrenderable"))  # raises nothing: the worker has nothing to retry
    assert _delta(before, _writes()) == {"TritonModel/patch-status": 1, "Event/create": 2}  # Ready=False, Degraded=True
    tm = kube.get("TritonModel", "unrenderable", NS)
    degraded = {c["type"]: c for c in tm["status"]["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "RenderFailed"), degraded
    assert "ValueError: Value out of range: 4294967296" in degraded["message"]
    assert kube.get_or_none("Deployment", "unrenderable", NS) is None
    _refresh(cache, op)
    before = _writes()
    asyncio.run(reconciler.reconcile(NS, "unrenderable"))
    assert _delta(before, _writes()) == {}, "the same spec planned again must write nothing"


def test_the_api_server_takes_the_volumes_of_claims_and_secrets_named_with_dots_or_at_length(apiserver: Path) -> None:
    """`pvc://a.b/...` and a GCS Secret `gcs.key` made volume names with a dot, which the API server refuses; two
    claims alike in their first 59 characters shared one truncated name. The Deployment rendered now is taken by
    the API server (a server-side dry run: admission and validation, nothing stored); the old names are refused."""
    import copy

    from e2e.kube import ApiError
    from triton_operator.api.v1alpha1 import TritonModel
    from triton_operator.render.kubernetes import render_children
    from triton_operator.render.modelconfig import render_repository

    kube = Kube(apiserver)
    if kube.get_or_none("Namespace", NS) is None:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    long_a, long_b = "c" * 70 + "-a", "c" * 70 + "-b"
    body = copy.deepcopy(MODEL)
    body["metadata"]["name"] = "dotted"
    del body["spec"]["source"]
    body["spec"]["versions"] = [{"version": 1, "source": {"uri": "pvc://models.team-a/m"}},
                                {"version": 2, "source": {"uri": f"pvc://{long_a}/m"}},
                                {"version": 3, "source": {"uri": f"pvc://{long_b}/m"}}]
    body["spec"]["modelFiles"] = {"uri": "gs://bucket/labels", "credentialsSecret": "gcs.key"}
    model = TritonModel.model_validate(body)
    children = render_children(model, render_repository([model]), "00000000-0000-0000-0000-0000000000d0", NS)
    for child in children:  # no owner to point at: the dry run would look for it
        del child["metadata"]["ownerReferences"]
    deployment = next(c for c in children if c["kind"] == "Deployment")
    for child in children:
        plural = child["kind"].lower() + "s"
        group = "/api/v1" if child["apiVersion"] == "v1" else f"/apis/{child['apiVersion']}"
        kube.request("POST", f"{group}/namespaces/{NS}/{plural}", child, params={"dryRun": "All"})

    old = copy.deepcopy(deployment)  # as the operator named them before
    pod = old["spec"]["template"]["spec"]
    renamed = {v["name"]: ("pvc-" + v["persistentVolumeClaim"]["claimName"])[:63] if "persistentVolumeClaim" in v
               else ("gcs-" + v["secret"]["secretName"])[:63] if "secret" in v else v["name"] for v in pod["volumes"]}
    for v in pod["volumes"]:
        v["name"] = renamed[v["name"]]
    for c in pod["initContainers"]:
        for m in c["volumeMounts"]:
            m["name"] = renamed[m["name"]]
    with pytest.raises(ApiError) as refused:
        kube.request("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", old, params={"dryRun": "All"})
    assert refused.value.status == 422, refused.value
    message = str(refused.value)
    assert "pvc-models.team-a" in message and "gcs-gcs.key" in message and "Duplicate value" in message, message


# -- leader election on a real Lease ------------------------------------------------------------------


def test_one_leader_at_a_time_a_follower_takes_over_a_lease_left_unrenewed_and_at_once_a_released_one(
        apiserver: Path) -> None:
    from dataclasses import replace

    from triton_operator.platform.leader import ElectionSettings, LeaderElection

    kube = Kube(apiserver)
    if kube.get_or_none("Namespace", "lease-test") is None:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "lease-test"}})
    timings = {"lease_seconds": 3, "renew_seconds": 2, "retry_seconds": 0.5}
    a = LeaderElection(_operator_kube(apiserver), ElectionSettings("lease-test", "trop", "replica-a", **timings))
    b = LeaderElection(_operator_kube(apiserver), ElectionSettings("lease-test", "trop", "replica-b", **timings))
    assert a.try_acquire_or_renew(), "a free Lease is taken"
    assert not b.try_acquire_or_renew(), "a Lease renewed within its duration is not"
    assert a.try_acquire_or_renew(), "its holder renews it"
    lease = kube.request("GET", "/apis/coordination.k8s.io/v1/namespaces/lease-test/leases/trop")
    assert lease["spec"]["holderIdentity"] == "replica-a" and lease["spec"]["leaseDurationSeconds"] == 3

    # a stops renewing (a SIGKILLed or frozen leader): b waits the whole duration on its own clock, then takes it.
    async def take_over() -> float:
        t0 = time.monotonic()
        assert await b.acquire(asyncio.Event())
        return time.monotonic() - t0

    waited = asyncio.run(take_over())
    assert 3 <= waited < 3 + 2, f"took over after {waited:.1f}s, the Lease lasts 3 s"
    lease = kube.request("GET", "/apis/coordination.k8s.io/v1/namespaces/lease-test/leases/trop")
    assert lease["spec"]["holderIdentity"] == "replica-b" and lease["spec"]["leaseTransitions"] == 1

    # a comes back: a follower now; b loses nothing. b shuts down cleanly and gives the Lease up: a takes it
    # on its next try, without waiting the duration.
    assert not a.try_acquire_or_renew()
    b._leading = True  # as after acquire()
    b.release()
    assert a.try_acquire_or_renew(), "a released Lease is free at once"

    # The leader whose renewals fail steps down before anyone else may take over.
    async def renew_fails() -> bool:
        lost = asyncio.Event()
        a._leading = True
        a.kube = _operator_kube(apiserver)
        # Every renewal now fails (404 on the namespace's Lease, then 404 on create).
        a.settings = replace(a.settings, namespace="no-such-namespace")
        holder = asyncio.create_task(a.hold(lost))
        await asyncio.wait_for(lost.wait(), 10)
        await holder
        return a.leading

    assert asyncio.run(renew_fails()) is False
