"""A model's Service and sequences (`render.service`, issue 41): a sequence model's Service, its own replicas' or its
copies' on a pool, keeps a client on one replica (ClientIP affinity, the timeout written out so that it goes with the
field); every other model's Service spreads connections (`None`, written out so that dropping the sequence batcher is a
change). kube-proxy acting on it, with a
client that opens a connection per request, is e2e/test_sequence_affinity.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.files import load_paths
from triton_operator.plan.compare import differs
from triton_operator.render.kubernetes import render_service
from triton_operator.render.pool import render_model_service
from triton_operator.render.service import AFFINITY_SECONDS
from triton_operator.validate import check_documents

ROOT = Path(__file__).resolve().parent.parent
UID = "00000000-0000-0000-0000-0000000000c3"


def _example(name: str) -> TritonModel:
    loaded = check_documents(load_paths([ROOT / "examples" / f"{name}.yaml"]))
    assert not loaded.errors, [str(e) for e in loaded.errors]
    return loaded.models[0][1]


def _pooled(model: TritonModel) -> TritonModel:
    return model.model_copy(update={"spec": model.spec.model_copy(update={"pool": "shared"})})


@pytest.mark.parametrize("render", [render_service, lambda m, uid, ns: render_model_service(_pooled(m), uid, ns)],
                         ids=["own-replicas", "pooled"])
def test_a_sequence_models_service_keeps_a_client_on_one_replica(render) -> None:  # type: ignore[no-untyped-def]
    spec = render(_example("sequence-accumulator"), UID, "ns")["spec"]
    assert spec["sessionAffinity"] == "ClientIP", spec
    assert spec["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": AFFINITY_SECONDS}}, spec
    assert AFFINITY_SECONDS == 10800, "Kubernetes' own default, written out"


@pytest.mark.parametrize("render", [render_service, lambda m, uid, ns: render_model_service(_pooled(m), uid, ns)],
                         ids=["own-replicas", "pooled"])
@pytest.mark.parametrize("example", ["add-sub", "dynamic-batching", "decoupled", "versions"])
def test_any_other_models_service_spreads_connections(render, example: str) -> None:  # type: ignore[no-untyped-def]
    spec = render(_example(example), UID, "ns")["spec"]
    assert spec["sessionAffinity"] == "None" and "sessionAffinityConfig" not in spec, spec


def test_dropping_the_sequence_batcher_is_a_change_the_operator_applies() -> None:
    """The operator applies a child again only when it differs in a field it renders: `None` is written out, so the
    Service without its sequence batcher differs from the one with it (and server-side apply then removes the
    timeout, which the operator owned and no longer sends; the API server refuses it beside `None`)."""
    model = _example("sequence-accumulator")
    plain = model.model_copy(update={"spec": model.spec.model_copy(update={"sequence_batcher": None})})
    before, after = render_service(model, UID, "ns"), render_service(plain, UID, "ns")
    assert after["spec"]["sessionAffinity"] == "None" and "sessionAffinityConfig" not in after["spec"]
    assert differs(before, after), "the live Service (ClientIP) against the desired one (None)"

