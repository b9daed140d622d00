"""In-place rollouts on the real nodes: a config change loaded into the running tritonservers through Triton's
repository API, replica by replica through the warm-up gate (`spec.rollout`, `plan.rollout`, `controller.reload`).

Clients send to the model Service's ClusterIP through the real kube-proxy (`e2e.load.ServiceLoad`); every request
is counted. `GateAudit` checks, several times a second, that every ready endpoint's Triton serves a config its pod's
gate approves. Same session operator (the chart, in-cluster) and per-test namespaces as `test_operator.py`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from e2e.inplace import GateAudit, annotations, reloadable, serving
from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad
from e2e.operator_fixtures import (
    OperatorHandle,
    apply,
    gate,
    is_model_ready,
    live_pods,
    load_examples,
    model_condition,
    record,
    wait_model,
)
from e2e.testing import consistently, ready_endpoints
from e2e.traffic import loaded_digest
from triton_operator.api.pod import ANNOTATION_DIGEST, ANNOTATION_RELOAD, ANNOTATION_RELOAD_FAILED

pytestmark = pytest.mark.cluster

def change_queue_delay(kube: Kube, namespace: str, delay: int, old: str) -> str:
    """Patches add-sub's batcher queue delay; returns status.configDigest once it is no longer `old`."""
    kube.patch("TritonModel", "add-sub", {"spec": {"batcher": {"maxQueueDelayMicroseconds": delay}}}, namespace,
               type="merge")
    tm = wait_model(kube, namespace, "add-sub", lambda tm: tm["status"].get("configDigest") != old,
                    "the new digest in the status", 30)
    return str(tm["status"]["configDigest"])


def test_in_place_change_keeps_every_pod_needs_no_spare_gpu_and_fails_no_request_while_new_pods_stay_pending(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes) -> None:
    # Two replicas of four GPUs each: every GPU of both nodes. No room for a surge pod anywhere.
    doc = reloadable(2)
    doc["spec"]["server"] = {"gpus": 4}
    apply(kubeconfig, namespace, doc)
    tm = wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 2,
                    "Ready with 2 warmed replicas", 180)
    wait_for("2 ready endpoints", lambda: len(ready_endpoints(kube, namespace, "add-sub")) == 2, 30)
    old = tm["status"]["configDigest"]
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in live_pods(kube, namespace, "add-sub")}
    template = kube.get("Deployment", "add-sub", namespace)["spec"]["template"]

    with ServiceLoad(kubeconfig, namespace, "add-sub") as load, GateAudit(kube, namespace, min_samples=11) as audit:
        wait_for("the load to be answered", lambda: load.tally().sent - load.tally().failed > 50, 30)
        t0 = time.monotonic()
        new = change_queue_delay(kube, namespace, 500, old)
        wait_for("both replicas reloaded in place and warm at the new config",
                 lambda: serving(kube, namespace, new, 2), 180)
        took = time.monotonic() - t0
        tm = wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm)
                        and tm["status"]["warmedReplicas"] == 2
                        and model_condition(tm, "Progressing").get("reason") == "RolloutComplete",
                        "Ready, rollout complete", 30)
        tally = load.stop()
    record("in-place rollout (2 replicas, Swap, ClusterIP load)",
           f"{took:.1f}s; {tally.summary()}; {audit.samples} gate audits")
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in live_pods(kube, namespace, "add-sub")}
    assert after == before, f"in place, no pod is replaced: before {before}, after {after}"
    assert kube.get("Deployment", "add-sub", namespace)["spec"]["template"] == template, "the pod template changed"
    assert tally.failed == 0 and tally.sent > 200, f"{tally.summary()}; {load.samples}"
    assert not audit.violations, audit.violations[:10]
    states = {s["pod"]: s.get("configDigest") for s in tm["status"]["replicaStates"]}
    assert states == dict.fromkeys(before, new), f"status.replicaStates[].configDigest: {states}"

    # The same kind of change with new pods: the surge pod needs 4 GPUs that no node has free.
    kube.patch("TritonModel", "add-sub", {"spec": {"rollout": {"strategy": "NewPods"},
                                                   "batcher": {"maxQueueDelayMicroseconds": 700}}},
               namespace, type="merge")

    def surge() -> dict | None:
        pods = [p for p in live_pods(kube, namespace, "add-sub") if p["metadata"]["name"] not in before]
        return next((p for p in pods if any(c.get("reason") == "Unschedulable" for c in
                                             p.get("status", {}).get("conditions") or ())), None)

    pending = wait_for("a surge pod that cannot be scheduled", surge, 60)
    why = next(c["message"] for c in pending["status"]["conditions"] if c.get("reason") == "Unschedulable")
    assert "nvidia.com/gpu" in why, why
    consistently("the surge pod stays Pending and both old replicas keep serving", lambda: (
        (p := kube.get("Pod", pending["metadata"]["name"], namespace)) is not None
        and p["status"].get("phase") == "Pending"
        and len(ready_endpoints(kube, namespace, "add-sub")) == 2), 10)
    record("new-pods rollout on full GPU nodes", f"surge pod Pending: {why}")


def test_a_config_that_fails_to_load_stops_after_one_replica_which_keeps_serving_and_a_revert_clears_it(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    apply(kubeconfig, namespace, reloadable(2))
    tm = wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 2,
                    "Ready with 2 warmed replicas", 180)
    old = tm["status"]["configDigest"]
    with ServiceLoad(kubeconfig, namespace, "add-sub") as load, GateAudit(kube, namespace, min_samples=10) as audit:
        wait_for("the load to be answered", lambda: load.tally().sent - load.tally().failed > 50, 30)
        kube.patch("TritonModel", "add-sub", {"spec": {"parameters": {"refuse": "yes"}}}, namespace, type="merge")
        tm = wait_model(kube, namespace, "add-sub",
                        lambda tm: model_condition(tm, "Degraded").get("reason") == "ReloadFailed", "ReloadFailed", 120)
        bad = tm["status"]["configDigest"]
        degraded = model_condition(tm, "Degraded")
        assert degraded["status"] == "True" and "refusing to load" in degraded["message"], degraded
        assert model_condition(tm, "Progressing")["reason"] == "RolloutStalled", tm["status"]["conditions"]
        pods = live_pods(kube, namespace, "add-sub")
        failed = [p for p in pods if annotations(p).get(ANNOTATION_RELOAD_FAILED) == bad]
        assert len(failed) == 1, [annotations(p) for p in pods]
        consistently("one replica failed, the other untouched, both serving the old config", lambda: all(
            annotations(p).get(ANNOTATION_DIGEST) == old and ANNOTATION_RELOAD not in annotations(p)
            and gate(p).get("status") == "True" and loaded_digest(p["status"]["podIP"]) == old
            for p in live_pods(kube, namespace, "add-sub")), 8)
        assert len(ready_endpoints(kube, namespace, "add-sub")) == 2

        kube.patch("TritonModel", "add-sub", {"spec": {"parameters": {"refuse": None}}}, namespace, type="merge")
        tm = wait_model(kube, namespace, "add-sub", lambda tm: tm["status"].get("configDigest") == old
                        and is_model_ready(tm) and model_condition(tm, "Degraded")["status"] == "False",
                        "the revert Ready, no longer Degraded", 60)
        wait_for("the stale failure annotation dropped", lambda: not any(
            ANNOTATION_RELOAD_FAILED in annotations(p) for p in live_pods(kube, namespace, "add-sub")), 30)
        tally = load.stop()
    record("in-place bad config and revert (2 replicas, Swap, ClusterIP load)", tally.summary())
    assert tally.failed == 0 and tally.sent > 200, f"{tally.summary()}; {load.samples}"
    assert not audit.violations, audit.violations[:10]


def test_the_operator_killed_mid_rollout_resumes_it_a_replica_added_later_serves_the_new_config_and_three_drain_under_load(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    operator.start()
    # Drain, one at a time, and a slow load: a wide window to kill the operator in.
    apply(kubeconfig, namespace, reloadable(2, init_seconds=4, mode="Drain"))
    tm = wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 2,
                    "Ready with 2 warmed replicas", 180)
    old = tm["status"]["configDigest"]
    uids = {p["metadata"]["uid"] for p in live_pods(kube, namespace, "add-sub")}
    with GateAudit(kube, namespace, min_samples=10) as audit:
        kube.patch("TritonModel", "add-sub", {"spec": {"batcher": {"maxQueueDelayMicroseconds": 900}}}, namespace,
                   type="merge")
        reloading = wait_for("a replica told to reload", lambda: next(
            (p for p in live_pods(kube, namespace, "add-sub") if ANNOTATION_RELOAD in annotations(p)), None), 60)
        assert annotations(reloading)[ANNOTATION_RELOAD] == "Drain"
        told = [p for p in live_pods(kube, namespace, "add-sub") if ANNOTATION_RELOAD in annotations(p)]
        assert len(told) == 1, f"maxUnavailable 1: {[p['metadata']['name'] for p in told]} told at once"
        operator.kill()
        new = kube.get("TritonModel", "add-sub", namespace)["status"]["configDigest"]
        assert new != old
        wait_for("both replicas at the new config after the operator came back", lambda: serving(
            kube, namespace, new, 2), 240)
    assert {p["metadata"]["uid"] for p in live_pods(kube, namespace, "add-sub")} == uids
    assert not audit.violations, audit.violations[:10]

    # A replica added now starts from the pod template (the old config) and joins only once it serves the new one.
    kube.patch("TritonModel", "add-sub", {"spec": {"replicas": 3}}, namespace, type="merge")
    wait_for("3 replicas at the new config", lambda: serving(kube, namespace, new, 3), 180)
    with GateAudit(kube, namespace, min_samples=5) as audit:
        wait_for("a few audits", lambda: audit.judged >= 5, 30)
    assert not audit.violations, audit.violations[:10]
    wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 3,
               "Ready with 3 warmed replicas", 60)

    # Three replicas rolled in place under load through the Service's ClusterIP, Drain mode: each leaves the
    # endpoints, drains, unloads and loads while the other two take the traffic.
    uids = {p["metadata"]["uid"] for p in live_pods(kube, namespace, "add-sub")}
    with ServiceLoad(kubeconfig, namespace, "add-sub") as load, GateAudit(kube, namespace, min_samples=20) as audit:
        wait_for("the load to be answered", lambda: load.tally().sent - load.tally().failed > 50, 30)
        t0 = time.monotonic()
        newer = change_queue_delay(kube, namespace, 1100, new)
        wait_for("3 replicas reloaded in place at the new config", lambda: serving(kube, namespace, newer, 3), 240)
        took = time.monotonic() - t0
        tally = load.stop()
    record("in-place rollout (3 replicas, Drain, ClusterIP load)",
           f"{took:.1f}s; {tally.summary()}; {audit.samples} gate audits")
    assert {p["metadata"]["uid"] for p in live_pods(kube, namespace, "add-sub")} == uids, "in place: the same pods"
    assert tally.failed == 0 and tally.sent > 200, f"{tally.summary()}; {load.samples}"
    assert not audit.violations, audit.violations[:10]


def _sequence_request(ip: str, corrid: int, value: int, start: bool = False, end: bool = False) -> int:
    client = grpcclient.InferenceServerClient(f"{ip}:8001")
    try:
        inp = grpcclient.InferInput("VALUE", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        out = client.infer("sequence-accumulator", [inp], sequence_id=corrid, sequence_start=start,
                           sequence_end=end, client_timeout=10)
        return int(out.as_numpy("SUM").reshape(-1)[0])
    finally:
        client.close()


def test_a_sequence_model_drains_its_live_sequence_before_it_reloads(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    doc = load_examples("sequence-accumulator")[0]
    doc["spec"]["sequenceBatcher"]["maxSequenceIdleMicroseconds"] = 3_000_000
    doc["spec"]["rollout"] = {"drainTimeoutSeconds": 120}  # mode Swap: a sequence model drains all the same
    apply(kubeconfig, namespace, doc)
    tm = wait_model(kube, namespace, "sequence-accumulator", lambda tm: is_model_ready(tm), "Ready", 180)
    old = tm["status"]["configDigest"]
    [pod] = live_pods(kube, namespace, "sequence-accumulator")
    ip = pod["status"]["podIP"]
    assert _sequence_request(ip, 7, 5, start=True) == 5

    kube.patch("TritonModel", "sequence-accumulator",
               {"spec": {"sequenceBatcher": {"direct": {"maxQueueDelayMicroseconds": 100}}}}, namespace, type="merge")
    wait_for("the replica out of the Service, reloading in Drain mode", lambda: (
        (p := live_pods(kube, namespace, "sequence-accumulator")[0])
        and annotations(p).get(ANNOTATION_RELOAD) == "Drain" and gate(p).get("status") == "False"
        and not ready_endpoints(kube, namespace, "sequence-accumulator")), 60)
    # The live sequence goes on (its client sends to the replica that holds its state), for longer than the quiet
    # period: the old config keeps it, and the reload waits.
    total = 5
    for i in range(8):
        total += i
        assert _sequence_request(ip, 7, i) == total, "the sequence's state was lost mid-drain"
        assert loaded_digest(ip, "sequence-accumulator") == old, "reloaded while the sequence was live"
        time.sleep(0.5)
    assert _sequence_request(ip, 7, 1, end=True) == total + 1
    last = time.monotonic()
    new = kube.get("TritonModel", "sequence-accumulator", namespace)["status"]["configDigest"]
    wait_for("the replica reloaded once the sequence ended and went quiet", lambda: serving(
        kube, namespace, new, 1, "sequence-accumulator"), 90)
    quiet = time.monotonic() - last
    record("sequence drain: last request to reloaded", f"{quiet:.1f}s (idle timeout 3 s)")
    assert quiet >= 3.0, f"reloaded {quiet:.1f}s after the sequence's last request, inside its idle timeout"
    wait_model(kube, namespace, "sequence-accumulator", is_model_ready, "Ready again", 60)
