"""Integer bounds: every integer field of the API has a minimum and a maximum, and what it renders into holds them.

A number the CRD accepts must render: Triton's ModelConfig fields are int32, uint32, int64 or uint64, and a value
beyond the type fails the render (`ValueError: Value out of range`) on every reconcile. So each integer field of
`api.v1alpha1` is checked against the proto field it renders into, read from tritonclient's generated descriptors,
or, for the fields that are not Triton's, against the Kubernetes field it becomes. A new integer field fails
`test_every_integer_field_is_bounded_by_what_it_renders_into` until it is bounded and listed here.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

import annotated_types
import pytest
import yaml
from google.protobuf.descriptor import FieldDescriptor
from pydantic import BaseModel
from tritonclient.grpc import model_config_pb2 as pb

from triton_operator.api import pool as pool_api
from triton_operator.api import v1alpha1 as api
from triton_operator.api.crd import crd, pool_crd
from triton_operator.render.modelconfig import render_repository
from triton_operator.validate import check_documents, load_documents

# What Triton's model_config.proto declares, by the proto type's range. (The API bounds 64-bit fields tighter, at
# 2**53 - 1: see `test_every_bound_in_the_crd_is_exact_as_the_api_server_holds_it`.)
INT32 = (-(2**31), 2**31 - 1)
UINT32 = (0, 2**32 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT64 = (0, 2**64 - 1)
_RANGE = {
    FieldDescriptor.TYPE_INT32: INT32, FieldDescriptor.TYPE_SINT32: INT32, FieldDescriptor.TYPE_SFIXED32: INT32,
    FieldDescriptor.TYPE_UINT32: UINT32, FieldDescriptor.TYPE_FIXED32: UINT32,
    FieldDescriptor.TYPE_INT64: INT64, FieldDescriptor.TYPE_SINT64: INT64, FieldDescriptor.TYPE_SFIXED64: INT64,
    FieldDescriptor.TYPE_UINT64: UINT64, FieldDescriptor.TYPE_FIXED64: UINT64,
}  # fmt: skip

#: The proto message each API class renders into (`render.modelconfig`); its fields keep their names.
MESSAGE = {
    api.TritonModelSpec: pb.ModelConfig,
    api.DynamicBatcher: pb.ModelDynamicBatching,
    api.QueuePolicy: pb.ModelQueuePolicy,
    api.SequenceBatcher: pb.ModelSequenceBatching,
    api.SequenceDirect: pb.ModelSequenceBatching.StrategyDirect,
    api.SequenceOldest: pb.ModelSequenceBatching.StrategyOldest,
    api.SequenceState: pb.ModelSequenceBatching.State,
    api.Tensor: pb.ModelInput,
    api.Warmup: pb.ModelWarmup,
    api.WarmupInput: pb.ModelWarmup.Input,
    api.InstanceGroup: pb.ModelInstanceGroup,
    api.EnsembleStep: pb.ModelEnsembling.Step,
}
#: Fields rendered into a proto field of another name or message.
RENAMED = {
    (api.Tensor, "reshape"): pb.ModelTensorReshape.DESCRIPTOR.fields_by_name["shape"],
    (api.VersionPolicy, "latest"): pb.ModelVersionPolicy.Latest.DESCRIPTOR.fields_by_name["num_versions"],
    (api.VersionPolicy, "specific"): pb.ModelVersionPolicy.Specific.DESCRIPTOR.fields_by_name["versions"],
    # a version directory's number, which a specific policy and ensemble steps name
    (api.ModelVersion, "version"): pb.ModelVersionPolicy.Specific.DESCRIPTOR.fields_by_name["versions"],
}
#: Integer fields that are not Triton's: the Kubernetes (or operator) field they become, and its type's range.
NOT_TRITON: dict[tuple[type[BaseModel], str], tuple[str, tuple[int, int]]] = {
    (api.TritonModelSpec, "replicas"): ("Deployment spec.replicas", INT32),
    (api.Server, "gpus"): ("the nvidia.com/gpu limit, a quantity", INT32),
    (api.Server, "startup_timeout_seconds"): ("a probe's initialDelaySeconds, failureThreshold", INT32),
    (api.Toleration, "toleration_seconds"): ("a toleration's tolerationSeconds", INT64),
    (api.TopologySpreadConstraint, "max_skew"): ("topologySpreadConstraints[].maxSkew", INT32),
    (api.TopologySpreadConstraint, "min_domains"): ("topologySpreadConstraints[].minDomains", INT32),
    (api.WarmupGate, "poll_interval_milliseconds"): ("a pod annotation the gate reads", INT32),
    (api.WarmupGate, "failed_request_threshold"): ("the probe's --fail-threshold (a Python int)", INT32),
    (api.Rollout, "max_unavailable"): ("the operator's rollout", INT32),
    (api.FetchLimits, "max_files"): ("fetch's --max-files, a Python int", INT32),
    (api.FetchLimits, "timeout_seconds"): ("fetch's --timeout, a Python int", INT32),
    (api.Rollout, "drain_timeout_seconds"): ("a pod annotation the gate reads", INT32),
    (api.Autoscaling, "min_replicas"): ("HorizontalPodAutoscaler spec.minReplicas", INT32),
    (api.Autoscaling, "max_replicas"): ("HorizontalPodAutoscaler spec.maxReplicas", INT32),
    (api.TritonModelStatus, "observed_generation"): ("metadata.generation", INT64),
    (api.Condition, "observed_generation"): ("metadata.generation", INT64),
    (api.TritonModelStatus, "replicas"): ("the scale subresource's status.replicas", INT32),
    (api.TritonModelStatus, "ready_replicas"): ("a count of pods", INT32),
    (api.TritonModelStatus, "warmed_replicas"): ("a count of pods", INT32),
    (pool_api.TritonPoolSpec, "replicas"): ("the pool's Deployment spec.replicas", INT32),
    (pool_api.TritonPoolStatus, "observed_generation"): ("metadata.generation", INT64),
    (pool_api.TritonPoolStatus, "replicas"): ("the scale subresource's status.replicas", INT32),
    (pool_api.TritonPoolStatus, "ready_replicas"): ("a count of pods", INT32),
    (pool_api.TritonPoolStatus, "models"): ("a count of TritonModels", INT32),
    (pool_api.TritonPoolStatus, "most_copies"): ("a count of copies (the pool HPA's demand)", INT32),
    (pool_api.PoolAutoscaling, "min_replicas"): ("the pool's HorizontalPodAutoscaler spec.minReplicas", INT32),
    (pool_api.PoolAutoscaling, "max_replicas"): ("the pool's HorizontalPodAutoscaler spec.maxReplicas", INT32),
}


def _bounds(metadata: list[Any]) -> tuple[int | None, int | None]:
    ge = le = None
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            ge = m.ge
        elif isinstance(m, annotated_types.Gt):
            ge = m.gt + 1
        elif isinstance(m, annotated_types.Le):
            le = m.le
        elif isinstance(m, annotated_types.Lt):
            le = m.lt - 1
        elif hasattr(m, "metadata"):  # a FieldInfo inside Annotated
            g, lo = _bounds(m.metadata)
            ge, le = (g if g is not None else ge), (lo if lo is not None else le)
    return ge, le


def _ints(tp: Any, metadata: list[Any]) -> Iterator[tuple[str, int | None, int | None]]:
    """(`[]` for a list item, `{}` for a dict value, `` for the field itself, ge, le) for each int in the type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is int:
        yield ("", *_bounds(metadata))
    elif origin is typing.Annotated:
        yield from _ints(args[0], [*metadata, *args[1:]])
    elif origin in (typing.Union, types.UnionType):
        for a in args:
            yield from _ints(a, metadata)
    elif origin is list:
        for where, ge, le in _ints(args[0], []):
            yield f"[]{where}", ge, le
    elif origin is dict:
        for where, ge, le in _ints(args[1], []):
            yield f"{{}}{where}", ge, le


def _classes(tp: Any) -> Iterator[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        yield tp
    for a in typing.get_args(tp):
        yield from _classes(a)


def integer_fields() -> list[tuple[type[BaseModel], str, str, int | None, int | None]]:
    """Every integer field reachable from TritonModel, TritonPool and their statuses: (class, field, where, ge, le)."""
    out, seen, todo = [], set(), [api.TritonModel, api.TritonModelStatus, pool_api.TritonPool, pool_api.TritonPoolStatus]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for name, f in cls.model_fields.items():
            for where, ge, le in _ints(f.annotation, list(f.metadata)):
                out.append((cls, name, where, ge, le))
            todo.extend(_classes(f.annotation))
    return sorted(out, key=lambda x: (x[0].__name__, x[1]))


def _proto_field(cls: type[BaseModel], name: str) -> Any:
    if (cls, name) in RENAMED:
        return RENAMED[(cls, name)]
    message = MESSAGE.get(cls)
    return None if message is None else message.DESCRIPTOR.fields_by_name.get(name)


def test_every_integer_field_is_bounded_by_what_it_renders_into() -> None:
    fields = integer_fields()
    assert len(fields) >= 35, f"the walk found only {len(fields)} integer fields: {fields}"
    problems = []
    for cls, name, where, ge, le in fields:
        label = f"{cls.__name__}.{name}{where}"
        if ge is None or le is None:
            problems.append(f"{label}: ge={ge} le={le}: both bounds are needed (the CRD's minimum and maximum)")
            continue
        proto = _proto_field(cls, name)
        if proto is not None:
            low, high = _RANGE[proto.type]
            what = proto.full_name
        elif (cls, name) in NOT_TRITON:
            what, (low, high) = NOT_TRITON[(cls, name)]
        else:
            problems.append(f"{label}: renders into no proto field this test knows and is not in NOT_TRITON: "
                            "map it to the model_config.proto field it becomes")
            continue
        if not (low <= ge and le <= high):
            problems.append(f"{label}: [{ge}, {le}] does not fit {what}, [{low}, {high}]")
    assert not problems, "\n".join(problems)


def test_the_proto_types_are_read_from_tritonclients_descriptors() -> None:
    """The mapping is not vacuous: the fields the review found crash the render are the types it says."""
    queue = pb.ModelQueuePolicy.DESCRIPTOR.fields_by_name["max_queue_size"]
    oldest = pb.ModelSequenceBatching.StrategyOldest.DESCRIPTOR.fields_by_name["max_candidate_sequences"]
    assert (queue.type, oldest.type) == (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_INT32)
    assert _proto_field(api.QueuePolicy, "max_queue_size") is queue
    assert _proto_field(api.SequenceOldest, "max_candidate_sequences") is oldest


def _integer_nodes(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if node.get("type") == "integer":
            yield path, node
        for key, value in node.items():
            yield from _integer_nodes(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _integer_nodes(value, f"{path}[{i}]")


@pytest.mark.parametrize("make", [crd, pool_crd], ids=["TritonModel", "TritonPool"])
def test_every_integer_in_the_crd_has_a_minimum_and_a_maximum(make: Any) -> None:
    schema = make()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    nodes = list(_integer_nodes(schema))
    assert len(nodes) >= (35 if make is crd else 8)
    unbounded = [p for p, n in nodes if "minimum" not in n or "maximum" not in n]
    assert not unbounded, f"integers the API server would take at any size: {unbounded}"


@pytest.mark.parametrize("make", [crd, pool_crd], ids=["TritonModel", "TritonPool"])
def test_every_bound_in_the_crd_is_exact_as_the_api_server_holds_it(make: Any) -> None:
    """The API server keeps minimum and maximum as float64 and checks defaults against them as int64: int64's top,
    2**63 - 1, became 2**63 and then int64's minimum, and it refused the CRD ("default: Invalid value: 0: in body
    should be less than or equal to -9223372036854775808"; e2e/test_admission.py installs it)."""
    schema = make()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    inexact = [f"{p}.{k}={n[k]}" for p, n in _integer_nodes(schema) for k in ("minimum", "maximum")
               if k in n and (abs(n[k]) > 2**53 - 1 or float(n[k]) != n[k])]
    assert not inexact, f"bounds a float64 does not hold exactly: {inexact}"


def _spec(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "m"},
        "spec": {"backend": "python", "maxBatchSize": 4, "inputs": [{"name": "INPUT", "dataType": "FP32", "dims": [4]}],
                 "outputs": [{"name": "OUTPUT", "dataType": "FP32", "dims": [4]}],
                 "instanceGroups": [{"kind": "CPU", "count": 1}],
                 "source": {"inline": {"model.py": "# m"}}, **spec},
    }


CRASHED = [  # what the review found passing the CRD and the webhook, then failing every render
    ("batcher", {"defaultQueuePolicy": {"maxQueueSize": 2**32}}, "spec.batcher.defaultQueuePolicy.maxQueueSize"),
    ("sequenceBatcher", {"oldest": {"maxCandidateSequences": 2**31}},
     "spec.sequenceBatcher.oldest.maxCandidateSequences"),
]


@pytest.mark.parametrize(("field", "value", "path"), CRASHED, ids=[c[2] for c in CRASHED])
def test_a_number_beyond_the_proto_type_is_refused_naming_the_field(field: str, value: dict[str, Any], path: str) -> None:
    loaded = check_documents(load_documents(yaml.safe_dump(_spec(**{field: value})), "big.yaml"))
    assert [e.path for e in loaded.errors] == [path], [str(e) for e in loaded.errors]
    assert not loaded.models


@pytest.mark.parametrize(("field", "value", "path"), CRASHED, ids=[c[2] for c in CRASHED])
def test_the_largest_number_accepted_renders(field: str, value: dict[str, Any], path: str) -> None:
    at_bound = yaml.safe_dump(_spec(**{field: value})).replace(str(2**32), str(2**32 - 1)).replace(str(2**31), str(2**31 - 1))
    loaded = check_documents(load_documents(at_bound, "bound.yaml"))
    assert not loaded.errors, [str(e) for e in loaded.errors]
    text = render_repository([m for _, m in loaded.models])["m"].config_pbtxt
    assert str(2**32 - 1) in text or str(2**31 - 1) in text, text


def test_control_values_fit_int32_and_are_whole_for_int32() -> None:
    def control(values: list[Any], data_type: str = "INT32") -> list[str]:
        doc = _spec(sequenceBatcher={"controlInputs": [
            {"name": "START", "kind": "START", "dataType": data_type, "falseTrue": values}]})
        return [e.path for e in check_documents(load_documents(yaml.safe_dump(doc), "c.yaml")).errors]

    assert control([0, 1e10]) == ["spec.sequenceBatcher.controlInputs[0].falseTrue[1]"]
    assert control([0, 0.5]) == ["spec.sequenceBatcher.controlInputs[0].falseTrue"]
    assert control([0.0, 0.5], "FP32") == []
    assert control([0, 1]) == []
