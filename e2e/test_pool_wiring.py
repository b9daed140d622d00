"""The pool's reconcile against real kubelets and real tritonservers, with the operator as a host process (issue 29):
examples/pool.yaml is placed, loaded and gated per model; answers come through each model's own Service; an update
reloads in place; a deleted model is unloaded; a deleted pool leaves its models PoolNotFound.

The chart-installed operator's pool tests (the issue's whole list) are e2e/test_pool.py.
"""

from __future__ import annotations

import copy
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from e2e.kube import Kube
from e2e.operator_fixtures import (
    OperatorHandle,
    apply,
    kubectl,
    load_examples,
    model_condition,
    record,
    start_operator,
    wait_model,
    wait_writes_settle,
)
from e2e.testing import routed, wait_for
from e2e.traffic import admin_not_refused, infer_add_sub, loaded_digest
from triton_operator.api.pool import ENDPOINTSLICE_MANAGER
from triton_operator.api.v1alpha1 import quantity_bytes
from triton_operator.plan.pool import POD_DELETION_COST

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
POOL_CRD = ROOT / "crds" / "tritonpools.yaml"
MODELS = ("pool-add-sub", "pool-scale", "pool-double", "pool-offset", "pool-pipeline")


def _slices(kube: Kube, namespace: str, model: str) -> list[dict[str, Any]]:
    return kube.items("EndpointSlice", namespace, labelSelector=f"kubernetes.io/service-name={model}")


def _ready_ips(kube: Kube, namespace: str, model: str) -> set[str]:
    return {e["addresses"][0] for s in _slices(kube, namespace, model) for e in s.get("endpoints") or ()
            if (e.get("conditions") or {}).get("ready")}


def _served_digest(ip: str, model: str) -> str | None:
    """The digest the replica serves `model` at; None when it has no READY copy (also while it unloads it, when
    Triton may answer READY and then no longer know the model)."""
    try:
        return loaded_digest(ip, model)
    except InferenceServerException:
        return None


def _placed_ips(kube: Kube, namespace: str, placed: list[str]) -> set[str]:
    return {kube.get("Pod", name, namespace)["status"].get("podIP") for name in placed}


def _ready(tm: dict[str, Any]) -> bool:
    c = model_condition(tm, "Ready")
    return c.get("status") == "True" and c.get("reason") == "AllCopiesWarmed"


def test_a_pool_places_loads_and_gates_each_model(kube: Kube, kubeconfig: Path, cluster: Any, nodes: Any,
                                                   tmp_path: Path) -> None:
    prefix = f"pw{uuid.uuid4().hex[:4]}"
    namespace = f"{prefix}-models"
    logs = cluster.logs or tmp_path
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(POOL_CRD))
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {"e2e.triton-operator.io/test": "true"}}})
    op = start_operator(kubeconfig, kube, logs, pattern=f"{prefix}-*", log_name=f"operator-{prefix}.log",
                        webhook=False)
    try:
        wait_for("the default ServiceAccount", lambda: kube.get_or_none("ServiceAccount", "default", namespace), 30)
        docs = load_examples("pool")
        for d in docs:
            if d["kind"] == "TritonPool":
                d["spec"]["server"]["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
        apply(kubeconfig, namespace, *docs)
        for name in MODELS:
            wait_model(kube, namespace, name, _ready, "Ready AllCopiesWarmed", 300)
        assert kube.get("Deployment", "shared-pool", namespace)["spec"]["replicas"] == 3
        addsub = kube.get("TritonModel", "pool-add-sub", namespace)
        placed = addsub["status"]["placement"]
        assert len(placed) == 2 and len(set(placed)) == 2, placed
        pods = {p["metadata"]["name"]: p for p in kube.items("Pod", namespace, labelSelector="serving.triton-operator.dev/pool=shared")}
        ips = {pods[n]["status"]["podIP"] for n in placed}
        assert _ready_ips(kube, namespace, "pool-add-sub") == ips
        for s in _slices(kube, namespace, "pool-add-sub"):
            assert s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == ENDPOINTSLICE_MANAGER
        svc = kube.get("Service", "pool-add-sub", namespace)
        assert "selector" not in svc["spec"]
        out = infer_add_sub(routed(kube, namespace, "pool-add-sub"), "pool-add-sub")
        assert out.tolist() == [[11, 22, 33, 44]]
        # Triton's admin APIs (shared memory, logging, trace) answer no client of a pooled model's Service without the
        # pool's key (issue 39); the operator's own loads, reloads and heals below still work with it.
        assert not (wrong := admin_not_refused(svc["spec"]["clusterIP"])), f"through pool-add-sub's Service: {wrong}"
        digest = addsub["status"]["configDigest"]
        for ip in ips:
            assert loaded_digest(ip, "pool-add-sub") == digest
        # Each replica's pod-deletion-cost is the MiB its copies take: a scale-down removes the one holding least.
        wait_for("each pool pod's deletion cost at what its copies take", lambda: {
            r["pod"]: str(quantity_bytes(r["used"]) // 2**20) for r in _pool_rows(kube, namespace, "shared")} == {
            p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(POD_DELETION_COST)
            for p in kube.items("Pod", namespace, labelSelector="serving.triton-operator.dev/pool=shared")}, 30)

        _reconciled_again_writes_nothing(kube, namespace, op)

        # A copy's tritonserver killed: that replica leaves the slice at once, and comes back once it has reloaded.
        victim = pods[placed[0]]
        victim_ip = victim["status"]["podIP"]
        os.kill(nodes.container_pid(victim, "tritonserver"), signal.SIGKILL)
        wait_for("the killed replica out of pool-add-sub's slice",
                 lambda: victim_ip not in _ready_ips(kube, namespace, "pool-add-sub"), 30)
        # (The kubelet may give the replica a new sandbox, and so a new IP: the slice follows the pod.)
        wait_for("the killed replica back in pool-add-sub's slice, reloaded",
                 lambda: _ready_ips(kube, namespace, "pool-add-sub") == _placed_ips(kube, namespace, placed), 180)
        ips = _placed_ips(kube, namespace, placed)
        for ip in ips:
            assert loaded_digest(ip, "pool-add-sub") == digest
        assert kube.get("TritonModel", "pool-add-sub", namespace)["status"]["placement"] == placed

        # An update: reloaded in place on both copies, placement unchanged.
        updated = copy.deepcopy(next(d for d in docs if d["metadata"]["name"] == "pool-add-sub"))
        updated["spec"]["batcher"] = {"maxQueueDelayMicroseconds": 3000}
        apply(kubeconfig, namespace, updated)
        tm = wait_model(kube, namespace, "pool-add-sub",
                        lambda t: t["status"].get("configDigest") != digest and _ready(t), "updated and Ready", 180)
        assert tm["status"]["placement"] == placed
        for ip in ips:
            assert loaded_digest(ip, "pool-add-sub") == tm["status"]["configDigest"]

        # Deleted: unloaded from its replicas, its capacity freed.
        kube.delete("TritonModel", "pool-add-sub", namespace)
        for ip in ips:
            wait_for(f"pool-add-sub unloaded at {ip}", lambda ip=ip: _served_digest(ip, "pool-add-sub") is None, 60)
        wait_for("the pool's record without pool-add-sub", lambda: all(
            "pool-add-sub" not in (r.get("models") or [])
            for r in (kube.get("TritonPool", "shared", namespace).get("status") or {}).get("replicaModels") or ()), 60)

        # The pool deleted: its models say PoolNotFound.
        kube.delete("TritonPool", "shared", namespace)
        wait_model(kube, namespace, "pool-scale", lambda t: model_condition(t, "Ready").get("reason") == "PoolNotFound",
                   "PoolNotFound", 60)
    except BaseException:
        print(op.log_tail(None, 200))
        raise
    finally:
        op.stop()
        kube.delete("Namespace", namespace)


def _versions(kube: Kube, namespace: str) -> dict[str, str]:
    """kind/name -> resourceVersion of everything a pool's rounds write or read in `namespace`."""
    kinds = ("TritonPool", "TritonModel", "Deployment", "PodDisruptionBudget", "Service", "EndpointSlice",
             "HorizontalPodAutoscaler", "Secret", "Pod")
    return {f"{k}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for k in kinds
            for o in kube.items(k, namespace)}


def _rounds(op: OperatorHandle) -> float:
    return sum(op.samples("triton_operator_pool_rounds_total").values())


def _loads(op: OperatorHandle) -> dict[str, float]:
    return {f"{dict(k)['verb']}/{dict(k)['result']}": v for k, v in op.samples("triton_operator_pool_loads_total").items()}


def _reconciled_again_writes_nothing(kube: Kube, namespace: str, op: OperatorHandle) -> None:
    """Issue 41: a settled pool reconciled again (an event of the pool without a spec change, then the rounds that
    follow) writes nothing to the API server and sends no replica a load or an unload: every object in the namespace
    keeps its resourceVersion, and the operator's counters of writes and loads stand still."""
    writes = wait_writes_settle(op, quiet=3.0)
    loads, rounds = _loads(op), _rounds(op)
    kube.patch("TritonPool", "shared", {"metadata": {"annotations": {"e2e.triton-operator.io/poke": "1"}}}, namespace,
               type="merge")
    versions = _versions(kube, namespace)
    wait_for("two pool rounds after the poke", lambda: _rounds(op) >= rounds + 2, 60)
    changed = {k: v for k, v in _versions(kube, namespace).items() if versions.get(k) != v}
    delta = {k: v - writes.get(k, 0) for k, v in op.writes().items() if v != writes.get(k, 0)}
    record("pool reconciled again", f"{_rounds(op) - rounds:.0f} rounds: {sum(delta.values()):.0f} writes, "
           f"{sum(_loads(op).values()) - sum(loads.values()):.0f} loads")
    assert not delta, f"a settled pool's rounds wrote {delta}"
    assert _loads(op) == loads, f"a settled pool's rounds sent loads: {loads} -> {_loads(op)}"
    assert not changed, f"a settled pool's rounds changed {sorted(changed)}"


def _pool_rows(kube: Kube, namespace: str, pool: str) -> list[dict[str, Any]]:
    return (kube.get("TritonPool", pool, namespace).get("status") or {}).get("replicaModels") or []


def _reason(kube: Kube, namespace: str, model: str) -> str:
    return str(model_condition(kube.get("TritonModel", model, namespace), "Ready").get("reason"))


def test_a_lost_node_moves_its_models_where_room_is_left_and_the_rest_report_insufficient_capacity(
        kube: Kube, kubeconfig: Path, cluster: Any, nodes: Any, tmp_path: Path) -> None:
    """A GPU pool of 2 replicas that each ask 3 of a node's 4 GPUs (one replica per node), 1200Mi each, placing by
    best fit (`placement.strategy: Pack`; a pool of fixed size spreads unless it says); four models of 400Mi: best
    fit puts three on one replica, one on the other. The node of the full replica is lost (its kubelet
    killed): its models leave their slices; once its pod is evicted, two of them fit beside the fourth and are
    loaded there, the third reports InsufficientPoolCapacity (the replacement pod cannot be scheduled: no node has 3
    free GPUs), and the fourth never leaves its slice. With the node back, the third is placed and served again."""
    if len(nodes.names) < 2:
        pytest.skip("needs two nodes")
    prefix = f"pn{uuid.uuid4().hex[:4]}"
    namespace = f"{prefix}-models"
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(POOL_CRD))
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {"e2e.triton-operator.io/test": "true"}}})
    op = start_operator(kubeconfig, kube, cluster.logs or tmp_path, pattern=f"{prefix}-*",
                        log_name=f"operator-{prefix}.log", webhook=False)
    lost = None
    try:
        wait_for("the default ServiceAccount", lambda: kube.get_or_none("ServiceAccount", "default", namespace), 30)
        docs = load_examples("pool")
        pool = next(d for d in docs if d["kind"] == "TritonPool")
        pool["metadata"]["name"] = "gpus"
        pool["spec"] = {"replicas": 2, "capacity": {"memoryPerGpu": "400Mi"}, "placement": {"strategy": "Pack"},
                        "server": {"gpus": 3, "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}}
        template = next(d for d in docs if d["metadata"].get("name") == "pool-scale")
        models = []
        for name in ("m-a", "m-b", "m-c", "m-d"):
            m = copy.deepcopy(template)
            m["metadata"] = {"name": name}
            m["spec"].update(pool="gpus", memory="400Mi", replicas=1)
            models.append(m)
        apply(kubeconfig, namespace, pool, *models)
        for m in models:
            wait_model(kube, namespace, m["metadata"]["name"], _ready, "Ready AllCopiesWarmed", 300)
        rows = {r["pod"]: r for r in _pool_rows(kube, namespace, "gpus")}
        full = next(r for r in rows.values() if len(r.get("models") or ()) == 3)
        other = next(r for r in rows.values() if r is not full)
        assert set(full["models"]) == {"m-a", "m-b", "m-c"} and other["models"] == ["m-d"], rows
        lost = full["node"]
        d_ips = _ready_ips(kube, namespace, "m-d")
        nodes.local.stop_kubelet(lost)

        for name in ("m-a", "m-b", "m-c"):
            wait_for(f"{name} out of its slice", lambda name=name: not _ready_ips(kube, namespace, name), 120)
        wait_model(kube, namespace, "m-c", lambda t: _reason(kube, namespace, "m-c") == "InsufficientPoolCapacity",
                   "m-c InsufficientPoolCapacity", 180)
        for name in ("m-a", "m-b"):
            tm = wait_model(kube, namespace, name, _ready, f"{name} Ready on the replica left", 180)
            assert tm["status"]["placement"] == [other["pod"]]
        msg = model_condition(kube.get("TritonModel", "m-c", namespace), "Ready")["message"]
        assert "0 of 1 copies placed" in msg and "400Mi" in msg, msg
        assert _ready_ips(kube, namespace, "m-d") == d_ips, "m-d never left its slice"
        assert kube.get("TritonModel", "m-d", namespace)["status"]["placement"] == [other["pod"]]

        nodes.local.start_kubelet(lost)
        lost = None
        wait_model(kube, namespace, "m-c", _ready, "m-c served again once the node is back", 300)
    except BaseException:
        print(op.log_tail(None, 200))
        raise
    finally:
        if lost is not None:
            nodes.local.start_kubelet(lost)
        op.stop()
        kube.delete("Namespace", namespace)
