"""The ValidatingWebhookConfiguration that sends TritonModel and TritonPool changes to the operator's webhook. Pure.

The chart renders the same object (`charts/triton-operator/templates/webhook.yaml`); the
operator applies it with the CA bundle of the certificate it issued itself at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from ..api.kinds import OWNED
from ..api.pool import POOL_PLURAL
from ..api.v1alpha1 import GROUP, PLURAL

WEBHOOK_NAME = f"{PLURAL}.{GROUP}"
WEBHOOK_PATH = "/validate-tritonmodels"  # both kinds: the review says which
#: What the webhook reviews: creates and updates (never a delete: a pool deleted under its models leaves them
#: reporting PoolNotFound, docs/concepts/pools.md), a pool's scale subresource included (`kubectl scale`, an HPA).
RESOURCES = (PLURAL, POOL_PLURAL, f"{POOL_PLURAL}/scale")
FAILURE_POLICIES = ("Fail", "Ignore")


@dataclass(frozen=True)
class WebhookTarget:
    """Where the API server calls the webhook: a Service (in a cluster) or a URL (an operator run locally)."""

    url: str | None = None
    service_namespace: str | None = None
    service_name: str | None = None
    service_port: int = 443

    def client_config(self, ca_bundle: str) -> dict[str, object]:
        if self.url:
            return {"url": self.url.rstrip("/") + WEBHOOK_PATH, "caBundle": ca_bundle}
        return {
            "service": {"namespace": self.service_namespace, "name": self.service_name, "path": WEBHOOK_PATH,
                        "port": self.service_port},
            "caBundle": ca_bundle,
        }

    def hosts(self) -> list[str]:
        """The names the serving certificate must carry."""
        if self.url:
            return [urlsplit(self.url).hostname or "localhost"]
        svc = f"{self.service_name}.{self.service_namespace}.svc"
        return [svc, f"{svc}.cluster.local"]


def render_webhook_configuration(
    name: str, target: WebhookTarget, ca_bundle: str, failure_policy: str = "Fail",
    namespaces: list[str] | None = None, timeout_seconds: int = 10,
) -> dict[str, object]:
    """`namespaces`: the exact namespaces watched (a namespaceSelector), or None for every namespace."""
    if failure_policy not in FAILURE_POLICIES:
        raise ValueError(f"failurePolicy must be one of {FAILURE_POLICIES}, got {failure_policy!r}")
    webhook: dict[str, object] = {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        "timeoutSeconds": timeout_seconds,
        "rules": [{
            "apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
            "resources": list(RESOURCES), "scope": "Namespaced",
        }],
        "clientConfig": target.client_config(ca_bundle),
    }
    if namespaces:
        webhook["namespaceSelector"] = {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(namespaces)}]}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": dict(OWNED)},
        "webhooks": [webhook],
    }
