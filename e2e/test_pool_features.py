"""Model features on a pool (issue 41, item 5): what a TritonModel does on its own replicas works the same when it is
pooled (spec.pool), each checked through the pooled model's own Service (its ClusterIP: kube-proxy picks the replica),
on real kubelets.

One pool of 2 replicas, one per node, holds every model at once, so the file pays for one pool start:

- `response-cache` (examples/response-cache.yaml with a dynamic batcher) on the pool's response cache (the pool's
  spec.server.cacheSize: a pooled model sets no server field): the same request twice, the second a cache hit in its
  replica's statistics, the model run once; and `dynamic-batching` (examples/dynamic-batching.yaml): concurrent
  requests executed together, by the model's own answer and by Triton's batch statistics;
- `decoupled` (examples/decoupled.yaml, 2 copies): gRPC streams through the ClusterIP's port 8001, each answered with
  exactly the responses the model sends;
- `scorer` (examples/versions.yaml's model with a third version and `versionPolicy.specific: [1, 3]`, 2 copies):
  versions 1 and 3 answer through the Service with their own code, version 2 is served nowhere;
- `drainer` (add-sub, 2 copies, `rollout.mode: Drain`): a config-only update under load through its ClusterIP, 0 failed
  requests, each copy out of the slice while it reloads (one at a time), `PoolAudit` finding no endpoint listed where
  the model was not READY at the desired digest.

And a pooled model asking for the response cache of a pool without one (cacheSize 0) is refused at `kubectl apply`.

Same session operator (the chart) as `test_pool.py`; one namespace for the whole module.
"""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad
from e2e.operator_fixtures import (
    OPERATOR_NAMESPACE_PREFIX,
    SESSION_LABEL,
    OperatorHandle,
    apply,
    as_stream,
    kubectl,
    load_examples,
    record,
)
from e2e.pool import (
    PoolAudit,
    placement,
    pool_doc,
    pooled_add_sub,
    replica_pods,
    served_digest,
    wait_placed_everywhere,
)
from e2e.testing import delete_namespace, is_ready
from e2e.traffic import model_ready_over_http
from tests.timing import scaled

pytestmark = pytest.mark.cluster

POOL = "features"
#: 8 copies of 64Mi (two models of 1 copy, three of 2) on 2 replicas: 4 each (Spread), 256Mi of the 384Mi.
CAPACITY = "384Mi"
MEMORY = "64Mi"
#: The pool's response cache, shared by its models with responseCache (16Mi, as examples/response-cache.yaml asks).
CACHE_BYTES = 16 << 20
CACHED, BATCHING, DECOUPLED, SCORER, DRAINER = "response-cache", "dynamic-batching", "decoupled", "scorer", "drainer"
NAMES = (CACHED, BATCHING, DECOUPLED, SCORER, DRAINER)

SCORER_V3 = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Version 3: the largest feature."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
            score = x.max(axis=1, keepdims=True).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCORE", score)]))
        return responses
'''


# -- the documents -------------------------------------------------------------------------------


def pooled(doc: dict, copies: int) -> dict:
    """An example made pooled: on POOL, `copies` copies of MEMORY each, and no server field (the pool's replicas
    carry them: the example's cacheSize is the pool's here)."""
    doc["spec"].pop("server", None)
    doc["spec"].update(pool=POOL, memory=MEMORY, replicas=copies)
    return doc


def cached_doc() -> dict:
    doc = pooled(load_examples("response-cache")[0], 1)
    doc["spec"]["batcher"] = {"maxQueueDelayMicroseconds": 1000}
    return doc


def scorer_doc() -> dict:
    """examples/versions.yaml's scorer (v1 the sum, v2 the mean), a v3 (the max), and a policy serving 1 and 3."""
    doc = pooled(load_examples("versions")[0], 2)
    doc["spec"]["versions"].append({"version": 3, "source": {"inline": {"model.py": SCORER_V3}}})
    doc["spec"]["versionPolicy"] = {"specific": [1, 3]}
    return doc


def drainer_doc(init_seconds: float = 0.0) -> dict:
    doc = pooled_add_sub(DRAINER, POOL, 2, MEMORY, init_seconds)
    doc["spec"]["rollout"] = {"mode": "Drain"}
    return doc


def fleet() -> list[dict]:
    pool = pool_doc(POOL, 2, CAPACITY)
    pool["spec"]["server"]["cacheSize"] = "16Mi"
    return [pool, cached_doc(), pooled(load_examples("dynamic-batching")[0], 1),
            pooled(load_examples("decoupled")[0], 2), scorer_doc(), drainer_doc()]


# -- the module's pool ---------------------------------------------------------------------------


@dataclass
class Fleet:
    namespace: str
    models: dict[str, dict]  # name -> TritonModel, once every copy was placed and READY
    ips: dict[str, str]  # replica pod -> its IP
    service_ips: dict[str, str]  # model -> its Service's ClusterIP

    def replicas_of(self, name: str) -> list[str]:
        """The pod IPs of the replicas the model is placed on."""
        return [self.ips[r] for r in placement(self.models[name])]


@pytest.fixture(scope="module")
def namespace(kube: Kube) -> Iterator[str]:
    """One namespace for the whole module (the pool is started once), inside the session operator's watch. Named
    `namespace` so that a failed test's diagnostics (e2e/conftest.py) read it."""
    name = f"{OPERATOR_NAMESPACE_PREFIX}pool-features-{uuid.uuid4().hex[:5]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
        "e2e.triton-operator.io/test": "true", SESSION_LABEL[0]: SESSION_LABEL[1]}}})
    wait_for(f"default ServiceAccount in {name}", lambda: kube.get_or_none("ServiceAccount", "default", name), 30)
    yield name
    delete_namespace(kube, name)


@pytest.fixture(scope="module")
def placed(kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> Fleet:
    """The pool and every model applied at once; returned once each model has every copy READY at its digest and
    answers through its ClusterIP."""
    t0 = time.monotonic()
    apply(kubeconfig, namespace, *fleet())
    replicas = wait_for("2 pool replicas Ready", lambda: (
        pods if len(pods := replica_pods(kube, namespace, POOL)) == 2 and all(is_ready(p) for p in pods) else None),
        180, 0.5)
    nodes = sorted(p["spec"]["nodeName"] for p in replicas)
    assert len(set(nodes)) == 2, f"the pool's 2 replicas are not on both nodes: {nodes}"
    models = wait_placed_everywhere(kube, namespace, NAMES, 300)
    service_ips = {n: kube.get("Service", n, namespace)["spec"]["clusterIP"] for n in NAMES}
    for n, ip in service_ips.items():
        wait_for(f"{n} ready through its ClusterIP {ip}", lambda n=n, ip=ip: model_ready_over_http(ip, n), 30, 0.2)
    record("pool features: pool and 5 models placed, serving through their Services",
           f"{time.monotonic() - t0:.1f}s")
    return Fleet(namespace, models, {p["metadata"]["name"]: p["status"]["podIP"] for p in replicas}, service_ips)


# -- talking to Triton ---------------------------------------------------------------------------


def post_infer(ip: str, model: str, inputs: list[dict], version: str = "") -> tuple[int, dict]:
    """One HTTP inference at `ip`:8000 on a new connection (through a ClusterIP: kube-proxy picks the replica);
    (status, the JSON answer)."""
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    conn = http.client.HTTPConnection(ip, 8000, timeout=30)
    try:
        conn.request("POST", path, json.dumps({"inputs": inputs}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def output(answer: dict, name: str) -> list[Any]:
    return next(o for o in answer["outputs"] if o["name"] == name)["data"]


def statistics(ips: list[str], model: str) -> dict[str, int]:
    """Triton's statistics of `model`, summed over the replicas at `ips` (HTTP, port 8000) and its versions."""
    total: dict[str, int] = {}
    for ip in ips:
        client = httpclient.InferenceServerClient(f"{ip}:8000", connection_timeout=10, network_timeout=10)
        try:
            for s in client.get_inference_statistics(model)["model_stats"]:
                figures = {"inference_count": s["inference_count"], "execution_count": s["execution_count"],
                           **{k: v["count"] for k, v in s["inference_stats"].items()},
                           **{f"batch_{b['batch_size']}": b["compute_infer"]["count"] for b in s["batch_stats"]}}
                for k, v in figures.items():
                    total[k] = total.get(k, 0) + int(v)
        finally:
            client.close()
    return total


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after))
            if after.get(k, 0) != before.get(k, 0)}


# -- 1. the response cache and dynamic batching --------------------------------------------------


def test_response_cache_and_dynamic_batching_on_the_pool(kube: Kube, placed: Fleet) -> None:
    for pod in replica_pods(kube, placed.namespace, POOL):
        args = next(c for c in pod["spec"]["containers"] if c["name"] == "tritonserver")["args"]
        assert f"--cache-config=local,size={CACHE_BYTES}" in args, (
            f"{pod['metadata']['name']}'s tritonserver has no 16Mi response cache (the pool's cacheSize): {args}")
    [ip] = placed.replicas_of(CACHED)
    client = httpclient.InferenceServerClient(f"{ip}:8000")
    try:
        config = client.get_model_config(CACHED)
    finally:
        client.close()
    assert config.get("response_cache", {}).get("enable") and "dynamic_batching" in config, (
        f"{CACHED}'s config as its replica loaded it has no response cache or no dynamic batcher: {config}")

    # the same request twice through the Service: the second answered from the cache, the model run once
    x = [1.5, -2.0, 3.0, 0.25]
    request = [{"name": "INPUT", "shape": [1, 4], "datatype": "FP32", "data": x}]
    before = statistics([ip], CACHED)
    answers = [post_infer(placed.service_ips[CACHED], CACHED, request) for _ in range(2)]
    assert all(status == 200 and output(a, "SQUARED") == [v * v for v in x] for status, a in answers), answers
    after = wait_for(f"both requests in {CACHED}'s statistics", lambda: (
        s if (s := statistics([ip], CACHED)).get("success", 0) - before.get("success", 0) >= 2 else None), 30, 0.2)
    seen = grown(before, after)
    assert (seen.get("cache_miss"), seen.get("cache_hit"), seen.get("execution_count")) == (1, 1, 1), (
        f"two identical requests through {CACHED}'s Service: expected 1 cache miss, 1 cache hit, 1 execution; "
        f"Triton's statistics on {ip} grew by {seen}")

    # concurrent requests through the Service: executed together by the dynamic batcher
    [ip] = placed.replicas_of(BATCHING)
    before = statistics([ip], BATCHING)
    rounds: list[list[int]] = []

    def one_round() -> bool:
        together = concurrent_batch(placed.service_ips[BATCHING], 8)
        rounds.append(together)
        return max(together) > 1

    wait_for(f"a round of 8 concurrent requests to {BATCHING} executed in batches", one_round, 30, 0)
    after = wait_for(f"the rounds in {BATCHING}'s statistics", lambda: (
        s if (s := statistics([ip], BATCHING)).get("success", 0) - before.get("success", 0) >= 8 * len(rounds)
        else None), 30, 0.2)
    seen = grown(before, after)
    batched = {k: v for k, v in seen.items() if k.startswith("batch_") and k != "batch_1"}
    assert batched and seen["execution_count"] < seen["inference_count"], (
        f"{BATCHING}: each request's BATCHED_WITH by round {rounds}, but Triton's statistics on {ip} show no batch of "
        f"more than one: {seen}")
    record("pool features: dynamic batching", f"BATCHED_WITH by round {rounds}; statistics grew by {seen}")


def test_a_pooled_model_asking_for_the_response_cache_of_a_pool_without_one_is_refused(
        kube: Kube, kubeconfig: Path, placed: Fleet) -> None:
    """A pool's replicas have the one cache its spec.server.cacheSize sizes: with 0 (a pool of no replicas here, it
    costs nothing), a pooled model with responseCache would cache nothing, and the webhook refuses it, naming the
    field and the rule (the pool's figures are not told: kubectl's caller has not shown it may read the namespace,
    `validate.admission.redacted`)."""
    empty = pool_doc("no-cache", 0, CAPACITY)
    empty["spec"]["server"]["cacheSize"] = "0"
    apply(kubeconfig, placed.namespace, empty)
    doc = cached_doc()
    doc["metadata"]["name"] = "uncached"
    doc["spec"]["pool"] = "no-cache"
    proc = kubectl(kubeconfig, "apply", "-n", placed.namespace, "-f", "-", stdin=as_stream([doc]), check=False)
    rule = "responseCache needs server.cacheSize > 0 (a pooled model: its pool's)"
    assert proc.returncode != 0 and "spec.responseCache" in proc.stderr and rule in proc.stderr, (
        f"a model with responseCache on pool no-cache (cacheSize 0): kubectl apply exited {proc.returncode}: "
        f"{proc.stderr.strip() or proc.stdout.strip()}")
    assert kube.get_or_none("TritonModel", "uncached", placed.namespace) is None, "the refused model was created"


def concurrent_batch(ip: str, n: int) -> list[int]:
    """`n` requests to dynamic-batching at `ip` at once, each on its own connection; each answer's BATCHED_WITH (how
    many requests shared its execute), after checking its OUTPUT (twice the input)."""
    start = threading.Barrier(n)
    got: list[tuple[float, int, dict]] = []

    def send(i: int) -> None:
        start.wait(10)
        status, answer = post_infer(ip, BATCHING, [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32",
                                                    "data": [float(i)]}])
        got.append((float(i), status, answer))

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(30))
    assert len(got) == n, f"{n - len(got)} of {n} concurrent requests to {BATCHING} not answered: {got}"
    wrong = [(x, status, answer) for x, status, answer in got if status != 200 or output(answer, "OUTPUT") != [2 * x]]
    assert not wrong, f"{BATCHING} through its Service answered wrongly (OUTPUT must be twice INPUT): {wrong}"
    return sorted(int(output(answer, "BATCHED_WITH")[0]) for _, _, answer in got)


# -- 2. a decoupled model's gRPC stream ----------------------------------------------------------


def stream(ip: str, count: int, request_id: str) -> list[int]:
    """One request over a gRPC stream to `ip`:8001: the INDEX of every data response until the FINAL one."""
    client = grpcclient.InferenceServerClient(f"{ip}:8001")
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        tensor = grpcclient.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([count], dtype=np.int32))
        client.async_stream_infer(DECOUPLED, [tensor], request_id=request_id, enable_empty_final_response=True)
        indices: list[int] = []
        deadline = time.monotonic() + scaled(30)
        while True:
            try:
                result, error = got.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"stream {request_id} through {ip}:8001: no FINAL response in {scaled(30):.0f}s; "
                                     f"data responses so far {indices}") from None
            assert error is None, f"stream {request_id} through {ip}:8001 failed after {indices}: {error}"
            response = result.get_response()
            assert response.id == request_id, f"a response to {response.id!r} on the stream of {request_id!r}"
            if response.outputs:
                indices.append(int(result.as_numpy("INDEX")[0]))
            if response.parameters["triton_final_response"].bool_param:
                return indices
    finally:
        client.stop_stream()
        client.close()


def test_decoupled_model_streams_over_grpc_through_the_pooled_service(placed: Fleet) -> None:
    ip = placed.service_ips[DECOUPLED]
    replicas = placed.replicas_of(DECOUPLED)
    before = statistics(replicas, DECOUPLED)
    counts = (5, 0, 3, 7)
    for i, count in enumerate(counts):
        got = stream(ip, count, f"stream-{i}")
        assert got == list(range(count)), (
            f"COUNT {count} through {DECOUPLED}'s ClusterIP {ip}:8001: expected the responses {list(range(count))} "
            f"then FINAL, got {got}")
    # Triton counts a decoupled request once it released it, just after its FINAL response
    after = wait_for(f"the {len(counts)} streamed requests in {DECOUPLED}'s statistics", lambda: (
        s if (s := statistics(replicas, DECOUPLED)).get("inference_count", 0) - before.get("inference_count", 0)
        >= len(counts) else None), 30, 0.2)
    seen = grown(before, after)
    assert seen.get("inference_count") == len(counts) and not seen.get("fail"), (
        f"{len(counts)} streams: Triton's statistics over {DECOUPLED}'s copies {replicas} grew by {seen}")


# -- 3. versions and a version policy ------------------------------------------------------------


def test_versions_the_policy_keeps_answer_through_the_pooled_service_and_the_dropped_one_is_not_served(
        placed: Fleet) -> None:
    ip = placed.service_ips[SCORER]
    features = [1.0, 2.0, 3.0, 6.0]
    request = [{"name": "FEATURES", "shape": [1, 4], "datatype": "FP32", "data": features}]
    expected = {"1": [12.0], "3": [6.0], "": [6.0]}  # v1 the sum, v3 the max; unversioned: the highest served
    for version, score in expected.items():
        for _ in range(4):  # new connections: kube-proxy spreads them over both copies
            status, answer = post_infer(ip, SCORER, request, version)
            assert status == 200 and output(answer, "SCORE") == score, (
                f"{SCORER} version {version or '(unversioned)'} through its ClusterIP: expected {score}, got "
                f"HTTP {status} {answer}")
    status, answer = post_infer(ip, SCORER, request, "2")
    assert status == 404 and f"'{SCORER}' version 2 is not found" in answer.get("error", ""), (
        f"{SCORER} version 2, which versionPolicy.specific [1, 3] drops, answered through its ClusterIP: HTTP {status} "
        f"{answer}")
    # every copy: versions 1 and 3 READY, version 2 not
    for replica in placed.replicas_of(SCORER):
        ready = {v: model_ready_over_http(replica, SCORER, v) for v in ("1", "2", "3")}
        assert ready == {"1": True, "2": False, "3": True}, f"{SCORER}'s versions READY on {replica}: {ready}"
    record("pool features: a dropped version asked for", f"HTTP {status} {answer}")


# -- 4. an update in Drain mode under load -------------------------------------------------------


def test_drain_update_under_load_through_the_pooled_service_fails_no_request(
        kube: Kube, kubeconfig: Path, placed: Fleet) -> None:
    namespace = placed.namespace
    copies = sorted(placement(placed.models[DRAINER]))
    old = placed.models[DRAINER]["status"]["configDigest"]
    with PoolAudit(kube, namespace, min_samples=10) as audit, \
            ServiceLoad(kubeconfig, namespace, DRAINER, DRAINER, threads=2, rate=10, refresh=0.5) as load:
        wait_for("the load answered", lambda: load.tally().sent - load.tally().failed >= 20, 30, 0.2)
        since = {n: len(h) for n, h in audit.changes.items()}
        t0 = time.monotonic()
        apply(kubeconfig, namespace, drainer_doc(init_seconds=1.5))  # config only: a new digest, loaded in place
        new = wait_for("the new digest in drainer's status", lambda: (
            d if (d := kube.get("TritonModel", DRAINER, namespace)["status"].get("configDigest")) != old else None),
            30, 0.2)
        models = wait_placed_everywhere(kube, namespace, [DRAINER], 120)
        ips = [placed.ips[r] for r in placement(models[DRAINER])]
        wait_for("every copy of drainer READY at the new digest", lambda: all(
            served_digest(ip, DRAINER) == new for ip in ips), 60, 0.2)
        took = time.monotonic() - t0
        answered = load.tally().sent
        wait_for("the load answered after the update", lambda: load.tally().sent >= answered + 20, 30, 0.2)
        tally = load.stop()
        audit.stop()
    assert sorted(placement(models[DRAINER])) == copies, f"drainer moved: {copies} -> {placement(models[DRAINER])}"
    assert tally.failed == 0 and tally.sent > tally.failed, (
        f"load through drainer's ClusterIP during its Drain update: {tally.summary()}; failures {load.samples}; "
        f"endpoints {load.endpoint_history[-8:]}")
    listed = [pods for _, pods in audit.changes[DRAINER][since.get(DRAINER, 0):]]
    out = {r: any(r not in pods for pods in listed) for r in copies}
    assert all(out.values()) and all(listed), (
        f"Drain, maxUnavailable 1: each copy leaves drainer's slice while it reloads, never both at once; the slice "
        f"listed {[sorted(p) for p in listed]} after the update (each copy out at some point: {out})")
    record("pool features: Drain update under load",
           f"{took:.1f}s for 2 copies; {tally.summary()}; slice listed {[sorted(p) for p in listed]}; "
           f"{audit.summary()}")
