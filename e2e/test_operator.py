"""The operator against the real cluster, with real tritonserver replicas run by real kubelets.

One operator per session (`operator` fixture: CRD applied server-side, `triton-operator run`
as a subprocess, drift interval 5 s); each test in its own namespace. What users do is done
with kubectl (apply, scale, delete); what users see is read from the API (TritonModel status,
children, pod conditions, EndpointSlices) and from Triton itself at the endpoint addresses.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from e2e.health_checks import argocd_health, kstatus
from e2e.kube import Kube, wait_for
from e2e.node import LogFollower
from e2e.operator_fixtures import (
    ANNOTATION_DIGEST,
    EXAMPLES,
    LABEL_MODEL,
    WARMED,
    OperatorHandle,
    add_sub,
    apply,
    as_stream,
    digest_of,
    gate,
    is_model_ready,
    kubectl,
    live_pods,
    load_examples,
    model_condition,
    model_pods,
    one_ready_pod,
    record,
    rolled_out,
    wait_model,
    wait_writes_settle,
)
from e2e.testing import container_status, endpoint_of, endpoint_ready, endpoints, is_ready, ready_endpoints, wait_gone
from e2e.traffic import infer_add_sub, model_ready_over_http
from tests.timing import scaled
from triton_operator.api.kinds import CHILDREN, OWNED_SELECTOR, POD, REPLICA_SET, WATCHED
from triton_operator.api.timestamps import parse_rfc3339
from triton_operator.render.kubernetes import Options

pytestmark = pytest.mark.cluster


# -- helpers ---------------------------------------------------------------------------------------


def template_digest(kube: Kube, namespace: str, name: str) -> str:
    return kube.get("Deployment", name, namespace)["spec"]["template"]["metadata"]["annotations"][ANNOTATION_DIGEST]


def managers(obj: dict) -> set[tuple[str, str | None]]:
    """(field manager, subresource) of every managedFields entry."""
    return {(m["manager"], m.get("subresource")) for m in obj["metadata"].get("managedFields") or ()}


def resource_versions(kube: Kube, namespace: str) -> dict[str, str]:
    """kind/name -> resourceVersion of the TritonModels, their children and pods in `namespace`."""
    out = {}
    for kind in (k.kind for k in WATCHED):
        for o in kube.items(kind, namespace):
            out[f"{kind}/{o['metadata']['name']}"] = o["metadata"]["resourceVersion"]
    return out


def owned_children(kube: Kube, namespace: str) -> list[str]:
    out = []
    for kind in (*(k.kind for k in CHILDREN), REPLICA_SET.kind, POD.kind):
        out += [f"{kind}/{o['metadata']['name']}" for o in kube.items(kind, namespace)
                if o["metadata"].get("labels", {}).get(LABEL_MODEL)]
    return out


def _seconds_of_day(text: str, pattern: str) -> float | None:
    """Time of day (s) of the first line matching `pattern`, in the operator's (`2026-11-21 12:33:36,123`)
    or Triton's (`I1121 12:33:35.987654`) log format."""
    for line in text.splitlines():
        if re.search(pattern, line):
            m = re.search(r"(\d\d):(\d\d):(\d\d)[.,](\d+)", line)
            if m:
                h, mi, sec, frac = m.groups()
                return int(h) * 3600 + int(mi) * 60 + int(sec) + float("0." + frac)
    return None


# -- apply, children, idempotence -------------------------------------------------------------------


def test_apply_renders_children_and_reconciling_again_writes_nothing(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", str(EXAMPLES / "add-sub.yaml"))
    wait_model(kube, namespace, "add-sub", is_model_ready, "Ready", 120, interval=0.05)
    # Ready means serving: the replica is Ready (gate and probes), so it is in the Service.
    assert [is_ready(p) for p in live_pods(kube, namespace, "add-sub")] == [True], "Ready before its replica is"
    tm = wait_model(kube, namespace, "add-sub", lambda tm: tm["status"].get("readyReplicas") == 1, "readyReplicas 1", 30)
    md, st = tm["metadata"], tm["status"]
    digest = st["configDigest"]
    assert re.fullmatch(r"[0-9a-f]{16}", digest), digest
    assert st["observedGeneration"] == md["generation"]
    assert model_condition(tm, "Ready")["reason"] == "AllReplicasWarmed"
    assert model_condition(tm, "Progressing") | {"lastTransitionTime": None} == {
        "type": "Progressing", "status": "False", "reason": "RolloutComplete", "observedGeneration": md["generation"],
        "message": f"all replicas serve config {digest}", "lastTransitionTime": None}
    assert model_condition(tm, "Degraded")["status"] == "False"
    assert kstatus(tm) == ("Current", "Resource is Ready"), "Flux's health check on the live object"
    argo = argocd_health(tm)  # Argo CD's, the chart's Lua, on the same live object
    assert argo[0] == "Healthy" and argo[1].startswith("AllReplicasWarmed: "), argo
    assert (st["replicas"], st["readyReplicas"], st["warmedReplicas"]) == (1, 1, 1)
    assert st["selector"] == f"{LABEL_MODEL}=add-sub"
    [replica] = st["replicaStates"]
    assert replica["state"] == "Ready" and replica["reason"] == "ModelWarmed"

    owner = {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "name": "add-sub",
             "uid": md["uid"], "controller": True, "blockOwnerDeletion": True}

    dep = kube.get("Deployment", "add-sub", namespace)
    tpl = dep["spec"]["template"]
    # The repository ConfigMap, laid out at its repository paths by the volume's items.
    # Immutable and named by its content: a pod re-created for this template always fetches these files.
    [volume] = [v for v in tpl["spec"]["volumes"] if "configMap" in v]
    repository = volume["configMap"]["name"]
    assert re.fullmatch(r"add-sub-repository-[0-9a-f]{10}", repository), repository
    key_of = {item["path"]: item["key"] for item in volume["configMap"]["items"]}
    assert set(key_of) == {"add-sub/config.pbtxt", "add-sub/1/model.py"}, key_of
    cm = kube.get("ConfigMap", repository, namespace)
    assert cm["immutable"] is True
    config = cm["data"][key_of["add-sub/config.pbtxt"]]
    assert 'key: "triton-operator.config-digest"' in config and f'string_value: "{digest}"' in config
    assert "max_batch_size: 8" in config and "dynamic_batching" in config
    assert "class TritonPythonModel" in cm["data"][key_of["add-sub/1/model.py"]]

    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert tpl["spec"]["readinessGates"] == [{"conditionType": WARMED}]
    assert tpl["metadata"]["annotations"][ANNOTATION_DIGEST] == digest
    triton, probe = tpl["spec"]["containers"]
    assert triton["name"] == "tritonserver" and probe["name"] == "probe"
    # add-sub's instance groups are all CPU: server.gpus defaults to what they need, none.
    assert "nvidia.com/gpu" not in (triton.get("resources") or {}).get("limits", {}), triton.get("resources")
    assert {p["name"]: p["containerPort"] for p in triton["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    # The container's readiness: the `probe` container (the operator's image) answers once tritonserver is up.
    assert "startupProbe" not in triton and triton["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 8090,
                                                                               "scheme": "HTTP"}
    assert probe["image"] == Options().operator_image and probe["args"][0] == "probe"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert "--load-model=add-sub" in triton["args"] and "--model-control-mode=explicit" in triton["args"]
    # Every file of add-sub is in its ConfigMap: tritonserver mounts it, with no fetch step before it.
    assert "initContainers" not in tpl["spec"], tpl["spec"].get("initContainers")
    assert {"name": "repository", "mountPath": "/models", "readOnly": True} in triton["volumeMounts"]

    svc = kube.get("Service", "add-sub", namespace)
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert svc["spec"]["selector"] == {LABEL_MODEL: "add-sub"}
    for child in (cm, dep, svc):
        assert child["metadata"]["ownerReferences"] == [owner], child["kind"]
        assert child["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "triton-operator"
    assert kube.get_or_none("PodDisruptionBudget", "add-sub", namespace) is None  # one replica: no PDB

    [pod] = live_pods(kube, namespace, "add-sub")
    assert gate(pod)["status"] == "True" and gate(pod)["reason"] == "ModelWarmed"
    assert digest_of(pod) == digest
    ip = pod["status"]["podIP"]
    wait_for("the replica ready in the Service's EndpointSlice", lambda: endpoint_ready(kube, namespace, "add-sub", ip),
             30)
    np.testing.assert_allclose(infer_add_sub(ip), [[11, 22, 33, 44]])

    # Every write is the operator's own and counted: kopf adds no finalizer or bookkeeping annotation,
    # and the operator writes children, status and gate under its one field manager.
    tm = kube.get("TritonModel", "add-sub", namespace)
    assert not tm["metadata"].get("finalizers"), tm["metadata"].get("finalizers")
    assert not [a for a in tm["metadata"].get("annotations") or {} if "kopf" in a]
    assert managers(tm) == {("kubectl-client-side-apply", None), ("triton-operator", "status")}, managers(tm)
    for child in (cm, dep, svc):
        assert {m for m in managers(child) if m[1] is None} == {("triton-operator", None)}, managers(child)
    assert ("triton-operator", "status") in managers(kube.get("Pod", pod["metadata"]["name"], namespace))

    # Reconciling again writes nothing: an event without a spec change, then a drift-timer round.
    before = wait_writes_settle(operator, quiet=2.0)
    reconciles = operator.reconciles()
    poked = time.monotonic()
    kube.patch("TritonModel", "add-sub", {"metadata": {"annotations": {"e2e.triton-operator.io/poke": "1"}}},
               namespace, type="merge")
    wait_for("a reconcile for the poke and one drift round", lambda: (
        operator.reconciles() >= reconciles + 2 and time.monotonic() - poked > operator.drift_interval + 1), 30)
    after = operator.writes()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before) if after.get(k) != before.get(k)}
    record("writes on re-reconcile", f"{sum(delta.values()):.0f} in {operator.reconciles() - reconciles:.0f} reconciles")
    assert not delta, f"a reconcile of an unchanged TritonModel wrote {delta}"

    # A new operator process (an upgrade, a reschedule) finds everything converged: it changes nothing,
    # and the model's Ready condition does not blink while the new process fills its caches.
    versions = resource_versions(kube, namespace)
    operator.restart()
    restarted = time.monotonic()
    wait_for("the new operator to reconcile, then one drift round", lambda: (
        operator.reconciles() >= 2 and time.monotonic() - restarted > operator.drift_interval + 1), 30)
    record("writes after an operator restart", f"{operator.writes()} in {operator.reconciles():.0f} reconciles "
           "(nothing in the namespace changes)")
    changed = {k: v for k, v in resource_versions(kube, namespace).items() if versions.get(k) != v}
    assert not changed, f"a restarted operator changed {sorted(changed)}: {operator.writes()}"


def test_delete_garbage_collects_every_child(kube: Kube, kubeconfig: Path, namespace: str,
                                             operator: OperatorHandle) -> None:
    apply(kubeconfig, namespace, add_sub())
    wait_model(kube, namespace, "add-sub", is_model_ready, "Ready", 120)
    children = owned_children(kube, namespace)
    assert {c.split("/")[0] for c in children} == {"ConfigMap", "Deployment", "Service", "ReplicaSet", "Pod"}, children

    kubectl(kubeconfig, "delete", "-n", namespace, "tritonmodel", "add-sub", "--wait=true", timeout=60)
    started = time.monotonic()
    wait_for("every child to be garbage-collected", lambda: not owned_children(kube, namespace), 90)
    record("delete: TritonModel gone -> children gone", f"{time.monotonic() - started:.1f}s")
    assert not kube.items("Pod", namespace)
    assert not kube.items("ConfigMap", namespace, label_selector=OWNED_SELECTOR)


# -- warm-up gating ---------------------------------------------------------------------------------


def test_warming_replica_stays_out_of_the_service_until_warm(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes) -> None:
    lazy = 4.0
    doc = load_examples("warmup")[0]
    doc["spec"]["parameters"]["lazyInitSeconds"] = str(lazy)
    apply(kubeconfig, namespace, doc)
    pod = wait_for("the warmup pod to get an IP", lambda: next(
        (p for p in live_pods(kube, namespace, "warmup") if p.get("status", {}).get("podIP")), None), 60)
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]

    t: dict[str, float] = {}
    warming_samples = 0
    gate_reasons: set[str] = set()
    flux: tuple[str, str] | None = None
    argo: tuple[str, str] | None = None
    deadline = time.monotonic() + scaled(120)
    while "endpoint_ready" not in t:
        assert time.monotonic() < deadline, f"timed out; saw {t}"
        pod = kube.get("Pod", name, namespace)
        ep = endpoint_of(kube, namespace, "warmup", ip)
        # Asked last: if Triton is not READY now, it was not when pod and endpoint were read.
        triton_ready = model_ready_over_http(ip, "warmup")
        now = time.monotonic()
        running = "running" in (container_status(pod, "tritonserver").get("state") or {})
        g = gate(pod)
        ep_ready = bool(ep and (ep.get("conditions") or {}).get("ready"))
        if running:
            t.setdefault("running", now)
        if triton_ready:
            t.setdefault("triton_ready", now)
        if g.get("status") == "True":
            t.setdefault("gate_true", now)
        if ep_ready:
            t.setdefault("endpoint_ready", now)
        if running and triton_ready is False:
            assert g.get("status") != "True", f"gate True while Triton is not READY: {g}"
            assert not ep_ready, "a warming replica is a ready endpoint"
            warming_samples += 1
            gate_reasons.add(g.get("reason", "(none)"))
            if flux is None:  # Flux's (kstatus) and Argo CD's health checks on the live object while it warms
                warming = kube.get("TritonModel", "warmup", namespace)
                flux, argo = kstatus(warming), argocd_health(warming)
        time.sleep(0.1)

    # The replica was kept out for the whole warm-up: by the API server's own clocks (second resolution),
    # the gate turned True at least the warm-up's sleep after tritonserver started.
    pod = kube.get("Pod", name, namespace)
    started = parse_rfc3339(container_status(pod, "tritonserver")["state"]["running"]["startedAt"])
    gated_at = parse_rfc3339(gate(pod)["lastTransitionTime"])
    assert started and gated_at and (gated_at - started).total_seconds() >= lazy - 1, (started, gated_at)
    assert warming_samples >= 5, f"only {warming_samples} samples saw the replica warming"
    assert flux is not None and flux[0] == "InProgress", f"kstatus of the model while its replica warmed: {flux}"
    assert argo is not None and argo[0] == "Progressing", f"Argo CD's health of the model while its replica warmed: {argo}"
    # The gate follows Triton, and the endpoint follows the gate (a poll sees each one no earlier).
    assert "gate_true" in t and t["triton_ready"] <= t["gate_true"] <= t["endpoint_ready"], t
    gate_latency = t["gate_true"] - t["triton_ready"]

    eps = ready_endpoints(kube, namespace, "warmup")
    assert [ep["addresses"] for ep in eps] == [[ip]]
    address = eps[0]["addresses"][0]
    client = grpcclient.InferenceServerClient(f"{address}:8001")
    try:
        x = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        x.set_data_from_numpy(np.array([[1, 1, 1, 1]], dtype=np.float32))
        t0 = time.monotonic()
        out = client.infer("warmup", [x], client_timeout=30).as_numpy("OUTPUT")
        first = time.monotonic() - t0
    finally:
        client.close()
    np.testing.assert_allclose(out, [[1, 2, 3, 4]])
    # A cold first request sleeps `lazy` seconds in the model; a warm one does not.
    assert first < lazy / 2, f"the first request took {first:.2f}s: the replica was not warm"

    g = gate(kube.get("Pod", name, namespace))
    tm = wait_model(kube, namespace, "warmup", is_model_ready, "Ready", 30)
    # The same latency from the logs: Triton's "successfully loaded" -> the operator's gate patch.
    loaded = _seconds_of_day(nodes.container_log(pod, "tritonserver"), "successfully loaded 'warmup'")
    gated = _seconds_of_day(operator.log_since(), f"Set readiness gate pod={namespace}/{name} status=True")
    if loaded is not None and gated is not None:
        record("warm-up: Triton 'successfully loaded' -> gate patched (logs)", f"{gated - loaded:.3f}s")
    [replica] = tm["status"]["replicaStates"]
    record("warm-up: container running -> gate True", f"{t['gate_true'] - t['running']:.2f}s (sleep {lazy}s)")
    record("warm-up: Triton READY -> gate True (test poll, 100 ms)", f"{gate_latency:.2f}s")
    record("warm-up: gate True -> endpoint ready", f"{t['endpoint_ready'] - t['gate_true']:.2f}s")
    record("warm-up: gate reasons while warming", sorted(gate_reasons))
    record("warm-up: first request after entering the Service", f"{first * 1000:.0f} ms")
    record("warm-up: gate message", g.get("message"))
    assert replica["state"] == "Ready" and replica["warmupSeconds"] >= lazy - 1, replica


# -- scale and rollout ------------------------------------------------------------------------------


class RolloutWatcher(threading.Thread):
    """Every `interval` seconds until stopped: the Service's ready endpoints, the model's live pods, and the
    TritonModel's Progressing reason."""

    def __init__(self, kubeconfig: Path, namespace: str, name: str, interval: float = 0.15) -> None:
        super().__init__(daemon=True)
        self.kube = Kube(kubeconfig)
        self.namespace, self.name, self.interval = namespace, name, interval
        self.ready: list[int] = []
        self.pods: list[int] = []
        self.progressing: set[str] = set()
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.ready.append(len(ready_endpoints(self.kube, self.namespace, self.name)))
                self.pods.append(len(live_pods(self.kube, self.namespace, self.name)))
                tm = self.kube.get("TritonModel", self.name, self.namespace)
                self.progressing.add(model_condition(tm, "Progressing").get("reason", ""))
            except Exception as e:  # noqa: BLE001 - recorded; the test fails on it
                self.errors.append(repr(e))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def test_a_deleted_replica_serves_through_its_prestop_sleep_and_its_probe_exits_with_tritonserver(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes) -> None:
    """The `probe` container answers the replica's readiness, told by the operator when the gate is set. On SIGTERM
    (at once: it has no preStop hook) it keeps answering while tritonserver serves through its preStop sleep, so the
    terminating endpoint stays `serving` (what kube-proxy falls back to when no ready endpoint is left); it exits on
    its own once tritonserver's port has closed, so the pod's deletion never waits out the grace period for it."""
    apply(kubeconfig, namespace, add_sub())
    wait_model(kube, namespace, "add-sub", is_model_ready, "Ready", 120)
    pod = one_ready_pod(kube, namespace, "add-sub")
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    wait_for("the replica's endpoint ready", lambda: endpoint_ready(kube, namespace, "add-sub", ip), 30)
    node = nodes.of(pod)
    probe_log = LogFollower(node, pod, "probe")
    started = "probe: answering readiness on 0.0.0.0:8090 for tritonserver's HTTP port 127.0.0.1:8000"
    wait_for("the probe container's start line", lambda: started in probe_log.text(), 10)
    # The operator told the probe when it set the gate (POST /gate over the pod network), so the probe passed right
    # after the gate instead of its fallback head start.
    noticed = "probe: the operator set the readiness gate; passing in 0.03 s"
    wait_for("the probe's line for the operator's gate notice", lambda: noticed in probe_log.text(), 10)

    deleted = time.monotonic()
    kube.delete("Pod", name, namespace)
    [ep] = wait_for("the deleted replica's endpoint terminating", lambda: [
        ep for ep in endpoints(kube, namespace, "add-sub")
        if ip in ep["addresses"] and ep["conditions"].get("terminating")], 30)
    assert ep["conditions"].get("ready") is False and ep["conditions"].get("serving") is True, ep
    # Still in its preStop sleep: tritonserver answers, although the replica has left the ready endpoints.
    np.testing.assert_allclose(infer_add_sub(ip), [[11, 22, 33, 44]])

    wait_gone(kube, "Pod", namespace, name, 60)
    gone = time.monotonic() - deleted
    record("delete: pod deleted -> gone (preStop sleep 5 s, then tritonserver's drain)", f"{gone:.1f}s")
    lines = probe_log.stop().splitlines()
    assert lines[-2:] == ["probe: SIGTERM; waiting for tritonserver's HTTP port to close",
                          "probe: tritonserver's HTTP port is closed; exiting"], lines
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert gone < grace, f"the pod took {gone:.1f}s to go, its whole grace period ({grace}s): something was killed"


def test_scale_then_config_change_rolls_out_with_a_warm_replica_always_serving(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    apply(kubeconfig, namespace, add_sub(strategy="NewPods"))
    wait_model(kube, namespace, "add-sub", is_model_ready, "Ready", 120)

    # kubectl scale goes through the scale subresource.
    kubectl(kubeconfig, "scale", "-n", namespace, "tritonmodel/add-sub", "--replicas=2")
    scale = kube.request("GET", f"/apis/serving.triton-operator.dev/v1alpha1/namespaces/{namespace}"
                                "/tritonmodels/add-sub/scale")
    assert scale["spec"]["replicas"] == 2
    wait_for("the Deployment scaled to 2", lambda: kube.get("Deployment", "add-sub", namespace)["spec"]["replicas"] == 2,
             30)
    tm = wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 2,
                    "Ready with 2 warmed replicas", 120)
    assert tm["status"]["replicas"] == 2
    scale = kube.request("GET", f"/apis/serving.triton-operator.dev/v1alpha1/namespaces/{namespace}"
                                "/tritonmodels/add-sub/scale")
    assert scale["status"]["replicas"] == 2 and scale["status"]["selector"] == f"{LABEL_MODEL}=add-sub"
    pdb = kube.get("PodDisruptionBudget", "add-sub", namespace)
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["selector"]["matchLabels"] == {LABEL_MODEL: "add-sub"}
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == tm["metadata"]["uid"]
    old = tm["status"]["configDigest"]
    wait_for("2 ready endpoints", lambda: len(ready_endpoints(kube, namespace, "add-sub")) == 2, 30)

    watcher = RolloutWatcher(kubeconfig, namespace, "add-sub")
    watcher.start()
    try:
        started = time.monotonic()
        kube.patch("TritonModel", "add-sub", {"spec": {"batcher": {"maxQueueDelayMicroseconds": 500}}}, namespace,
                   type="merge")
        tm = wait_model(kube, namespace, "add-sub", lambda tm: tm["status"].get("configDigest") != old and is_model_ready(tm),
                        "Ready at the new config", 180)
        new = tm["status"]["configDigest"]
        wait_for("every replica at the new config, warm, and no old one left",
                 lambda: rolled_out(kube, namespace, "add-sub", new, 2), 120)
        wait_for("2 ready endpoints again", lambda: len(ready_endpoints(kube, namespace, "add-sub")) == 2, 30)
        took = time.monotonic() - started
    finally:
        watcher.stop()
    counts = watcher.ready
    assert not watcher.errors, watcher.errors[:3]
    assert len(counts) >= 20, counts
    record("rollout: ready endpoints min/max over samples", f"{min(counts)}/{max(counts)} over {len(counts)} samples "
           f"({took:.1f}s rollout; live pods max {max(watcher.pods)})")
    assert min(counts) >= 1, f"the Service had no ready endpoint during the rollout: {counts}"
    assert max(watcher.pods) <= 3, f"more than one surge replica at a time: {watcher.pods}"  # replica by replica
    assert "RollingOut" in watcher.progressing, watcher.progressing
    tm = kube.get("TritonModel", "add-sub", namespace)
    assert tm["status"]["warmedReplicas"] == 2 and model_condition(tm, "Progressing")["reason"] == "RolloutComplete"
    assert template_digest(kube, namespace, "add-sub") == new
    for pod in live_pods(kube, namespace, "add-sub"):
        np.testing.assert_allclose(infer_add_sub(pod["status"]["podIP"]), [[11, 22, 33, 44]])


# -- failures Triton reports ------------------------------------------------------------------------

BROKEN_MODEL = """\
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("e2e-broken: cannot open /weights/missing.bin")

    def execute(self, requests):
        return []
"""


def test_model_failing_to_initialize_is_degraded_with_tritons_reason(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    doc = add_sub("broken")
    doc["spec"].pop("modelWarmup")
    doc["spec"]["source"]["inline"]["model.py"] = BROKEN_MODEL
    apply(kubeconfig, namespace, doc)
    tm = wait_model(kube, namespace, "broken", lambda tm: model_condition(tm, "Degraded").get("status") == "True",
                    "Degraded", 120)
    degraded, ready = model_condition(tm, "Degraded"), model_condition(tm, "Ready")
    assert degraded["reason"] == "ModelLoadFailed", degraded
    assert "e2e-broken: cannot open /weights/missing.bin" in degraded["message"], degraded
    assert ready["status"] == "False" and ready["reason"] == "ModelLoadFailed"
    assert "e2e-broken" in ready["message"]
    [replica] = tm["status"]["replicaStates"]
    assert replica["state"] == "Failed" and "e2e-broken: cannot open /weights/missing.bin" in replica["message"]
    assert tm["status"]["warmedReplicas"] == 0

    events = wait_for("a Warning event on the TritonModel", lambda: [
        e for e in kube.items("Event", namespace, field_selector={"involvedObject.name": "broken"})
        if e["type"] == "Warning" and e["involvedObject"]["kind"] == "TritonModel"], 15)
    assert any(e["reason"] == "ModelLoadFailed" and "e2e-broken" in e["message"] for e in events), events
    [pod] = live_pods(kube, namespace, "broken")
    assert gate(pod)["status"] == "False" and gate(pod)["reason"] == "ModelLoadFailed"
    assert not ready_endpoints(kube, namespace, "broken")
    record("bad model: Degraded message", degraded["message"][:160])
    # Flux's health check (kstatus) on the live object: Failed, not InProgress, with Triton's reason.
    broken = kube.get("TritonModel", "broken", namespace)
    status, message = kstatus(broken)
    assert status == "Failed" and "e2e-broken" in message, (status, message)
    status, message = argocd_health(broken)  # Argo CD's: Degraded, with Triton's reason
    assert status == "Degraded" and message.startswith("ModelLoadFailed: ") and "e2e-broken" in message, (status, message)


# -- ensembles ------------------------------------------------------------------------------------------


def infer_sentiment(address: str, texts: list[str]) -> tuple[list[float], list[str]]:
    client = grpcclient.InferenceServerClient(f"{address}:8001")
    try:
        t = grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")
        t.set_data_from_numpy(np.array([[s.encode()] for s in texts], dtype=object))
        res = client.infer("sentiment", [t], client_timeout=30)
        return ([float(x) for x in res.as_numpy("SCORE").reshape(-1)],
                [x.decode() for x in res.as_numpy("LABEL").reshape(-1)])
    finally:
        client.close()


def test_ensemble_is_refused_before_its_steps_serves_the_pipeline_and_rolls_with_a_step(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    docs = {d["metadata"]["name"]: d for d in load_examples("sentiment-ensemble")}

    # The steps do not exist yet: the operator's admission webhook refuses the ensemble, naming them.
    proc = kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=as_stream([docs["sentiment"]]), check=False)
    assert proc.returncode != 0 and "TritonModel 'tokenizer' is not defined" in proc.stderr, proc.stderr
    assert kube.get_or_none("TritonModel", "sentiment", namespace) is None
    assert not owned_children(kube, namespace)

    apply(kubeconfig, namespace, docs["tokenizer"], docs["classifier"])
    apply(kubeconfig, namespace, docs["sentiment"])
    tm = wait_model(kube, namespace, "sentiment", is_model_ready, "Ready once its steps exist", 180)
    ann = kube.get("Deployment", "sentiment", namespace)["spec"]["template"]["metadata"]["annotations"]
    assert ann[ANNOTATION_DIGEST] == tm["status"]["configDigest"]
    assert set(ann["serving.triton-operator.dev/triton-steps"].split(",")) == {"tokenizer", "classifier"}
    [ep] = wait_for("a ready endpoint of the ensemble", lambda: ready_endpoints(kube, namespace, "sentiment"), 30)
    texts = ["what a great wonderful day", "awful terrible service", "the cat sat"]
    scores, labels = infer_sentiment(ep["addresses"][0], texts)
    assert labels == ["positive", "negative", "neutral"] and scores == [3.5, -4.0, 0.0], (scores, labels)
    # The steps (spec.replicas 0 in the example) run no replica of their own: the ensemble's pods serve them.
    for step in ("tokenizer", "classifier"):
        st = wait_model(kube, namespace, step, lambda tm: tm["status"].get("servedBy") == ["sentiment"],
                        "served by the ensemble", 60)
        ready = model_condition(st, "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "ServedByEnsembles"), ready
        assert not model_pods(kube, namespace, step), f"{step} runs pods of its own"
        assert kube.get("Deployment", step, namespace)["spec"]["replicas"] == 0

    # A change to a step rolls the ensemble's replicas: they serve the new step.
    old = ann[ANNOTATION_DIGEST]
    classifier = kube.get("TritonModel", "classifier", namespace)
    source = classifier["spec"]["source"]["inline"]["model.py"]
    assert '"great": 1.5' in source
    kube.patch("TritonModel", "classifier", {"spec": {"source": {"inline": {
        "model.py": source.replace('"great": 1.5', '"great": 5.0')}}}}, namespace, type="merge")
    new = wait_for("the ensemble's Deployment to roll", lambda: (
        template_digest(kube, namespace, "sentiment") if template_digest(kube, namespace, "sentiment") != old else None),
        30)
    wait_model(kube, namespace, "sentiment", lambda tm: tm["status"].get("configDigest") == new and is_model_ready(tm),
               "Ready at the new digest", 180)
    wait_for("the ensemble's replicas rolled", lambda: rolled_out(kube, namespace, "sentiment", new, 1), 120)
    [ep] = wait_for("a ready endpoint of the ensemble", lambda: ready_endpoints(kube, namespace, "sentiment"), 30)
    scores, labels = infer_sentiment(ep["addresses"][0], texts)
    assert scores == [7.0, -4.0, 0.0], scores
    wait_model(kube, namespace, "classifier", is_model_ready, "Ready at its new generation", 120)



# -- model versions -------------------------------------------------------------------------------------


def _score(address: str, model: str, version: str = "") -> float:
    client = grpcclient.InferenceServerClient(f"{address}:8001")
    try:
        x = grpcclient.InferInput("FEATURES", [1, 4], "FP32")
        x.set_data_from_numpy(np.array([[1, 2, 3, 6]], dtype=np.float32))
        return float(client.infer(model, [x], model_version=version, client_timeout=30).as_numpy("SCORE")[0][0])
    finally:
        client.close()


def test_two_versions_serve_side_by_side_and_a_policy_that_unserves_a_pinned_one_is_refused(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    docs = {d["metadata"]["name"]: d for d in load_examples("versions")}
    apply(kubeconfig, namespace, docs["scorer"])
    apply(kubeconfig, namespace, docs["scorer-v1"])
    for name in ("scorer", "scorer-v1"):
        wait_model(kube, namespace, name, is_model_ready, "Ready", 180)
    # The gate checked both versions: the replica says which it asks Triton about.
    [pod] = live_pods(kube, namespace, "scorer")
    assert pod["metadata"]["annotations"]["serving.triton-operator.dev/triton-versions"] == "scorer=1,2"
    assert gate(pod)["status"] == "True"
    [ep] = wait_for("a ready endpoint of scorer", lambda: ready_endpoints(kube, namespace, "scorer"), 30)
    ip = ep["addresses"][0]
    assert _score(ip, "scorer", "1") == 12.0  # version 1: the sum
    assert _score(ip, "scorer", "2") == 3.0  # version 2: the mean
    assert _score(ip, "scorer") == 3.0  # unversioned: the latest
    [ens] = wait_for("a ready endpoint of scorer-v1", lambda: ready_endpoints(kube, namespace, "scorer-v1"), 30)
    assert _score(ens["addresses"][0], "scorer-v1") == 12.0  # the ensemble's pinned version 1

    # latest: 1 would stop serving version 1, which scorer-v1 pins: refused at apply, naming the ensemble's field.
    changed = docs["scorer"]  # a fresh copy: load_examples reads the file each time
    changed["spec"]["versionPolicy"] = {"latest": 1}
    proc = kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=as_stream([changed]), check=False)
    assert proc.returncode != 0, proc.stdout
    assert "scorer-v1" in proc.stderr and "spec.ensemble.steps[0].modelVersion" in proc.stderr, proc.stderr
    assert kube.get("TritonModel", "scorer", namespace)["spec"]["versionPolicy"] == {"all": {}}
