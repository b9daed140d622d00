"""The operator's Prometheus port (`servers.prometheus`, `run --metrics-port`) against clients that are slow or
numerous (issue 39, M4): real sockets to the server on 127.0.0.1, in an event loop of its own as in the operator.

prometheus-client's `start_http_server`, which served it before, started a thread per connection and never timed one
out. Now: an idle connection and one whose headers trickle are closed within seconds, connections over the cap are
reset at the accept, none of them costs a thread, and Prometheus's scrape is answered throughout and after.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.hostile_servers import closed_within, over_the_cap
from tests.timing import scaled, wait_until
from triton_operator.servers import prometheus, tls_server

#: Closed "within seconds": the server's deadline for the stage, and this much more for a busy machine.
MARGIN = 4.0


class RunningMetrics:
    """The endpoint in a thread running its own event loop."""

    def __init__(self, max_connections: int = prometheus.MAX_CONNECTIONS) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.max_connections = max_connections
        self.port = 0

    def __enter__(self) -> RunningMetrics:
        self.thread.start()
        started = asyncio.run_coroutine_threadsafe(
            prometheus.serve_metrics("127.0.0.1", 0, self.max_connections), self.loop)
        self.runner, self.port = started.result(20)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def scrape(self) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def server() -> Iterator[RunningMetrics]:
    with RunningMetrics() as running:
        yield running




def test_a_scrape_gets_the_operators_metrics(server: RunningMetrics) -> None:
    status, body = server.scrape()
    assert status == 200
    assert b"triton_operator_metrics_connections_refused_total" in body, body[:500]


def test_an_idle_connection_is_closed_within_seconds(server: RunningMetrics) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        took = closed_within(sock, tls_server.IDLE_SECONDS + MARGIN + 10)
    assert took is not None, "a connection that sent nothing was still open"
    assert took < tls_server.IDLE_SECONDS + MARGIN, f"closed only after {took:.1f}s"


def test_a_request_whose_headers_trickle_is_closed_within_seconds(server: RunningMetrics) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        closed = None
        for i in range(60):  # a header line every half second, for up to 30 s
            try:
                sock.sendall(f"X-Slow-{i}: y\r\n".encode())
            except ConnectionError:
                closed = time.monotonic() - start
                break
            if closed_within(sock, 0.5) is not None:
                closed = time.monotonic() - start
                break
    assert closed is not None, "a client sending a header line every 0.5 s was never closed"
    assert closed < tls_server.IDLE_SECONDS + MARGIN, f"closed only after {closed:.1f}s"


def test_connections_over_the_cap_are_refused_without_a_thread_each_and_scrapes_resume() -> None:
    cap, extra = 8, 8
    with RunningMetrics(max_connections=cap) as server:
        threads = threading.active_count()
        with over_the_cap(server.port, cap, extra):
            assert threading.active_count() == threads, "connections started threads"
        deadline = time.monotonic() + scaled(20)
        while True:  # their places are free again once they close
            try:
                status, _ = server.scrape()
                break
            except (ConnectionError, http.client.RemoteDisconnected):
                assert time.monotonic() < deadline, "the endpoint refused scrapes after the others had gone"
        assert status == 200


def test_prometheus_clients_own_server_started_a_thread_per_connection() -> None:
    """What this replaced, pinned: prometheus-client's server holds a thread for every open connection."""
    from prometheus_client import start_http_server

    from triton_operator.triton.local import free_port

    port = free_port()
    httpd, thread = start_http_server(port, addr="127.0.0.1")
    try:
        threads = threading.active_count()
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(8)]
        wait_until("a thread for each of the 8 connections", lambda: threading.active_count() >= threads + 8, 20)
        for s in held:
            s.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)
