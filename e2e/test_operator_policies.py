"""The chart's NetworkPolicy on the real API server (issue 32).

The local cluster's network plugin (the bridge CNI) enforces none. So this checks only that the
objects are what they should be: the chart's policy names the API server's own addresses (found by Helm's lookup
of the `kubernetes` Service's endpoints) for the TLS port, and the API server accepts the example policy for model
pods (examples/policies/network-policy.yaml).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from e2e.kube import Kube
from e2e.operator_fixtures import (
    RELEASE,
    RELEASE_NAMESPACE,
    OperatorHandle,
    kubectl,
)

pytestmark = pytest.mark.cluster

EXAMPLE_POLICY = Path(__file__).resolve().parent.parent / "examples" / "policies" / "network-policy.yaml"


def test_the_network_policies_are_what_the_api_server_takes_though_this_cluster_enforces_none(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    """The local cluster's bridge CNI enforces no NetworkPolicy: only the objects are checked. The chart's policy
    admits, on the TLS port, exactly the API server's own addresses, which Helm's lookup found in the `kubernetes`
    Service's endpoints at install."""
    policy = kube.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/networkpolicies/"
                                 f"{RELEASE}-triton-operator")
    apiserver = {a for s in kube.items("EndpointSlice", "default", label_selector={
        "kubernetes.io/service-name": "kubernetes"}) for e in s.get("endpoints") or () for a in e["addresses"]}
    assert apiserver, "the kubernetes Service has no endpoints"
    rules = {p["port"]: r.get("from") for r in policy["spec"]["ingress"] for p in r["ports"]}
    assert sorted(peer["ipBlock"]["cidr"] for peer in rules[9443] or ()) == sorted(f"{a}/32" for a in apiserver), rules
    assert rules[8081] == [{"namespaceSelector": {}}] and set(rules) == {9443, 8081}, rules
    (example,) = [d for d in yaml.safe_load_all(EXAMPLE_POLICY.read_text()) if d]
    kubectl(kubeconfig, "apply", "--server-side", "-n", namespace, "-f", str(EXAMPLE_POLICY))
    stored = kube.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/triton-models")
    assert stored["spec"]["ingress"] == [
        {**r, "ports": [{"protocol": "TCP", **p} for p in r["ports"]]} for r in example["spec"]["ingress"]]
