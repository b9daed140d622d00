"""Model versions (issue 13 part 1): `spec.versions` (each version its own files) and `spec.versionPolicy`.

Pure: rendering (a directory per version, `version_policy` through the ModelConfig protobuf), the rules
(field-named errors shared by render, the webhook and import), the gate's versions annotation, and import
round trips. Real: two versions in a real tritonserver, each answering when addressed by version, an ensemble
step pinning one, `check_replica` seeing every served version, and `latest: 1` unloading the older one.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests.triton_helpers import serve, tensor
from triton_operator.api.pod import ANNOTATION_VERSIONS, parse_versions_annotation, versions_annotation
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.cli.main import main
from triton_operator.files import load_paths
from triton_operator.importer import parse_config
from triton_operator.render.kubernetes import render_deployment
from triton_operator.render.modelconfig import render_repository
from triton_operator.triton.local import free_port
from triton_operator.validate import Document, check_documents
from triton_operator.validate.admission import review

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "versions.yaml"


def model_py(version: int) -> str:
    """A Python-backend model whose OUTPUT is INPUT + 10 * version: each version answers differently."""
    return f'''import numpy as np
import triton_python_backend_utils as pb_utils

VERSION = {version}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            out = pb_utils.Tensor("OUTPUT", (x + 10 * VERSION).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
'''


def versioned(policy: dict[str, Any] | None = None, versions: tuple[int, ...] = (1, 2), name: str = "m") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "backend": "python",
        "maxBatchSize": 4,
        "inputs": [{"name": "INPUT", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUTPUT", "dataType": "FP32", "dims": [4]}],
        "instanceGroups": [{"kind": "CPU", "count": 1}],
        "versions": [{"version": v, "source": {"inline": {"model.py": model_py(v)}}} for v in versions],
    }
    if policy is not None:
        spec["versionPolicy"] = policy
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": name},
            "spec": spec}


def ensemble(step_version: int, step: str = "m") -> dict[str, Any]:
    return {
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": "pipe"},
        "spec": {
            "platform": "ensemble", "maxBatchSize": 4,
            "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "y", "dataType": "FP32", "dims": [4]}],
            "ensemble": {"steps": [{"model": step, "modelVersion": step_version, "inputMap": {"INPUT": "x"},
                                    "outputMap": {"OUTPUT": "y"}}]},
        },
    }  # fmt: skip


def models(*bodies: dict[str, Any]) -> list[TritonModel]:
    loaded = check_documents([Document(f"<test>#{i}", b) for i, b in enumerate(bodies)])
    assert not loaded.errors, "\n".join(map(str, loaded.errors))
    return [m for _, m in loaded.models]


def errors(*bodies: dict[str, Any]) -> dict[str, str]:
    """Field path -> message of every error (schema or rule)."""
    loaded = check_documents([Document(f"<test>#{i}", b) for i, b in enumerate(bodies)])
    return {e.path: e.message for e in loaded.errors}


# ---------------------------------------------------------------- rendering


def test_source_alone_is_version_1_without_a_policy() -> None:
    body = versioned()
    del body["spec"]["versions"]
    body["spec"]["source"] = {"inline": {"model.py": model_py(1)}}
    [m] = models(body)
    assert m.spec.available_versions == [1] and m.spec.served_versions == [1]
    r = render_repository([m])["m"]
    assert sorted(r.files) == ["m/1/model.py", "m/config.pbtxt"]
    assert not r.config.HasField("version_policy"), "no policy given: nothing rendered, Triton's default applies"


@pytest.mark.parametrize(("policy", "rendered", "served"), [
    (None, None, [1, 2]),
    ({"latest": 1}, 'latest {\n    num_versions: 1\n  }', [2]),
    ({"latest": 2}, 'latest {\n    num_versions: 2\n  }', [1, 2]),
    ({"all": {}}, 'all {\n  }', [1, 2]),
    ({"specific": [1]}, 'specific {\n    versions: 1\n  }', [1]),
])  # fmt: skip
def test_each_version_gets_its_directory_and_the_policy_is_rendered(
    policy: dict[str, Any] | None, rendered: str | None, served: list[int]
) -> None:
    [m] = models(versioned(policy))
    r = render_repository([m])["m"]
    assert sorted(r.files) == ["m/1/model.py", "m/2/model.py", "m/config.pbtxt"]
    assert r.files["m/1/model.py"].decode() == model_py(1) and r.files["m/2/model.py"].decode() == model_py(2)
    text = r.config_pbtxt
    if rendered is None:
        assert "version_policy" not in text
        assert m.spec.served_versions == [2], "Triton's default policy is latest 1"
    else:
        assert f"version_policy {{\n  {rendered}\n}}" in text, text
        assert m.spec.served_versions == served
    assert parse_config(text) == r.config, "config.pbtxt is the ModelConfig protobuf, printed"


def test_a_new_version_changes_the_digest() -> None:
    one = render_repository(models(versioned({"all": {}}, versions=(1,))))["m"]
    two = render_repository(models(versioned({"all": {}})))["m"]
    assert one.digest != two.digest


def test_warmup_files_of_versions_share_the_models_warmup_directory() -> None:
    body = versioned({"all": {}})
    data = "AAAAAA=="
    for v in body["spec"]["versions"]:
        v["source"]["warmupFiles"] = {"zeros.bin": data}
    [m] = models(body)
    files = render_repository([m])["m"].files
    assert files["m/warmup/zeros.bin"] == b"\0\0\0\0"
    assert not any(p.startswith(("m/1/warmup", "m/2/warmup")) for p in files)


# ---------------------------------------------------------------- rules, with the field named


def _with(body: dict[str, Any], edit: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    edit(body["spec"])
    return body


CASES = {
    "source-and-versions": (
        _with(versioned(), lambda s: s.update(source={"inline": {"model.py": model_py(1)}})),
        "spec.versions", "set source (served as version 1) or versions, not both"),
    "duplicate": (
        _with(versioned(), lambda s: s["versions"][1].update(version=1)),
        "spec.versions[1].version", "version 1 is also spec.versions[0]; each version is one directory"),
    "pin-without-https": (
        _with(versioned(), lambda s: s["versions"][1].update(source={"uri": "pvc://claim/m/2", "sha256": "c" * 64})),
        "spec.versions[1].source.sha256", "sha256 pins the file or archive an https:// uri names"),
    "no-model-py": (
        _with(versioned(), lambda s: s["versions"][1].update(source={"inline": {"other.py": ""}})),
        "spec.versions[1].source.inline", "the python backend loads model.py, which is missing"),
    "warmup-conflict": (
        _with(versioned(), lambda s: [v["source"].update(warmupFiles={"w.bin": b}) for v, b in
                                      zip(s["versions"], ("AAAAAA==", "AQEBAQ=="), strict=True)]),
        "spec.versions[1].source.warmupFiles[w.bin]", "differs from spec.versions[0]'s file of that name"),
    "specific-missing": (
        versioned({"specific": [2, 3]}),
        "spec.versionPolicy.specific[1]", "version 3 does not exist (the model has versions 1, 2): Triton only logs "
        "an error for it and serves the others, so it silently never loads"),
    "specific-none": (
        versioned({"specific": [3]}),
        "spec.versionPolicy.specific[0]", "version 3 does not exist (the model has versions 1, 2): none of the "
        "versions listed exists, so Triton fails the load"),
    "policy-two-kinds": (
        versioned({"latest": 1, "all": {}}),
        "spec.versionPolicy", "set exactly one of latest, all or specific"),
    "latest-zero": (versioned({"latest": 0}), "spec.versionPolicy.latest", "greater than or equal to 1"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_versions_spec_is_refused_with_the_field_named(case: str) -> None:
    body, path, message = CASES[case]
    got = errors(body)
    assert path in got, f"no error at {path}: {got}"
    assert message in got[path], got[path]


def test_versions_on_an_ensemble_are_refused() -> None:
    ens = ensemble(-1)
    ens["spec"]["versions"] = [{"version": 1, "source": {"inline": {"model.py": ""}}}]
    assert "an ensemble has no versions" in errors(ens, versioned())["spec.versions"]


@pytest.mark.parametrize(("policy", "pin", "message"), [
    (None, 3, "TritonModel 'm' has no version 3 (it has versions 1, 2), so Triton refuses the ensemble; use -1 "
              "(the latest served) or one of 2"),
    (None, 1, "TritonModel 'm' does not serve version 1 (no versionPolicy: Triton serves the latest version only; "
              "it serves version 2), so Triton refuses the ensemble"),
    ({"latest": 1}, 1, "does not serve version 1 (versionPolicy latest: 1; it serves version 2)"),
    ({"specific": [1]}, 2, "does not serve version 2 (versionPolicy specific: [1]; it serves version 1)"),
    ({"latest": 1}, 0, "TritonModel 'm' has no version 0"),
])  # fmt: skip
def test_a_step_pinning_a_version_not_served_is_refused(policy: dict[str, Any] | None, pin: int, message: str) -> None:
    got = errors(ensemble(pin), versioned(policy))
    assert message in got.get("spec.ensemble.steps[0].modelVersion", ""), got


@pytest.mark.parametrize(("policy", "pin"), [({"all": {}}, 1), ({"all": {}}, 2), ({"latest": 2}, 1), (None, 2),
                                             (None, -1), ({"specific": [1]}, 1)])
def test_a_step_pinning_a_served_version_is_accepted(policy: dict[str, Any] | None, pin: int) -> None:
    assert errors(ensemble(pin), versioned(policy)) == {}


def test_a_step_of_a_model_with_source_alone_may_pin_1_only() -> None:
    body = versioned()
    del body["spec"]["versions"]
    body["spec"]["source"] = {"inline": {"model.py": model_py(1)}}
    assert errors(ensemble(1), body) == {}
    assert "has no version 2 (it has version 1)" in errors(ensemble(2), body)["spec.ensemble.steps[0].modelVersion"]


def test_the_webhook_refuses_a_policy_change_that_unserves_a_pinned_version() -> None:
    old, new = versioned({"all": {}}), versioned({"latest": 1})
    ens = ensemble(1)
    assert review(ens, None, {"m": old}).allowed
    verdict = review(new, old, {"pipe": ens}, ["pipe"])
    assert not verdict.allowed
    assert "would break ensemble pipe: spec.ensemble.steps[0].modelVersion: TritonModel 'm' does not serve version 1" \
        in verdict.message, verdict.message
    verdict = review(ensemble(3), None, {"m": old})
    assert not verdict.allowed and "spec.ensemble.steps[0].modelVersion: TritonModel 'm' has no version 3" in verdict.message


def test_render_cli_refuses_an_unserved_pin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all([ensemble(1), versioned({"latest": 1})]))
    assert main(["render", str(path), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "TritonModel/pipe: spec.ensemble.steps[0].modelVersion: TritonModel 'm' does not serve version 1" in err, err


# ---------------------------------------------------------------- the gate's versions


def test_the_deployment_names_the_versions_the_gate_checks() -> None:
    ms = models(versioned({"all": {}}), ensemble(1))
    rendered = render_repository(ms)
    ann = render_deployment(rendered["pipe"].model, rendered, "uid", "ns")["spec"]["template"]["metadata"]["annotations"]
    assert ann[ANNOTATION_VERSIONS] == "m=1,2"
    assert parse_versions_annotation(ann[ANNOTATION_VERSIONS]) == {"m": (1, 2)}
    ann = render_deployment(rendered["m"].model, rendered, "uid", "ns")["spec"]["template"]["metadata"]["annotations"]
    assert parse_versions_annotation(ann[ANNOTATION_VERSIONS]) == {"m": (1, 2)}
    # a model serving version 1 alone gets no annotation: its pods are what they were before versions existed
    body = versioned()
    del body["spec"]["versions"]
    body["spec"]["source"] = {"inline": {"model.py": model_py(1)}}
    [single] = models(body)
    assert versions_annotation([single]) == ""
    assert ANNOTATION_VERSIONS not in render_deployment(single, render_repository([single]), "uid", "ns")["spec"]["template"][
        "metadata"]["annotations"]
    assert parse_versions_annotation("m=1,x;=2;n=") == {"m": (1,)}


# ---------------------------------------------------------------- fetched versions


def _fetched_versions(sha: str = "c" * 64) -> dict[str, Any]:
    body = versioned({"all": {}})
    body["spec"]["versions"][1]["source"] = {"uri": "https://h/m-v2.tar.gz", "sha256": sha}
    body["spec"]["versions"].append({"version": 3, "source": {"uri": "pvc://claim/models/m/3"}})
    return body


def test_each_fetched_version_gets_its_own_fetch_argument_and_rolls_the_digest() -> None:
    [m] = models(_fetched_versions())
    rendered = render_repository([m])
    assert sorted(rendered["m"].files) == ["m/1/model.py", "m/config.pbtxt"], "fetched files are not in the ConfigMap"
    pod = render_deployment(m, rendered, "uid", "ns")["spec"]["template"]["spec"]
    [fetch] = pod["initContainers"]
    args = fetch["args"]
    assert args[args.index("--uri"):] == ["--uri", "m/2=https://h/m-v2.tar.gz", "--sha256", f"m/2={'c' * 64}",
                                          "--uri", "m/3=pvc://claim/models/m/3"]
    assert [v["name"] for v in pod["volumes"]].count("pvc-claim") == 1
    [other] = models(_fetched_versions("d" * 64))
    assert render_repository([other])["m"].digest != rendered["m"].digest, "a version's new pin rolls the replicas"


def test_fetch_places_each_version_in_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton_operator.agent import fetch

    root = tmp_path / "pvc"
    for v in (1, 3):
        (root / "claim" / "models" / "m" / str(v)).mkdir(parents=True)
        (root / "claim" / "models" / "m" / str(v) / "model.py").write_text(model_py(v))
    monkeypatch.setattr(fetch, "PVC_ROOT", root)
    repo = tmp_path / "repo"
    assert fetch.run(tmp_path / "no-configmap", repo, ["m=pvc://claim/models/m/1", "m/3=pvc://claim/models/m/3"]) == 0
    assert (repo / "m" / "1" / "model.py").read_text() == model_py(1)
    assert (repo / "m" / "3" / "model.py").read_text() == model_py(3)
    with pytest.raises(fetch.FetchError, match="a version is a number"):
        fetch.run(tmp_path / "no-configmap", repo, ["m/x=pvc://claim/models/m/3"])


# ---------------------------------------------------------------- import round trips


@pytest.mark.parametrize("policy", [{"all": {}}, {"latest": 2}, {"specific": [1, 3]}, None])
def test_import_round_trips_versions_and_policy(policy: dict[str, Any] | None, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.yaml"
    src.write_text(yaml.safe_dump(versioned(policy, versions=(1, 2, 3))))
    first, second, imported = tmp_path / "first", tmp_path / "second", tmp_path / "imported.yaml"
    assert main(["render", str(src), "-o", str(first)]) == 0
    assert main(["import", str(first), "-o", str(imported)]) == 0
    err = capsys.readouterr().err
    assert "warning" not in err, err
    [doc] = list(yaml.safe_load_all(imported.read_text()))
    assert [v["version"] for v in doc["spec"]["versions"]] == [1, 2, 3]
    assert doc["spec"].get("versionPolicy") == policy
    assert not check_documents(load_paths([imported])).errors
    assert main(["render", str(imported), "-o", str(second)]) == 0
    files = {str(p.relative_to(first)): p.read_bytes() for p in sorted(first.rglob("*")) if p.is_file()}
    assert files == {str(p.relative_to(second)): p.read_bytes() for p in sorted(second.rglob("*")) if p.is_file()}
    assert sorted(files) == ["m/1/model.py", "m/2/model.py", "m/3/model.py", "m/config.pbtxt"]


def test_import_of_a_lone_version_1_is_still_spec_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    cfg = pb.ModelConfig(name="m", backend="python", max_batch_size=4)
    cfg.version_policy.all.SetInParent()
    (repo / "m" / "config.pbtxt").write_text(str(cfg))
    (repo / "m" / "1" / "model.py").write_text(model_py(1))
    assert main(["import", str(repo)]) == 0
    [doc] = list(yaml.safe_load_all(capsys.readouterr().out))
    assert doc["spec"]["source"] == {"inline": {"model.py": model_py(1)}} and "versions" not in doc["spec"]
    assert doc["spec"]["versionPolicy"] == {"all": {}}


def test_the_example_serves_two_versions() -> None:
    loaded = check_documents(load_paths([EXAMPLE]))
    assert not loaded.errors, "\n".join(map(str, loaded.errors))
    by_name = {m.name: m for _, m in loaded.models}
    versioned_models = [m for m in by_name.values() if m.spec.versions]
    assert versioned_models and all(len(m.spec.served_versions) >= 2 for m in versioned_models)


# ---------------------------------------------------------------- a real tritonserver


def _infer(served: Any, name: str, version: str) -> np.ndarray:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = served.client.infer(name, [tensor("INPUT" if name == "m" else "x", x)], model_version=version)
    return result.as_numpy("OUTPUT" if name == "m" else "y")[0]


def _check(served: Any, digest: str, versions: dict[str, tuple[int, ...]], address: str | None = None) -> Any:
    from triton_operator.triton.replica import check_replica

    return asyncio.run(check_replica(address or served.server.http_url, "m", (), digest, versions=versions))


@pytest.mark.triton
def test_two_versions_in_a_real_tritonserver(tmp_path: Path) -> None:
    x = np.arange(4, dtype=np.float32)
    repo = tmp_path / "repo"
    with serve(models(versioned({"all": {}}), ensemble(1)), repo) as served:
        # both versions answer when addressed by version, each with its own code; unversioned is the latest
        assert list(_infer(served, "m", "1")) == list(x + 10)
        assert list(_infer(served, "m", "2")) == list(x + 20)
        assert list(_infer(served, "m", "")) == list(x + 20)
        # an ensemble step pinned to version 1 runs version 1
        assert list(_infer(served, "pipe", "")) == list(x + 10)
        digest = served.rendered["m"].digest
        verdict = _check(served, digest, {"m": (1, 2)})
        assert verdict.ok, verdict
        assert "(versions 1, 2)" in verdict.message
        # the gate asks over HTTP (the port tritonserver opens after gRPC): nothing listening is unreachable
        closed = _check(served, digest, {"m": (1, 2)}, address=f"127.0.0.1:{free_port()}")
        assert (closed.ok, closed.reason, closed.ready_seen) == (False, "TritonUnreachable", False), closed
        assert "did not answer" in closed.message, closed

        # latest: 1 unloads version 1 when the model is loaded again through the repository API
        served.client.unload_model("pipe")  # (its pin on version 1 is refused by the rules with latest: 1)
        [narrowed] = models(versioned({"latest": 1}))
        rendered = render_repository([narrowed])
        (repo / "m" / "config.pbtxt").write_bytes(rendered["m"].files["m/config.pbtxt"])
        served.load(["m"])
        served.wait_for("version 1 to unload", lambda: not served.client.is_model_ready("m", "1"))
        assert served.client.is_model_ready("m", "2")
        assert list(_infer(served, "m", "2")) == list(x + 20)
        with pytest.raises(InferenceServerException, match=r"version 1|not found|unavailable"):
            _infer(served, "m", "1")
        states = {m.version: m.state for m in served.client.get_model_repository_index().models if m.name == "m"}
        assert states.get("2") == "READY" and states.get("1") != "READY", states

        new = rendered["m"].digest
        assert new != digest
        assert _check(served, new, {"m": (2,)}).ok
        stale = _check(served, digest, {"m": (2,)})
        assert not stale.ok and stale.reason == "ConfigDigestMismatch"
        # a gate still asking for version 1 is told which version is missing
        missing = _check(served, new, {"m": (1, 2)})
        assert not missing.ok and "model m version 1" in missing.message, missing


def test_import_of_binary_versions_asks_for_a_uri_per_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    cfg = pb.ModelConfig(name="m", backend="onnxruntime", max_batch_size=4)
    cfg.version_policy.latest.num_versions = 2
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(str(cfg))
    for v in (1, 2):
        (repo / "m" / str(v)).mkdir()
        (repo / "m" / str(v) / "model.onnx").write_bytes(b"\x08\x07\xff" + bytes([v]))
    assert main(["import", str(repo)]) == 0
    out, err = capsys.readouterr()
    [doc] = list(yaml.safe_load_all(out))
    assert [v["source"] for v in doc["spec"]["versions"]] == [{"uri": "pvc://CHANGE-ME/m/1"}, {"uri": "pvc://CHANGE-ME/m/2"}]
    assert doc["spec"]["versionPolicy"] == {"latest": 2}
    assert "set spec.versions[1].source.uri to where they live (now pvc://CHANGE-ME/m/2)" in err, err
