"""Benchmarks: the operator's figures, each measured side by side with the usual approach in the same run.

Benchmarks are not tests: nothing here fails on a time. `python -m bench.run [NAME...]` (or `make bench
[BENCH=NAME]`) runs them and writes `bench/results/<name>.json` plus `bench/results/RESULTS.md`.

| module | measures |
|---|---|
| `batching.py` (+ `loadgen.py`, the separate load process) | throughput and latency, dynamic batcher vs none |
| `scale.py` (+ `naive_operator.py`, the usual kopf operator) | reconcile time, API requests, steady-state writes |
| | and RSS at 100 and 1000 TritonModels |
| `gate_latency.py` (`gate`) | Triton READY -> pod Ready, warm-up gate vs a /v2/health/ready probe every 10 s |
| `first_request.py` | first request after a replica joins the endpoints, gated + warm-up vs a TCP probe |
| `pods.py`, `kubeenv.py` | the benchmarks' own cluster (one real node), operator (never the shared `.cluster`), watches |
| `models.py` | the examples as the benchmarks run them, checked and rendered by the operator |
| `common.py` | machine facts, percentiles, result files and the Markdown table |
"""
