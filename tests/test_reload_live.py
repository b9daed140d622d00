"""In-place reloads against a REAL tritonserver (2.51 from the nvidia-pytriton wheel, CPU, Python backend).

Pins what `triton_operator.triton.reload` and `triton_operator.controller.reload` rely on (measured by hand in
TRITON_NOTES.md, "Reloading a model in a running server"): a load with a new `config` while the model serves
swaps in the background, with no failed request; a load that fails leaves the old copy serving; an unload takes
the model away until the next load. Then one replica's reload end to end (`reload_replica`, Swap and Drain, a
config that loads and one that does not), with a recording stand-in for the Kubernetes API only.

The server restricts its repository API to a key, with the flags replicas run with (`render.repository_key`): the
operator's calls carry the key; without it, an unload, a load with files of one's own and the index are refused
over HTTP (403) and gRPC, and the model keeps serving.

The model: a Python model whose `initialize` sleeps `initSeconds` (a model that takes a while to load, so the
swap is observable) and raises when `failInitialize` is "yes" (a config Triton cannot load); it answers
INPUT + `generation`, so each answer says which config's copy served it.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.timing import scaled, wait_until
from tests.triton_helpers import RELOADABLE_SPEC as SPEC
from tests.triton_helpers import Served, models_from_yaml, start_served, tensor
from triton_operator.api.pod import (
    ANNOTATION_DIGEST,
    ANNOTATION_DRAIN_SECONDS,
    ANNOTATION_LOADED,
    ANNOTATION_PREVIOUS,
    ANNOTATION_RELOAD,
    ANNOTATION_RELOAD_FAILED,
    ANNOTATION_RELOAD_FROM,
    ANNOTATION_RELOAD_MESSAGE,
    DIGEST_PARAMETER,
    KEY_HEADER,
)
from triton_operator.controller.reload import drain, reload_replica
from triton_operator.plan.rollout import INSTRUCTION
from triton_operator.render.kubernetes import configmap_key
from triton_operator.render.modelconfig import RenderedModel, config_json, render_repository
from triton_operator.render.repository_key import GRPC_KEY_HEADER, RepositoryKeys
from triton_operator.triton import reload as triton
from triton_operator.triton.local import LocalTritonServer

pytestmark = pytest.mark.triton

#: A decoupled model: one request (COUNT) answered by COUNT responses 0.2 s apart, each 100 x `generation` + i,
#: then the FINAL flag.
STREAM_SPEC = """
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata: {{name: {name}}}
spec:
  backend: python
  batching: false
  decoupled: true
  inputs: [{{name: COUNT, dataType: INT32, dims: [1]}}]
  outputs: [{{name: INDEX, dataType: INT32, dims: [1]}}]
  instanceGroups: [{{kind: CPU, count: 1}}]
  parameters: {{generation: "{generation}"}}
  source:
    inline:
      model.py: |
        import json
        import time

        import numpy as np
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def initialize(self, args):
                params = json.loads(args["model_config"])["parameters"]
                self.generation = int(params["generation"]["string_value"])

            def execute(self, requests):
                for request in requests:
                    count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().reshape(-1)[0])
                    sender = request.get_response_sender()
                    for i in range(count):
                        time.sleep(0.2)
                        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(
                            "INDEX", np.array([100 * self.generation + i], dtype=np.int32))]))
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
"""

#: The first (served) config of every model: generation 1.
BASE = {"delay": 100, "init": "1", "fail": "no", "generation": "1"}
#: A config that loads: another batcher delay and generation (so another digest).
NEW = {"delay": 5000, "generation": "2"}
#: A config whose initialize raises (after its sleep): Triton cannot load it.
BAD = {"delay": 7000, "generation": "3", "fail": "yes"}

#: One model per test, so no test sees another's reload. SWAP's initialize takes 2 s: the swap is long enough
#: for thousands of requests to arrive while the new copy loads.
SWAP, REFUSED, UNLOAD, SEEN, DRAIN = "reload-swap", "reload-refused", "reload-unload", "reload-seen", "reload-drain"
GUARDED = "reload-guarded"  # clients without the key try to unload it and to load code of their own
#: The model's repository key, as the operator derives it (`render.repository_key`): the server requires it.
KEY = RepositoryKeys(b"k" * 32).key("ns", GUARDED, "00000000-0000-0000-0000-000000000001")
STREAM = "reload-stream"
REPLICA = {case: f"replica-{case}" for case in ("swap-ok", "swap-bad", "drain-ok", "drain-bad")}
INIT = {SWAP: "2"}


def render(name: str, **changes: object) -> RenderedModel:
    values = {**BASE, "init": INIT.get(name, BASE["init"]), **changes}
    [model] = models_from_yaml(SPEC.format(name=name, **values), name)
    return render_repository([model])[name]


def render_stream(generation: int) -> RenderedModel:
    [model] = models_from_yaml(STREAM_SPEC.format(name=STREAM, generation=generation), STREAM)
    return render_repository([model])[STREAM]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    names = [SWAP, REFUSED, UNLOAD, SEEN, DRAIN, GUARDED, *REPLICA.values()]
    models = [m for n in names for m in models_from_yaml(SPEC.format(name=n, **{**BASE, "init": INIT.get(n, "1")}))]
    models += models_from_yaml(STREAM_SPEC.format(name=STREAM, generation=1), STREAM)
    started: list[LocalTritonServer] = []
    try:
        served = start_served(models, tmp_path_factory.mktemp("reload") / "repo", on_start=started.append, key=KEY)
        yield served
        served.client.close()
    finally:
        for s in started:  # ten Python models keep tritonserver past stop()'s default grace of 10 s
            s.stop(grace=3)


def address(server: Served) -> str:
    """Where the operator asks a replica's Triton: its HTTP endpoint (`triton.rest`)."""
    return server.server.http_url


def served_digest(server: Served, name: str) -> str | None:
    now = asyncio.run(triton.served(address(server), name))
    return now.digest if now is not None else None


def infer(client: grpcclient.InferenceServerClient, name: str) -> int:
    """One request; the generation of the config whose copy answered it."""
    out = client.infer(name, [tensor("INPUT", np.zeros((1, 4), np.float32))]).as_numpy("OUTPUT")
    assert out is not None and len(set(out.ravel().tolist())) == 1, out
    return int(out.ravel()[0])


@dataclass
class Counts:
    sent: int
    failed: int
    by_generation: dict[int, int]
    errors: dict[str, int]


class Traffic:
    """Client threads sending requests to one model without a pause (each on its own connection), recording each
    request's send time and outcome: the generation that answered it, or Triton's message."""

    def __init__(self, server: Served, name: str, threads: int = 3) -> None:
        self.url, self.name = server.server.grpc_url, name
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.events: list[tuple[float, int | str]] = []  # (sent at, generation or error)
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        try:
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    outcome: int | str = infer(client, self.name)
                except InferenceServerException as exc:
                    outcome = (exc.message() or str(exc))[:160]
                with self.lock:
                    self.events.append((sent, outcome))
        finally:
            client.close()

    def counts(self, since: float = 0.0, until: float = float("inf")) -> Counts:
        """The requests sent in [since, until) (answered by now)."""
        with self.lock:
            outcomes = [o for t, o in self.events if since <= t < until]
        gens = collections.Counter(o for o in outcomes if isinstance(o, int))
        errors = collections.Counter(o for o in outcomes if isinstance(o, str))
        return Counts(len(outcomes), sum(errors.values()), dict(gens), dict(errors))

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + scaled(10)
        while self.counts().sent < 50:  # flowing before the test acts
            assert time.monotonic() < deadline, f"no traffic to {self.name}: {self.counts()}"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


def timed_load(server: Served, name: str, pbtxt: str) -> tuple[triton.Loaded, float]:
    start = time.monotonic()
    loaded = asyncio.run(triton.load(address(server), server.server.grpc_url, name, config_json(pbtxt), key=KEY))
    return loaded, time.monotonic() - start


# ---------------------------------------------------------------- Triton's behaviour, through triton/reload.py


def test_config_json_is_the_rendered_config() -> None:
    """config_json carries every field of the pbtxt, the digest parameter included (protobuf's JSON mapping)."""
    new = render(SWAP, **NEW)
    loaded = json.loads(config_json(new.config_pbtxt))
    assert loaded["name"] == SWAP
    assert loaded["parameters"][DIGEST_PARAMETER] == {"string_value": new.digest}
    assert int(loaded["dynamic_batching"]["max_queue_delay_microseconds"]) == NEW["delay"]


def test_load_with_a_new_config_swaps_without_a_failed_request(server: Served) -> None:
    old, new = render(SWAP), render(SWAP, **NEW)
    assert old.digest != new.digest
    assert served_digest(server, SWAP) == old.digest
    with Traffic(server, SWAP) as traffic:
        start = time.monotonic()
        loaded, seconds = timed_load(server, SWAP, new.config_pbtxt)
        returned = time.monotonic()
        time.sleep(0.5)
    during, after = traffic.counts(start, returned), traffic.counts(returned)
    figures = (f"load took {seconds:.2f}s; {during.sent} requests sent during it, {during.failed} failed, "
               f"answered by generation {during.by_generation}, errors {during.errors}; {after.sent} sent after it, "
               f"{after.failed} failed, by generation {after.by_generation}")
    print(f"\nswap: {figures}")  # the measured figures, shown with -s
    assert loaded.ok, server.why(f"load failed: {loaded.message}; {figures}")
    assert during.failed == 0 and after.failed == 0, server.why(figures)
    assert seconds >= 2.0, f"the load did not wait for the new copy's 2 s initialize: {figures}"
    assert during.by_generation.get(1, 0) > 0, f"the old copy did not answer while the new one loaded: {figures}"
    assert set(during.by_generation) <= {1, 2} and set(after.by_generation) == {2}, figures
    now = asyncio.run(triton.served(address(server), SWAP))
    assert now is not None and now.digest == new.digest, now
    assert f'"max_queue_delay_microseconds": "{NEW["delay"]}"' in now.config, now.config
    assert now.sequence_idle_seconds is None


def test_a_load_that_fails_leaves_the_old_config_serving(server: Served) -> None:
    old, bad = render(REFUSED), render(REFUSED, **BAD)
    assert served_digest(server, REFUSED) == old.digest
    with Traffic(server, REFUSED) as traffic:
        start = time.monotonic()
        loaded, seconds = timed_load(server, REFUSED, bad.config_pbtxt)
        time.sleep(0.3)
    during = traffic.counts(start)
    figures = (f"load took {seconds:.2f}s; {during.sent} requests sent, {during.failed} failed, "
               f"by generation {during.by_generation}, errors {during.errors}")
    print(f"\nrefused load: {figures}; Triton said: {loaded.message}")
    assert not loaded.ok, server.why(f"Triton loaded a config whose initialize raises; {figures}")
    assert "failInitialize is yes" in loaded.message and REFUSED in loaded.message, loaded.message
    assert during.failed == 0 and set(during.by_generation) == {1}, server.why(figures)
    assert server.client.is_model_ready(REFUSED)
    assert served_digest(server, REFUSED) == old.digest


def test_unload_takes_the_model_away_until_the_next_load(server: Served) -> None:
    old, new = render(UNLOAD), render(UNLOAD, **NEW)
    assert served_digest(server, UNLOAD) == old.digest
    assert infer(server.client, UNLOAD) == 1
    asyncio.run(triton.unload(server.server.grpc_url, UNLOAD, key=KEY))
    assert not server.client.is_model_ready(UNLOAD), "unload() returned while the model was still READY"
    assert asyncio.run(triton.served(address(server), UNLOAD)) is None
    with pytest.raises(InferenceServerException) as refused:
        infer(server.client, UNLOAD)
    print(f"\nafter unload, a request: {refused.value.message()}")
    loaded, seconds = timed_load(server, UNLOAD, new.config_pbtxt)
    print(f"load after unload: {seconds:.2f}s")
    assert loaded.ok, server.why(loaded.message)
    assert served_digest(server, UNLOAD) == new.digest
    assert infer(server.client, UNLOAD) == 2


def test_requests_seen_counts_each_request(server: Served) -> None:
    addr = address(server)

    def seen() -> int:
        return asyncio.run(triton.requests_seen(addr, SEEN))

    # Triton counts a request in its statistics just after the response goes out, so a count read at once may lag
    # the last request (CI saw 4 of 5 on a loaded machine): read until it has caught up, then compare.
    first = seen()
    for _ in range(17):
        assert infer(server.client, SEEN) == 1
    wait_until("17 requests counted", lambda: seen() >= first + 17, 10)
    second = seen()
    assert second - first == 17, (first, second)
    assert seen() == second  # no request, no change
    for _ in range(5):
        infer(server.client, SEEN)
    wait_until("5 more requests counted", lambda: seen() >= second + 5, 10)
    assert seen() - second == 5


# ---------------------------------------------------------------- the repository key


def post(server: Served, path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> tuple[int, str]:
    """One HTTP call to the server's repository API, as any client of the model's Service could make it."""
    req = urllib.request.Request(f"http://{address(server)}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - 127.0.0.1
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def intruder(name: str, marker: Path) -> tuple[str, dict[str, bytes]]:
    """A load request's `config` and files for a Python model of a client's own: its code writes `marker` when it runs
    inside tritonserver."""
    config = json.dumps({"name": name, "backend": "python", "max_batch_size": 0,
                         "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [4]}],
                         "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]}]})
    code = (f"class TritonPythonModel:\n    def initialize(self, args):\n        open({str(marker)!r}, 'w').write('ran')\n"
            "    def execute(self, requests):\n        return []\n")
    return config, {"file:1/model.py": code.encode()}


def test_without_the_key_no_client_can_unload_a_model_or_load_code_of_its_own(server: Served, tmp_path: Path) -> None:
    """What anyone who reached a replica could do with the repository API open: unload the model, or load their own
    Python code (under a new name, or over the served model). Each is refused over HTTP (403) and gRPC, with no key
    or a wrong one; the model stays READY and answers; none of the code ran. The same load with the key (the
    operator's) does run it: the payload is real."""
    marker = tmp_path / "intruder-ran"
    assert infer(server.client, GUARDED) == 1
    attempts: dict[str, tuple[str, dict[str, Any]]] = {}
    for target in ("intruder", GUARDED):
        config, files = intruder(target, marker)
        body = {"parameters": {"config": config, **{k: base64.b64encode(v).decode() for k, v in files.items()}}}
        attempts[f"load {target} with files"] = (f"/v2/repository/models/{target}/load", body)
    attempts["unload"] = (f"/v2/repository/models/{GUARDED}/unload", {})
    attempts["index"] = ("/v2/repository/index", {})
    answers = {f"{what} ({'a wrong key' if headers else 'no key'})": post(server, path, body, headers)
               for what, (path, body) in attempts.items() for headers in (None, {KEY_HEADER: "0" * 64})}
    print(f"\nHTTP without the key: {sorted({status for status, _ in answers.values()})}; "
          f"{next(iter(answers.values()))[1]}")
    for what, (status, text) in answers.items():
        assert status == 403 and "This API is restricted" in text, server.why(f"{what}: {status} {text}")

    client = grpcclient.InferenceServerClient(server.server.grpc_url)
    config, files = intruder("intruder", marker)
    calls = {"unload": lambda h: client.unload_model(GUARDED, headers=h),
             "load with files": lambda h: client.load_model("intruder", config=config, files=files, headers=h),
             "index": lambda h: client.get_model_repository_index(headers=h)}
    try:
        for what, call in calls.items():
            for headers in (None, {GRPC_KEY_HEADER: "0" * 64}):
                with pytest.raises(InferenceServerException) as refused:
                    call(headers)
                assert refused.value.status() == "StatusCode.UNAVAILABLE", (what, headers, refused.value)
                assert "This protocol is restricted" in (refused.value.message() or ""), (what, refused.value)
        print(f"gRPC without the key: {refused.value.status()} {refused.value.message()}")
    finally:
        client.close()
    assert not marker.exists(), server.why("a client's code ran in tritonserver")
    assert server.client.is_model_ready(GUARDED), server.why(f"{GUARDED} is not READY after the refused calls")
    assert infer(server.client, GUARDED) == 1
    assert asyncio.run(triton.served(address(server), GUARDED)).digest == render(GUARDED).digest  # type: ignore[union-attr]

    status, text = post(server, *attempts["load intruder with files"], {KEY_HEADER: KEY})
    assert status == 200 and marker.read_text() == "ran", server.why(f"the load with the key: {status} {text}")
    assert post(server, "/v2/repository/models/intruder/unload", {}, {KEY_HEADER: KEY})[0] == 200


def test_the_gate_asks_why_a_model_is_not_ready_with_the_key(server: Served) -> None:
    """The gate's question when a model is not READY (the repository index) carries the key; without it (a replica
    holding another key) the verdict says so instead of blaming the model."""
    from triton_operator.triton.replica import check_replica

    known = asyncio.run(check_replica(address(server), "no-such-model", (), "d", key=KEY))
    assert (known.reason, known.message) == ("ModelLoadFailed", "model no-such-model is UNAVAILABLE: not in the model "
                                             "repository"), known
    refused = asyncio.run(check_replica(address(server), "no-such-model", (), "d"))
    assert refused.reason == "RepositoryKeyRefused" and "This API is restricted" in refused.message, refused


# ---------------------------------------------------------------- drain()


def pod(name: str, annotations: Mapping[str, str], ready: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": f"{name}-pod", "annotations": dict(annotations)},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_drain_waits_for_a_quiet_second_and_gives_up_at_its_timeout(server: Served) -> None:
    addr, body = address(server), pod(DRAIN, {})
    done, took = asyncio.run(drain(lambda: body, addr, DRAIN, timeout=5.0, quiet=1.0))
    assert done and 1.0 <= took < 4.0, (done, took)
    with Traffic(server, DRAIN, threads=1):
        done, took = asyncio.run(drain(lambda: body, addr, DRAIN, timeout=2.0, quiet=1.0))
    assert not done and 2.0 <= took < 5.0, (done, took)


# ---------------------------------------------------------------- reload_replica, end to end


class RecordingKube:
    """The two calls reload_replica makes on the Kubernetes API: get (a ConfigMap) and patch_pod_annotations."""

    def __init__(self, configmaps: Mapping[str, dict[str, Any]]) -> None:
        self.configmaps = configmaps
        self.gets: list[tuple[str, str, str, str]] = []
        self.patches: list[tuple[str, str, dict[str, str | None], dict[str, str | None] | None]] = []

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets.append((api_version, kind, namespace, name))
        return self.configmaps.get(name) if (api_version, kind) == ("v1", "ConfigMap") else None

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None],
                              expect: Mapping[str, str | None] | None = None) -> dict[str, Any]:
        self.patches.append((namespace, name, dict(annotations), dict(expect) if expect is not None else None))
        return {"metadata": {"namespace": namespace, "name": name, "annotations": {}}}


def run_replica(server: Served, name: str, mode: str, target: RenderedModel, old: RenderedModel,
                ) -> tuple[RecordingKube, dict[str, str], float]:
    annotations = {ANNOTATION_DIGEST: target.digest, ANNOTATION_RELOAD: mode, ANNOTATION_RELOAD_FROM: "cm",
                   ANNOTATION_PREVIOUS: old.digest}
    if mode == "Drain":
        annotations[ANNOTATION_DRAIN_SECONDS] = "0"
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "ns", "name": "cm"},
          "data": {configmap_key(f"{name}/config.pbtxt"): target.config_pbtxt}}
    kube, body = RecordingKube({"cm": cm}), pod(name, annotations)
    start = time.monotonic()
    asyncio.run(reload_replica(kube, lambda: body, address(server), server.server.grpc_url, name, KEY))  # type: ignore[arg-type]
    return kube, annotations, time.monotonic() - start


def expect_of(annotations: Mapping[str, str]) -> dict[str, str | None]:
    return {k: annotations[k] for k in (ANNOTATION_DIGEST, ANNOTATION_RELOAD, ANNOTATION_RELOAD_FROM)}


@pytest.mark.parametrize("mode", ["Swap", "Drain"])
def test_reload_replica_loads_the_new_config_and_clears_the_instruction(server: Served, mode: str) -> None:
    name = REPLICA[f"{mode.lower()}-ok"]
    old, new = render(name), render(name, **NEW)
    assert served_digest(server, name) == old.digest
    if mode == "Swap":
        with Traffic(server, name) as traffic:
            kube, annotations, seconds = run_replica(server, name, mode, new, old)
        counts = traffic.counts()
        print(f"\nreload_replica Swap: {seconds:.2f}s; {counts}")
        assert counts.failed == 0, server.why(f"requests failed during a Swap: {counts}")
    else:
        kube, annotations, seconds = run_replica(server, name, mode, new, old)
        print(f"\nreload_replica Drain: {seconds:.2f}s")
    assert kube.gets == [("v1", "ConfigMap", "ns", "cm")]
    # the instruction goes, and the loaded digest is written in the same patch (status never sees one without the other)
    done = {**dict.fromkeys(INSTRUCTION), ANNOTATION_LOADED: new.digest}
    assert kube.patches == [("ns", f"{name}-pod", done, expect_of(annotations))], kube.patches
    assert served_digest(server, name) == new.digest
    assert infer(server.client, name) == 2


@pytest.mark.parametrize("mode", ["Swap", "Drain"])
def test_reload_replica_with_a_config_that_cannot_load_keeps_the_old_one(server: Served, mode: str) -> None:
    name = REPLICA[f"{mode.lower()}-bad"]
    old, bad = render(name), render(name, **BAD)
    assert served_digest(server, name) == old.digest
    kube, annotations, seconds = run_replica(server, name, mode, bad, old)
    print(f"\nreload_replica {mode} of a config that cannot load: {seconds:.2f}s; patches {kube.patches}")
    [(namespace, pod_name, patch, expect)] = kube.patches
    assert (namespace, pod_name, expect) == ("ns", f"{name}-pod", expect_of(annotations))
    assert patch[ANNOTATION_RELOAD_FAILED] == bad.digest, patch
    assert "failInitialize is yes" in (patch[ANNOTATION_RELOAD_MESSAGE] or ""), patch
    assert patch[ANNOTATION_DIGEST] == old.digest, patch
    assert {k: patch[k] for k in INSTRUCTION} == dict.fromkeys(INSTRUCTION), patch
    assert server.client.is_model_ready(name), server.why(f"{name} is not READY after a failed {mode}")
    assert served_digest(server, name) == old.digest, server.why(f"{name} does not serve the old config again")
    assert infer(server.client, name) == 1


class Stream:
    """One gRPC stream to a decoupled model: responses (or errors) as they arrive, with their arrival times."""

    def __init__(self, server: Served, name: str) -> None:
        self.client = grpcclient.InferenceServerClient(server.server.grpc_url)
        self.lock = threading.Lock()
        self.got: list[tuple[float, int | str]] = []
        self.client.start_stream(callback=self._on)
        self.name = name

    def _on(self, result: Any, error: Any) -> None:
        with self.lock:
            if error is not None:
                self.got.append((time.monotonic(), str(error)[:160]))
            elif result.as_numpy("INDEX") is not None:
                self.got.append((time.monotonic(), int(result.as_numpy("INDEX").reshape(-1)[0])))

    def send(self, count: int) -> None:
        self.client.async_stream_infer(self.name, [tensor("COUNT", np.array([count], np.int32))])

    def answers(self) -> list[int | str]:
        with self.lock:
            return [a for _, a in self.got]

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def test_a_drain_reloads_a_decoupled_model_only_once_its_open_stream_is_closed(server: Served) -> None:
    """Pins Triton's part: an unload returns at once, but the copy stays UNLOADING while a client's stream is open,
    and the stream gets every response. So the Drain's wait for the unload (`triton.unloaded`) is a wait for the
    open streams: the new config loads only once the client closed its stream."""
    old, new = render_stream(1), render_stream(2)
    assert served_digest(server, STREAM) == old.digest
    annotations = {ANNOTATION_DIGEST: new.digest, ANNOTATION_RELOAD: "Drain", ANNOTATION_RELOAD_FROM: "cm",
                   ANNOTATION_DRAIN_SECONDS: "30"}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "ns", "name": "cm"},
          "data": {configmap_key(f"{STREAM}/config.pbtxt"): new.config_pbtxt}}
    kube, body = RecordingKube({"cm": cm}), pod(STREAM, annotations)  # NotReady: out of the Service
    stream = Stream(server, STREAM)
    reload_done = threading.Event()

    def reload() -> None:
        try:
            asyncio.run(reload_replica(kube, lambda: body, address(server), server.server.grpc_url, STREAM,
                                       KEY))  # type: ignore[arg-type]
        finally:
            reload_done.set()

    worker = threading.Thread(target=reload, daemon=True)
    try:
        stream.send(10)  # 2 s of responses
        wait_until("the stream's first response", lambda: stream.answers(), 10)
        worker.start()
        wait_until("the stream's 10 responses", lambda: len(stream.answers()) >= 10, 20)
        assert stream.answers() == list(range(100, 110)), stream.answers()
        # The drain's quiet second and the unload are past; the stream is still open: nothing new loads.
        time.sleep(2.5)
        index = {m.name: m.state for m in server.client.get_model_repository_index(headers=server.headers).models}
        assert index[STREAM] == "UNLOADING", server.why(f"{STREAM} with an open stream: {index[STREAM]}")
        assert not reload_done.is_set(), server.why("the reload finished while a stream was open")
        closed = time.monotonic()
    finally:
        stream.close()
    worker.join(60)
    assert reload_done.is_set(), server.why("the reload did not finish after the stream closed")
    print(f"\ndecoupled Drain: reloaded {time.monotonic() - closed:.2f}s after the stream closed")
    done = {**dict.fromkeys(INSTRUCTION), ANNOTATION_LOADED: new.digest}
    assert kube.patches == [("ns", f"{STREAM}-pod", done, expect_of(annotations))], kube.patches
    assert served_digest(server, STREAM) == new.digest
    after = Stream(server, STREAM)
    try:
        after.send(2)
        wait_until("the new config's responses", lambda: len(after.answers()) >= 2, 20)
        assert after.answers() == [200, 201], after.answers()
    finally:
        after.close()
