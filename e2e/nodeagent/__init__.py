"""A node agent that plays kubelet for fake GPU nodes (test infrastructure, not shipped).

Registers nodes with `nvidia.com/gpu` capacity and runs the pods bound to them as local
processes - tritonserver from the nvidia-pytriton wheel, the operator's own console script - each
pod in its own network namespace with a 198.18.0.0/16 address, volumes bind-mounted at their
mountPaths, probes, restarts and kubelet-accurate status. See `python -m e2e.nodeagent --help`.
"""

from e2e.nodeagent.agent import NodeAgent, NodeConfig

__all__ = ["NodeAgent", "NodeConfig"]
