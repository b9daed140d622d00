"""The probe's health check (`agent.probe.Health`): what it calls broken, as a pure state machine, and against a real
tritonserver whose Python stub is killed, whose model is unloaded, and which is stopped (SIGSTOP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.probing import KEY, get
from tests.timing import scaled
from tests.triton_helpers import Served, load_models, serve, tensor
from triton_operator.agent.confirm import FAILED, NO_SAMPLE, SERVED, UNKNOWN, Verdict, sample_request
from triton_operator.agent.probe import Health
from triton_operator.api.pod import REPOSITORY_KEY_ENV
from triton_operator.render.modelconfig import config_json
from triton_operator.triton.local import free_port

# -- the state machine ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_failures_with_no_success_break_a_model_and_a_success_or_a_reload_clears_it():
    h = Health(("ens", "step"), fail_threshold=3)
    h.observe({"ens": (5, 0), "step": (5, 0)})
    assert h.broken() == {}
    h.observe({"ens": (5, 2), "step": (5, 2)})
    assert h.broken() == {}, "two failures are under the threshold"
    h.observe({"ens": (5, 4), "step": (5, 4)})
    assert set(h.broken()) == {"ens", "step"}
    assert "failed 4 requests in a row" in h.broken()["step"]
    h.observe({"ens": (5, 9), "step": (5, 9)})
    assert set(h.broken()) == {"ens", "step"}, "broken is sticky while no request succeeds"
    h.observe({"ens": (6, 9), "step": (5, 9)})
    assert set(h.broken()) == {"step"}, "a success clears the model it counts on"
    h.observe({"ens": (0, 0), "step": (0, 0)})
    assert h.broken() == {}, "counters that went back are a model loaded again"


def test_failures_between_successes_are_not_a_break():
    """A slow model, or clients some of whose requests fail, still succeeds: never broken."""
    h = Health(("m",), fail_threshold=3)
    s = f = 0
    h.observe({"m": (s, f)})
    for _ in range(50):
        f += 2
        h.observe({"m": (s, f)})
        s += 1
        h.observe({"m": (s, f)})
        assert h.broken() == {}
    h.observe({"m": (s, f)})  # no traffic at all: nothing moves, nothing breaks
    assert h.broken() == {}


def test_a_fail_threshold_of_0_never_breaks_a_model_by_its_failed_requests_but_still_by_the_rest():
    """warmupGate.failedRequestThreshold: 0, for a model whose code raises on some clients' requests."""
    h = Health(("m",), fail_threshold=0)
    h.observe({"m": (5, 0)})
    for fail in range(1, 100, 7):
        h.observe({"m": (5, fail)})
        assert h.broken() == {}, "failed requests alone, with the rule off"
    h.observe({})
    assert set(h.broken()) == {"m"}, "a model no longer loaded is still broken"


def test_a_model_missing_from_the_statistics_is_broken_at_once():
    h = Health(("ens", "step"))
    h.observe({"ens": (1, 0), "step": (1, 0)})
    h.observe({"ens": (1, 0)})
    assert list(h.broken()) == ["step"] and "not loaded" in h.broken()["step"]
    h.observe({"ens": (1, 0), "step": (0, 0)})
    assert h.broken() == {}


def test_no_answer_for_hang_seconds_is_a_hung_tritonserver_and_a_closed_port_is_no_verdict():
    clock = Clock()
    h = Health(("m",), hang_seconds=2.0, clock=clock)
    h.observe(None)
    assert h.broken() == {}, "no answer before any answer: tritonserver is starting"
    h.observe({"m": (1, 0)})
    clock.now = 1.5
    h.observe(None)
    assert h.broken() == {}
    clock.now = 2.1
    h.observe(None)
    assert list(h.broken()) == ["tritonserver"]
    h.observe({"m": (1, 0)})
    assert h.broken() == {}
    h.observe(None, refused=True)
    assert h.broken() == {} and h.counts == {}


def test_a_stub_seen_dead_on_two_checks_breaks_its_model_until_it_is_reaped():
    h = Health(("ens", "step"))
    counts = {"ens": (1, 0), "step": (1, 0)}
    h.observe(counts, dead={41: "step", 7: "other-model"})
    assert h.broken() == {}, "one sight of a zombie may be a stub being reaped"
    h.observe(counts, dead={41: "step"})
    assert list(h.broken()) == ["step"] and "pid 41" in h.broken()["step"]
    h.observe(counts, dead={})
    assert h.broken() == {}


def test_a_dead_stub_that_is_never_reaped_is_forgiven_once_its_model_is_loaded_again():
    h = Health(("step",))
    h.observe({"step": (1, 3)}, dead={41: "step"}, live={})
    h.observe({"step": (1, 3)}, dead={41: "step"}, live={})
    assert list(h.broken()) == ["step"]
    h.observe({"step": (0, 0)}, dead={41: "step"}, live={})  # counters restarted: loaded again
    assert h.broken() == {}
    h.observe({"step": (0, 0)}, dead={41: "step"}, live={})
    assert h.broken() == {}, "the old zombie stays forgiven"
    # A new stub of the model, with counters that did not move (no request before the fault): loaded again too.
    h = Health(("step",))
    h.observe({"step": (0, 0)}, dead={}, live={40: "step"})
    h.observe({"step": (0, 0)}, dead={40: "step"}, live={})
    h.observe({"step": (0, 0)}, dead={40: "step"}, live={})
    assert list(h.broken()) == ["step"]
    h.observe({"step": (0, 0)}, dead={40: "step"}, live={52: "step"})
    assert h.broken() == {}


def _suspect(clock: Clock) -> Health:
    """A model that failed 3 requests in a row with confirmation on: a suspect, not broken."""
    h = Health(("m",), fail_threshold=3, confirm_every=1.0, clock=clock)
    h.observe({"m": (5, 0)})
    h.observe({"m": (5, 3)})
    return h


def test_failures_past_the_threshold_make_a_suspect_and_only_a_failed_request_of_the_probes_own_breaks_it():
    """Issue 39: a client sending inputs the model's code refuses fails requests exactly as a broken model does."""
    clock = Clock()
    h = _suspect(clock)
    assert h.broken() == {} and h.suspects == {"m": "model m failed 3 requests in a row and served none "
                                                     "(Triton's statistics)"}
    [(model, token)] = h.due()
    assert model == "m" and h.due() == [], "one confirmation in flight per model"
    h.observe({"m": (5, 9)})
    assert h.broken() == {}, "more failures while it is confirmed: still the last verdict"
    h.confirmed("m", token, Verdict(FAILED, "HTTP 500: Stub process 'm_0_0' is not healthy."))
    assert list(h.broken()) == ["m"] and "own request (its warm-up sample) failed too" in h.broken()["m"]
    assert "not healthy" in h.broken()["m"] and h.due() == [], "broken is sticky: nothing more to confirm"
    h.observe({"m": (6, 9)})
    assert h.broken() == {} and h.suspects == {}, "a success clears it"


def test_a_suspect_that_serves_the_probes_request_is_cleared_and_a_flood_gets_one_request_a_second():
    clock = Clock()
    h = _suspect(clock)
    asked = 0
    fail = 3
    for tick in range(100):  # 10 s of a client sending bad inputs at full rate, checked every 0.1 s
        clock.now = tick / 10
        for model, token in h.due():
            asked += 1
            h.confirmed(model, token, Verdict(SERVED))
        fail += 5
        h.observe({"m": (5 + asked, fail)})  # the probe's own request counts as a success
        assert h.broken() == {}, f"the clients' failures broke the model at {clock.now:.1f}s"
    assert asked == 10, f"{asked} confirmations in 10 s"


def test_no_verdict_keeps_the_suspect_and_asks_again_a_second_later():
    clock = Clock()
    h = _suspect(clock)
    [(_, token)] = h.due()
    h.confirmed("m", token, Verdict(UNKNOWN, "HTTP 503: Exceeds maximum queue size"))
    assert h.broken() == {} and "m" in h.suspects and h.due() == []
    clock.now = 1.0
    [(_, token)] = h.due()
    h.confirmed("m", token, Verdict(FAILED, "HTTP 500: boom"))
    assert list(h.broken()) == ["m"]


def test_a_model_with_nothing_to_confirm_with_keeps_the_old_rule():
    """No warm-up sample, an input_data_file sample the probe cannot read, a decoupled model: failures alone decide."""
    clock = Clock()
    h = _suspect(clock)
    [(_, token)] = h.due()
    h.confirmed("m", token, Verdict(NO_SAMPLE, "no warm-up sample"))
    assert list(h.broken()) == ["m"] and "no warm-up sample" in h.broken()["m"]


def test_a_verdict_about_what_came_before_a_success_or_a_reload_is_dropped():
    clock = Clock()
    h = _suspect(clock)
    [(_, token)] = h.due()
    h.observe({"m": (6, 3)})  # a client's request served meanwhile
    h.confirmed("m", token, Verdict(FAILED, "HTTP 500: boom"))
    assert h.broken() == {}
    h.observe({"m": (6, 6)})
    clock.now = 1.0
    [(_, token)] = h.due()
    h.observe({"m": (0, 0)})  # loaded again (the operator's heal)
    h.confirmed("m", token, Verdict(FAILED, "HTTP 500: boom"))
    assert h.broken() == {} and h.suspects == {}


def test_a_model_threshold_of_its_own_overrides_the_replicas():
    h = Health(("a", "b"), fail_threshold=3, thresholds={"a": 0, "b": 10})
    h.observe({"a": (1, 0), "b": (1, 0)})
    h.observe({"a": (1, 50), "b": (1, 9)})
    assert h.broken() == {}
    h.observe({"a": (1, 50), "b": (1, 10)})
    assert list(h.broken()) == ["b"]


def test_on_a_pool_replica_each_model_is_judged_by_the_threshold_its_config_carries():
    """Issue 39: a pool replica's probe (every-model mode) learns a model's threshold from its loaded config with its
    first confirmation (asked at its first failure), and forgets it when the model is loaded again."""
    clock = Clock()
    h = Health((), every=True, fail_threshold=3, confirm_every=1.0, clock=clock)
    h.observe({"a": (5, 0), "off": (5, 0), "strict": (5, 0)})
    h.observe({"a": (5, 1), "off": (5, 1), "strict": (5, 1)})
    jobs = dict(h.due())
    assert set(jobs) == {"a", "off", "strict"} and h.broken() == {}, "a first failure reads the model's config"
    h.confirmed("a", jobs["a"], Verdict(FAILED, "boom", config=True))  # none in its config: the default, 3
    h.confirmed("off", jobs["off"], Verdict(FAILED, "boom", config=True, threshold=0))
    h.confirmed("strict", jobs["strict"], Verdict(FAILED, "boom", config=True, threshold=1))
    assert list(h.broken()) == ["strict"] and h.suspects == {}, "1 failure is under a's 3; off never counts"
    assert h.thresholds == {"a": 3, "off": 0, "strict": 1}
    h.observe({"a": (5, 3), "off": (5, 500), "strict": (5, 1)})
    assert list(h.suspects) == ["a"] and list(h.broken()) == ["strict"]
    clock.now = 1.0
    [(model, token)] = h.due()
    h.confirmed(model, token, Verdict(FAILED, "boom", config=True))
    assert sorted(h.broken()) == ["a", "strict"]
    h.observe({"a": (0, 0), "off": (0, 0), "strict": (0, 0)})  # loaded again: their configs may say otherwise now
    assert h.broken() == {} and h.thresholds == {}


# -- the probe's own request, built from a model's config (pure) --------------------------------------------------


def _config(**fields: object) -> dict:
    return {"name": "m", "max_batch_size": 8, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]},
                                                          {"name": "S", "data_type": "TYPE_STRING", "dims": [2]}],
            "model_warmup": [{"name": "w", "batch_size": 2, "inputs": {
                "A": {"data_type": "TYPE_FP32", "dims": [4], "random_data": True},
                "S": {"data_type": "TYPE_STRING", "dims": [2], "zero_data": True},
                "CONTROL": {"data_type": "TYPE_INT32", "dims": [1], "zero_data": True}}}], **fields}


def test_the_request_is_the_first_warm_up_sample_as_triton_builds_it():
    request = sample_request(_config())
    assert not isinstance(request, str), request
    header, data = request
    body = json.loads(header)
    assert body["inputs"] == [
        {"name": "A", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
        {"name": "S", "shape": [1, 2], "datatype": "BYTES", "parameters": {"binary_data_size": 8}}], \
        "batch 1, control inputs left out, strings empty"
    assert len(data) == 24 and data[16:] == bytes(8)
    assert body["parameters"] == {"binary_data_output": True}
    header, _ = sample_request(_config(max_batch_size=0))  # type: ignore[misc]
    assert json.loads(header)["inputs"][0]["shape"] == [4], "a model without batching: its dims"


def test_a_sequence_model_sends_a_sequence_of_one_with_an_id_of_the_type_it_takes():
    corrid = {"control_input": [{"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID",
                                                                 "data_type": "TYPE_STRING"}]}]}
    header, _ = sample_request(_config(sequence_batching=corrid))  # type: ignore[misc]
    params = json.loads(header)["parameters"]
    assert params["sequence_start"] is True and params["sequence_end"] is True
    assert isinstance(params["sequence_id"], str)
    header, _ = sample_request(_config(sequence_batching={}))  # type: ignore[misc]
    assert isinstance(json.loads(header)["parameters"]["sequence_id"], int)


def test_nothing_to_send_says_why():
    assert sample_request(_config(model_warmup=[])) == "no warm-up sample"
    assert "decoupled" in str(sample_request(_config(model_transaction_policy={"decoupled": True})))
    file_only = [{"name": "w", "batch_size": 1, "inputs": {"A": {"data_type": "TYPE_FP32", "dims": [4],
                                                                  "input_data_file": "a.bin"}}}]
    assert "input_data_file" in str(sample_request(_config(model_warmup=file_only)))
    second = [*file_only, _config()["model_warmup"][0]]
    assert not isinstance(sample_request(_config(model_warmup=second)), str), "the first usable sample"


# -- against a real tritonserver ---------------------------------------------------------------------------

HOLD = 4


@pytest.fixture(scope="module")
def sentiment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    models = load_models(Path(__file__).resolve().parents[1] / "examples" / "sentiment-ensemble.yaml")
    with serve(models, tmp_path_factory.mktemp("health") / "repo") as served:
        yield served


@pytest.fixture
def probe(sentiment: Served) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "operator"), REPOSITORY_KEY_ENV: KEY}
    proc = subprocess.Popen(
        [sys.executable, "-m", "triton_operator.cli.main", "probe", "--listen", f"127.0.0.1:{port}",
         "--target", sentiment.server.http_url, "--hold", str(HOLD), "--head-start", "0.1",
         "--model", "sentiment", "--model", "tokenizer", "--model", "classifier",
         "--repository", str(sentiment.server.model_repository)],
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + scaled(20)
        while True:
            try:
                if get(port, "/status", key=KEY)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the probe did not start"
            time.sleep(0.05)
        yield proc, port
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()


def infer(served: Served) -> bool:
    try:
        served.client.infer("sentiment", [tensor("TEXT", np.array([[b"a good film"]], dtype=object))])
        return True
    except Exception:  # noqa: BLE001 - a failed request is what is counted
        return False


def stubs_of(served: Served, model: str) -> list[int]:
    """The Python backend stubs tritonserver started for `model`: its child processes whose command names the model's
    file (found by parent process, not by name alone)."""
    assert served.server.process is not None
    parent = served.server.process.pid
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and f"/{model}/".encode() in b" ".join(cmd[1:2]):
            out.append(int(pid))
    return out


def status(port: int) -> dict:
    return json.loads(get(port, "/status", key=KEY)[1])


def repository(served: Served, action: str, model: str, body: dict | None = None) -> None:
    req = urllib.request.Request(f"http://{served.server.http_url}/v2/repository/models/{model}/{action}",
                                 data=json.dumps(body or {}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - http:// to the test's own server
        assert resp.status == 200


def held(port: int) -> tuple[threading.Thread, list[tuple[int, str, float]]]:
    out: list[tuple[int, str, float]] = []
    t = threading.Thread(target=lambda: out.append(get(port)))
    t.start()
    return t, out


def wait_passing(port: int) -> None:
    deadline = time.monotonic() + scaled(30)
    while get(port)[0] != 200:
        assert time.monotonic() < deadline, f"the probe never passed: {status(port)}"


@pytest.mark.triton
def test_a_killed_stub_fails_the_held_probe_and_a_reload_of_the_step_brings_it_back(sentiment, probe):
    _, port = probe
    assert all(infer(sentiment) for _ in range(3))
    wait_passing(port)
    thread, out = held(port)
    time.sleep(0.3)
    assert not out, "a passing probe is held"
    stubs = stubs_of(sentiment, "tokenizer")
    assert stubs, "no stub process of tokenizer"
    for pid in stubs:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    failed = 0
    while thread.is_alive() and time.monotonic() - killed < HOLD:
        failed += not infer(sentiment)
        time.sleep(0.02)
    thread.join()
    [(code, body, answered)] = out
    assert code == 503, (code, body)
    print(f"stub SIGKILL -> held probe failed in {answered - killed:.2f}s after {failed} failed requests")
    broken = status(port)["broken"]
    assert "tokenizer" in broken and "classifier" not in broken, broken
    assert "Python stub of model tokenizer" in body, "the stub, not the failed requests, told first"
    assert get(port)[0] == 503, "a broken replica fails every probe"
    # Triton still calls it READY: the probe is what sees it.
    assert urllib.request.urlopen(f"http://{sentiment.server.http_url}/v2/models/tokenizer/ready").status == 200
    # The operator's heal: an unload, and at once a load with the desired config (no wait for the unload: a dead
    # stub's copy stays UNLOADING).
    config = config_json((sentiment.server.model_repository / "tokenizer" / "config.pbtxt").read_text())
    repository(sentiment, "unload", "tokenizer")
    repository(sentiment, "load", "tokenizer", {"parameters": {"config": config}})
    assert stubs_of(sentiment, "tokenizer"), "no new stub"
    wait_passing(port)
    assert infer(sentiment)
    assert status(port)["broken"] == {}


@pytest.mark.triton
def test_an_unloaded_model_fails_the_held_probe_at_once(sentiment, probe):
    _, port = probe
    wait_passing(port)
    thread, out = held(port)
    time.sleep(0.3)
    unloading = time.monotonic()
    repository(sentiment, "unload", "classifier")
    thread.join()
    [(code, body, answered)] = out
    assert code == 503 and "classifier is not loaded" in body, body
    print(f"unload -> held probe failed in {answered - unloading:.2f}s")
    repository(sentiment, "load", "classifier")
    wait_passing(port)


@pytest.mark.triton
def test_a_stopped_tritonserver_fails_the_probe_and_passes_again_when_continued(sentiment, probe):
    _, port = probe
    wait_passing(port)
    assert sentiment.server.process is not None
    pid = sentiment.server.process.pid
    thread, out = held(port)
    time.sleep(0.3)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        thread.join(HOLD + 2)
    finally:
        os.kill(pid, signal.SIGCONT)
    [(code, body, answered)] = out
    assert code == 503 and "did not answer" in body, body
    print(f"SIGSTOP -> held probe failed in {answered - stopped:.2f}s")
    wait_passing(port)
    assert infer(sentiment)
