"""Validation of pools and of the models placed on them (`validate.pool`, issue 29): a model no replica of its pool
could hold is refused by `triton-operator render`/`validate` naming its field and the figures, and a pool change
that would strand placed models is refused naming the pool's field."""

from __future__ import annotations

from typing import Any

import yaml

from tests.documents import pool_document as pool
from tests.documents import python_model as model
from triton_operator.api.pool import TritonPool
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.cli.main import main
from triton_operator.validate import check_documents, load_documents
from triton_operator.validate.pool import pool_change_problems


def check(*docs: dict[str, Any]) -> list[tuple[str, str, str]]:
    loaded = check_documents(load_documents(yaml.safe_dump_all(docs), "t.yaml"))
    return [(e.model, e.path, e.message) for e in loaded.errors]


def test_a_model_that_fits_a_replica_is_valid_and_the_pool_is_loaded() -> None:
    loaded = check_documents(load_documents(yaml.safe_dump_all([model(pool="p", memory="4Gi"), pool()]), "t.yaml"))
    assert loaded.errors == [] and [p.name for _, p in loaded.pools] == ["p"]


def test_a_model_larger_than_a_replica_is_refused_with_the_figures() -> None:
    ((who, path, message),) = check(model(pool="p", memory="5Gi"), pool())
    assert (who, path) == ("TritonModel/m", "spec.memory")
    assert "a copy takes 5Gi, more than a replica of pool 'p' holds (spec.capacity.memoryPerReplica gives 4Gi)" in message


def test_a_model_asking_for_the_response_cache_of_a_pool_without_one_is_refused() -> None:
    ((who, path, message),) = check(model(pool="p", memory="1Gi", responseCache=True), pool(server={"cacheSize": "0"}))
    assert (who, path) == ("TritonModel/m", "spec.responseCache")
    assert "pool 'p' has no response cache" in message
    assert check(model(pool="p", memory="1Gi", responseCache=True), pool(server={"cacheSize": "16Mi"})) == []


def test_an_ensemble_counts_its_steps_and_is_refused_at_spec_pool() -> None:
    ens = {"apiVersion": model()["apiVersion"], "kind": "TritonModel", "metadata": {"name": "ens"}, "spec": {
        "platform": "ensemble", "pool": "p", "maxBatchSize": 4,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "ensemble": {"steps": [{"model": "m", "inputMap": {"INPUT": "IN"}, "outputMap": {"OUTPUT": "OUT"}}]}}}
    assert check(ens, model(pool="p", memory="3Gi", replicas=0), pool()) == []
    errors = check(ens, model(pool="p", memory="3Gi", replicas=0), pool(capacity={"memoryPerReplica": "2Gi"}))
    assert sorted((w, p) for w, p, _ in errors) == [("TritonModel/ens", "spec.pool"), ("TritonModel/m", "spec.memory")]
    assert any("with its steps (m 3Gi)" in message for who, _, message in errors if who == "TritonModel/ens")


def test_a_gpu_pool_holds_memory_per_gpu_times_its_gpus() -> None:
    gpu_pool = pool(capacity={"memoryPerGpu": "3Gi"}, server={"gpus": 2})
    assert check(model(pool="p", memory="5Gi"), gpu_pool) == []
    assert [p for _, p, _ in check(model(pool="p", memory="7Gi"), gpu_pool)] == ["spec.memory"]


def test_a_pool_with_both_capacities_or_capacity_against_gpus_is_refused() -> None:
    assert [p for _, p, _ in check(pool(capacity={"memoryPerReplica": "1Gi", "memoryPerGpu": "1Gi"}))] == ["spec.capacity"]
    assert [p for _, p, _ in check(pool(capacity={"memoryPerReplica": "1Gi"}, server={"gpus": 1}))] == [
        "spec.capacity.memoryPerReplica"]


def test_a_pools_server_meets_the_rules_a_models_server_does() -> None:
    assert [p for _, p, _ in check(pool(server={"args": ["--http-restricted-api=x"]}))] == ["spec.server.args[0]"]


def test_the_render_command_refuses_a_model_too_large_for_its_pool(tmp_path: Any, capsys: Any) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump_all([model(pool="p", memory="5Gi"), pool()]))
    assert main(["render", str(path)]) == 1
    assert "TritonModel/m: spec.memory: a copy takes 5Gi" in capsys.readouterr().err


def test_an_unknown_placement_strategy_is_refused_naming_the_field(tmp_path: Any, capsys: Any) -> None:
    assert check(pool(placement={"strategy": "Balanced"})) == [
        ("TritonPool/p", "spec.placement.strategy", "Input should be 'Spread' or 'Pack'")]
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump_all([model(pool="p", memory="1Gi"), pool(placement={"strategy": "spread"})]))
    assert main(["render", str(path)]) == 1
    assert "TritonPool/p: spec.placement.strategy: Input should be 'Spread' or 'Pack'" in capsys.readouterr().err
    assert check(pool(placement={"strategy": "Pack"}), pool("q", placement={})) == []


def _pool(**spec: Any) -> TritonPool:
    return TritonPool.model_validate(pool(**spec))


def _models() -> list[TritonModel]:
    return [TritonModel.model_validate(model("a", pool="p", memory="3Gi", replicas=2)),
            TritonModel.model_validate(model("b", pool="p", memory="1Gi")),
            TritonModel.model_validate(model("c", pool="q", memory="9Gi"))]


PLACED = {"a": ["r0", "r1"], "b": ["r0"], "c": ["x0"]}


def test_a_pool_change_that_keeps_every_placed_model_is_allowed() -> None:
    assert pool_change_problems(_pool(replicas=3), _models(), PLACED) == []
    assert pool_change_problems(_pool(capacity={"memoryPerReplica": "4Gi"}), _models(), PLACED) == []


def test_a_smaller_replica_than_is_placed_on_one_is_refused() -> None:
    problem, total = pool_change_problems(_pool(capacity={"memoryPerReplica": "3Gi"}), _models(), PLACED)
    assert problem.path == "spec.capacity.memoryPerReplica" and problem.rule == "pool-change"
    assert "replica r0 holds 4Gi of them (a, b), more than the 3Gi a replica would hold" in problem.message
    assert total.path == "spec.replicas" and "they take 7Gi in all, more than 2 replicas of 3Gi hold" in total.message


def test_fewer_replicas_than_a_models_copies_or_than_the_placed_memory_needs_is_refused() -> None:
    problems = pool_change_problems(_pool(replicas=1), _models(), PLACED)
    assert [p.path for p in problems] == ["spec.replicas", "spec.replicas"]
    assert "a has 2 copies on distinct replicas, more than 1 replicas" in problems[0].message
    assert "they take 7Gi in all, more than 1 replicas of 4Gi hold" in problems[1].message


def test_a_pooled_model_may_set_its_own_failed_request_threshold() -> None:
    """Issue 39: the pool's probe reads it from the model's config (it was refused while the probe had one for all)."""
    from tests.documents import python_model, validation_errors

    for threshold in (0, 1, 50):
        body = python_model("m", pool="p", memory="64Mi", warmupGate={"failedRequestThreshold": threshold})
        assert validation_errors(body) == [], threshold
