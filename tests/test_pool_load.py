"""Loading pooled models into a pool replica (`render.pool.load_request`, issue 29), against a REAL tritonserver (2.51
from the nvidia-pytriton wheel) started as a pool replica is: explicit model control, an empty repository, the
repository API restricted to a key. An inline model loads from its config and `file:` parameters alone, and serves,
with nothing written to the replica's disk; an ensemble's load over steps loaded so answers an error although the
ensemble serves (Triton 2.51, pinned here), and answers none once its steps are in the replica's repository on
disk; without the key, a load is refused."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from tritonclient.utils import InferenceServerException

from tests.timing import scaled
from tests.triton_helpers import Served, load_models, models_from_yaml, serve, tensor
from triton_operator.api.pod import REPOSITORY_KEY_ENV
from triton_operator.api.pool import TritonPool
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.files import write_repository
from triton_operator.render.modelconfig import RenderedModel, render_repository
from triton_operator.render.pool import LoadRequest, load_request, render_pool_deployment
from triton_operator.triton.local import LocalTritonServer

pytestmark = pytest.mark.triton

ROOT = Path(__file__).resolve().parent.parent
KEY = "pool-test-key"


def _models() -> tuple[dict[str, RenderedModel], dict[str, LoadRequest]]:
    rendered = render_repository(load_models(ROOT / "examples" / "pool.yaml"))
    return rendered, {name: load_request(r) for name, r in rendered.items()}


def _load(replica: Served, req: LoadRequest, files: bool = True) -> None:
    replica.client.load_model(req.name, config=req.config, files=dict(req.files) if files else None,
                              headers=replica.headers)


def test_an_inline_model_loads_from_its_request_alone(tmp_path: Path) -> None:
    rendered, requests = _models()
    assert set(requests["pool-scale"].files) == {"file:1/model.py"}
    repo = tmp_path / "models"
    repo.mkdir()  # the replica's `models` emptyDir: there, and empty
    with serve([], repo, load=[], key=KEY) as replica:
        replica.wait_for("tritonserver ready", replica.client.is_server_ready)
        for name in ("pool-add-sub", "pool-scale"):
            _load(replica, requests[name])
            assert replica.client.is_model_ready(name), replica.why(f"{name} is not READY after its load")
            loaded = replica.client.get_model_config(name).config
            assert loaded.parameters["triton-operator.config-digest"].string_value == rendered[name].digest
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        answer = replica.client.infer("pool-scale", [tensor("INPUT", x)],
                                      outputs=[grpcclient.InferRequestedOutput("OUTPUT")])
        assert answer.as_numpy("OUTPUT").tolist() == (x * 2).tolist()
        assert list(repo.iterdir()) == [], "nothing of the models on the replica's disk"


def _pipeline_answers(replica: Served) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    answer = replica.client.infer("pool-pipeline", [tensor("IN", x)],
                                  outputs=[grpcclient.InferRequestedOutput("OUT")])
    assert answer.as_numpy("OUT").tolist() == (x * 2 + 1).tolist()


def test_an_ensemble_over_steps_loaded_from_requests_loads_but_its_load_says_it_failed(tmp_path: Path) -> None:
    """Measured on 2.51, pinned: an ensemble's load looks its steps up in the model repository on disk, where steps
    loaded from requests are not ("failed to poll model 'pool-double': model not found in any model repository").
    The load call then fails, INTERNAL "failed to poll from model repository", and yet the ensemble is loaded, READY
    at the desired config, and serves. So a load's answer alone says nothing: the operator checks READY and the
    config digest, as the gate does. Models loaded from requests are not in the repository index either (it lists the
    repository on disk), so the gate cannot read their state or reason there."""
    rendered, requests = _models()
    assert requests["pool-pipeline"].files == {"file:1/.keep": b""}, "an ensemble: its version directory alone"
    repo = tmp_path / "models"
    repo.mkdir()
    with serve([], repo, load=[], key=KEY) as replica:
        replica.wait_for("tritonserver ready", replica.client.is_server_ready)
        for step in ("pool-double", "pool-offset"):
            _load(replica, requests[step])
            assert replica.client.is_model_ready(step), replica.why(f"{step} is not READY after its load")
        with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
            _load(replica, requests["pool-pipeline"])
        assert replica.client.is_model_ready("pool-pipeline"), replica.why("the ensemble is not READY")
        loaded = replica.client.get_model_config("pool-pipeline").config
        assert loaded.parameters["triton-operator.config-digest"].string_value == rendered["pool-pipeline"].digest
        _pipeline_answers(replica)
        assert list(replica.client.get_model_repository_index(headers=replica.headers).models) == []


def test_an_ensemble_over_steps_in_the_repository_loads_from_its_request(tmp_path: Path) -> None:
    """With its steps' files in the replica's repository (as the pool replica's sidecar would write them), loaded by
    name, an ensemble loads from its request with no error, and serves."""
    rendered, requests = _models()
    repo = tmp_path / "models"
    repo.mkdir()
    with serve([], repo, load=[], key=KEY) as replica:
        replica.wait_for("tritonserver ready", replica.client.is_server_ready)
        write_repository({n: rendered[n] for n in ("pool-double", "pool-offset")}, repo)
        for step in ("pool-double", "pool-offset"):
            _load(replica, requests[step], files=False)
        _load(replica, requests["pool-pipeline"])
        assert replica.client.is_model_ready("pool-pipeline"), replica.why("the ensemble is not READY")
        _pipeline_answers(replica)


def test_without_the_key_a_load_with_files_is_refused(tmp_path: Path) -> None:
    _, requests = _models()
    req = requests["pool-scale"]
    (tmp_path / "models").mkdir()
    with serve([], tmp_path / "models", load=[], key=KEY) as replica:
        replica.wait_for("tritonserver ready", replica.client.is_server_ready)
        with pytest.raises(Exception, match=r"(?i)restricted|permission|unavailable|expecting header"):
            replica.client.load_model(req.name, config=req.config, files=dict(req.files))
        assert not replica.client.is_model_ready(req.name)


def test_a_uri_model_is_loaded_from_disk_with_its_config_alone() -> None:
    """A uri model's load carries no `file:` parameter: its sources, pins and rendered files go to the replica's
    fetch-server sidecar (tests/test_fetch_server.py), which places them where Triton reads them."""
    model = TritonModel.model_validate(yaml.safe_load("""
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata: {name: fetched}
spec:
  pool: shared
  memory: 1Gi
  backend: python
  inputs: [{name: INPUT, dataType: FP32, dims: [4]}]
  outputs: [{name: OUTPUT, dataType: FP32, dims: [4]}]
  source: {uri: "https://example.invalid/model.tar.gz", sha256: "%s"}
""" % ("0" * 64)))
    req = load_request(render_repository([model])["fetched"])
    assert req.files == {}
    assert req.fetch is not None
    assert list(req.fetch.sources) == [{"field": "spec.source.uri", "version": "1",
                                        "uri": "https://example.invalid/model.tar.gz", "sha256": "0" * 64}]


SLOW_MODEL = """
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata: {name: slow}
spec:
  pool: shared
  memory: 64Mi
  backend: python
  inputs: [{name: INPUT, dataType: FP32, dims: [4]}]
  outputs: [{name: OUTPUT, dataType: FP32, dims: [4]}]
  instanceGroups: [{kind: CPU, count: 1}]
  source:
    inline:
      model.py: |
        import time

        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def initialize(self, args):
                time.sleep(4)

            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())]) for r in requests]
"""


def _pool_args() -> list[str]:
    """The pool replica's own tritonserver args (`render_pool_deployment`), but what the local server sets itself
    (repository, ports), with the key the kubelet would put in."""
    from tests.documents import pool_document

    pool = TritonPool.model_validate(pool_document())
    (triton, _, _) = render_pool_deployment(pool, "uid", "ns")["spec"]["template"]["spec"]["containers"]
    own = ("--model-repository=", "--http-port=", "--grpc-port=", "--metrics-port=")
    return [a.replace(f"$({REPOSITORY_KEY_ENV})", KEY) for a in triton["args"] if not a.startswith(own)]


@pytest.mark.parametrize("strict", [False, True], ids=["pool-args", "strict-readiness"])
def test_with_the_pools_args_a_model_loading_leaves_the_server_ready(tmp_path: Path, strict: bool) -> None:
    """tritonserver takes the pool's rendered args, and with them (--strict-readiness=false) its /v2/health/ready
    stays 200 while a model is LOADING: one model's load does not mark the replica unready for the others. With
    Triton's default strict readiness (the other case) the server is not ready meanwhile, which is why the pool
    turns it off."""
    (model,) = models_from_yaml(SLOW_MODEL)
    rendered = render_repository([model])
    repo = tmp_path / "models"
    write_repository(rendered, repo)  # on disk, so that the index shows the load's state
    args = _pool_args() + (["--strict-readiness=true"] if strict else [])
    server = LocalTritonServer(model_repository=repo, extra_args=args, log_path=tmp_path / "triton.log")
    server.start(scaled(120))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        replica = Served(server=server, client=client, rendered=rendered, key=KEY)
        replica.wait_for("tritonserver ready", client.is_server_ready)
        loading = threading.Thread(target=lambda: client.load_model("slow", headers=replica.headers))
        loading.start()
        replica.wait_for("slow LOADING", lambda: any(
            m.name == "slow" and m.state == "LOADING"
            for m in client.get_model_repository_index(headers=replica.headers).models))
        ready_while_loading = client.is_server_ready()
        loading.join(timeout=60)
        assert client.is_model_ready("slow"), replica.why("slow did not load")
        assert ready_while_loading is (not strict), replica.why(f"server ready while a model loads: {ready_while_loading}")
    finally:
        client.close()
        server.stop()


def _scale_archive(factor: int) -> bytes:
    import io
    import tarfile

    code = (b"import numpy as np\nimport triton_python_backend_utils as pb_utils\n\n\nclass TritonPythonModel:\n"
            b"    def execute(self, requests):\n        out = []\n        for r in requests:\n"
            b"            x = pb_utils.get_input_tensor_by_name(r, 'INPUT').as_numpy()\n"
            b"            out.append(pb_utils.InferenceResponse([pb_utils.Tensor('OUTPUT', (x * %d).astype(np.float32))]))\n"
            b"        return out\n" % factor)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("model.py")
        info.size = len(code)
        tar.addfile(info, io.BytesIO(code))
    return buf.getvalue()


def _fetched_model(uri: str, sha: str) -> RenderedModel:
    model = TritonModel.model_validate(yaml.safe_load(f"""
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata: {{name: fetched}}
spec:
  pool: shared
  memory: 64Mi
  backend: python
  maxBatchSize: 4
  inputs: [{{name: INPUT, dataType: FP32, dims: [4]}}]
  outputs: [{{name: OUTPUT, dataType: FP32, dims: [4]}}]
  instanceGroups: [{{kind: CPU, count: 1}}]
  source: {{uri: "{uri}", sha256: "{sha}"}}
"""))
    return render_repository([model])["fetched"]


def test_a_uri_model_loads_through_its_linked_directory_and_swaps_in_place(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A uri model on a pool replica: the fetch-server sidecar (real HTTP, fetching from a real HTTPS server) places
    its digest behind the link `<repo>/fetched`, and the REAL tritonserver loads it from there with the `config`
    parameter alone. A new pin is fetched beside it and the link swapped: the served copy answers as before until the
    reload, which then answers with the new files. Unloaded and deleted, nothing of it is left."""
    import hashlib

    from tests.fetch_server_client import KEY as SIDECAR_KEY
    from tests.fetch_server_client import ask as _ask
    from tests.fetch_server_client import settled as _settled
    from tests.https_server import serve as https_serve
    from triton_operator.agent.fetch_server import STORE, Limits
    from triton_operator.agent.fetch_server import serve as fetch_serve

    (tmp_path / "https").mkdir()
    gen = https_serve(tmp_path / "https")
    https = next(gen)
    monkeypatch.setenv("SSL_CERT_FILE", str(https.ca_file))
    repo = tmp_path / "models"
    sidecar = fetch_serve(("127.0.0.1", 0), repo, Limits(1 << 20, 100, 60), SIDECAR_KEY)
    threading.Thread(target=sidecar.serve_forever, daemon=True).start()
    try:
        two, three = _scale_archive(2), _scale_archive(3)
        https["/two.tgz"], https["/three.tgz"] = two, three
        first = _fetched_model(https.url("/two.tgz"), hashlib.sha256(two).hexdigest())
        second = _fetched_model(https.url("/three.tgz"), hashlib.sha256(three).hexdigest())
        assert first.digest != second.digest, "a new uri and pin: a new digest"
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        with serve([], repo, load=[], key=KEY) as replica:
            replica.wait_for("tritonserver ready", replica.client.is_server_ready)

            def answer() -> list[list[float]]:
                out = replica.client.infer("fetched", [tensor("INPUT", x)],
                                           outputs=[grpcclient.InferRequestedOutput("OUTPUT")])
                return out.as_numpy("OUTPUT").tolist()  # type: ignore[no-any-return]

            for rendered, factor in ((first, 2), (second, 3)):
                req = load_request(rendered)
                assert req.files == {} and req.fetch is not None
                status, _ = _ask(sidecar, "PUT", "/v1/models/fetched", {
                    "digest": rendered.digest, "sources": [dict(s) for s in req.fetch.sources], "files": {}},
                    key=SIDECAR_KEY)
                assert status == 202
                assert _settled(sidecar, "fetched")["digest"] == rendered.digest
                assert (repo / "fetched").is_symlink()
                if factor == 3:
                    assert answer() == (x * 2).tolist(), "the served copy is left alone until its reload"
                replica.client.load_model(req.name, config=req.config, headers=replica.headers)
                assert replica.client.is_model_ready("fetched"), replica.why("fetched is not READY after its load")
                loaded = replica.client.get_model_config("fetched").config
                assert loaded.parameters["triton-operator.config-digest"].string_value == rendered.digest
                assert answer() == (x * factor).tolist()
            assert _ask(sidecar, "POST", "/v1/models/fetched/prune", key=SIDECAR_KEY)[0] == 200
            assert [p.name for p in (repo / STORE / "fetched").iterdir() if p.is_dir()] == [second.digest]
            replica.client.unload_model("fetched", headers=replica.headers)
            assert _ask(sidecar, "DELETE", "/v1/models/fetched", key=SIDECAR_KEY)[0] == 200
            assert sorted(p.name for p in repo.iterdir()) == [STORE] and list((repo / STORE).iterdir()) == []
    finally:
        sidecar.shutdown()
        sidecar.server_close()
        gen.close()
