"""Self-healing on a pool (issue 29 with issue 33): a model whose Python stub died stays READY in Triton's eyes, so a
pool replica's probe (`--every-model`) watches every model the replica serves and says which is broken on
`GET /status` (held until news with `?since=N&wait=S`), without failing the pod's readiness (the other models on the
replica serve on); the operator takes that copy alone out of that model's slices, unloads and loads it again there,
and lists it again once READY.

The decisions are pure (`plan.pool.to_heal`, `work`, `serving`, `failing_copies`, the model's status; `Health` in
every-model mode); the probe runs for real against a REAL tritonserver (2.51) loaded as a pool replica is (models
from load requests: their stubs run from a directory Triton made, `/tmp/folderXXXXXX/1/model.py`, and are known by
their instance name). The whole path on the real node: e2e/test_pool_heal.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.documents import pool_document, python_model
from tests.probing import KEY
from tests.timing import scaled
from triton_operator.agent.probe import Health
from triton_operator.api.pod import KEY_HEADER, REPOSITORY_KEY_ENV
from triton_operator.api.pool import TritonPool
from triton_operator.plan import pool as pp
from triton_operator.plan.placement import PoolReplica
from triton_operator.render.pool import ReplicaPod
from triton_operator.triton import pool as triton_pool
from triton_operator.triton.local import LocalTritonServer, free_port

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)


# -- the probe's health, every model (pure) --------------------------------------------------------------------


def test_every_model_mode_watches_what_triton_serves_and_knows_a_stub_by_its_instance_name() -> None:
    h = Health((), every=True)
    counts = {"a": (1, 0), "a_b": (1, 0)}
    h.observe(counts, dead={}, live={41: "a_b_0_0", 42: "a_0_0"})
    assert h.models == ("a", "a_b") and h.broken() == {}, "a model the operator has not loaded yet is not missing"
    h.observe(counts, dead={41: "a_b_0_0"}, live={42: "a_0_0"})
    h.observe(counts, dead={41: "a_b_0_0"}, live={42: "a_0_0"})
    assert list(h.broken()) == ["a_b"], "the longest model name the instance starts with: a_b, not a"
    # unloaded by the operator (the heal): no statistics, not broken; loaded again, a new stub: forgiven
    h.observe({"a": (1, 0)}, dead={41: "a_b_0_0"}, live={42: "a_0_0"})
    assert h.broken() == {}
    h.observe(counts, dead={41: "a_b_0_0"}, live={42: "a_0_0", 43: "a_b_0_0"})
    assert h.broken() == {}


def test_every_model_mode_takes_no_old_stub_exiting_after_a_swap_for_a_break_but_still_a_killed_one() -> None:
    """A Swap (the operator's in-place update) starts the model's new stubs before its old ones exit: seen in CI, the
    old stub's exit was reported as a dead stub, and the copy was healed (out of its slices) for nothing."""
    h = Health((), every=True)
    counts = {"a": (1, 0), "b": (1, 0)}
    h.observe(counts, dead={}, live={41: "a_0_0", 42: "a_0_1", 50: "b_0_0"})
    h.observe(counts, dead={}, live={41: "a_0_0", 42: "a_0_1", 50: "b_0_0", 61: "a_0_0", 62: "a_0_1"})  # a's new
    for _ in range(2):  # a's old stubs exit, on two checks
        h.observe(counts, dead={41: "a_0_0", 42: "a_0_1"}, live={50: "b_0_0", 61: "a_0_0", 62: "a_0_1"})
    assert h.broken() == {}, "replaced, not broken"
    for _ in range(2):  # one of a's stubs killed, with no load since it started
        h.observe(counts, dead={61: "a_0_0"}, live={50: "b_0_0", 62: "a_0_1"})
    assert list(h.broken()) == ["a"], "a killed stub is still a break"


def test_every_model_mode_breaks_a_model_failing_its_requests_and_says_which() -> None:
    h = Health((), every=True, fail_threshold=3)
    h.observe({"a": (5, 0), "b": (5, 0)})
    h.observe({"a": (5, 3), "b": (6, 0)})
    assert list(h.broken()) == ["a"]


def test_a_long_poll_of_the_status_waits_for_news() -> None:
    h = Health((), every=True)
    started = time.monotonic()
    h.wait_news(h.version, 0.2)
    assert time.monotonic() - started >= 0.2, "no news: held for the wait"
    threading.Timer(0.05, h.changed).start()
    h.wait_news(h.version, 10)
    assert h.version == 1


# -- the operator's decisions (pure) ---------------------------------------------------------------------------


def _body(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "metadata": {**doc["metadata"], "namespace": "ns", "uid": f"uid-{doc['metadata']['name']}",
                                "generation": 1}}


def _ensemble(name: str, *steps: str) -> dict[str, Any]:
    chain = [{"model": s, "inputMap": {"INPUT": "IN"}, "outputMap": {"OUTPUT": f"OUT{i}"}} for i, s in enumerate(steps)]
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": name},
            "spec": {"platform": "ensemble", "pool": "p", "maxBatchSize": 4, "replicas": 1,
                     "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
                     "outputs": [{"name": f"OUT{i}", "dataType": "FP32", "dims": [4]} for i in range(len(steps))],
                     "ensemble": {"steps": chain}}}


def _world() -> tuple[dict[str, pp.Member], Any, dict[str, ReplicaPod]]:
    """a and b (1 copy each) and ensemble e over step s, all on one replica r1 of pool p."""
    bodies = {n: _body(python_model(n, pool="p", memory="64Mi", replicas=1 if n != "s" else 0)) for n in ("a", "b", "s")}
    bodies["e"] = _body(_ensemble("e", "s"))
    members = pp.members("p", bodies)
    pool = TritonPool.model_validate(pool_document("p", replicas=1))
    placement = pp.placement_of(pool, [PoolReplica("r1", "n1")], members)
    return members, placement, {"r1": ReplicaPod("r1", "u", "198.18.0.9", "n1", True, False)}


def _serving_all(members: dict[str, pp.Member]) -> dict[tuple[str, str], pp.Seen]:
    return {("r1", n): pp.Seen(True, m.digest) for n, m in members.items()}


def test_a_broken_copy_leaves_its_models_slices_alone_and_is_reloaded_there() -> None:
    members, placement, pods = _world()
    seen = _serving_all(members)
    records = {"r1": {n: m.digest or "" for n, m in members.items()}}
    broken = {("r1", "a"): "the Python stub of model a (pid 41) has exited; every request to it fails"}
    serving = pp.serving(placement, members, pods, records, seen, frozenset(), broken)
    assert serving["a"] == set() and serving["b"] == {"r1"} and serving["e"] == {"r1"}, serving
    assert pp.serving(placement, members, pods, records, seen)["a"] == {"r1"}, \
        "without the probe's word, Triton's READY lists the broken copy (the defect)"
    healing = pp.to_heal(placement, members, broken)
    assert healing == {("r1", "a")}
    work = pp.work(placement, members, ["r1"], records, seen, {}, healing=healing)
    assert [(ld.member, ld.heal) for ld in work["r1"].load] == [("a", True)], "READY at its digest, reloaded anyway"
    assert pp.to_heal(placement, members, broken, held={("r1", "a")}) == set(), "a heal's back-off"


def test_an_ensemble_whose_step_broke_is_out_and_only_the_step_is_reloaded() -> None:
    members, placement, pods = _world()
    seen = _serving_all(members)
    records = {"r1": {n: m.digest or "" for n, m in members.items()}}
    broken = {("r1", "s"): "stub dead", ("r1", "e"): "model e failed 3 requests in a row"}
    serving = pp.serving(placement, members, pods, records, seen, frozenset(), broken)
    assert serving["e"] == set() and serving["a"] == {"r1"}
    assert pp.to_heal(placement, members, broken) == {("r1", "s")}
    assert pp.failing_copies(placement, members, "e", {("r1", "s"): "stub dead"}) == {"r1": "stub dead"}
    assert pp.failing_copies(placement, members, "a", {("r1", "s"): "stub dead"}) == {}


def test_the_step_graph_is_built_once_per_round_and_answers_as_a_graph_built_per_question(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: the graph was built again by each of serving, to_heal, work (order) and failing_copies (once per
    member: O(members²) per publish). Built once by `graph_of`, each answers the same and builds nothing."""
    members, placement, pods = _world()
    seen = _serving_all(members)
    records = {"r1": {n: m.digest or "" for n, m in members.items()}}
    broken = {("r1", "s"): "stub dead", ("r1", "b"): "stub dead"}
    graph = pp.graph_of(members)
    assert graph.found("e") == ("e", "s") and graph.found("a") == ("a",)

    def ask(g: pp.StepGraph | None) -> tuple[Any, ...]:
        healing = pp.to_heal(placement, members, broken, graph=g)
        work = pp.work(placement, members, ["r1"], {"r1": {}}, {}, {}, healing=healing, graph=g)
        return (pp.serving(placement, members, pods, records, seen, frozenset(), broken, g), healing,
                {n: pp.failing_copies(placement, members, n, broken, g) for n in members},
                [ld.member for ld in work["r1"].load], pp.order(["e", "s", "a"], members, g))

    built_per_question = ask(None)
    assert built_per_question[3].index("s") < built_per_question[3].index("e"), "a step loads before its ensemble"

    def built_again(*_: Any, **__: Any) -> Any:
        raise AssertionError("the step graph was built again")

    monkeypatch.setattr(pp.step_graph, "of_models", built_again)
    assert ask(graph) == built_per_question


def test_a_failing_copy_is_reported_degraded_model_failing_while_it_heals() -> None:
    members, placement, _ = _world()
    status = pp.model_status(members["a"], "p", True, placement, set(), {}, NOW, set(),
                             failing={"r1": "the Python stub of model a (pid 41) has exited"})
    conds = {c.type: c for c in status.conditions}
    assert (conds["Degraded"].status, conds["Degraded"].reason) == ("True", pp.MODEL_FAILING)
    assert "r1: the Python stub of model a (pid 41) has exited; healing" in conds["Degraded"].message
    assert (conds["Ready"].status, conds["Progressing"].reason) == ("False", "Healing")


# -- the probe against a real tritonserver, models loaded as on a pool -----------------------------------------


ADD = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())]) for r in requests]
'''


def _get(port: int, path: str, timeout: float = 10) -> tuple[int, dict[str, Any] | str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={KEY_HEADER: KEY})  # the pool's key, which the probe's /status needs
        resp = conn.getresponse()
        body = resp.read().decode()
        return resp.status, json.loads(body) if body.startswith("{") else body
    finally:
        conn.close()


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[tuple[LocalTritonServer, int]]:
    """A tritonserver as a pool replica (explicit, empty repository) with two models loaded from requests, and a
    probe in every-model mode beside it."""
    (tmp_path / "models").mkdir()
    server = LocalTritonServer(model_repository=tmp_path / "models", model_control_mode="explicit",
                               log_path=tmp_path / "triton.log", extra_args=["--strict-readiness=false"])
    server.start(scaled(120))
    proc = None
    try:
        deadline = time.monotonic() + scaled(60)
        while not _up(server.http_url):  # it opens HTTP last (gRPC first)
            assert time.monotonic() < deadline, f"tritonserver's HTTP port never answered:\n{server.log_tail()}"
            time.sleep(0.05)
        bodies = {n: _body(python_model(n, pool="p", memory="64Mi", source={"inline": {"model.py": ADD}}))
                  for n in ("one", "two")}
        members = pp.members("p", bodies)
        for m in members.values():
            assert m.request is not None
            why = asyncio.run(triton_pool.load(server.grpc_url, m.request.name, m.request.config, m.request.files,
                                               None))
            assert why is None, why
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "operator"), REPOSITORY_KEY_ENV: KEY}
        proc = subprocess.Popen(
            [sys.executable, "-m", "triton_operator.cli.main", "probe", "--listen", f"127.0.0.1:{port}",
             "--target", server.http_url, "--hold", "4", "--head-start", "0.1", "--every-model"],
            stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + scaled(20)
        while True:
            try:
                if _get(port, "/status")[0] == 200:
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
            if proc.stderr:
                proc.stderr.close()
        server.stop()


def _up(address: str) -> bool:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=2)
    try:
        conn.request("GET", "/v2/health/ready")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _stubs(server: LocalTritonServer, instance: str) -> list[int]:
    """tritonserver's child processes running the Python stub of `instance` (its 8th argument)."""
    assert server.process is not None
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if ppid == server.process.pid and len(argv) > 8 and argv[8] == instance.encode():
            out.append(int(pid))
    return out


@pytest.mark.triton
def test_a_killed_stub_of_a_request_loaded_model_is_reported_for_that_model_alone_and_readiness_holds(
        replica: tuple[LocalTritonServer, int]) -> None:
    server, port = replica
    deadline = time.monotonic() + scaled(20)
    while not (status := _get(port, "/status")[1]) or not isinstance(status, dict) or not status["checks"]:
        assert time.monotonic() < deadline, f"the probe never checked: {status}"  # its first check
        time.sleep(0.05)
    assert isinstance(status, dict) and status["broken"] == {} and sorted(status["models"]) == ["one", "two"], status
    (stub,) = _stubs(server, "one_0_0")
    assert b"/tmp/" in Path(f"/proc/{stub}/cmdline").read_bytes(), "a request-loaded model runs from Triton's own dir"
    answer: list[Any] = []
    poll = threading.Thread(target=lambda: answer.append(_get(port, f"/status?since={status['version']}&wait=4")))
    poll.start()
    os.kill(stub, signal.SIGKILL)
    poll.join(10)
    assert answer and isinstance(answer[0][1], dict), answer
    news = answer[0][1]
    assert list(news["broken"]) == ["one"] and "has exited" in news["broken"]["one"], news
    assert news["version"] > status["version"]
    assert _get(port, "/ready")[0] == 200, "the pod's readiness took every model on the replica out"
