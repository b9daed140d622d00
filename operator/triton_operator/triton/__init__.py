"""The operator's clients of a replica: its tritonserver (readiness, loaded configs, statistics, loads and unloads)
and the operator's own programs beside it in the pod (`probe`: the probe's gate notice and health; `fetcher`: a pool
replica's fetch-server). Those programs themselves run in the pod and live in `agent`, which imports nothing of this
package: what both sides must agree on is the pod contract, `api.pod`."""
