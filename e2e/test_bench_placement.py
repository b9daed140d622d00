"""bench.placement's pure parts (no cluster): that its pool and models make the operator's own placement pack every
model on one replica under Pack and spread them evenly under Spread (the premise of the comparison), the order of
the rounds, how perf_analyzer's CSV is read, and the result's rows. In e2e/ because bench.placement imports the
cluster harness (e2e.pool)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from bench.placement import (
    MODELS,
    REPLICAS,
    STRATEGIES,
    cgroup_cpu,
    model_doc,
    order,
    parse_csv,
    pool_doc,
    result,
)
from triton_operator.api.pool import TritonPool
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.plan.placement import Placement, PoolReplica, place

#: A report perf_analyzer 2.51.0 wrote with `-f` in this benchmark's first run (spread1-m00; microseconds).
CSV = """\
Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,\
Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency
2,16.9232,149,4422,54481,37,58216,457,1,104529,193772,199332,213071
"""


def counts(placement: Placement, replicas: list[PoolReplica]) -> list[int]:
    return sorted((sum(r.name in c for c in placement.copies.values()) for r in replicas), reverse=True)


@pytest.mark.parametrize("one_at_a_time", [False, True], ids=["created together", "placed one per round"])
def test_the_pool_packs_every_model_on_one_replica_under_pack_and_spreads_them_under_spread(one_at_a_time: bool) -> None:
    replicas = [PoolReplica(f"shared-pool-{i}", "bench-node-1") for i in range(REPLICAS)]
    models = [TritonModel.model_validate(model_doc(f"spread1-m{i:02d}")) for i in range(MODELS)]
    got = {}
    for strategy in STRATEGIES:
        doc = pool_doc()
        doc["spec"]["placement"]["strategy"] = strategy
        pool = TritonPool.model_validate(doc)
        if one_at_a_time:  # as the operator may see them: each round places the models created since the last
            previous: dict[str, tuple[str, ...]] = {}
            for i in range(1, MODELS + 1):
                pl = place(pool, replicas, models[:i], previous)
                previous = dict(pl.copies)
        else:
            pl = place(pool, replicas, models, {})
        assert not pl.shortfalls
        got[strategy] = counts(pl, replicas)
    assert got == {"Spread": [MODELS // REPLICAS] * REPLICAS, "Pack": [MODELS] + [0] * (REPLICAS - 1)}


def test_each_strategy_is_measured_as_often_and_neither_always_first() -> None:
    assert order(1) == ["Spread", "Pack"]
    assert order(2) == ["Spread", "Pack", "Pack", "Spread"]
    assert sorted(order(3)) == ["Pack"] * 3 + ["Spread"] * 3


def test_perf_analyzers_csv_is_read_in_infer_per_second_and_milliseconds() -> None:
    got = parse_csv(CSV)
    assert got["infer_per_s"] == 16.9232 and got["concurrency"] == 2
    assert got["p50_ms"] == 104.529 and got["p95_ms"] == 199.332 and got["p99_ms"] == 213.071
    assert got["server_queue_ms"] == 54.481 and got["server_infer_ms"] == 58.216
    assert "avg_ms" not in got, "2.51's CSV has no average latency column"
    with pytest.raises(ValueError, match="no row"):
        parse_csv(CSV.splitlines()[0] + "\n")


def test_the_cgroup_cpu_of_a_live_process_is_read() -> None:
    got = cgroup_cpu(os.getpid())
    assert got["cpu_s"] > 0 and got["throttled"] >= 0 and got["periods"] >= got["throttled"]


def _run(strategy: str, tag: str, per_replica: list[int], infer: float, p95: float, failed: int = 0) -> dict[str, Any]:
    models = {f"{tag}-m{i:02d}": {"exit": 0, "infer_per_s": infer, "p50_ms": p95 / 2, "p95_ms": p95 + i,
                                  "server_queue_ms": 1.0, "server_infer_ms": 5.0} for i in range(MODELS)}
    for name in list(models)[:failed]:
        models[name] = {"exit": 99, "error": "ValueError: no row"}
    return {"strategy": strategy, "tag": tag, "models_per_replica": per_replica, "place_seconds": 10.0,
            "load_seconds": 16.0, "total_infer_per_s": infer * (MODELS - failed), "models": models,
            "failed": sorted(models)[:failed],
            "replica_cpu": {f"r{i}": {"cpu_per_s": 0.4 if n else 0.01, "periods": 160, "throttled_periods": 80 if n
                                      else 0} for i, n in enumerate(per_replica)},
            "clients_cpu_s": 3.0, "machine_cpu_busy": 0.8}


def test_the_rows_set_spread_against_pack_round_by_round() -> None:
    runs = [_run("Spread", "spread1", [4, 4, 4], 15.0, 100.0), _run("Pack", "pack1", [12, 0, 0], 5.0, 300.0),
            _run("Pack", "pack2", [12, 0, 0], 6.0, 280.0, failed=1), _run("Spread", "spread2", [4, 4, 4], 14.0, 110.0)]
    cfg = {"models": MODELS, "replicas": REPLICAS, "rounds": 2, "concurrency": 2, "window_ms": 5000, "windows": 3,
           "burn_ms": 5.0, "cpu_limit": "400m", "model_memory": "64Mi", "capacity_per_replica": "768Mi",
           "via": "ClusterIP (kube-proxy)", "perf_analyzer": "Perf Analyzer Version 2.51.0", "perf_analyzer_args": []}
    res = result({"config": cfg, "runs": runs})
    rows = {r.figure.split(" (")[0]: r for r in res.rows}
    assert rows["models per replica"].ours == "4, 4, 4" and rows["models per replica"].usual == "12, 0, 0"
    through = rows[f"throughput, all {MODELS} models together"]
    assert through.ours == "174.0 infer/s (180.0, 168.0 by round)"
    assert through.usual == "63.0 infer/s (60.0, 66.0 by round)"
    assert rows["perf_analyzer runs that failed"].usual == f"1 of {2 * MODELS}"
    assert rows["p95 latency per model"].ours.startswith("median ") and "max 121.0 ms" in rows[
        "p95 latency per model"].ours
    assert "throttled in 50% of CFS periods" in rows["tritonserver CPU per replica during the load"].ours
    assert "CPU_LIMIT" not in res.method and "400m" in res.method
