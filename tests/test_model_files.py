"""Model-level files, `label_filename` and input `format` (issue 13 part 3: what NVIDIA's example repository uses).

Pure: rendering (files beside config.pbtxt, `format` and `label_filename` through the ModelConfig protobuf), the
rules (field-named errors), the fetch step placing `spec.modelFiles.uri` in the model directory, and an import of
a repository in the shape of NVIDIA's `docs/examples/model_repository` (configs written here) with nothing
dropped. Real: Triton's classification extension answering "score:index:label" from a labels file the operator
placed (examples/classification.yaml).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml

from tests.cli_helpers import cli, configs_under, diff, normalized
from tests.triton_helpers import EXAMPLES, load_models, serve, tensor
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.files import load_paths
from triton_operator.importer import parse_config
from triton_operator.render.kubernetes import render_deployment
from triton_operator.render.modelconfig import render_repository
from triton_operator.validate import Document, check_documents

EXAMPLE = EXAMPLES / "classification.yaml"
LABELS = [f"class_{i:02d}" for i in range(10)]


def spec(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "backend": "python",
        "maxBatchSize": 4,
        "inputs": [{"name": "IMAGE", "dataType": "FP32", "dims": [3, 4, 4], "format": "FORMAT_NCHW"}],
        "outputs": [{"name": "SCORES", "dataType": "FP32", "dims": [10], "labelFilename": "labels.txt"}],
        "instanceGroups": [{"kind": "CPU", "count": 1}],
        "modelFiles": {"inline": {"labels.txt": "\n".join(LABELS) + "\n"}},
        "source": {"inline": {"model.py": "# model\n"}},
    }
    body.update(extra)
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": "m"},
            "spec": {k: v for k, v in body.items() if v is not None}}


def errors(body: dict[str, Any]) -> dict[str, str]:
    loaded = check_documents([Document("<test>", body)])
    return {e.path: e.message for e in loaded.errors}


# ---------------------------------------------------------------- rendering


def test_renders_labels_beside_config_and_the_fields_through_the_protobuf() -> None:
    [model] = [TritonModel.model_validate(spec())]
    r = render_repository([model])["m"]
    assert r.files["m/labels.txt"] == ("\n".join(LABELS) + "\n").encode()
    assert sorted(r.files) == ["m/1/model.py", "m/config.pbtxt", "m/labels.txt"]
    cfg = parse_config(r.config_pbtxt)
    assert cfg.input[0].format == cfg.input[0].FORMAT_NCHW
    assert cfg.output[0].label_filename == "labels.txt"
    assert 'format: FORMAT_NCHW' in r.config_pbtxt and 'label_filename: "labels.txt"' in r.config_pbtxt


def test_labels_are_in_the_digest_and_an_unused_field_changes_nothing() -> None:
    base = render_repository([TritonModel.model_validate(spec())])["m"].digest
    changed = spec()
    changed["spec"]["modelFiles"]["inline"]["labels.txt"] = "other\n"
    assert render_repository([TritonModel.model_validate(changed)])["m"].digest != base
    # a spec that sets none of the new fields renders exactly as before (no format, no label_filename, no file)
    plain = spec(modelFiles=None)
    plain["spec"]["inputs"][0].pop("format")
    plain["spec"]["outputs"][0].pop("labelFilename")
    r = render_repository([TritonModel.model_validate(plain)])["m"]
    assert "format" not in r.config_pbtxt and "label_filename" not in r.config_pbtxt
    assert sorted(r.files) == ["m/1/model.py", "m/config.pbtxt"]


def test_model_files_uri_is_fetched_into_the_model_directory_and_pinned_in_the_digest() -> None:
    body = spec(modelFiles={"uri": "https://example.com/labels.tar.gz", "sha256": "a" * 64})
    rendered = render_repository([TritonModel.model_validate(body)])
    pod = render_deployment(rendered["m"].model, rendered, "uid", "ns")["spec"]["template"]["spec"]
    args = pod["initContainers"][0]["args"]
    assert "m/.=https://example.com/labels.tar.gz" in args and f"m/.={'a' * 64}" in args
    other = spec(modelFiles={"uri": "https://example.com/labels.tar.gz", "sha256": "b" * 64})
    assert render_repository([TritonModel.model_validate(other)])["m"].digest != rendered["m"].digest


def test_fetch_places_model_files_beside_the_versions_and_refuses_to_replace_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from triton_operator.agent import fetch

    root = tmp_path / "pvc"
    (root / "claim" / "m-files").mkdir(parents=True)
    (root / "claim" / "m-files" / "labels.txt").write_text("a\nb\n")
    (root / "claim" / "m-files" / "extra").mkdir()
    (root / "claim" / "m-files" / "extra" / "vocab.bin").write_bytes(b"\x00\xff")
    (root / "claim" / "bad").mkdir()
    (root / "claim" / "bad" / "config.pbtxt").write_text('name: "m"')
    (root / "claim" / "bad" / "2").mkdir()
    monkeypatch.setattr(fetch, "PVC_ROOT", root)
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text("rendered")
    assert fetch.run(tmp_path / "no-configmap", repo, ["m/.=pvc://claim/m-files"]) == 0
    assert (repo / "m" / "labels.txt").read_text() == "a\nb\n"
    assert (repo / "m" / "extra" / "vocab.bin").read_bytes() == b"\x00\xff"
    assert sorted(p.name for p in repo.iterdir()) == ["m"], "the staging directory is gone"
    with pytest.raises(fetch.FetchError, match=r"holds 2, config.pbtxt: spec.modelFiles may not replace"):
        fetch.run(tmp_path / "no-configmap", repo, ["m/.=pvc://claim/bad"])
    assert (repo / "m" / "config.pbtxt").read_text() == "rendered"


# ---------------------------------------------------------------- rules


def test_valid_spec_passes() -> None:
    assert errors(spec()) == {}
    # with a uri, the labels are fetched: the operator cannot see them, and does not guess
    assert errors(spec(modelFiles={"uri": "pvc://claim/labels"})) == {}


@pytest.mark.parametrize(
    ("edit", "path", "message"),
    [
        (lambda s: s["inputs"][0].update(dims=[48]), "spec.inputs[0].format",
         'FORMAT_NCHW needs exactly 3 dims (Triton: "model input NHWC/NCHW require 3 dims"), got [48]'),
        (lambda s: s["inputs"][0].update(format="FORMAT_NHWC", dims=[4, 4, 3, 1]), "spec.inputs[0].format",
         'FORMAT_NHWC needs exactly 3 dims (Triton: "model input NHWC/NCHW require 3 dims"), got [4, 4, 3, 1]'),
        (lambda s: s.pop("modelFiles"), "spec.outputs[0].labelFilename",
         "'labels.txt' is not a file of the model directory: add it to spec.modelFiles.inline (or "
         "spec.modelFiles.uri); Triton fails the load without it"),
        (lambda s: s["outputs"][0].update(labelFilename="missing.txt"), "spec.outputs[0].labelFilename",
         "'missing.txt' is not in spec.modelFiles.inline (it has ['labels.txt']); Triton fails the load without it"),
        (lambda s: s["outputs"][0].update(format="FORMAT_NCHW"), "spec.outputs[0].format",
         "format is for inputs: Triton's model outputs have no format"),
        (lambda s: s["inputs"][0].update(labelFilename="labels.txt"), "spec.inputs[0].labelFilename",
         "labelFilename is for outputs: Triton's model inputs have no label_filename"),
        (lambda s: s["modelFiles"]["inline"].update({"7": "x"}), "spec.modelFiles.inline[7]",
         "'7' is the operator's to render (the config, the warm-up directory or a version directory); give the "
         "file another name"),
        (lambda s: s.update(modelFiles={"uri": "pvc://claim/x", "sha256": "a" * 64}), "spec.modelFiles.sha256",
         "sha256 pins the file or archive an https:// uri names (fetch checks the download); pin an s3:// or gs:// "
         "object with objectVersion"),
    ],
)
def test_refused_with_the_field_named(edit: Any, path: str, message: str) -> None:
    body = spec()
    edit(body["spec"])
    got = errors(body)
    assert got.get(path) == message, got


def test_format_none_and_3_dims_pass() -> None:
    body = spec()
    body["spec"]["inputs"][0].update(format="FORMAT_NONE", dims=[7])
    assert errors(body) == {}


def test_the_schema_refuses_a_label_path_and_an_unknown_format() -> None:
    body = spec()
    body["spec"]["outputs"][0]["labelFilename"] = "../labels.txt"
    assert errors(body)
    body = spec()
    body["spec"]["inputs"][0]["format"] = "FORMAT_NC"
    assert errors(body)


# ---------------------------------------------------------------- import: NVIDIA's example repository's shape

# Written here in the shape of the models in Triton's docs/examples/model_repository (not copied from it): an image
# classifier whose NCHW input is reshaped and whose output names a labels file beside config.pbtxt, a two-input
# add/sub model, and a sequence model with START/READY controls; their model files are binary.
NVIDIA_SHAPED = {
    "vision_net": """
name: "vision_net"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {
    name: "pixels"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 32, 32 ]
    reshape { shape: [ 1, 3, 32, 32 ] }
  }
]
output [
  {
    name: "logits"
    data_type: TYPE_FP32
    dims: [ 10 ]
    reshape { shape: [ 1, 10, 1, 1 ] }
    label_filename: "vision_labels.txt"
  }
]
""",
    "nhwc_net": """
name: "nhwc_net"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "image", data_type: TYPE_UINT8, format: FORMAT_NHWC, dims: [ 16, 16, 3 ] } ]
output [ { name: "probs", data_type: TYPE_FP32, dims: [ 10 ], label_filename: "nhwc_labels.txt" } ]
""",
    "adder": """
name: "adder"
platform: "tensorflow_graphdef"
max_batch_size: 8
input [
  { name: "INPUT0", data_type: TYPE_INT32, dims: [ 16 ] },
  { name: "INPUT1", data_type: TYPE_INT32, dims: [ 16 ] }
]
output [
  { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 16 ] },
  { name: "OUTPUT1", data_type: TYPE_INT32, dims: [ 16 ] }
]
""",
    "accumulate": """
name: "accumulate"
platform: "tensorflow_graphdef"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START", control [ { kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] } ] },
    { name: "READY", control [ { kind: CONTROL_SEQUENCE_READY, int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
""",
}
BINARY = {"vision_net": "model.onnx", "nhwc_net": "model.onnx", "adder": "model.graphdef",
          "accumulate": "model.graphdef"}


def write_nvidia_shaped(root: Path) -> Path:
    for name, text in NVIDIA_SHAPED.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(text.lstrip())
        (root / name / "1" / BINARY[name]).write_bytes(b"\x08\x07\x12\x00\xff\xfe" + name.encode())
    (root / "vision_net" / "vision_labels.txt").write_text("\n".join(LABELS) + "\n")
    (root / "nhwc_net" / "nhwc_labels.txt").write_text("".join(f"label {i}\n" for i in range(10)))
    return root


def test_import_of_an_nvidia_shaped_repository_drops_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = write_nvidia_shaped(tmp_path / "model_repository")
    imported = tmp_path / "imported.yaml"
    rc, _, err = cli(["import", str(repo), "-o", str(imported)], capsys)
    assert rc == 0, err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    # the only warnings: the binary model files, which (as today) need a uri to be filled in; nothing dropped
    assert all("version files are binary" in w for w in warnings), err
    assert len(warnings) == len(NVIDIA_SHAPED) and "not supported" not in err and "not imported" not in err, err
    assert not check_documents(load_paths([imported])).errors

    docs = {d["metadata"]["name"].replace("-", "_"): d["spec"] for d in yaml.safe_load_all(imported.read_text())}
    assert docs["vision_net"]["modelFiles"] == {"inline": {"vision_labels.txt": "\n".join(LABELS) + "\n"}}
    assert docs["vision_net"]["inputs"][0]["format"] == "FORMAT_NCHW"
    assert docs["vision_net"]["outputs"][0]["labelFilename"] == "vision_labels.txt"
    assert docs["nhwc_net"]["inputs"][0]["format"] == "FORMAT_NHWC"
    assert "modelFiles" not in docs["adder"] and "format" not in docs["adder"]["inputs"][0]

    out = tmp_path / "re-rendered"
    rc, _, err = cli(["render", str(imported), "-o", str(out)], capsys)
    assert rc == 0, err
    after = configs_under(out)
    for name, text in NVIDIA_SHAPED.items():
        original, again = normalized(parse_config(text)), normalized(after[name])
        # field by field first (a readable failure), then the whole message
        for fd, value in original.ListFields():
            assert getattr(again, fd.name) == value, f"{name}.{fd.name} differs:\n{diff(original, again, 'a', 'b')}"
        assert [fd.name for fd, _ in again.ListFields()] == [fd.name for fd, _ in original.ListFields()], name
        assert original == again, diff(original, again, "original", "re-rendered")
    for name, label in (("vision_net", "vision_labels.txt"), ("nhwc_net", "nhwc_labels.txt")):
        assert (out / name / label).read_bytes() == (repo / name / label).read_bytes()


def test_import_of_binary_model_files_asks_for_a_model_files_uri(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    repo = write_nvidia_shaped(tmp_path / "model_repository")
    (repo / "adder" / "lookup.bin").write_bytes(b"\xff\x00\x01")
    imported = tmp_path / "imported.yaml"
    rc, _, err = cli(["import", str(repo), "-o", str(imported)], capsys)
    assert rc == 0, err
    assert ("warning: adder: model directory files are binary or nested (lookup.bin); set spec.modelFiles.uri to "
            "where they live (now pvc://CHANGE-ME/adder/model-files)") in err
    docs = {d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all(imported.read_text())}
    assert docs["adder"]["modelFiles"] == {"uri": "pvc://CHANGE-ME/adder/model-files"}


# ---------------------------------------------------------------- the classification extension, for real


def _classes(served: Any, image: np.ndarray, k: int) -> list[tuple[float, int, str]]:
    res = served.client.infer("fruit-classifier", [tensor("IMAGE", image)],
                              outputs=[grpcclient.InferRequestedOutput("SCORES", class_count=k)])
    out = []
    for entry in res.as_numpy("SCORES")[0]:
        value, index, label = entry.decode().split(":", 2)
        out.append((float(value), int(index), label))
    return out


@pytest.mark.triton
def test_classification_returns_the_labels_of_the_model_directory(tmp_path: Path) -> None:
    models = load_models(EXAMPLE)
    labels = models[0].spec.model_files.inline["fruit_labels.txt"].splitlines()  # type: ignore[union-attr]
    image = np.zeros((1, 3, 4, 4), dtype=np.float32)
    image[0, 0, 1, :] = 0.75  # class 1 (banana) scores 0.75
    image[0, 0, 3, :] = 0.5  # class 3 (date) scores 0.5
    with serve(models, tmp_path / "repo") as served:
        assert (tmp_path / "repo" / "fruit-classifier" / "fruit_labels.txt").is_file()
        top = _classes(served, image, 2)
        assert [(i, label) for _, i, label in top] == [(1, "banana"), (3, "date")], top
        assert [v for v, _, _ in top] == [0.75, 0.5]
        assert all(labels[i] == label for _, i, label in _classes(served, image, 5))
        # without class_count the raw scores come back
        raw = served.client.infer("fruit-classifier", [tensor("IMAGE", image)]).as_numpy("SCORES")
        assert list(raw[0]) == [0.0, 0.75, 0.0, 0.5, 0.0]
        config = served.client.get_model_config("fruit-classifier").config
        assert config.output[0].label_filename == "fruit_labels.txt"
        assert config.input[0].format == config.input[0].FORMAT_NCHW


def test_import_skips_hidden_files_and_keeps_an_ensembles_files(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    repo = write_nvidia_shaped(tmp_path / "model_repository")
    (repo / "adder" / ".gitignore").write_text("*.tmp\n")
    (repo / "pipe" / "1").mkdir(parents=True)
    (repo / "pipe" / "notes.txt").write_text("how this ensemble came to be\n")
    (repo / "pipe" / "config.pbtxt").write_text("""
name: "pipe"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A", data_type: TYPE_INT32, dims: [ 16 ] }, { name: "B", data_type: TYPE_INT32, dims: [ 16 ] } ]
output [ { name: "SUM", data_type: TYPE_INT32, dims: [ 16 ] }, { name: "DIFF", data_type: TYPE_INT32, dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "adder", model_version: -1,
  input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
  output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "DIFF" } } ] }
""")
    imported = tmp_path / "imported.yaml"
    rc, _, err = cli(["import", str(repo), "-o", str(imported)], capsys)
    assert rc == 0, err
    assert "warning: adder: hidden files in the model directory were not imported: .gitignore" in err
    docs = {d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all(imported.read_text())}
    assert "modelFiles" not in docs["adder"]
    # an ensemble's directory may hold files too (an ensemble output can name labels): they come along
    assert docs["pipe"]["modelFiles"] == {"inline": {"notes.txt": "how this ensemble came to be\n"}}
    out = tmp_path / "re-rendered"
    rc, _, err = cli(["render", str(imported), "-o", str(out)], capsys)
    assert rc == 0, err
    assert (out / "pipe" / "notes.txt").read_text() == "how this ensemble came to be\n"
