"""`LocalTritonServer.start` (used by `triton-operator validate`, the tests and the benchmarks) against a real
tritonserver that cannot bind its gRPC port: the port is held by a socket of the test's own, bound but not
listening, so tritonserver's bind fails with "Address already in use" and it exits before it listens."""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.timing import scaled
from triton_operator.triton.local import LocalTritonServer

pytestmark = pytest.mark.triton


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))  # no listen(): a connect is refused, and tritonserver cannot bind it
        yield s.getsockname()[1]


def test_a_server_that_exits_before_it_listens_is_started_again_on_fresh_ports(
        tmp_path: Path, held_port: int, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "repo").mkdir()
    log = tmp_path / "tritonserver.log"
    server = LocalTritonServer(model_repository=tmp_path / "repo", grpc_port=held_port, log_path=log)
    with caplog.at_level(logging.WARNING, logger="triton_operator.triton"):
        server.start(timeout=60)
    try:
        assert server.grpc_port != held_port
        with socket.create_connection(("127.0.0.1", server.grpc_port), 2):
            pass
        warned = [r.getMessage() for r in caplog.records]
        # Its exit code is tritonserver's: 1, or -6 when gRPC's poller aborts on the way out (a rehearsal at 828d844:
        # "epoll_wait error: Bad file descriptor", SIGABRT); either way the start is tried again.
        assert len(warned) == 1 and re.search(r"exited with code (1|-6) before it listened \(start 1 of 2\)",
                                              warned[0]), warned
        # Both starts' output is kept: the first's bind failure, then the second's header and its gRPC service. The
        # port answers a moment before tritonserver's line about it reaches the file (CI read the file in between).
        started = f"Started GRPCInferenceService at 127.0.0.1:{server.grpc_port}"
        deadline = time.monotonic() + scaled(10)
        while started not in (text := log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        first, _, second = text.partition("--- start 2 of 2, ports ")
        assert f"failed to start GRPC service: Unavailable - Socket '127.0.0.1:{held_port}' already in use" in first
        assert started in second, text[-2000:]
    finally:
        server.stop()
    assert server.process is not None and server.process.returncode is not None


def test_the_last_starts_failure_is_raised_with_the_servers_log(tmp_path: Path, held_port: int) -> None:
    (tmp_path / "repo").mkdir()
    server = LocalTritonServer(model_repository=tmp_path / "repo", grpc_port=held_port,
                               log_path=tmp_path / "tritonserver.log")
    with pytest.raises(RuntimeError) as err:
        server.start(timeout=60, attempts=1)
    message = str(err.value)
    assert message.startswith("tritonserver exited with code 1 before it listened:\n"), message[:300]
    assert f"Socket '127.0.0.1:{held_port}' already in use" in message
    assert server.grpc_port == held_port  # one start: the ports are the caller's
