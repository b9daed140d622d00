"""Triton's repository API on the real nodes (issue 32): only the operator may load, unload or list models; and
Triton's other admin APIs (shared memory, logging, trace: issue 39) answer only the key too.

Replicas restrict the API to their model's key (`render.repository_key`), read from a Secret the operator created;
the key is in no pod spec. Through the model's Service (its ClusterIP, through the real kube-proxy) and at each
replica: an unload, a load of a client's own Python code (config plus `file:1/model.py`, under a new name or over the
served model) and the repository index are refused, over HTTP (403) and gRPC; every replica keeps the model READY and
answering; the same call with the model's key is accepted, and the operator still reloads a config in place.

Then a host-run operator (`e2e.operator_fixtures.start_operator`, its own namespace pattern): restarted with the same
key file it changes nothing and still reloads in place; started with another master key, it rolls the replicas to
new pods that hold the new key, and reloads them in place.
"""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import (
    OperatorHandle,
    as_stream,
    gate,
    is_model_ready,
    kubectl,
    load_examples,
    model_pods,
    record,
    repository_key_file,
    start_operator,
    wait_model,
)
from e2e.testing import delete_namespace
from e2e.traffic import ADMIN_HTTP, admin_grpc_calls, grpc_not_refused, http_call, infer_add_sub
from triton_operator.api.pod import ANNOTATION_DIGEST, KEY_HEADER, REPOSITORY_KEY_ENV

pytestmark = pytest.mark.cluster

MODEL = "add-sub"


def add_sub(replicas: int, generation: str = "1") -> dict[str, Any]:
    doc = load_examples("add-sub")[0]
    doc["spec"]["replicas"] = replicas
    doc["spec"]["parameters"] = {"generation": generation}  # a change of it is a config change: loaded in place
    return doc


def apply(kubeconfig: Path, namespace: str, doc: dict[str, Any]) -> None:
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=as_stream([doc]))


def intruder(name: str) -> tuple[str, dict[str, bytes]]:
    """A load's `config` and files: a Python model of a client's own, which would run its code in tritonserver."""
    config = json.dumps({"name": name, "backend": "python", "max_batch_size": 0,
                         "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [4]}],
                         "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]}]})
    code = ("import os\nclass TritonPythonModel:\n    def initialize(self, args):\n        os.system('id')\n"
            "    def execute(self, requests):\n        return []\n")
    return config, {"file:1/model.py": code.encode()}


def http_attempts() -> dict[str, tuple[str, dict[str, Any] | None]]:
    out: dict[str, tuple[str, dict[str, Any] | None]] = {"unload": (f"/v2/repository/models/{MODEL}/unload", {}),
                                                         "index": ("/v2/repository/index", {}), **ADMIN_HTTP}
    for target in ("intruder", MODEL):
        config, files = intruder(target)
        body = {"parameters": {"config": config, **{k: base64.b64encode(v).decode() for k, v in files.items()}}}
        out[f"load {target} with files"] = (f"/v2/repository/models/{target}/load", body)
    return out


def accepts(ip: str, port: int) -> bool:
    """Whether a TCP connection to ip:port is accepted."""
    try:
        with socket.create_connection((ip, port), 2):
            return True
    except OSError:
        return False


def refused_over_http(address: str) -> dict[str, tuple[int, str]]:
    """Every attempt at `address`, with no key and with a wrong one: what Triton answered, where it did not refuse."""
    answers = {f"{what} ({'wrong key' if h else 'no key'})": http_call(address, path, body, h)
               for what, (path, body) in http_attempts().items() for h in (None, {KEY_HEADER: "0" * 64})}
    return {what: a for what, a in answers.items() if not (a[0] == 403 and "This API is restricted" in a[1])}


def refused_over_grpc(address: str) -> dict[str, str]:
    """The same over gRPC at `address` (host:port): what was not refused."""
    client = grpcclient.InferenceServerClient(address)
    config, files = intruder("intruder")
    calls = {"unload": lambda h: client.unload_model(MODEL, headers=h),
             "load with files": lambda h: client.load_model("intruder", config=config, files=files, headers=h),
             "index": lambda h: client.get_model_repository_index(headers=h), **admin_grpc_calls(client)}
    try:
        return grpc_not_refused(calls)
    finally:
        client.close()


def key_secret(kube: Kube, namespace: str) -> tuple[str, str]:
    """The Secret the Deployment's tritonserver reads its key from, and the key (read as the cluster's admin)."""
    template = kube.get("Deployment", MODEL, namespace)["spec"]["template"]["spec"]
    (ref,) = [e["valueFrom"]["secretKeyRef"] for e in template["containers"][0]["env"] if e["name"] == REPOSITORY_KEY_ENV]
    secret = kube.get("Secret", ref["name"], namespace)
    return ref["name"], base64.b64decode(secret["data"][ref["key"]]).decode()


def pods_at(kube: Kube, namespace: str, digest: str, replicas: int) -> list[dict[str, Any]] | None:
    pods = [p for p in model_pods(kube, namespace, MODEL) if not p["metadata"].get("deletionTimestamp")]
    ok = len(pods) == replicas and all(
        (p["metadata"].get("annotations") or {}).get(ANNOTATION_DIGEST) == digest and gate(p).get("status") == "True"
        for p in pods)
    return pods if ok else None


def reload_in_place(kube: Kube, kubeconfig: Path, namespace: str, replicas: int, generation: str) -> None:
    """A config change (parameters) reaches the running replicas in place: the same pods, the new digest, warmed."""
    before = sorted(p["metadata"]["name"] for p in model_pods(kube, namespace, MODEL)
                    if not p["metadata"].get("deletionTimestamp"))  # (one a rollout replaced may still be stopping)
    apply(kubeconfig, namespace, add_sub(replicas, generation))
    tm = wait_model(kube, namespace, MODEL, lambda t: is_model_ready(t) and (t.get("status") or {}).get(
        "warmedReplicas") == replicas, f"Ready with generation {generation}", 180)
    digest = tm["status"]["configDigest"]
    pods = wait_for(f"{replicas} replicas at {digest}", lambda: pods_at(kube, namespace, digest, replicas), 120)
    assert sorted(p["metadata"]["name"] for p in pods) == before, "the reload made new pods: it was not in place"


def test_through_the_service_no_client_may_unload_the_model_or_load_its_own_code(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    apply(kubeconfig, namespace, add_sub(2))
    tm = wait_model(kube, namespace, MODEL, lambda t: is_model_ready(t) and t["status"].get("readyReplicas") == 2,
                    "Ready with 2 replicas", 240)
    name, key = key_secret(kube, namespace)
    secret = kube.get("Secret", name, namespace)
    assert secret["immutable"] is True and secret["metadata"]["ownerReferences"][0]["uid"] == tm["metadata"]["uid"]
    pods = [p for p in model_pods(kube, namespace, MODEL) if not p["metadata"].get("deletionTimestamp")]
    for obj in (*pods, kube.get("Deployment", MODEL, namespace)):
        assert key not in json.dumps(obj), f"the key is in {obj['kind']} {obj['metadata']['name']}"

    svc = kube.get("Service", MODEL, namespace)["spec"]["clusterIP"]
    # kube-proxy programs the ready endpoints a moment after they turn ready (its sync runs at most once a second):
    # until then the ClusterIP refuses connections, as on any cluster (a CI run once met that here). Wait for it, so
    # that what is checked below is Triton's answer, not kube-proxy's lag.
    wait_for("kube-proxy to send the ClusterIP's HTTP and gRPC ports to the replicas",
             lambda: accepts(svc, 8000) and accepts(svc, 8001), 30, 0.1)
    addresses = {"the Service": svc} | {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    for where, ip in addresses.items():
        assert not (wrong := refused_over_http(f"{ip}:8000")), f"{where} over HTTP: {wrong}"
        assert not (wrong := refused_over_grpc(f"{ip}:8001")), f"{where} over gRPC: {wrong}"
    # Every replica still serves the model (READY, warmed, answering), and the TritonModel says so.
    for p in pods:
        ip = p["status"]["podIP"]
        with urllib.request.urlopen(f"http://{ip}:8000/v2/models/{MODEL}/ready", timeout=10) as resp:
            assert resp.status == 200
        np.testing.assert_array_equal(infer_add_sub(ip, MODEL), [[11, 22, 33, 44]])
        assert gate(kube.get("Pod", p["metadata"]["name"], namespace)).get("status") == "True"
    np.testing.assert_array_equal(infer_add_sub(svc, MODEL), [[11, 22, 33, 44]])
    assert is_model_ready(kube.get("TritonModel", MODEL, namespace))
    # With the model's key (the operator's), the same API answers: the restriction is the key, not a closed door.
    status, text = http_call(f"{svc}:8000", "/v2/repository/index", {}, {KEY_HEADER: key})
    assert status == 200 and {"name": MODEL, "version": "1", "state": "READY"} in json.loads(text), (status, text)
    # The admin APIs answer the key too (the restriction is the key): the log level and the shared-memory status.
    assert http_call(f"{svc}:8000", "/v2/logging", None, {KEY_HEADER: key})[0] == 200
    assert http_call(f"{svc}:8000", "/v2/systemsharedmemory/status", None, {KEY_HEADER: key})[0] == 200
    record("repository and admin APIs through the Service without the key",
           f"refused: {len(http_attempts()) * 2} HTTP calls (403) and {(3 + len(ADMIN_HTTP)) * 2} gRPC calls "
           f"(UNAVAILABLE) at the Service and at each of {len(pods)} replicas; the model READY throughout")

    reload_in_place(kube, kubeconfig, namespace, 2, "2")  # the operator, with the key, still reloads in place


def test_a_restarted_operator_keeps_its_key_and_a_new_master_key_rolls_the_replicas(
        kube: Kube, kubeconfig: Path, cluster: Any, nodes: Any, tmp_path: Path) -> None:
    prefix = f"rk{uuid.uuid4().hex[:4]}"
    namespace = f"{prefix}-models"
    logs = cluster.logs or tmp_path
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {"e2e.triton-operator.io/test": "true"}}})
    op = start_operator(kubeconfig, kube, logs, pattern=f"{prefix}-*", log_name=f"operator-{prefix}.log", webhook=False)
    try:
        wait_for("the default ServiceAccount", lambda: kube.get_or_none("ServiceAccount", "default", namespace), 30)
        apply(kubeconfig, namespace, add_sub(1))
        tm = wait_model(kube, namespace, MODEL, is_model_ready, "Ready", 240)
        first_secret, _ = key_secret(kube, namespace)
        (pod,) = wait_for("the replica warmed", lambda: pods_at(kube, namespace, tm["status"]["configDigest"], 1), 60)
        generation = kube.get("Deployment", MODEL, namespace)["metadata"]["generation"]

        # Restarted with the same key file: nothing rolls, and it still loads configs into the replica.
        op.restart()
        wait_for("the restarted operator to reconcile", lambda: op.reconciles() >= 1, 60)
        reload_in_place(kube, kubeconfig, namespace, 1, "2")
        assert kube.get("Deployment", MODEL, namespace)["metadata"]["generation"] == generation
        assert key_secret(kube, namespace)[0] == first_secret
        assert [p["metadata"]["name"] for p in model_pods(kube, namespace, MODEL)] == [pod["metadata"]["name"]]
        assert "RepositoryKeyRefused" not in op.log_since()

        # Another master key: a new Secret, new pods holding it (not old ones the operator could no longer reload).
        new_key = tmp_path / "another-master-key"
        new_key.write_text(base64.b64encode(b"another master key of 32 bytes..").decode())
        op.stop()
        op.argv[op.argv.index("--repository-key-file") + 1] = str(new_key)
        op.start()
        second_secret = wait_for("the Deployment to name a new key Secret", lambda: (
            s if (s := key_secret(kube, namespace)[0]) != first_secret else None), 60)
        tm = wait_model(kube, namespace, MODEL, lambda t: is_model_ready(t) and t["status"].get("warmedReplicas") == 1,
                        "Ready on the new key", 240)
        (new_pod,) = wait_for("the replica replaced and warmed",
                              lambda: pods_at(kube, namespace, tm["status"]["configDigest"], 1), 120)
        assert new_pod["metadata"]["name"] != pod["metadata"]["name"]
        assert kube.get_or_none("Secret", first_secret, namespace) is not None, "the old Secret stays (no delete)"
        reload_in_place(kube, kubeconfig, namespace, 1, "3")
        record("repository master key changed", f"Secret {first_secret} -> {second_secret}; the replica rolled")
    finally:
        op.stop()
        delete_namespace(kube, namespace)  # the operator stopped first
    assert repository_key_file(logs).exists()
