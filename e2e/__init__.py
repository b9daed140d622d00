"""End-to-end test infrastructure: a local Kubernetes control plane, a node agent that plays
kubelet for fake GPU nodes (running real tritonserver processes), and the pytest fixtures
and smoke tests built on them. Nothing here is shipped with the operator."""
