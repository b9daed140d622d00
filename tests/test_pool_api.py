"""The TritonPool API and a TritonModel's `spec.pool` (issue 29): what a pool is, and what a pooled model may not set,
refused with the field named by `triton-operator validate` (`validate.rules`) as by the CRD's CEL rules."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tests.documents import pool_document as pool
from tests.documents import python_model as model
from triton_operator.api.pool import TritonPool
from triton_operator.api.v1alpha1 import API_VERSION
from triton_operator.validate import check_documents, load_documents


def errors(*docs: dict[str, Any]) -> list[tuple[str, str]]:
    loaded = check_documents(load_documents(yaml.safe_dump_all(docs), "t.yaml"))
    return [(e.path, e.rule) for e in loaded.errors]


def test_a_pooled_model_with_its_memory_is_valid() -> None:
    assert errors(model(pool="p", memory="1Gi")) == []


@pytest.mark.parametrize(("spec", "path"), [
    ({"pool": "p"}, "spec.memory"),
    ({"memory": "1Gi"}, "spec.memory"),
    ({"pool": "p", "memory": "1Gi", "server": {"resources": {"limits": {"memory": "8Gi"}}}}, "spec.server.resources"),
    ({"pool": "p", "memory": "1Gi", "server": {"image": "my/triton:1"}}, "spec.server.image"),
    ({"pool": "p", "memory": "1Gi", "server": {"gpus": 1}}, "spec.server.gpus"),
    ({"pool": "p", "memory": "1Gi", "server": {"fetch": {"maxFiles": 5}}}, "spec.server.fetch.maxFiles"),
    ({"pool": "p", "memory": "1Gi", "warmupGate": {"enabled": False}}, "spec.warmupGate.enabled"),
    ({"pool": "p", "memory": "1Gi", "rollout": {"strategy": "NewPods"}}, "spec.rollout.strategy"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_what_a_pooled_model_may_not_set_is_refused_naming_the_field(spec: dict[str, Any], path: str) -> None:
    assert errors(model(**spec)) == [(path, "pooled-model")]


def test_a_pooled_model_may_autoscale_its_copies_and_a_pool_its_replicas() -> None:
    assert errors(model(pool="p", memory="1Gi", autoscaling={"maxReplicas": 3, "target": {"inflightRequests": 4}})) == []
    scaled = TritonPool.model_validate(pool(autoscaling={"minReplicas": 2, "maxReplicas": 6,
                                                         "targetFreeFraction": 0.25}))
    assert scaled.spec.autoscaling is not None
    assert scaled.spec.autoscaling.target_bytes(scaled.spec.replica_bytes) == 3 << 30  # 4Gi less a quarter
    with pytest.raises(ValidationError, match="targetFreeFraction"):
        TritonPool.model_validate(pool(autoscaling={"maxReplicas": 6, "targetFreeFraction": 1}))


def test_a_server_field_at_its_default_is_no_setting() -> None:
    """The API server fills the defaults in: a pooled model read back from it has them all, and is valid."""
    assert errors(model(pool="p", memory="1Gi", server={"cacheSize": "64Mi", "startupTimeoutSeconds": 600})) == []


def test_a_pooled_model_may_carry_the_image_that_0_1_stored_as_its_default() -> None:
    """0.1.x's CRD defaulted spec.server.image, and the API server stored that default in every model it created: such
    a pooled model stays valid (its pool's image is what runs), while any other image is refused (above)."""
    from triton_operator import DEFAULT_TRITON_IMAGE, LEGACY_TRITON_IMAGE

    assert errors(model(pool="p", memory="1Gi", server={"image": LEGACY_TRITON_IMAGE})) == []
    assert errors(model(pool="p", memory="1Gi", server={"image": DEFAULT_TRITON_IMAGE})) == [
        ("spec.server.image", "pooled-model")]


def _ensemble(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": "TritonModel", "metadata": {"name": "ens"},
        "spec": {"platform": "ensemble", "maxBatchSize": 4,
                 "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
                 "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
                 "ensemble": {"steps": [{"model": "m", "inputMap": {"INPUT": "IN"},
                                         "outputMap": {"OUTPUT": "OUT"}}]}, **spec},
    }


def test_a_pooled_ensemble_needs_no_memory_and_its_steps_on_its_pool() -> None:
    assert errors(_ensemble(pool="p"), model(pool="p", memory="1Gi", replicas=0)) == []
    assert errors(_ensemble(pool="p"), model()) == [("spec.pool", "pool-steps")]
    assert errors(_ensemble(pool="p"), model(pool="q", memory="1Gi")) == [("spec.pool", "pool-steps")]


def test_a_pool_holds_memory_per_replica_or_per_gpu_times_gpus() -> None:
    cpu = TritonPool.model_validate(pool())
    assert cpu.spec.replica_bytes == 4 << 30 and cpu.spec.capacity_path == "spec.capacity.memoryPerReplica"
    gpu = TritonPool.model_validate(pool(capacity={"memoryPerGpu": "80Gi"}, server={"gpus": 2}))
    assert gpu.spec.replica_bytes == 160 << 30 and gpu.spec.capacity_path == "spec.capacity.memoryPerGpu"


def test_a_pool_without_capacity_is_refused() -> None:
    with pytest.raises(ValidationError, match="capacity"):
        TritonPool.model_validate({**pool(), "spec": {"replicas": 1}})
