"""The programs that run inside a replica pod, from the operator's image, beside tritonserver: one room, so that a
reader changing what runs in the pod opens one package (as CloudNativePG keeps its instance manager apart).

- `fetch`: the `fetch` init container (`triton-operator fetch`), which assembles the model repository from the
  mounted ConfigMap and the models' uris before tritonserver starts;
- `fetch_server`: a pool replica's `fetch-server` sidecar (`triton-operator fetch-server`), which places uri models
  in the repository volume when the operator asks, with the fetch step's own code;
- `probe`, with its socket server `probe_server` and its own request to a model `confirm`: the `probe` sidecar
  (`triton-operator probe`) of a gated replica, which holds the kubelet's readiness probe and watches that the
  replica's models serve.

Their contract with the operator (ports, paths, the key's header and variable, the words of `GET /status`) is in
`api.pod`, which both sides read; the operator's clients of these programs are `triton.probe` (the probe's `/gate`
and `/status`) and `triton.fetcher` (the fetch-server's API). Nothing of the operator imports this package but `cli`,
which runs its programs; it stands on `api.pod`, on `servers.tls_server` (the bounded HTTP site the fetch-server
shares with the operator's ports) and on the standard library: the probe and the fetch step start without pydantic
(tests/test_agent.py), and none of it speaks gRPC.
"""
