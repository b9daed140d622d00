"""Talking to Kubernetes: the API client (`kube`), its credentials (`kubeconfig`), Lease leader election
(`leader`), serving certificates (`certificates`), the API server's errors (`errors`) and which namespaces are
the operator's (`namespaces`).

Knows nothing of the product beyond the kinds it reads and writes (`api`): no planner, renderer or Triton, and no
kopf. `controller` (the model's reconcile, and the pool's beside it) and `servers` stand on it.
"""
