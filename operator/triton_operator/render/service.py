"""What a model's Service says besides its ports, the same whether the model has replicas of its own
(`render.kubernetes.render_service`) or copies on a pool (`render.pool.render_model_service`).

A sequence model keeps each sequence's state in one tritonserver: the sequence batcher binds a correlation ID to the
instance that took its first request, and another server knows nothing of it: a request of that sequence sent there
is refused or answered from no state. kube-proxy picks a backend for each
new connection, at random, so a client that opens a connection per request (no keep-alive, or an L7 proxy in between
that does so) would scatter one sequence over the replicas: measured on the demo cluster (issue 41), 96 of 100 answers
wrong for a model's own Deployment of 2 replicas, 75 of 100 for a pooled model with 2 copies.

`sessionAffinity: ClientIP` makes kube-proxy send every new connection from a client address to the backend its first
one went to, for `timeoutSeconds` after the last new connection (iptables: the `recent` match, set again on each one).
The timeout is Kubernetes' own default, 3 hours, written out: a client that keeps one connection open past a short
timeout, then opens another mid-sequence, must still reach the same server; and a field we own goes again when the
model stops being a sequence model (a defaulted one would stay behind, and the API server refuses
`sessionAffinityConfig` beside `sessionAffinity: None`). What affinity costs: one client address reaches one replica,
so an L7 ingress in front sends all of its traffic to one (it must then keep affinity itself, by a header such as
the correlation ID, to spread the load). Other models get Kubernetes' default, `None` (connections spread), written
out (`session_affinity`).

No client, no I/O.
"""

from __future__ import annotations

from typing import Any

from ..api.v1alpha1 import TritonModel

#: Kubernetes' default `sessionAffinityConfig.clientIP.timeoutSeconds`, written out (see the module docstring).
AFFINITY_SECONDS = 10800


def session_affinity(model: TritonModel) -> dict[str, Any]:
    """The Service spec's affinity fields for `model`: ClientIP for a sequence model, `None` (Kubernetes' default,
    written out) otherwise. Written out because the operator applies a child again only when it differs from what
    it renders in a field it renders (`plan.compare.differs`): a field it stopped rendering would never be taken away,
    and a model that stops being a sequence model would keep its affinity."""
    if model.spec.sequence_batcher is None:
        return {"sessionAffinity": "None"}
    return {"sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": AFFINITY_SECONDS}}}
