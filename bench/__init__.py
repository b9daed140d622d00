"""Benchmarks: the operator's figures, each measured side by side with the usual approach in the same run.

Benchmarks are not tests: nothing here fails on a time. `python -m bench.run [NAME...]` (or `make bench
[BENCH=NAME]`) runs them and writes `bench/results/<name>.json` plus `bench/results/RESULTS.md`.

| module | measures |
|---|---|
| `batching.py` (+ `loadgen.py`, the separate load process) | throughput and latency, dynamic batcher vs none |
| `scale.py` (+ `naive_operator.py`, the usual kopf operator) | reconcile time, API requests, steady-state writes |
| | and RSS at 100, 1000 and 3000 TritonModels (`BENCH_SCALE_SIZES`) |
| `gate_latency.py` (`gate`) | Triton READY -> pod Ready, warm-up gate vs a /v2/health/ready readiness probe |
| `first_request.py` | first request after a replica joins the endpoints, gated + warm-up vs a TCP probe |
| `rollout.py` | one config change on 3 replicas: in place (Swap, Drain) vs new pods, under load |
| `autoscale.py` | one load step: the HPA on Triton's queue time vs a CPU-utilisation HPA |
| `faults.py` | a replica that stops serving: out of the Service, healed, serving again; what the checks cost |
| `pool.py` | a TritonPool vs a Deployment per model: GPUs, apply -> endpoint, 200 models in one pool |
| `pool_speed.py` (+ `pool_speed_math.py`, `pool_trace.py`) | the pool's time against Triton's own (its log): a new |
| | model, a killed replica, 200 models at once; where the operator's share goes (its rounds, traced) |
| `pods.py`, `kubeenv.py` | the benchmarks' own cluster (one real node), operator (never the shared `.cluster`), watches |
| `clients.py`, `memprofile.py` | API requests by client (the audit log); the operator under tracemalloc |
| `models.py` | the examples as the benchmarks run them, checked and rendered by the operator |
| `common.py` | machine facts (the commit, and whether the tree differed), percentiles, result files, RESULTS.md |
| `readme.py` | the docs' benchmark tables and figures (docs/benchmarks.md, any page citing one), from the results (`make docs`) |
"""
