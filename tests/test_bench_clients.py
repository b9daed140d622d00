"""bench/scale.py attributes each audited request to its client by user agent (bench/clients.py): the operator's
writes are what the scale benchmark reports, so no other component's request may count as the operator's."""

from __future__ import annotations

import pytest

from bench.clients import by_client, client_of
from triton_operator.platform.kube import USER_AGENT


@pytest.mark.parametrize(("agent", "client"), [
    ("kubelet/v1.35.4 (linux/amd64) kubernetes/abc", "kubelet"),  # node status and its Lease: the real node
    ("kube-proxy/v1.35.4 (linux/amd64) kubernetes/abc", "kube-proxy"),
    ("kube-controller-manager/v1.35.4 (linux/amd64) kubernetes/abc/system:serviceaccount:kube-system:x",
     "kube-controller-manager"),
    ("python-urllib3/2.2.3", "bench"),
    ("kopf/1.37.2", "operator"),
    ("OpenAPI-Generator/31.0.0/python", "operator"),  # the kubernetes client, which the operator used before
    (USER_AGENT, "operator"),  # platform.kube's own client
])
def test_client_of(agent: str, client: str) -> None:
    assert client_of(agent) == client


def test_the_nodes_heartbeats_are_not_the_operators_writes() -> None:
    audit = {"kubelet/v1.35.4": {"patch nodes/status": 15, "update leases": 24}, "kopf/1.37.2": {"list pods": 1}}
    assert by_client(audit) == {"kubelet": {"patch nodes/status": 15, "update leases": 24},
                                "operator": {"list pods": 1}}
