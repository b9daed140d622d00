"""Custom batching: `spec.batcher.strategyLibrary` rendered into TRITON_BATCH_STRATEGY_PATH, checked, imported back,
and proven in a real tritonserver with a strategy compiled here from C (`tests/data/strategy/max_requests.c`, which
declares the few parts of Triton's C API it uses): the batches Triton forms never hold more requests than the
strategy allows, while the same model without it batches past that cap. examples/custom-batcher/ is served the way
its comments say, from a claim laid out as they describe.
"""

from __future__ import annotations

import copy
import queue
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml

from tests.timing import scaled
from tests.triton_helpers import Served, fetch_uris, tensor
from triton_operator.agent import fetch
from triton_operator.api.pod import DIGEST_PARAMETER
from triton_operator.api.v1alpha1 import BATCH_STRATEGY_PARAMETER, TritonModel
from triton_operator.cli.main import main
from triton_operator.files import write_repository
from triton_operator.importer import import_config, parse_config
from triton_operator.render.kubernetes import render_children, render_deployment
from triton_operator.render.modelconfig import REPOSITORY_ROOT, render_repository
from triton_operator.triton.local import LocalTritonServer
from triton_operator.validate import Document, FieldError, check_documents

DATA = Path(__file__).parent / "data"
STRATEGY_C = DATA / "strategy" / "max_requests.c"
CAP = 2  # requests per batch the compiled strategy allows
MAX_BATCH = 8

EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "examples" / "custom-batcher"
#: Answers each request with the number of requests in the execute() call it came in: the batch Triton formed.
#: The example's own model file, served inline by the tests below and from a claim by the example's test.
MODEL_PY = (EXAMPLE_DIR / "model.py").read_text()

ELF_SO = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256))  # stands for a compiled library in pure tests


def _doc(name: str, strategy: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "backend": "python",
        "maxBatchSize": MAX_BATCH,
        "batcher": {"maxQueueDelayMicroseconds": 50_000, "preferredBatchSize": [4, 8]},
        "inputs": [{"name": "INPUT", "dataType": "FP32", "dims": [1]}],
        "outputs": [{"name": "BATCHED_WITH", "dataType": "INT32", "dims": [1]}],
        "instanceGroups": [{"kind": "CPU", "count": 1}],
        "source": {"inline": {"model.py": MODEL_PY}},
    }
    if strategy is not None:
        body["batcher"]["strategyLibrary"] = strategy
    body.update(spec)
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": name},
            "spec": body}


def _checked(*docs: dict[str, Any]) -> tuple[list[TritonModel], list[FieldError]]:
    loaded = check_documents([Document(f"<test>#{i}", d) for i, d in enumerate(docs)])
    return [m for _, m in loaded.models], loaded.errors


def _valid(*docs: dict[str, Any]) -> list[TritonModel]:
    models, errors = _checked(*docs)
    assert not errors, "\n".join(map(str, errors))
    return models


def _refused(doc: dict[str, Any]) -> dict[str, FieldError]:
    _, errors = _checked(doc)
    assert errors, "accepted, but must be refused"
    return {e.path: e for e in errors}


FROM_URI = {"uri": "pvc://strategies/capped"}


# ---------------------------------------------------------------- rendering


def test_a_source_file_renders_as_the_path_replicas_see() -> None:
    [m] = _valid(_doc("capped", {"file": "max_requests.so"}, source=FROM_URI, modelName="capped_v2"))
    cfg = render_repository([m])["capped"].config
    assert cfg.parameters[BATCH_STRATEGY_PARAMETER].string_value == "/models/capped_v2/1/max_requests.so"
    # ... because that is where each replica's tritonserver finds the repository
    deployment = next(c for c in render_children(m, render_repository([m]), "uid", "ns") if c["kind"] == "Deployment")
    server = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "tritonserver")
    assert f"--model-repository={REPOSITORY_ROOT}" in server["args"]
    assert {"name": "models", "mountPath": REPOSITORY_ROOT, "readOnly": True} in server["volumeMounts"]
    # a repository loaded from elsewhere (`triton-operator validate`, a test) names its own root
    local = render_repository([m], repository_root="/tmp/repo/")["capped"].config
    assert local.parameters[BATCH_STRATEGY_PARAMETER].string_value == "/tmp/repo/capped_v2/1/max_requests.so"
    nested = _valid(_doc("capped", {"file": "lib/max_requests.so"}, source=FROM_URI))
    assert (render_repository(nested)["capped"].config.parameters[BATCH_STRATEGY_PARAMETER].string_value
            == "/models/capped/1/lib/max_requests.so")


def test_an_image_path_renders_as_given_and_no_strategy_renders_no_parameter() -> None:
    [m, plain] = _valid(_doc("capped", {"path": "/opt/strategies/max_requests.so"}), _doc("plain"))
    rendered = render_repository([m, plain])
    assert rendered["capped"].config.parameters[BATCH_STRATEGY_PARAMETER].string_value == "/opt/strategies/max_requests.so"
    assert 'key: "TRITON_BATCH_STRATEGY_PATH"' in rendered["capped"].config_pbtxt
    assert BATCH_STRATEGY_PARAMETER not in rendered["plain"].config.parameters
    assert rendered["capped"].digest != rendered["plain"].digest


def test_render_cli_names_the_replicas_root_unless_told_another(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "capped.yaml"
    spec.write_text(yaml.safe_dump(_doc("capped", {"file": "max_requests.so"}, source=FROM_URI)))
    assert main(["render", str(spec)]) == 0
    assert 'string_value: "/models/capped/1/max_requests.so"' in capsys.readouterr().out
    out = (tmp_path / "out").resolve()
    assert main(["render", str(spec), "-o", str(out), "--repository-root", str(out)]) == 0
    capsys.readouterr()
    assert f'string_value: "{out}/capped/1/max_requests.so"' in (out / "capped" / "config.pbtxt").read_text()


# ---------------------------------------------------------------- validation


def test_a_strategy_needs_a_batching_model() -> None:
    errors = _refused(_doc("capped", batching=False, batcher={"strategyLibrary": {"path": "/opt/s.so"}}))
    e = errors["spec.batcher.strategyLibrary"]
    assert e.rule == "batch-strategy-batching"
    assert "needs a batching model (batching: true, maxBatchSize >= 1)" in e.message


def test_an_inline_source_must_hold_the_file_and_cannot_hold_a_library() -> None:
    missing = _refused(_doc("capped", {"file": "max_requests.so"}))["spec.batcher.strategyLibrary.file"]
    assert missing.rule == "batch-strategy-file"
    assert missing.message.startswith("'max_requests.so' is not in spec.source.inline")
    assert "spec.source.uri" in missing.message
    text = _doc("capped", {"file": "notes.so"})
    text["spec"]["source"]["inline"]["notes.so"] = "not a library\n"
    as_text = _refused(text)["spec.batcher.strategyLibrary.file"]
    assert as_text.message.startswith("spec.source.inline[notes.so] is text, not a shared library (no ELF header)")
    # a uri's files are only seen at pod start; an image path is the image's business
    _valid(_doc("a", {"file": "max_requests.so"}, source=FROM_URI), _doc("b", {"path": "/opt/s.so"}))


def test_file_and_path_are_one_choice() -> None:
    both = _refused(_doc("capped", {"file": "s.so", "path": "/opt/s.so"}, source=FROM_URI))
    assert both["spec.batcher.strategyLibrary"].message == (
        "set exactly one of file (a file of spec.source) or path (in the image)"
    )
    for bad in ({"path": "relative/s.so"}, {"file": "../s.so"}, {"file": "/abs/s.so"}):
        assert _refused(_doc("capped", bad, source=FROM_URI)), bad


def test_the_parameter_itself_is_the_operators_to_render() -> None:
    e = _refused(_doc("capped", parameters={BATCH_STRATEGY_PARAMETER: "/opt/s.so"}))[
        f"spec.parameters[{BATCH_STRATEGY_PARAMETER}]"
    ]
    assert e.rule == "batch-strategy-parameter"
    assert e.message.startswith("is rendered from spec.batcher.strategyLibrary")


def test_not_with_the_sequence_batcher() -> None:
    doc = _doc("capped", {"path": "/opt/s.so"}, sequenceBatcher={})
    assert _refused(doc)["spec.sequenceBatcher"].rule == "scheduling-oneof"


# ---------------------------------------------------------------- import


def _imported(cfg_text: str, files: dict[str, bytes] | None, versions: dict[str, list[int]]) -> Any:
    return import_config(parse_config(cfg_text), files, versions=versions)


def test_import_round_trips_a_file_and_a_path() -> None:
    [m, p] = _valid(_doc("capped", {"file": "max_requests.so"}, source=FROM_URI), _doc("pathed", {"path": "/opt/s.so"}))
    rendered = render_repository([m, p])
    res = _imported(rendered["capped"].config_pbtxt, {"max_requests.so": ELF_SO, "model.py": MODEL_PY.encode()},
                    {"capped": [1]})
    spec = res.manifest["spec"]
    assert spec["batcher"]["strategyLibrary"] == {"file": "max_requests.so"}
    assert "parameters" not in spec
    res_p = _imported(rendered["pathed"].config_pbtxt, {"model.py": MODEL_PY.encode()}, {"pathed": [1]})
    assert res_p.manifest["spec"]["batcher"]["strategyLibrary"] == {"path": "/opt/s.so"}
    # rendered again: the same config (the digest aside)
    for name, r in (("capped", res), ("pathed", res_p)):
        doc = copy.deepcopy(r.manifest)
        doc["spec"]["source"] = FROM_URI if name == "capped" else {"inline": {"model.py": MODEL_PY}}
        [again] = _valid(doc)
        a, b = rendered[name].config, render_repository([again])[name].config
        for c in (a, b):
            del c.parameters[DIGEST_PARAMETER]
        assert a == b, name


def test_import_finds_the_file_whatever_root_the_repository_had() -> None:
    text = render_repository(_valid(_doc("capped", {"path": "/srv/triton/capped/1/lib/s.so"})))["capped"].config_pbtxt
    res = _imported(text, {"lib/s.so": ELF_SO, "model.py": b""}, {"capped": [1]})
    assert res.manifest["spec"]["batcher"]["strategyLibrary"] == {"file": "lib/s.so"}
    # a file not in version 1's directory (which becomes spec.source) is the image's
    assert _imported(text, {"model.py": b""}, {"capped": [1]}).manifest["spec"]["batcher"]["strategyLibrary"] == {
        "path": "/srv/triton/capped/1/lib/s.so"}
    # several versions become spec.versions, not spec.source, so `file` (a file of spec.source) cannot name it
    several = import_config(parse_config(text), versions={"capped": [1, 3]},
                            version_files={1: {"lib/s.so": ELF_SO}, 3: {"lib/s.so": ELF_SO}})
    assert several.manifest["spec"]["batcher"]["strategyLibrary"] == {"path": "/srv/triton/capped/1/lib/s.so"}


def test_a_model_with_versions_takes_a_path_not_a_file() -> None:
    doc = _doc("capped", {"file": "s.so"})
    doc["spec"]["versions"] = [{"version": 1, "source": doc["spec"].pop("source")}]
    e = _refused(doc)["spec.batcher.strategyLibrary.file"]
    assert e.rule == "batch-strategy-file"
    assert e.message.startswith("names a file of spec.source (version 1's directory), and this model has versions")
    doc["spec"]["batcher"]["strategyLibrary"] = {"path": "/opt/s.so"}
    _valid(doc)


def test_import_reports_a_relative_path_and_drops_one_no_batcher_asks() -> None:
    base = 'name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
    rel = _imported(base + 'dynamic_batching {}\nparameters { key: "TRITON_BATCH_STRATEGY_PATH" value { string_value: '
                    '"lib/s.so" } }\n', {}, {"m": [1]})
    assert [p.path for p in rel.problems] == [f"spec.parameters[{BATCH_STRATEGY_PARAMETER}]"]
    assert "relative" in rel.problems[0].message
    none = _imported(base + 'parameters { key: "TRITON_BATCH_STRATEGY_PATH" value { string_value: "/opt/s.so" } }\n',
                     {}, {"m": [1]})
    assert "parameters" not in none.manifest["spec"] and "batcher" not in none.manifest["spec"]
    assert any("without dynamic_batching" in w for w in none.warnings), none.warnings


# ---------------------------------------------------------------- a real tritonserver


def _compile(out_dir: Path, cap: int) -> Path:
    """The C strategy built with gcc (it declares the few parts of Triton's C API it uses itself)."""
    lib = out_dir / "max_requests.so"
    cmd = ["gcc", "-std=c11", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", f"-DMAX_REQUESTS={cap}",
           "-o", str(lib), str(STRATEGY_C)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    return lib


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path, Path]]:
    """Three copies of one model in one explicit-mode tritonserver: `plain` without a strategy, `from-uri` with the
    compiled library as a file of its uri source (placed by the replicas' own fetch step from a claim), `from-image`
    with it as an absolute path. The repository is assembled as in a pod: rendered files, then fetched ones."""
    tmp = tmp_path_factory.mktemp("custom-batcher")
    lib = _compile(tmp, CAP)
    claim = tmp / "pvc" / "strategies" / "from-uri"
    claim.mkdir(parents=True)
    (claim / "model.py").write_text(MODEL_PY)
    shutil.copy(lib, claim / "max_requests.so")
    models = _valid(
        _doc("plain"),
        _doc("from-uri", {"file": "max_requests.so"}, source={"uri": "pvc://strategies/from-uri"}),
        _doc("from-image", {"path": str(lib)}),
    )
    repo = tmp / "models"
    rendered = render_repository(models, repository_root=str(repo))
    config_dir = write_repository(rendered, tmp / "config")  # what the ConfigMap volume holds
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fetch, "PVC_ROOT", tmp / "pvc")
        assert fetch.run(config_dir, repo, ["from-uri=pvc://strategies/from-uri"]) == 0
    server = LocalTritonServer(model_repository=repo, model_control_mode="explicit", log_path=tmp / "tritonserver.log")
    try:
        server.start(scaled(120))
        s = Served(server=server, client=grpcclient.InferenceServerClient(server.grpc_url), rendered=rendered)
        try:
            s.load(["plain", "from-uri", "from-image"])
            yield s, lib, repo
        finally:
            s.client.close()
    finally:
        server.stop()


def _batches(s: Served, model: str, n: int = 32) -> tuple[dict[int, int], list[int]]:
    """Send n requests at once; Triton's batch statistics (executions by batch size) and what each request's
    execute() call held, as the model saw it."""
    assert s.batch_sizes(model) == {}, s.why(f"{model} executed before the test sent anything")
    results: queue.Queue = queue.Queue()
    for i in range(n):
        s.client.async_infer(model, [tensor("INPUT", np.array([[float(i)]], dtype=np.float32))],
                             callback=lambda result, error: results.put((result, error)))
    seen = []
    deadline = time.monotonic() + scaled(30)
    while len(seen) < n:
        try:
            result, error = results.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(s.why(f"{model}: only {len(seen)} of {n} responses within {scaled(30):.0f} s")) from None
        assert error is None, s.why(f"{model}: a request failed: {error}")
        seen.append(int(result.as_numpy("BATCHED_WITH")[0, 0]))
    sizes = s.wait_for(
        f"{model}'s batch statistics covering all {n} requests",
        lambda: (b := s.batch_sizes(model)) and sum(k * v for k, v in b.items()) == n and b,
    )
    print(f"{model}: {n} concurrent requests, batch sizes (size: executions) {dict(sorted(sizes.items()))}")
    return sizes, seen


@pytest.mark.triton
def test_the_loaded_configs_name_the_library(served: tuple[Served, Path, Path]) -> None:
    s, lib, repo = served
    fetched = repo / "from-uri" / "1" / "max_requests.so"
    assert fetched.read_bytes() == lib.read_bytes()
    for model, path in (("from-uri", fetched), ("from-image", lib)):
        cfg = s.client.get_model_config(model).config
        assert cfg.parameters[BATCH_STRATEGY_PARAMETER].string_value == str(path), s.why(f"{model}: {cfg.parameters}")
        assert f"Loading custom batching strategy library {path} for model {model}" in s.server.log_tail(400), s.why(
            f"{model}: Triton did not say it loaded the strategy"
        )
    assert BATCH_STRATEGY_PARAMETER not in s.client.get_model_config("plain").config.parameters


@pytest.mark.triton
def test_without_a_strategy_batches_exceed_the_cap(served: tuple[Served, Path, Path]) -> None:
    s, _, _ = served
    sizes, seen = _batches(s, "plain")
    assert max(sizes) > CAP, s.why(f"plain: no batch above {CAP} under load, so the test proves nothing: {sizes}")
    assert max(seen) > CAP


@pytest.mark.triton
@pytest.mark.parametrize("model", ["from-uri", "from-image"])
def test_the_strategy_caps_every_batch(served: tuple[Served, Path, Path], model: str) -> None:
    s, _, _ = served
    sizes, seen = _batches(s, model)
    assert max(sizes) == CAP, s.why(f"{model}: batch sizes {sizes}: the strategy allows at most {CAP} requests")
    assert max(seen) == CAP, s.why(f"{model}: execute() calls held {sorted(set(seen))} requests")


# ---------------------------------------------------------------- examples/custom-batcher


@pytest.mark.triton
def test_the_example_serves_from_its_claim_with_its_strategy(tmp_path: Path) -> None:
    """examples/custom-batcher/custom-batcher.yaml as its comments say to run it: its claim holds the example's
    model.py and max_requests.so built with the command given there; the replica's fetch step (the --uri the
    rendered Deployment gives it) copies them into version 1's directory. Served beside the same model without
    the strategy: that one batches past the cap, the example never does."""
    text = (EXAMPLE_DIR / "custom-batcher.yaml").read_text()
    docs = {d["kind"]: d for d in yaml.safe_load_all(text) if d}
    loaded = check_documents([Document(f"custom-batcher.yaml#{i}", d) for i, d in enumerate(docs.values())])
    assert not loaded.errors, [str(e) for e in loaded.errors]
    [(_, model)] = loaded.models
    assert f"-DMAX_REQUESTS={CAP} " in text, "the example's build command makes the library this test compiles"
    # the replicas' path, and the claim and directory the fetch step copies from
    assert (render_repository([model])[model.name].config.parameters[BATCH_STRATEGY_PARAMETER].string_value
            == f"/models/{model.triton_name}/1/max_requests.so")
    uris = fetch_uris(render_deployment(model, render_repository([model]), "uid", "ns"))
    assert uris == [f"{model.triton_name}=pvc://{docs['PersistentVolumeClaim']['metadata']['name']}/models/"
                    f"{model.triton_name}"], uris

    claim = tmp_path / "pvc" / docs["PersistentVolumeClaim"]["metadata"]["name"] / "models" / model.triton_name
    claim.mkdir(parents=True)
    shutil.copy(EXAMPLE_DIR / "model.py", claim / "model.py")
    shutil.copy(_compile(tmp_path, CAP), claim / "max_requests.so")
    plain_doc = copy.deepcopy(docs["TritonModel"])
    plain_doc["metadata"]["name"] = "capped-batches-without"
    del plain_doc["spec"]["batcher"]["strategyLibrary"]
    plain_doc["spec"]["source"] = {"inline": {"model.py": MODEL_PY}}
    [plain] = _valid(plain_doc)

    repo = tmp_path / "models"
    rendered = render_repository([model, plain], repository_root=str(repo))
    config_dir = write_repository(rendered, tmp_path / "config")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fetch, "PVC_ROOT", tmp_path / "pvc")
        assert fetch.run(config_dir, repo, uris) == 0
    lib = repo / model.triton_name / "1" / "max_requests.so"
    assert sorted(p.name for p in lib.parent.iterdir()) == ["max_requests.so", "model.py"]

    server = LocalTritonServer(model_repository=repo, model_control_mode="explicit", log_path=tmp_path / "tritonserver.log")
    try:
        server.start(scaled(120))
        s = Served(server=server, client=grpcclient.InferenceServerClient(server.grpc_url), rendered=rendered)
        try:
            s.load([model.triton_name, plain.triton_name])
            assert f"Loading custom batching strategy library {lib} for model {model.triton_name}" in (
                s.server.log_tail(400)), s.why("Triton did not say it loaded the example's strategy")
            sizes, seen = _batches(s, plain.triton_name)
            assert max(sizes) > CAP, s.why(f"without the strategy no batch above {CAP}, proving nothing: {sizes}")
            sizes, seen = _batches(s, model.triton_name)
            assert max(sizes) == CAP and max(seen) == CAP, s.why(f"the example's batches {sizes}, seen {set(seen)}")
        finally:
            s.client.close()
    finally:
        server.stop()
