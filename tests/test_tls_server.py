"""The operator's TLS port (`servers.tls_server`, served by `AdmissionWebhook`) against clients that are slow,
numerous or malformed: real sockets and real TLS to a server on 127.0.0.1, as in issue 32's findings.

- A client that connects and never starts TLS, one that sends its headers a byte at a time and one whose body
  trickles are closed within seconds.
- Connections over the cap are refused as soon as they are accepted, and the server serves again once they go.
- Malformed AdmissionReviews get HTTP 400 with the reason, no 500 and no traceback in the log.

The same against the operator installed by the chart, on a real node: e2e/test_tls_server.py.
"""

from __future__ import annotations

import http.client
import json
import logging
import select
import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from tests.hostile_servers import closed_within, over_the_cap
from tests.timing import scaled, wait_until
from tests.webhook_server import FakeModelsApi, RunningWebhook
from triton_operator.servers import tls_server

PATH = "/validate-tritonmodels"
#: Closed "within seconds": the server's deadline for the stage, and this much more for a busy machine.
MARGIN = 4.0


@pytest.fixture(scope="module")
def server() -> Iterator[RunningWebhook]:
    with RunningWebhook(FakeModelsApi()) as running:
        yield running




def _tls(server: RunningWebhook) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return server.context.wrap_socket(raw, server_hostname="127.0.0.1")


def _post(server: RunningWebhook, body: bytes) -> tuple[int, dict]:
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=server.context, timeout=20)
    try:
        conn.request("POST", PATH, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else {}
    finally:
        conn.close()


def _review(request: object) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def test_a_connection_that_never_starts_tls_is_closed_within_seconds(server: RunningWebhook) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        took = closed_within(sock, tls_server.HANDSHAKE_SECONDS + MARGIN + 10)
    assert took is not None, "a connection that never sent a ClientHello was still open (asyncio's default: 60 s)"
    assert took < tls_server.HANDSHAKE_SECONDS + MARGIN, f"closed only after {took:.1f}s"


def test_a_request_whose_headers_trickle_is_closed_within_seconds(server: RunningWebhook) -> None:
    with _tls(server) as sock:
        start = time.monotonic()
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\n".encode())
        closed = None
        for i in range(60):  # a header line every half second, for up to 30 s
            try:
                sock.sendall(f"X-Slow-{i}: y\r\n".encode())
            except (ConnectionError, ssl.SSLError):
                closed = time.monotonic() - start
                break
            if (took := closed_within(sock, 0.5)) is not None:
                closed = time.monotonic() - start
                break
            del took
    assert closed is not None, "a client sending a header line every 0.5 s was never closed (aiohttp: 3630 s)"
    assert closed < tls_server.IDLE_SECONDS + MARGIN, f"closed only after {closed:.1f}s"


def test_a_body_that_trickles_is_cut_off_within_seconds(server: RunningWebhook) -> None:
    with _tls(server) as sock:
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 100000\r\n\r\n{".encode())
        start = time.monotonic()
        answer = b""
        for _ in range(60):  # a byte every half second, for up to 30 s
            try:
                sock.sendall(b" ")
            except (ConnectionError, ssl.SSLError):
                break
            readable, _, _ = select.select([sock], [], [], 0.5)
            if readable:
                try:
                    chunk = sock.recv(4096)
                except (ConnectionError, ssl.SSLError):
                    break
                if not chunk:
                    break
                answer += chunk
                if b"\r\n\r\n" in answer:
                    break
        took = time.monotonic() - start
    assert took < tls_server.BODY_SECONDS + MARGIN, f"a body trickling a byte every 0.5 s was read for {took:.1f}s"
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_connections_over_the_cap_are_refused_at_once_and_the_server_serves_again_when_they_go() -> None:
    cap = tls_server.MAX_CONNECTIONS
    extra = 16
    with RunningWebhook(FakeModelsApi()) as server:
        # The first `cap` are accepted and wait for their handshake; the rest are reset as soon as accepted.
        with over_the_cap(server.port, cap, extra) as held:
            readable, _, _ = select.select(held, [], [], 0)
            assert not readable, f"{len(readable)} of the first {cap} connections were closed at once"
        # Their places are free again once they close.
        deadline = time.monotonic() + scaled(20)
        while True:
            try:
                status, _ = _post(server, b"{}")
                break
            except (ConnectionError, ssl.SSLError):
                assert time.monotonic() < deadline, "the server refused connections after the others had gone"
        assert status == 400


def _nested_spec(depth: int) -> bytes:
    start = _review({"uid": "u", "operation": "CREATE", "namespace": "a", "object": {
        "metadata": {"name": "m"}, "spec": "HERE"}})
    return start.replace(b'"HERE"', b'{"a":' * depth + b"1" + b"}" * depth)


MALFORMED = {
    "the finding's request": b'{"request":"x"}',
    "request not an object": _review("x"),
    "not JSON": b"{not json",
    "an array nested 100000 deep": b"[" * 100000 + b"]" * 100000,
    "a spec nested 5000 deep": _nested_spec(5000),
    "a spec nested 500 deep": _nested_spec(500),
    "a list": b"[]",
    "a wrong apiVersion": json.dumps({"apiVersion": "v1", "kind": "AdmissionReview", "request": {}}).encode(),
    "no uid": _review({"operation": "CREATE", "object": {"metadata": {"name": "m"}}}),
    "operation a number": _review({"uid": "u", "operation": 7}),
    "object a list": _review({"uid": "u", "operation": "CREATE", "namespace": "a", "object": []}),
    "metadata a string": _review({"uid": "u", "operation": "CREATE", "namespace": "a", "object": {"metadata": "x"}}),
    "namespace a number": _review({"uid": "u", "operation": "CREATE", "namespace": 3, "object": {"metadata": {}}}),
    "name missing": _review({"uid": "u", "operation": "UPDATE", "namespace": "a", "object": {"metadata": {}}}),
    "name a list": _review({"uid": "u", "operation": "CREATE", "namespace": "a",
                            "object": {"metadata": {"name": ["m"]}, "spec": {}}}),
}


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_review_gets_400_with_the_reason_and_no_traceback(server: RunningWebhook, body: bytes,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="triton_operator"), caplog.at_level(logging.DEBUG, logger="aiohttp"):
        status, answer = _post(server, body)
    assert status == 400, (status, answer)
    assert "not an AdmissionReview" in answer.get("error", ""), answer
    logged = [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert not logged, [r.getMessage() for r in logged]


def test_a_review_with_a_spec_of_the_wrong_shape_is_denied_naming_the_field(server: RunningWebhook) -> None:
    """Not malformed as a review: the API server would send it had the CRD not refused it; the verdict names it."""
    status, answer = _post(server, _review({"uid": "u1", "operation": "CREATE", "namespace": "a", "object": {
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
        "metadata": {"name": "m", "namespace": "a"}, "spec": {"inputs": "x"}}}))
    assert status == 200, answer
    response = answer["response"]
    assert response["uid"] == "u1" and response["allowed"] is False
    assert "spec.inputs" in response["status"]["message"], response


def test_a_body_over_the_limit_is_refused_before_it_is_read(server: RunningWebhook) -> None:
    with _tls(server) as sock:
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {tls_server.MAX_BODY + 1}\r\n\r\n".encode())
        sock.settimeout(10)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_bodies_over_the_budget_together_get_503_at_once(server: RunningWebhook, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each body under the limit, but more of them at once than the budget: the next is refused, not read."""
    budget = tls_server.Budget(1024 * 1024)
    monkeypatch.setattr(tls_server, "BODIES", budget)
    head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {700 * 1024}\r\n\r\n{{".encode()
    with _tls(server) as first, _tls(server) as second:
        first.sendall(head)
        wait_until("the first body reserved: it is being read", lambda: budget.used == 700 * 1024, 10, interval=0.01)
        second.sendall(head)
        second.settimeout(10)
        answer = second.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert budget.used == 700 * 1024, "the first body's reservation"
    deadline = time.monotonic() + scaled(20)
    while budget.used:  # given back once the first request ends (its body deadline, or its connection closed)
        assert time.monotonic() < deadline, f"{budget.used} bytes of the budget were never given back"
        time.sleep(0.05)


def test_every_answer_closes_its_connection_so_the_api_server_never_reuses_one_the_server_is_closing(
        server: RunningWebhook) -> None:
    """A CI run (2026-11-29, e2e/test_pool.py): the API server sent an AdmissionReview on a kept-alive connection just
    as the server's 5 s idle deadline closed it; Go's transport does not send a POST again, and `kubectl apply` failed
    with "failed calling webhook ...: EOF". Each answer now says `Connection: close` and the server ends the
    connection, so the client dials anew for its next review."""
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=server.context, timeout=20)
    try:
        conn.request("POST", PATH, body=_review({"uid": "u1"}), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.getheader("Connection", "").lower() == "close", resp.getheaders()
        sock = conn.sock
        assert sock is None or closed_within(sock, scaled(5)) is not None, "the server ended the connection"
    finally:
        conn.close()
