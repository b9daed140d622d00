"""`triton-operator probe`: the readiness endpoint of a gated Triton replica, a small container beside tritonserver.

With the warm-up gate, the container's readiness only has to say "tritonserver is up": it opens its ports only once
the models it loads at start are loaded and warm (gRPC first, then HTTP), and the gate says what it serves. A TCP
probe says that, but only on the kubelet's ticks (period 1 s, the shortest there is), so a replica waited up to a
second after READY for its container to turn ready.

This server answers the kubelet's HTTP probe by long-polling instead. While tritonserver's HTTP port refuses
connections, it holds the probe request (up to `hold` seconds, under the probe's timeout) and connects every
`interval`; the answer comes as soon as the port accepts one. The kubelet starts its next probe at once after a
long one (its ticker has fired meanwhile), so a probe is nearly always waiting.

When it passes. A readiness probe's success sets the pod's Ready at once from the gate as the kubelet last synced
it, and is itself a pod sync; the kubelet runs at most one sync of a pod per PLEG relist (1 s). So if the probe
passed before the kubelet had the operator's gate, Ready waited up to a second for the next relist. The operator
sets the gate once both ports are open and Triton answers READY, then tells this server (`POST /gate`, see
`notify_gate`); a held probe passes `settle` later, time for the kubelet to receive the gate's pod update and
sync it first. Without that notice (an operator that cannot reach the pod, a gate already True when tritonserver
restarted) the probe passes `head_start` after the port opened.

A port that closes after a success is answered at once (503): that is tritonserver exiting. On SIGTERM the server
keeps answering until tritonserver's port refuses (its drain is over) and then exits, so that the pod's termination
does not wait for it.

Bounds. Anything that reaches the pod can connect here, so a connection that sends nothing (or stops sending)
for `IDLE_SECONDS` is closed, and at most `MAX_CONNECTIONS` are served at once, a thread each: one more is
closed as soon as it is accepted. The kubelet holds one probe at a time and the operator posts one notice, so
the cap is far above what they use. The idle timeout is on the socket's reads and writes, never on the hold:
a held probe sent its request already, and waits up to `hold` seconds by design.

Standard library only: it runs in every replica, and starts in a fraction of a second.
"""

from __future__ import annotations

import http.server
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Where the operator tells the probe server that it has set the gate.
GATE_PATH = "/gate"
#: A connection that sends nothing (or reads nothing of the answer) for this long is closed.
IDLE_SECONDS = 5.0
#: Connections served at once (a thread each); more are closed as soon as they are accepted.
MAX_CONNECTIONS = 32


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something listens on the port. A connect that times out counts as open: a closed local port refuses
    at once, and a listener whose accept queue is full (tritonserver overloaded) drops the SYN instead."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except TimeoutError:
        return True
    except OSError:
        return False


@dataclass
class Readiness:
    """When tritonserver's port is open, when the operator set the gate, and what the last answer was: shared by the
    request threads. `sleep` None waits on a condition a gate notice wakes; tests pass a fake clock and sleep."""

    check: Callable[[], bool]
    hold: float = 8.0
    head_start: float = 0.5
    settle: float = 0.03
    interval: float = 0.005
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] | None = None
    open_since: float | None = None
    gate_at: float | None = None
    last_ready: bool = False
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def _observe(self) -> bool:
        is_open = self.check()
        with self._cond:
            if not is_open:
                self.open_since = self.gate_at = None  # a notice is about the tritonserver that answered it
            elif self.open_since is None:
                self.open_since = self.clock()
        return is_open

    def gate_set(self) -> bool:
        """The operator set the pod's readiness gate True: probes pass `settle` from now. Counts only while
        tritonserver's port is open (the gate is about the tritonserver behind it); False if it is not."""
        is_open = self._observe()
        with self._cond:
            if is_open:
                self.gate_at = self.clock()
                self._cond.notify_all()
        return is_open

    def _passes_at(self) -> float | None:
        """When a probe may pass (under the lock): `settle` after the gate's notice, else `head_start` after the
        port opened. None while the port is closed."""
        if self.open_since is None:
            return None
        at = self.open_since + self.head_start
        return at if self.gate_at is None else min(at, self.gate_at + self.settle)

    def answer(self) -> tuple[bool, str]:
        """Wait, within `hold`, until a probe may pass; say ready or why not."""
        deadline = self.clock() + self.hold
        while True:
            is_open = self._observe()
            with self._cond:
                now = self.clock()
                if not is_open and self.last_ready:
                    # It was ready: a closed port is news the kubelet should have now, not after a hold.
                    self.last_ready = False
                    return False, "tritonserver's HTTP port refuses connections"
                at = self._passes_at() if is_open else None
                if at is not None and now >= at:
                    self.last_ready = True
                    return True, "tritonserver is up"
                if now >= deadline:
                    self.last_ready = False
                    return False, "tritonserver's HTTP port refuses connections"
                wait = max(0.001, min(self.interval if at is None else at - now, deadline - now))
                if self.sleep is None:
                    self._cond.wait(wait)  # a gate notice wakes it early
                    continue
            self.sleep(wait)


def serve(listen: tuple[str, int], target: tuple[str, int], hold: float, head_start: float, settle: float,
          stop_poll: float = 0.1, idle: float = IDLE_SECONDS, max_connections: int = MAX_CONNECTIONS) -> int:
    # SIGTERM and SIGINT are blocked from here on, in this thread and every thread it starts, and taken with
    # sigwait below: no handler runs inside a wait that holds a lock the handler would need, and a signal sent as
    # soon as the port listens stays pending instead of killing the process.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    readiness = Readiness(check=lambda: port_open(*target), hold=hold, head_start=head_start, settle=settle)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = idle  # each read and write of the socket; BaseHTTPRequestHandler closes on the timeout

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/", "/ready"):
                self._reply(404, "not found")
                return
            ready, why = readiness.answer()
            self._reply(200 if ready else 503, why)

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != GATE_PATH:
                self._reply(404, "not found")
                return
            if readiness.gate_set():
                print(f"probe: the operator set the readiness gate; passing in {settle:g} s", file=sys.stderr,
                      flush=True)
                self._reply(200, f"passing readiness probes in {settle:g} s")
            else:
                self._reply(409, "tritonserver's HTTP port refuses connections")

        def _reply(self, code: int, text: str) -> None:
            body = (text + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:
            pass  # one probe a second: no access log

    slots = threading.BoundedSemaphore(max_connections)

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        block_on_close = False
        request_queue_size = 64  # the listen backlog: beyond it, connections wait in SYN retries, not refused at once

        def process_request(self, request: Any, client_address: Any) -> None:
            if not slots.acquire(blocking=False):
                self.shutdown_request(request)  # over the cap: closed at once, no thread
                return
            try:
                super().process_request(request, client_address)
            except BaseException:
                slots.release()
                raise

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                slots.release()

        def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
            # A kubelet that gave up on a held probe (its timeout, the pod's deletion) has closed the connection; a
            # client that does not read the answer timed out.
            if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
                super().handle_error(request, client_address)

    server = Server(listen, Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    print(f"probe: answering readiness on {listen[0]}:{listen[1]} for tritonserver's HTTP port {target[0]}:{target[1]}"
          f" (hold {hold:g} s; passes {settle:g} s after the operator's POST {GATE_PATH}, else {head_start:g} s after the"
          " port opens)", file=sys.stderr, flush=True)
    signal.sigwait(stop_signals)
    # tritonserver drains after the preStop sleep: keep answering until its port refuses, then go.
    print("probe: SIGTERM; waiting for tritonserver's HTTP port to close", file=sys.stderr, flush=True)
    while port_open(*target, timeout=stop_poll):
        time.sleep(stop_poll)
    server.shutdown()
    print("probe: tritonserver's HTTP port is closed; exiting", file=sys.stderr, flush=True)
    return 0


async def notify_gate(host: str, port: int, timeout: float = 1.0) -> int:
    """Tells a replica's probe server that the operator has just set its readiness gate True (`POST /gate`); the
    answer's status code (200: probes pass `settle` from now; 409: tritonserver's port is closed there)."""
    import asyncio  # here: the probe container itself never needs it

    async def post() -> int:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"POST {GATE_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 0\r\n"
                         "Connection: close\r\n\r\n".encode())
            await writer.drain()
            status = (await reader.readline()).split()
            if len(status) < 2 or not status[1].isdigit():
                raise ConnectionError(f"not an HTTP answer: {b' '.join(status)!r}")
            return int(status[1])
        finally:
            writer.close()

    return await asyncio.wait_for(post(), timeout)


def address(text: str, default_host: str) -> tuple[str, int]:
    """`HOST:PORT` or `:PORT` or `PORT`."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return (host or default_host), int(port)
