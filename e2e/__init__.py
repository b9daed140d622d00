"""End-to-end test infrastructure: a local Kubernetes cluster with real nodes (containerd + kubelet, fake
GPUs through the device-plugin API) running our real images, and the pytest fixtures
and smoke tests built on them. Nothing here is shipped with the operator."""
