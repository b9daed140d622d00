"""Benchmarks: the operator's figures, each measured side by side with the usual approach in the same run.

Benchmarks are not tests: nothing here fails on a time. `python -m bench.run [NAME...]` (or `make bench
[BENCH=NAME]`) runs them and writes `bench/results/<name>.json` plus `bench/results/RESULTS.md`.

| module | measures |
|---|---|
| `batching.py` (+ `loadgen.py`, the separate load process) | throughput and latency, dynamic batcher vs none |
| `common.py` | machine facts, percentiles, result files and the Markdown table |
"""
