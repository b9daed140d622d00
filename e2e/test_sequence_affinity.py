"""A sequence model behind 2 replicas, called by a client that opens a new connection for every request (as an L7
ingress or a client without keep-alive does), on the real node through kube-proxy (issue 41, item 5).

Triton keeps a sequence's state in the one server that took its first request, and kube-proxy picks a backend at
random for each new connection. The operator gives a sequence model's Service `sessionAffinity: ClientIP`
(`render.service`): every request of a sequence reaches the replica that holds its state. Shown for both shapes, in
one namespace under the session operator:
- `seq-own`: examples/sequence-accumulator.yaml with a Deployment of its own, 2 replicas;
- `seq-pooled`: the same model on a pool of 2 replicas (one per node), 2 copies.

For each, 10 sequences of 10 requests, two at a time with their requests interleaved, each request over a fresh
HTTP connection to the Service's ClusterIP: every running sum must be right. Before the load,
both replicas must be ready endpoints of the Service, so that without the affinity about half the requests would
land on the replica without the sequence's state (measured before the change: 96 of 100 answers wrong for the own
Deployment, 75 of 100 for the pooled model).

Then the model stops being a sequence model (spec.sequenceBatcher dropped): its Service goes back to no affinity,
both fields gone (server-side apply removes what the operator no longer sends; a defaulted timeout left behind would
make the API server refuse the Service).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import OperatorHandle, apply, is_model_ready, load_examples, wait_model
from e2e.pool import model_ready, pool_doc
from e2e.testing import proxied_addresses, ready_addresses

pytestmark = pytest.mark.cluster

POOL = "seq"
SEQUENCES = 10
REQUESTS = 10


def _own() -> dict:
    doc = load_examples("sequence-accumulator")[0]
    doc["metadata"]["name"] = "seq-own"
    doc["spec"]["replicas"] = 2
    return doc


def _pooled() -> dict:
    doc = load_examples("sequence-accumulator")[0]
    doc["metadata"]["name"] = "seq-pooled"
    doc["spec"] |= {"pool": POOL, "memory": "64Mi", "replicas": 2}
    return doc


def _request(cluster_ip: str, model: str, corrid: int, value: int, start: bool, end: bool) -> int:
    """One request of a sequence over a connection of its own (closed after the answer)."""
    client = httpclient.InferenceServerClient(f"{cluster_ip}:8000", connection_timeout=10, network_timeout=10)
    try:
        inp = httpclient.InferInput("VALUE", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        out = client.infer(model, [inp], sequence_id=corrid, sequence_start=start, sequence_end=end)
        return int(out.as_numpy("SUM").reshape(-1)[0])
    finally:
        client.close()


def _run_sequences(cluster_ip: str, model: str) -> list[str]:
    """SEQUENCES sequences of REQUESTS requests, two live at a time (their requests interleaved); what went wrong,
    one line per request. Two, not all ten: the example's model has 4 sequence slots (maxBatchSize 4, one
    instance), and Triton's direct strategy holds a sequence beyond them in its backlog until a slot frees, so a
    client that waits on each answer would stall until the older sequences idle out (their state gone: "must specify
    the START flag"), on one replica as on two."""
    wrong: list[str] = []
    for pair in range(1, SEQUENCES + 1, 2):
        sums = {pair: 0, pair + 1: 0}
        for i in range(REQUESTS):
            for corrid in list(sums):
                value = corrid * 100 + i
                sums[corrid] += value
                try:
                    got = _request(cluster_ip, model, corrid, value, start=i == 0, end=i == REQUESTS - 1)
                except Exception as e:  # noqa: BLE001 - a refused request is a wrong answer: say which and why
                    wrong.append(f"sequence {corrid} request {i}: {type(e).__name__}: {e}")
                    continue
                if got != sums[corrid]:
                    wrong.append(f"sequence {corrid} request {i}: sum {got}, expected {sums[corrid]}")
    return wrong


def _check(kube: Kube, namespace: str, model: str) -> None:
    svc = kube.get("Service", model, namespace)
    assert svc["spec"].get("sessionAffinity") == "ClientIP", f"{model}'s Service: {svc['spec']}"
    ips = wait_for(f"{model}: both replicas ready endpoints of its Service",
                   lambda: (a if len(a := ready_addresses(kube, namespace, model)) == 2 else None), 60)
    wait_for(f"{model}: kube-proxy sending its http port to both",
             lambda: proxied_addresses(namespace, model) in (ips, None), 60)
    wrong = _run_sequences(svc["spec"]["clusterIP"], model)
    assert not wrong, (f"{model}: {len(wrong)} of {SEQUENCES * REQUESTS} requests wrong through its Service "
                       f"(ready endpoints {sorted(ips)}): {wrong[:3]}; kube-proxy's rules for it:\n"
                       + _rules(namespace, model))


def _rules(namespace: str, model: str) -> str:
    """kube-proxy's nat rules for the Service and its endpoints' chains with their packet counters (iptables mode;
    this process runs in the network namespace whose rules kube-proxy writes), and the `recent` lists that hold the
    affinity: which rule each new connection took."""
    out = subprocess.run(["iptables-save", "-c", "-t", "nat"], capture_output=True, text=True, timeout=30).stdout
    chains = {w for line in out.splitlines() if f"{namespace}/{model}:" in line
              for w in line.split() if w.startswith(("KUBE-SVC-", "KUBE-SEP-"))}
    lists = {p.name: p.read_text() for p in Path("/proc/net/xt_recent").glob("KUBE-SEP-*")}
    return "\n".join([*(line for line in out.splitlines() if any(c in line for c in chains)),
                       *(f"xt_recent {n}: {v.strip()[:300]}" for n, v in sorted(lists.items()) if n in chains)])


def _affinity_dropped(kube: Kube, namespace: str, model: str) -> None:
    kube.patch("TritonModel", model, {"spec": {"sequenceBatcher": None}}, namespace, type="merge")
    wait_for(f"{model}'s Service without affinity once the sequence batcher is dropped", lambda: (
        "sessionAffinityConfig" not in (s := kube.get("Service", model, namespace)["spec"])
        and s.get("sessionAffinity", "None") == "None"), 60)


def test_every_request_of_a_sequence_reaches_the_replica_that_holds_its_state(
        operator: OperatorHandle, kube: Kube, kubeconfig: Path, namespace: str) -> None:
    apply(kubeconfig, namespace, pool_doc(POOL, 2, "256Mi"), _own(), _pooled())
    wait_model(kube, namespace, "seq-own", is_model_ready, "Ready with 2 replicas", 240)
    wait_model(kube, namespace, "seq-pooled", lambda tm: model_ready(tm) and tm["status"].get("warmedReplicas") == 2,
               "Ready with 2 copies warmed", 240)
    for model in ("seq-own", "seq-pooled"):
        _check(kube, namespace, model)
    for model in ("seq-own", "seq-pooled"):
        _affinity_dropped(kube, namespace, model)
