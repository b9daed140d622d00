"""`triton-operator probe`, the readiness endpoint beside tritonserver, run as its own process (as in a pod) against a
port this test opens and closes in tritonserver's place."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.probing import KEY, get
from tests.timing import scaled, wait_until
from triton_operator.agent.probe import Readiness, address
from triton_operator.agent.probe_server import MAX_CONNECTIONS, MAX_HELD, REQUEST_SECONDS
from triton_operator.api.pod import REPOSITORY_KEY_ENV
from triton_operator.triton.local import free_port
from triton_operator.triton.probe import notify_gate, probe_news, probe_status

HEAD_START = 0.6
SETTLE = 0.05


class Target:
    """tritonserver's HTTP port, as a listening socket the test opens and closes."""

    def __init__(self) -> None:
        self.port = free_port()
        self.sock: socket.socket | None = None
        self.opened_at = 0.0

    def open(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.opened_at = time.monotonic()
        self.sock = s

    def close(self) -> None:
        assert self.sock is not None
        self.sock.close()
        self.sock = None


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target()
    yield t
    if t.sock is not None:
        t.close()


def _start_probe(target: Target, *args: str, key: str | None = KEY) -> tuple[subprocess.Popen[str], int]:
    """`triton-operator probe` against `target` with `args` and the replica key `key`, once it listens on its port."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "operator")}
    env.pop(REPOSITORY_KEY_ENV, None)
    if key is not None:
        env[REPOSITORY_KEY_ENV] = key
    proc = subprocess.Popen(
        [sys.executable, "-m", "triton_operator.cli.main", "probe", "--listen", f"127.0.0.1:{port}",
         "--target", f"127.0.0.1:{target.port}", *args],
        stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + scaled(20)
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the probe server did not listen on {port}: {proc.communicate()[1]}")
            time.sleep(0.02)


@pytest.fixture
def probe(target: Target) -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc, port = _start_probe(target, "--hold", "2", "--head-start", str(HEAD_START), "--gate-settle", str(SETTLE))
    yield proc, port
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stderr and not proc.stderr.closed:
        proc.stderr.close()


def test_a_probe_is_held_until_tritonserver_is_up_then_passes_after_the_head_start(probe, target):
    _, port = probe
    # Nothing listens: the probe is held for --hold, then fails.
    started = time.monotonic()
    status, body, answered = get(port)
    assert (status, body.strip()) == (503, "tritonserver's HTTP port refuses connections")
    assert answered - started >= 2.0, "a probe while tritonserver is down must be held for --hold"

    # The port opens while a probe is held: that probe passes, once the port has been open for the head start.
    threading.Timer(0.5, target.open).start()
    status, body, answered = get(port)
    assert (status, body.strip()) == (200, "tritonserver is up")
    assert target.opened_at > 0
    assert answered >= target.opened_at + HEAD_START, "the probe passed before the gate's head start"

    # Up: every probe passes at once.
    for _ in range(3):
        assert get(port)[0] == 200


def notify(port: int, key: str | None = KEY) -> tuple[int, float]:
    """The operator's notice (the client the gate uses): its status and when it was sent (monotonic)."""
    sent = time.monotonic()
    return asyncio.run(notify_gate("127.0.0.1", port, key)), sent


def held_probe(port: int) -> tuple[threading.Thread, list[tuple[int, str, float]]]:
    """A probe in the background, as the kubelet's held one."""
    out: list[tuple[int, str, float]] = []
    thread = threading.Thread(target=lambda: out.append(get(port)))
    thread.start()
    return thread, out


def test_the_operators_gate_notice_passes_a_held_probe_after_the_settle_time(probe, target):
    proc, port = probe
    target.open()
    thread, out = held_probe(port)
    time.sleep(0.1)  # the probe is held: the port has not been open for the head start yet
    assert not out
    status, sent = notify(port)
    assert status == 200
    thread.join(5)
    [(code, body, answered)] = out
    assert (code, body.strip()) == (200, "tritonserver is up")
    assert answered >= sent + SETTLE, "the probe passed before the kubelet had time to sync the gate"
    assert answered < target.opened_at + HEAD_START, "the notice did not cut the head start short"
    target.close()
    proc.terminate()
    assert "probe: the operator set the readiness gate; passing in 0.05 s" in proc.communicate(timeout=5)[1]


def test_a_gate_notice_counts_only_for_the_tritonserver_that_was_up_when_it_came(probe, target):
    _, port = probe
    # Sent while tritonserver's port is closed: refused, and a later start waits the whole head start.
    assert notify(port)[0] == 409
    threading.Timer(0.2, target.open).start()
    status, _, answered = get(port)
    assert status == 200 and answered >= target.opened_at + HEAD_START
    # A notice for this tritonserver, then it exits and restarts: the new one waits for a notice or the head start.
    assert notify(port)[0] == 200
    target.close()
    assert get(port)[0] == 503
    threading.Timer(0.2, target.open).start()
    status, _, answered = get(port)
    assert status == 200 and answered >= target.opened_at + HEAD_START, "an old notice let a restarted one pass"


def test_a_closed_port_after_a_success_fails_at_once_then_probes_are_held_again(probe, target):
    _, port = probe
    target.open()
    assert get(port)[0] == 200
    target.close()
    asked = time.monotonic()
    status, body, answered = get(port)
    assert (status, body.strip()) == (503, "tritonserver's HTTP port refuses connections")
    assert answered - asked < 1.0, "a port that closed after a success must fail the next probe at once"
    # tritonserver restarting: held again, and passes when it is back.
    threading.Timer(0.3, target.open).start()
    assert get(port)[0] == 200


def test_other_paths_are_not_found(probe):
    _, port = probe
    assert get(port, "/metrics")[0] == 404
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/ready")
        assert conn.getresponse().status == 404
    finally:
        conn.close()


def test_on_sigterm_it_answers_until_tritonserver_has_gone_then_exits(probe, target):
    proc, port = probe
    target.open()
    assert get(port)[0] == 200
    proc.send_signal(signal.SIGTERM)
    # tritonserver is still in its preStop sleep or draining: the probe stays up and keeps passing.
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    assert get(port)[0] == 200
    target.close()
    assert proc.wait(timeout=5) == 0
    assert "tritonserver's HTTP port is closed; exiting" in proc.communicate()[1]


def test_sigterm_with_tritonserver_down_exits_at_once(probe):
    proc, _ = probe
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0


def test_readiness_counts_the_head_start_from_when_the_port_was_first_seen_open():
    now = [0.0]
    state = {"open": False}
    r = Readiness(check=lambda: state["open"], hold=5.0, head_start=0.1, interval=0.005,
                  clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    state["open"] = True
    assert r.answer() == (True, "tritonserver is up")
    assert now[0] == pytest.approx(0.1)
    # Seen open long ago: at once.
    now[0] = 10.0
    assert r.answer() == (True, "tritonserver is up")
    assert now[0] == 10.0


def test_readiness_passes_settle_after_the_gate_notice_when_that_comes_before_the_head_start():
    now = [0.0]
    state = {"open": True}
    r = Readiness(check=lambda: state["open"], hold=5.0, head_start=0.5, settle=0.03, interval=0.005,
                  clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert r._observe()
    now[0] = 0.1
    assert r.gate_set()
    assert r.answer() == (True, "tritonserver is up")
    assert now[0] == pytest.approx(0.13)
    # A closed port forgets the notice; reopened, the head start counts again.
    state["open"] = False
    assert not r.gate_set()
    assert r.answer() == (False, "tritonserver's HTTP port refuses connections")
    state["open"] = True
    start = now[0]
    assert r.answer() == (True, "tritonserver is up")
    assert now[0] == pytest.approx(start + 0.5)


def test_another_clients_probes_neither_hold_back_the_kubelets_pass_nor_take_the_news_of_a_break():
    """Issue 39: the verdict a probe follows is the one its own client was last given. With one shared verdict, an
    outsider told "ready" first made the kubelet's next probe wait out the hold, and an outsider told of a break
    first left the kubelet's probe held."""
    now = [0.0]
    state: dict[str, object] = {"open": False, "why": None}
    r = Readiness(check=lambda: bool(state["open"]), hold=5.0, head_start=0.0, interval=0.005,
                  clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                  broken=lambda: state["why"])  # type: ignore[arg-type,return-value]
    assert r.answer(client="node") == (False, "tritonserver's HTTP port refuses connections")
    state["open"] = True
    assert r.answer(client="pod") == (True, "tritonserver is up")
    asked = now[0]
    assert r.answer(client="node") == (True, "tritonserver is up")
    assert now[0] == asked, "the kubelet's pass waited for the outsider's hold"
    state["why"] = "model m is broken"
    assert r.answer(client="pod") == (False, "model m is broken")
    asked = now[0]
    assert r.answer(client="node") == (False, "model m is broken")
    assert now[0] == asked, "the outsider took the news of the break"
    # A probe that follows a pass is held while passing; one cut short (the server needs its place) is answered at
    # once, with the verdict it would get at the end of its hold.
    state["why"] = None
    assert r.answer(client="node") == (True, "tritonserver is up")
    asked = now[0]
    cut = threading.Event()
    cut.set()
    assert r.answer(cut, client="node") == (True, "tritonserver is up") and now[0] == asked
    assert r.now("node") == (True, "tritonserver is up")
    state["open"] = False
    assert r.answer(client="node")[0] is False
    assert r.now("node") == (False, "tritonserver's HTTP port refuses connections")


@pytest.mark.parametrize(("text", "expected"), [(":8090", ("127.0.0.2", 8090)), ("8090", ("127.0.0.2", 8090)),
                                                ("127.0.0.1:8000", ("127.0.0.1", 8000))])
def test_address(text, expected):
    assert address(text, "127.0.0.2") == expected


@pytest.mark.parametrize("text", ["", ":", "host:", ":0", ":70000", "x:y"])
def test_address_rejects(text):
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        address(text, "127.0.0.2")


def test_cli_rejects_a_head_start_or_a_settle_time_over_the_hold(capsys):
    from triton_operator.cli.main import main

    assert main(["probe", "--hold", "1", "--head-start", "2"]) == 1
    assert "--hold must be over 0 and over --head-start" in capsys.readouterr().err
    assert main(["probe", "--hold", "1", "--head-start", "0.5", "--gate-settle", "1"]) == 1
    assert "--gate-settle must be 0 or more, and under --hold" in capsys.readouterr().err


# -- bounds: a held probe outlives the request deadline ---------------------------------------------------------


def test_a_probe_held_longer_than_the_request_deadline_still_gets_its_answer(target):
    """The deadline is on the request's arrival; a held probe has sent its request and waits `hold`."""
    proc, port = _start_probe(target, "--hold", str(REQUEST_SECONDS + 6), "--head-start", "0.1")
    try:
        opener = threading.Timer(REQUEST_SECONDS + 3, target.open)
        opener.start()
        started = time.monotonic()
        status, _, answered = get(port)
        opener.join()
        assert status == 200 and answered - started > REQUEST_SECONDS, (status, answered - started)
    finally:
        proc.kill()
        proc.communicate()


# -- issue 39 (M2): no client can keep the kubelet's probe from its answer; /status and /gate need the key ------


class Crowd:
    """`n` other clients of the probe port, in one thread: each connects and sends a byte of a request every `every`
    seconds (None: sends nothing), or its whole request at once (`whole`); when the server closes one (its deadline,
    its answer, an eviction) it connects again at once, so the pressure never lets up."""

    REQUEST = b"GET /ready HTTP/1.1\r\nHost: probe\r\nUser-Agent: crowd\r\n\r\n"

    def __init__(self, port: int, n: int, every: float | None = None, whole: bool = False,
                 source: str | None = None) -> None:
        self.port, self.n, self.every, self.whole, self.source = port, n, every, whole, source
        self.closed = 0  # connections the server closed
        self.stop = threading.Event()
        self.sel = selectors.DefaultSelector()
        self.sent: dict[socket.socket, int] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Crowd:
        for _ in range(self.n):
            self._connect()
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)
        for s in list(self.sent):
            s.close()
        self.sel.close()

    def _connect(self) -> None:
        s = socket.socket()
        if self.source is not None:  # another client address than the kubelet-like probes' (another pod's)
            s.bind((self.source, 0))
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        self.sent[s] = 0
        self.sel.register(s, selectors.EVENT_READ)

    def _drop(self, s: socket.socket) -> None:
        self.sel.unregister(s)
        del self.sent[s]
        s.close()
        self.closed += 1

    def _run(self) -> None:
        next_byte = time.monotonic()
        while not self.stop.is_set():
            for key, _ in self.sel.select(0.05):
                s = key.fileobj
                try:
                    gone = not s.recv(65536)
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    self._drop(s)
                    self._connect()
            now = time.monotonic()
            if self.whole:
                for s, n in list(self.sent.items()):
                    if n < len(self.REQUEST):
                        with contextlib.suppress(OSError):  # not connected yet
                            self.sent[s] = n + s.send(self.REQUEST[n:])
            elif self.every is not None and now >= next_byte:
                next_byte = now + self.every
                for s, n in list(self.sent.items()):
                    if n < len(self.REQUEST) - 4:  # never the end of the head
                        with contextlib.suppress(OSError):
                            self.sent[s] = n + s.send(self.REQUEST[n:n + 1])


def _ready_port(target: Target, *args: str) -> tuple[subprocess.Popen[str], int]:
    proc, port = _start_probe(target, *args)
    target.open()
    deadline = time.monotonic() + scaled(20)
    while get(port)[0] != 200:
        assert time.monotonic() < deadline, "the probe never passed"
    return proc, port


@pytest.mark.parametrize(("n", "every"), [(32, 3.0), (1000, 3.0), (1000, None)])
def test_slow_clients_never_keep_the_kubelets_probe_from_its_answer(target, n, every):
    """Issue 39, M2: 32 connections that each sent a byte every 3 s took every slot of the old server, and the
    kubelet's probe met a closed connection. Here they (and 1000, reconnecting as soon as they are closed, from the
    kubelet's own address) change no answer."""
    proc, port = _ready_port(target, "--hold", "8", "--head-start", "0.1")
    answers: list[object] = []
    try:
        with Crowd(port, n, every) as crowd:
            until = time.monotonic() + 3 * REQUEST_SECONDS + 2  # past a few of the crowd's deadlines
            while time.monotonic() < until:
                try:
                    answers.append(get(port)[0])
                except OSError as exc:  # ConnectionError (EOF, reset, refused) and TimeoutError
                    answers.append(repr(exc))
            closed = crowd.closed
    finally:
        proc.kill()
        proc.communicate()
    print(f"{n} slow clients (a byte every {every} s): {len(answers)} probes, {closed} crowd connections closed")
    assert answers and all(a == 200 for a in answers), [a for a in answers if a != 200][:5]
    assert closed > 0, "the server closed none of the slow connections"


def test_a_full_server_evicts_the_crowds_unfinished_connections_never_the_kubelets(target):
    """Past the cap (64 here), a newcomer evicts an unfinished connection of the address that holds the most: 1000
    silent connections from another address (another pod) that reconnect at once never cost a probe its answer."""
    proc, port = _ready_port(target, "--hold", "8", "--head-start", "0.1", "--max-connections", "64")
    answers: list[object] = []
    try:
        with Crowd(port, 1000, source="127.0.0.2") as crowd:
            # Probes for 2 request deadlines, and on until the crowd was evicted (over 1000 of its connections
            # closed): how many go in a fixed time depends on the CPU left to the crowd's thread.
            until, latest = time.monotonic() + 2 * REQUEST_SECONDS, time.monotonic() + scaled(2 * REQUEST_SECONDS + 20)
            while time.monotonic() < until or (crowd.closed <= 1000 and time.monotonic() < latest):
                try:
                    answers.append(get(port)[0])
                except OSError as exc:
                    answers.append(repr(exc))
            closed = crowd.closed
    finally:
        proc.kill()
        proc.communicate()
    print(f"1000 silent clients from another address, cap 64: {len(answers)} probes, {closed} evicted or closed")
    assert answers and all(a == 200 for a in answers), [a for a in answers if a != 200][:5]
    assert closed > 1000, "the crowd was not evicted"


def test_a_request_sent_slowly_is_closed_at_its_whole_request_deadline(probe):
    """The old server's timeout was per read: a byte every few seconds kept a connection forever."""
    _, port = probe
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(0.5)
        started, answer = time.monotonic(), b""
        for byte in Crowd.REQUEST[:-4]:  # a byte every half second, never the end of the head
            try:
                sock.sendall(bytes([byte]))
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except ConnectionError:
                break
            if not chunk:
                break
            answer += chunk
        else:
            pytest.fail(f"still open after {time.monotonic() - started:.1f}s of a byte every 0.5 s")
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_flood_of_whole_probes_still_lets_a_new_probe_be_answered(target):
    """Complete `GET /ready` requests are held (tritonserver is down: up to the hold); with more of them than the
    server holds at once, the oldest held is answered now, with its verdict: a new probe is answered, and passes
    once tritonserver is up, while the flood goes on."""
    proc, port = _start_probe(target, "--hold", "30", "--head-start", "0.1")
    try:
        with Crowd(port, 4 * MAX_HELD + MAX_CONNECTIONS, whole=True) as crowd:
            status, body, _ = get(port)
            assert (status, body.strip()) == (503, "tritonserver's HTTP port refuses connections")
            target.open()
            deadline = time.monotonic() + scaled(20)
            while (status := get(port)[0]) != 200:
                assert status == 503 and time.monotonic() < deadline, status
            # More of the flood answered than the server holds connections: waited for while the flood goes on, not
            # read at the moment the new probe passed (a CI run with 4 workers, the CPU busy, read 942 then).
            answered = wait_until(f"more than {MAX_CONNECTIONS} of the flood's probes answered",
                                  lambda: crowd.closed if crowd.closed > MAX_CONNECTIONS else None, 20)
    finally:
        proc.kill()
        proc.communicate()
    assert answered > MAX_CONNECTIONS, f"the flood was answered only {answered} times"


def _post(port: int, path: str, key: str | None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, headers={"triton-operator-key": key} if key else {})
        return conn.getresponse().status
    finally:
        conn.close()


def test_status_and_gate_answer_only_the_replicas_key(probe, target):
    """`GET /status` says what is broken and `POST /gate` moves the verdict: the operator's, with the replica key."""
    _, port = probe
    target.open()
    for key in (None, "", "not-the-key", KEY[:-1], KEY + "k"):
        assert get(port, "/status", key=key)[0] == 401, key
        assert _post(port, "/gate", key) == 401, key
        assert notify(port, key)[0] == 401, key
    status, body, _ = get(port, "/status", key=KEY)
    assert status == 200 and '"broken": {}' in body, body
    # The operator's clients (the gate's, the pool's) send it.
    with pytest.raises(ConnectionError, match="401"):
        asyncio.run(probe_status("127.0.0.1", port))
    assert asyncio.run(probe_status("127.0.0.1", port, KEY)) == {}
    assert asyncio.run(probe_news("127.0.0.1", port, since=0, wait=0.1, key=KEY))[1] == {}
    assert _post(port, "/gate", KEY) == 200
    assert notify(port, KEY)[0] == 200
    # The kubelet's probe needs none.
    assert get(port)[0] == 200


def test_without_a_key_status_and_gate_refuse_everyone(target):
    proc, port = _start_probe(target, "--hold", "2", key=None)
    try:
        target.open()
        assert get(port, "/status", key=KEY)[0] == 401
        assert notify(port, KEY)[0] == 401
    finally:
        proc.kill()
        err = proc.communicate()[1]
    assert f"probe: warning: no {REPOSITORY_KEY_ENV} in the environment" in err
