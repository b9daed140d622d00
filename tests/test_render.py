"""Pure rendering: spec -> ModelConfig -> config.pbtxt, deterministic, with a digest and the repository layout."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from triton_operator.api.pod import DIGEST_PARAMETER
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.files import load_paths
from triton_operator.render.modelconfig import config_text, render_repository, repository_for
from triton_operator.validate import check_documents

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOLDEN = Path(__file__).parent / "golden"


def _model(**spec: object) -> TritonModel:
    body = {
        "apiVersion": "serving.triton-operator.dev/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": "m"},
        "spec": {"backend": "python", "source": {"inline": {"model.py": "pass\n"}}, **spec},
    }
    return TritonModel.model_validate(body)


def _example_models() -> list[TritonModel]:
    loaded = check_documents(load_paths([EXAMPLES]))
    assert not loaded.errors, [str(e) for e in loaded.errors]
    return [m for _, m in loaded.models]


def test_non_batching_model_gets_explicit_max_batch_size_zero() -> None:
    r = render_repository([_model(batching=False)])["m"]
    assert "max_batch_size: 0\n" in r.config_pbtxt
    # and it is where the field belongs, right after the name
    assert r.config_pbtxt.splitlines()[1] == "max_batch_size: 0"
    parsed = text_format.Parse(r.config_pbtxt, pb.ModelConfig())
    assert parsed.max_batch_size == 0


def test_batching_default_is_four_and_no_empty_sub_messages() -> None:
    r = render_repository([_model()])["m"]
    text = r.config_pbtxt
    assert "max_batch_size: 4" in text
    for empty in ("model_transaction_policy", "response_cache", "dynamic_batching", "reshape", "optimization"):
        assert empty not in text, f"{empty} rendered although the spec does not ask for it:\n{text}"


def test_empty_batcher_still_selects_dynamic_batching() -> None:
    text = render_repository([_model(batcher={})])["m"].config_pbtxt
    assert "dynamic_batching {\n}" in text


def test_pytriton_mapping_of_flags() -> None:
    text = render_repository([_model(decoupled=True, batching=False)])["m"].config_pbtxt
    assert "model_transaction_policy {\n  decoupled: true\n}" in text
    text = render_repository([_model(responseCache=True)])["m"].config_pbtxt
    assert "response_cache {\n  enable: true\n}" in text


def test_data_types_use_triton_names() -> None:
    m = _model(inputs=[{"name": "T", "dataType": "BYTES", "dims": [-1]}, {"name": "B", "dataType": "BF16", "dims": [2]}])
    text = render_repository([m])["m"].config_pbtxt
    assert "data_type: TYPE_STRING" in text and "data_type: TYPE_BF16" in text


def test_digest_parameter_proves_the_repository() -> None:
    a = render_repository([_model()])["m"]
    assert a.config.parameters[DIGEST_PARAMETER].string_value == a.digest
    assert f'string_value: "{a.digest}"' in a.config_pbtxt
    changed_code = render_repository([_model(source={"inline": {"model.py": "pass  # v2\n"}})])["m"]
    changed_config = render_repository([_model(maxBatchSize=8)])["m"]
    assert len({a.digest, changed_code.digest, changed_config.digest}) == 3


def test_ensemble_digest_follows_its_steps() -> None:
    models = [m for m in _example_models() if m.name in ("tokenizer", "classifier", "sentiment")]
    before = render_repository(models)
    edited = []
    for m in models:
        if m.name == "classifier":
            inline = dict(m.spec.source.inline)
            inline["model.py"] += "\n# changed\n"
            m = m.model_copy(update={"spec": m.spec.model_copy(update={"source": m.spec.source.model_copy(update={"inline": inline})})})
        edited.append(m)
    after = render_repository(edited)
    assert before["tokenizer"].digest == after["tokenizer"].digest
    assert before["classifier"].digest != after["classifier"].digest
    assert before["sentiment"].digest != after["sentiment"].digest, "a step change must roll the ensemble"


def test_repository_layout() -> None:
    warm = base64.b64encode(b"\0" * 16).decode()
    m = _model(
        inputs=[{"name": "I", "dataType": "FP32", "dims": [4]}],
        source={"inline": {"model.py": "pass\n", "util.py": "x = 1\n"}, "warmupFiles": {"i.bin": warm}},
        modelWarmup=[{"name": "w", "inputs": {"I": {"dataType": "FP32", "dims": [4], "inputDataFile": "i.bin"}}}],
    )
    files = render_repository([m])["m"].files
    assert sorted(files) == ["m/1/model.py", "m/1/util.py", "m/config.pbtxt", "m/warmup/i.bin"]
    assert files["m/warmup/i.bin"] == b"\0" * 16


def test_ensemble_repository_includes_its_steps() -> None:
    rendered = render_repository(_example_models())
    files = repository_for("sentiment", rendered)
    dirs = sorted({p.split("/")[0] for p in files})
    assert dirs == ["classifier", "sentiment", "tokenizer"]


def test_cpu_only_maps_gpu_instance_groups() -> None:
    m = _model(instanceGroups=[{"kind": "GPU", "count": 2, "gpus": [0, 1]}])
    assert "kind: KIND_GPU" in render_repository([m])["m"].config_pbtxt
    cpu = render_repository([m], cpu_only=True)["m"].config_pbtxt
    assert "kind: KIND_CPU" in cpu and "gpus" not in cpu


def test_rendering_is_deterministic_byte_for_byte() -> None:
    models = _example_models()
    first = {k: v.files for k, v in render_repository(models).items()}
    second = {k: v.files for k, v in render_repository(list(reversed(models))).items()}
    assert first == second


def test_config_text_round_trips_through_protobuf() -> None:
    for r in render_repository(_example_models()).values():
        parsed = text_format.Parse(r.config_pbtxt, pb.ModelConfig())
        assert parsed == r.config
        assert config_text(parsed) == r.config_pbtxt


@pytest.mark.parametrize("name", ["add-sub", "sentiment", "sequence-accumulator", "non-batching"])
def test_golden_files(name: str) -> None:
    """Representative configs, byte for byte. Regenerate with UPDATE_GOLDEN=1 after an intended change."""
    rendered = render_repository(_example_models())
    text = rendered[name].config_pbtxt
    golden = GOLDEN / f"{name}.pbtxt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"missing golden file {golden}; run with UPDATE_GOLDEN=1"
    assert text == golden.read_text()
