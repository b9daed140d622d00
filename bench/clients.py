"""Who sent an API request, from its user agent (`client_of`), and the API server's audit log summed by client
(`by_client`): how bench/scale.py tells the operator's requests from the kubelet's, kube-proxy's and its own."""

from __future__ import annotations

from collections import Counter


def client_of(agent: str) -> str:
    """Who sent a request, from its user agent."""
    # The real node's kubelet (node status, its Lease) and kube-proxy write too: they are not the operator.
    for component in ("kube-controller-manager", "kube-scheduler", "kube-apiserver", "kubectl", "kubelet",
                      "kube-proxy"):
        if agent.startswith(component):
            return component
    if agent.startswith("python-urllib3"):
        return "bench"  # e2e.kube.Kube: our creates and watches
    return "operator"  # kopf (aiohttp) and controller.kube (triton-operator/<version>)


def by_client(audit: dict[str, Counter[str]]) -> dict[str, dict[str, int]]:
    out: dict[str, Counter[str]] = {}
    for agent, counts in audit.items():
        out.setdefault(client_of(agent), Counter()).update(counts)
    return {c: dict(sorted(v.items())) for c, v in sorted(out.items())}
