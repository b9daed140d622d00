"""`triton-operator probe`, the readiness endpoint beside tritonserver, run as its own process (as in a pod) against a
port this test opens and closes in tritonserver's place."""

from __future__ import annotations

import asyncio
import http.client
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.probing import get
from triton_operator.triton.local import free_port
from triton_operator.triton.probe import IDLE_SECONDS, MAX_CONNECTIONS, Readiness, address, notify_gate

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


def _start_probe(target: Target, *args: str) -> tuple[subprocess.Popen[str], int]:
    """`triton-operator probe` against `target` with `args`, once it listens on its port."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "operator")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "triton_operator.cli.main", "probe", "--listen", f"127.0.0.1:{port}",
         "--target", f"127.0.0.1:{target.port}", *args],
        stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 20
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


def notify(port: int) -> tuple[int, float]:
    """The operator's notice (the client the gate uses): its status and when it was sent (monotonic)."""
    sent = time.monotonic()
    return asyncio.run(notify_gate("127.0.0.1", port)), sent


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


# -- bounds (issue 32): idle connections and too many of them --------------------------------------------------


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `sock`, None if it did not within `seconds`."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return time.monotonic() - start
    except ConnectionError:
        return time.monotonic() - start
    except TimeoutError:
        return None


def test_an_idle_connection_is_closed_within_seconds(probe):
    _, port = probe
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /ready HTTP/1.1\r\n")  # and then nothing
        took = _closed_within(sock, IDLE_SECONDS + 15)
    assert took is not None, "a connection that stopped sending was kept (a thread each, without limit)"
    assert took < IDLE_SECONDS + 3, f"closed only after {took:.1f}s"


def test_connections_over_the_cap_are_closed_at_once_and_probes_pass_once_they_go(probe, target):
    _, port = probe
    target.open()
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    over = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(8)]
    try:
        kept = [s for s in over if _closed_within(s, 2.0) is None]
        assert not kept, f"{len(kept)} of 8 connections over the cap of {MAX_CONNECTIONS} were kept"
        readable, _, _ = select.select(held, [], [], 0)
        assert not readable, f"{len(readable)} of the first {MAX_CONNECTIONS} connections were closed at once"
    finally:
        for s in held + over:
            s.close()
    deadline = time.monotonic() + 10
    while True:  # the server frees their threads as it sees them close
        try:
            assert get(port)[0] == 200
            break
        except (ConnectionError, http.client.RemoteDisconnected):
            assert time.monotonic() < deadline, "probes still refused after the idle connections closed"


def test_a_probe_held_longer_than_the_idle_timeout_still_gets_its_answer(target):
    """The idle timeout is on the socket's reads and writes; a held probe has sent its request and waits `hold`."""
    proc, port = _start_probe(target, "--hold", str(IDLE_SECONDS + 4), "--head-start", "0.1")
    try:
        opener = threading.Timer(IDLE_SECONDS + 1, target.open)
        opener.start()
        started = time.monotonic()
        status, _, answered = get(port)
        opener.join()
        assert status == 200 and answered - started > IDLE_SECONDS, (status, answered - started)
    finally:
        proc.kill()
        proc.communicate()
