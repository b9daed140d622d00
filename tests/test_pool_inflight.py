"""A load in flight when the operator stops (issue 29), against a REAL tritonserver (2.51 from the nvidia-pytriton
wheel) started as a pool replica is: the load a stopped operator sent goes on in Triton, and the restarted one must
wait for it rather than send it again, yet still load the model when that load fails.

What Triton says meanwhile (pinned here): a model loaded from a request is never in the repository index, loading
or not; its config question answers "has no available versions" once the load has reached Triton (loading, and
after a failed load too) and "is not found" before. The restarted operator's decision is run on those answers, asked
of the server over HTTP as the operator asks them (`triton.pool.served`, `heard_of`), then decided by
`plan.pool.awaited` and `plan.pool.work`: nothing is sent while the load runs; a load that failed is sent again once
the bound has passed; a load recorded but never sent is sent at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.documents import pool_document
from tests.timing import scaled
from triton_operator.api.pod import REPOSITORY_KEY_ENV, TRITON_CONTAINER
from triton_operator.api.pool import TritonPool
from triton_operator.plan import pool as pp
from triton_operator.plan.placement import PoolReplica
from triton_operator.render.pool import render_pool_deployment
from triton_operator.triton import pool as triton_pool
from triton_operator.triton.local import LocalTritonServer
from triton_operator.triton.rest import TritonClient, TritonError

pytestmark = pytest.mark.triton

KEY = "pool-inflight-key"
REPLICA = "p-pool-0"

SLOW = """
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata: {name: NAME, namespace: ns, uid: uid-NAME, generation: 1}
spec:
  pool: p
  memory: 64Mi
  replicas: 1
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
                FAIL

            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())]) for r in requests]
"""


def _body(name: str, fails: bool = False) -> dict[str, Any]:
    text = SLOW.replace("NAME", name).replace("FAIL", "raise RuntimeError('initialize failed')" if fails else "pass")
    body: dict[str, Any] = yaml.safe_load(text)
    return body


def _pool_args() -> list[str]:
    """The pool replica's own tritonserver args, but what the local server sets itself, with the key filled in."""
    pool = TritonPool.model_validate(pool_document())
    triton = next(c for c in render_pool_deployment(pool, "uid", "ns")["spec"]["template"]["spec"]["containers"]
                  if c["name"] == TRITON_CONTAINER)
    own = ("--model-repository=", "--http-port=", "--grpc-port=", "--metrics-port=")
    return [a.replace(f"$({REPOSITORY_KEY_ENV})", KEY) for a in triton["args"] if not a.startswith(own)]


class Replica:
    """A tritonserver as a pool replica, and the operator's questions to it, from a loop of the test's own."""

    def __init__(self, tmp: Path) -> None:
        (tmp / "models").mkdir()
        self.server = LocalTritonServer(model_repository=tmp / "models", extra_args=_pool_args(),
                                        log_path=tmp / "triton.log")
        self.server.start(scaled(120))
        self.address = self.server.http_url
        self.loop = asyncio.new_event_loop()
        assert _wait(self.up), f"tritonserver's HTTP port never answered ready:\n{self.server.log_tail()}"

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/v2/health/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def send(self, member: pp.Member) -> tuple[threading.Thread, list[str | None]]:
        """The stopped operator's load: sent from a thread of its own, and left to run."""
        assert member.request is not None
        answer: list[str | None] = []

        def load() -> None:
            answer.append(asyncio.run(triton_pool.load(self.server.grpc_url, member.request.name, member.request.config,
                                                       member.request.files, KEY)))
        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        return thread, answer

    def seen(self, member: pp.Member) -> pp.Seen:
        s = self.run(triton_pool.served(self.address, member.triton_name, member.digest or "", None, KEY))
        return pp.Seen(s.ready, s.digest, s.message, answered=not s.unanswered)

    def index(self) -> list[Any]:
        async def ask() -> list[Any]:
            async with TritonClient(self.address, KEY) as client:
                return list((await client.repository_index(timeout=5)).models)
        return self.run(ask())

    def received(self, name: str) -> bool:
        """Whether Triton has the load: its config question no longer says the model is not found."""
        return bool(self.run(triton_pool.heard_of(self.address, name)))

    def close(self) -> None:
        self.loop.close()
        self.server.stop()


@pytest.fixture
def replica(tmp_path: Path) -> Any:
    r = Replica(tmp_path)
    try:
        yield r
    finally:
        r.close()


def _wait(probe: Any, timeout: float = 20.0) -> bool:
    """Polls `probe` (a condition of Triton's, not a time) until true or `timeout` seconds (scaled)."""
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.05)
    return False


def _decide(replica: Replica, members: dict[str, pp.Member], placement: Any, loading: dict[str, pp.InFlight],
            now: dt.datetime) -> tuple[dict[tuple[str, str], pp.InFlight], list[str]]:
    """The restarted operator's first round on this replica: what it waits for, and what it sends."""
    seen = {(REPLICA, n): replica.seen(m) for n, m in members.items()}
    heard = {(REPLICA, n): replica.run(triton_pool.heard_of(replica.address, m.triton_name))
             for n, m in members.items()}
    waiting = pp.awaited(placement, members, {REPLICA: loading}, seen, heard, now)
    work = pp.work(placement, members, [REPLICA], {}, seen, {}, waiting)
    return waiting, [ld.member for ld in work[REPLICA].load]


def _world(*bodies: dict[str, Any]) -> tuple[dict[str, pp.Member], Any]:
    members = pp.members("p", {b["metadata"]["name"]: b for b in bodies})
    pool = TritonPool.model_validate(pool_document("p", replicas=1))
    return members, pp.placement_of(pool, [PoolReplica(REPLICA, "n1")], members)


def test_a_load_in_flight_is_waited_for_not_sent_again(replica: Replica) -> None:
    members, placement = _world(_body("slow"))
    slow = members["slow"]
    assert slow.digest is not None
    thread, answer = replica.send(slow)
    sent = pp.InFlight(slow.digest, dt.datetime.now(dt.UTC))
    try:
        assert _wait(lambda: replica.received("slow")), f"Triton never had the load: {answer}"
        assert not replica.seen(slow).ready, "READY before its 4 s initialize was over"
        assert replica.index() == [], "a model loaded from a request is in the repository index"
        waiting, sends = _decide(replica, members, placement, {"slow": sent}, dt.datetime.now(dt.UTC))
        assert waiting == {(REPLICA, "slow"): sent} and sends == [], (waiting, sends)
        # Without the record, the restarted operator would send it again (the defect).
        assert _decide(replica, members, placement, {}, dt.datetime.now(dt.UTC))[1] == ["slow"]
    finally:
        thread.join(60)
    assert answer == [None], answer
    waiting, sends = _decide(replica, members, placement, {"slow": sent}, dt.datetime.now(dt.UTC))
    assert waiting == {} and sends == [], "READY at the desired digest: nothing left to wait for or send"
    assert replica.server.log_path is not None
    log = replica.server.log_path.read_text()
    assert log.count("loading: slow:1") == 1, f"Triton got more than one load of slow:\n{log[-3000:]}"


def test_a_load_in_flight_that_fails_is_sent_again_once_the_bound_has_passed(replica: Replica) -> None:
    members, placement = _world(_body("bad", fails=True))
    bad = members["bad"]
    assert bad.digest is not None
    thread, answer = replica.send(bad)
    sent = pp.InFlight(bad.digest, dt.datetime.now(dt.UTC))
    assert _wait(lambda: replica.received("bad")), "Triton never had the load"
    assert _decide(replica, members, placement, {"bad": sent}, dt.datetime.now(dt.UTC))[1] == [], "sent while loading"
    thread.join(60)
    assert answer and answer[0] and "initialize failed" in answer[0], answer
    # Triton answers as it did while the load ran: the restarted operator cannot tell, and waits out the bound.
    assert replica.received("bad") and not replica.seen(bad).ready
    assert _decide(replica, members, placement, {"bad": sent}, dt.datetime.now(dt.UTC))[1] == []
    later = sent.since + dt.timedelta(seconds=pp.IN_FLIGHT_SECONDS)
    assert _decide(replica, members, placement, {"bad": sent}, later)[1] == ["bad"], "a failed load never retried"


def test_a_load_recorded_but_never_sent_is_sent_at_once(replica: Replica) -> None:
    members, placement = _world(_body("slow"))
    slow = members["slow"]
    assert slow.digest is not None
    recorded = {"slow": pp.InFlight(slow.digest, dt.datetime.now(dt.UTC))}
    assert not replica.received("slow"), "Triton says it had a load no one sent"
    waiting, sends = _decide(replica, members, placement, recorded, dt.datetime.now(dt.UTC))
    assert waiting == {} and sends == ["slow"]


def test_triton_says_the_same_of_a_model_it_never_heard_of_and_one_it_did(replica: Replica) -> None:
    """The words `heard_of` reads, pinned: a question about a model never loaded, and the 404's text."""
    async def ask() -> TritonError:
        async with TritonClient(replica.address) as client:
            with pytest.raises(TritonError) as info:
                await client.model_config("nothing-here", timeout=5)
            return info.value
    error = replica.run(ask())
    assert error.status == 404 and triton_pool.NOT_FOUND in error.message(), error.message()
