"""Failures a client causes are not a broken replica (issue 39, H2): the probe confirms a model that failed its
clients' requests with a request of its own (its warm-up sample, `agent.confirm`) before it calls it broken.

Against a REAL tritonserver (2.51) and the probe run as its own process, as in a pod: a Python model whose code raises
`ValueError` on negative inputs (the ordinary way a Python model refuses bad input), and an ensemble over it. Clients
sending only negative inputs at full rate leave the replica ready; a model whose code fails every request, a killed
stub and an unloaded model still fail the probe."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.documents import python_model
from tests.probing import KEY, get
from tests.timing import scaled
from tests.triton_helpers import Served, ServerPool, models_from_yaml, tensor
from triton_operator.api.pod import REPOSITORY_KEY_ENV
from triton_operator.plan import pool as pp
from triton_operator.render.modelconfig import config_json
from triton_operator.triton import pool as triton_pool
from triton_operator.triton.local import LocalTritonServer, free_port

pytestmark = pytest.mark.triton

HOLD = 3

#: `picky` raises on a negative input, and on every input once a file `broken` is next to its model.py (a fault of
#: its own); its warm-up sample is zeros. `picky-ens` is an ensemble of one step, picky.
MODELS = """
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata: {name: picky}
spec:
  backend: python
  maxBatchSize: 8
  inputs: [{name: INPUT, dataType: FP32, dims: [4]}]
  outputs: [{name: OUTPUT, dataType: FP32, dims: [4]}]
  instanceGroups: [{kind: CPU, count: 1}]
  modelWarmup:
    - {name: zeros, batchSize: 1, inputs: {INPUT: {dataType: FP32, dims: [4], zeroData: true}}}
  source:
    inline:
      model.py: |
        import pathlib

        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def execute(self, requests):
                if pathlib.Path(__file__).with_name("broken").exists():
                    raise RuntimeError("broken: every request fails")
                out = []
                for r in requests:
                    x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
                    if (x < 0).any():
                        raise ValueError("negative input")
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", x)]))
                return out
---
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata: {name: picky-ens}
spec:
  platform: ensemble
  maxBatchSize: 8
  inputs: [{name: X, dataType: FP32, dims: [4]}]
  outputs: [{name: Y, dataType: FP32, dims: [4]}]
  ensemble:
    steps: [{model: picky, inputMap: {INPUT: X}, outputMap: {OUTPUT: Y}}]
"""


@pytest.fixture(scope="module")
def picky_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Served]]:
    """The module's tritonserver serving `MODELS`, started on first use and started again (on a fresh repository)
    for the next test if one left it dead. One CI run's held probe said, after a Python stub was SIGKILLed under a
    flood, that tritonserver's port refused connections: true only if tritonserver went down with its stub (not seen
    again in 15 runs here, with and without CPU load); a test after that is about its own behaviour, not that."""
    root = tmp_path_factory.mktemp("confirm")
    pool = ServerPool()
    current: list[Served] = []

    def get() -> Served:
        if not current or current[-1].server.process is None or current[-1].server.process.poll() is not None:
            current.append(pool.serve(models_from_yaml(MODELS, "picky"), root / f"repo{len(current)}"))
        return current[-1]

    try:
        yield get
    finally:
        pool.close()


@pytest.fixture
def picky(picky_server: Callable[[], Served]) -> Served:
    return picky_server()


@pytest.fixture
def probe(picky: Served) -> Iterator[int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "operator"), REPOSITORY_KEY_ENV: KEY}
    proc = subprocess.Popen(
        [sys.executable, "-m", "triton_operator.cli.main", "probe", "--listen", f"127.0.0.1:{port}",
         "--target", picky.server.http_url, "--hold", str(HOLD), "--head-start", "0.1",
         "--model", "picky-ens", "--model", "picky", "--repository", str(picky.server.model_repository)],
        stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + scaled(20)
        while True:
            try:
                if get(port, "/status", key=KEY)[0] == 200 and status(port)["checks"]:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the probe did not start"
            time.sleep(0.05)
        yield port
    finally:
        proc.kill()
        proc.wait()


def status(port: int) -> dict:
    return json.loads(get(port, "/status", key=KEY)[1])


def infer(served: Served, model: str, value: float) -> bool:
    name = "X" if model == "picky-ens" else "INPUT"
    try:
        served.client.infer(model, [tensor(name, np.full((1, 4), value, dtype=np.float32))])
        return True
    except Exception:  # noqa: BLE001 - a failed request is what is counted
        return False


def wait_passing(port: int) -> None:
    deadline = time.monotonic() + scaled(30)
    while get(port)[0] != 200:
        assert time.monotonic() < deadline, f"the probe never passed: {status(port)}"


class Flood:
    """Client threads sending only negative inputs to `model`, without a pause, until stopped."""

    def __init__(self, served: Served, model: str, threads: int = 3) -> None:
        self.stop = threading.Event()
        self.failed = 0
        self.served_ok = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._send, args=(served, model)) for _ in range(threads)]

    def _send(self, served: Served, model: str) -> None:
        while not self.stop.is_set():
            ok = infer(served, model, -1.0)
            with self._lock:
                self.failed += not ok
                self.served_ok += ok

    def __enter__(self) -> Flood:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join()


def success_count(served: Served, model: str) -> int:
    return int(served.stats(model).inference_stats.success.count)


@pytest.mark.parametrize("model", ["picky", "picky-ens"])
def test_clients_sending_only_inputs_the_model_refuses_leave_the_replica_ready(picky, probe, model):
    port = probe
    wait_passing(port)
    successes = success_count(picky, "picky")
    probes: list[int] = []
    seen_broken: list[dict] = []
    with Flood(picky, model) as flood:
        # Three held probes in a row (the kubelet's): each passes when its hold is over, unless something broke.
        for _ in range(3):
            probes.append(get(port)[0])
            if (broken := status(port)["broken"]):
                seen_broken.append(broken)
        assert infer(picky, model, 1.0), "a good request is answered during the flood"
    confirmations = success_count(picky, "picky") - successes - 1  # the good request above is one
    print(f"{model}: {flood.failed} bad requests failed during {len(probes) * HOLD} s, probes {probes}, "
          f"{confirmations} requests of the probe's own served")
    assert flood.failed >= 30 and flood.served_ok == 0, "the clients' bad requests failed (Triton counts them)"
    assert probes == [200, 200, 200] and not seen_broken, (probes, seen_broken)
    assert confirmations >= 1, "the probe confirmed the model with a request of its own"
    assert status(port)["broken"] == {}


def test_a_model_whose_every_request_fails_is_broken_once_its_own_sample_fails_too(picky, probe):
    port = probe
    wait_passing(port)
    switch = picky.server.model_repository / "picky" / "1" / "broken"
    switch.touch()
    try:
        held: list[tuple[int, str, float]] = []
        thread = threading.Thread(target=lambda: held.append(get(port)))
        thread.start()
        broke = time.monotonic()
        while thread.is_alive() and time.monotonic() - broke < HOLD + 2:
            infer(picky, "picky", 1.0)  # clients' good requests, failing now
        thread.join()
        [(code, body, answered)] = held
        assert code == 503, (code, body)
        assert "own request (its warm-up sample) failed too" in body and "broken: every request fails" in body, body
        print(f"a model failing every request -> held probe failed in {answered - broke:.2f}s")
    finally:
        switch.unlink()
    assert infer(picky, "picky", 1.0)
    wait_passing(port)


def repository(served: Served, action: str, model: str, body: dict | None = None) -> None:
    req = urllib.request.Request(f"http://{served.server.http_url}/v2/repository/models/{model}/{action}",
                                 data=json.dumps(body or {}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - http:// to the test's own server
        assert resp.status == 200


def stubs_of(served: Served, model: str) -> list[int]:
    """tritonserver's Python stubs of `model` (its child processes whose command names the model's file)."""
    assert served.server.process is not None
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if ppid == served.server.process.pid and f"/{model}/".encode() in b" ".join(cmd[1:2]):
            out.append(int(pid))
    return out


def test_under_a_flood_a_killed_stub_fails_the_probe(picky, probe):
    port = probe
    wait_passing(port)
    successes = success_count(picky, "picky")
    with Flood(picky, "picky"):
        # The flood made the model a suspect, and the probe's own request served (the only successes there are).
        picky.wait_for("a request of the probe's own", lambda: success_count(picky, "picky") > successes)
        assert get(port)[0] == 200
        held: list[tuple[int, str, float]] = []
        thread = threading.Thread(target=lambda: held.append(get(port)))
        thread.start()
        time.sleep(0.3)  # the probe is held (passing) before the kill
        stubs = stubs_of(picky, "picky")
        assert stubs, picky.why("no Python stub of picky found among tritonserver's children")
        for pid in stubs:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        thread.join()
    [(code, body, answered)] = held
    assert code == 503, picky.why(f"the held probe passed after the stub's SIGKILL: {body}")
    if "refuses connections" in body:
        # The verdict is true only if tritonserver itself went down with its stub (a Triton crash, not ours): the
        # probe then fails for that, at once. A tritonserver still running behind a "refuses" verdict is a defect.
        assert picky.server.process is not None
        try:
            exit_code = picky.server.process.wait(scaled(10))
        except subprocess.TimeoutExpired:
            pytest.fail(picky.why(f"the probe said tritonserver refuses connections, yet it runs: {body}"))
        print(f"stub SIGKILL under a flood took tritonserver down too (exit code {exit_code}); the held probe failed "
              f"in {answered - killed:.2f}s: {body.strip()}\n{picky.server.log_tail(15)}")
        return
    assert "Python stub of model picky" in body or "own request" in body, picky.why(body)
    print(f"stub SIGKILL under a flood -> held probe failed in {answered - killed:.2f}s: {body.strip()}")
    config = config_json((picky.server.model_repository / "picky" / "config.pbtxt").read_text())
    repository(picky, "unload", "picky")
    repository(picky, "load", "picky", {"parameters": {"config": config}})
    wait_passing(port)
    assert infer(picky, "picky", 1.0)


def test_an_unloaded_model_fails_the_held_probe_at_once(picky, probe):
    port = probe
    wait_passing(port)
    held: list[tuple[int, str, float]] = []
    thread = threading.Thread(target=lambda: held.append(get(port)))
    thread.start()
    time.sleep(0.3)  # the probe is held (passing) before the unload
    unloading = time.monotonic()
    repository(picky, "unload", "picky-ens")
    thread.join()
    [(code, body, answered)] = held
    assert code == 503 and "picky-ens is not loaded" in body, picky.why(body)
    print(f"unload -> held probe failed in {answered - unloading:.2f}s")
    repository(picky, "load", "picky-ens")
    wait_passing(port)


# -- a pool replica: every model, each with its own threshold ---------------------------------------------------

PICKY_PY = MODELS.split("model.py: |\n", 1)[1].split("---", 1)[0]
PICKY_PY = "\n".join(line[8:] for line in PICKY_PY.splitlines())
WARMUP = [{"name": "zeros", "batchSize": 1, "inputs": {"INPUT": {"dataType": "FP32", "dims": [4], "zeroData": True}}}]


@pytest.fixture
def pool_replica(tmp_path: Path) -> Iterator[tuple[LocalTritonServer, int]]:
    """A tritonserver as a pool replica is (explicit mode, an empty repository, models loaded from requests) and the
    pool's probe beside it (`--every-model`, as `render.pool` runs it): `picky` at the default threshold with a warm-up
    sample, `strict` (threshold 1) and `lenient` (0) with none; all three raise on negative inputs."""
    (tmp_path / "models").mkdir()
    server = LocalTritonServer(model_repository=tmp_path / "models", model_control_mode="explicit",
                               log_path=tmp_path / "triton.log", extra_args=["--strict-readiness=false"])
    server.start(scaled(120))
    proc = None
    try:
        specs = {"picky": {"modelWarmup": WARMUP}, "strict": {"warmupGate": {"failedRequestThreshold": 1}},
                 "lenient": {"warmupGate": {"failedRequestThreshold": 0}}}
        bodies = {}
        for name, spec in specs.items():
            doc = python_model(name, pool="p", memory="64Mi", source={"inline": {"model.py": PICKY_PY}}, **spec)
            bodies[name] = {**doc, "metadata": {**doc["metadata"], "namespace": "ns", "uid": f"uid-{name}",
                                                "generation": 1}}
        deadline = time.monotonic() + scaled(60)
        # gRPC opens first: loads go there. A load whose connection fails (OSError) is sent again until the deadline:
        # a guard for a port that is not accepting yet, though start() returns only once the gRPC port accepts.
        while True:
            why = None
            try:
                for m in pp.members("p", bodies).values():
                    assert m.request is not None
                    why = asyncio.run(triton_pool.load(server.grpc_url, m.request.name, m.request.config,
                                                       m.request.files, None))
                    assert why is None, why
                break
            except OSError:
                assert time.monotonic() < deadline, server.log_tail()
                time.sleep(0.1)
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "operator"), REPOSITORY_KEY_ENV: KEY}
        proc = subprocess.Popen(
            [sys.executable, "-m", "triton_operator.cli.main", "probe", "--listen", f"127.0.0.1:{port}",
             "--target", server.http_url, "--hold", "4", "--head-start", "0.1", "--every-model"],
            stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + scaled(30)
        while True:
            try:
                if len(status(port)["models"]) == 3:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the probe did not start"
            time.sleep(0.05)
        yield server, port
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        server.stop(grace=3)  # its graceful exit is not this test's: Triton waits out a held request (10 s at the default grace)


def test_on_a_pool_replica_each_model_is_judged_by_its_own_threshold_and_a_request_of_the_probes_own(pool_replica):
    server, port = pool_replica
    client = grpcclient.InferenceServerClient(server.grpc_url)
    served = Served(server=server, client=client, rendered={})
    try:
        seen: set[str] = set()
        with Flood(served, "picky", threads=2), Flood(served, "lenient", threads=2) as flood:
            assert not infer(served, "strict", -1.0)  # one bad request: its threshold is 1, and it has no sample
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                seen |= set(status(port)["broken"])
                time.sleep(0.05)
        print(f"pool replica: {flood.failed} bad requests to lenient in 6 s; broken seen: {sorted(seen)}")
        assert seen == {"strict"}, f"{sorted(seen)}: picky (confirmed by its sample) and lenient (0) never broke"
        assert infer(served, "picky", 1.0) and infer(served, "strict", 1.0)
        served.wait_for("strict served again: no longer broken", lambda: status(port)["broken"] == {})
    finally:
        client.close()
