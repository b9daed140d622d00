"""Servers on 127.0.0.1 that answer as a hostile replica would (issue 39, M1): an HTTP server whose answers never end
(fast, or a byte at a time, or announced as huge), a gRPC server whose every answer is one oversized message; and the
peak resident memory a block of code adds (`peak_growth`), read from the kernel (VmHWM, reset through clear_refs); and
how soon a server closed a client's socket (`closed_within`) and a server filled to its connection cap
(`over_the_cap`), for the tests of its deadlines and caps."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

#: How much an "endless" fast answer streams before it holds the connection open without ending: far more than any
#: client may keep, and a bounded load on the machine that runs the test.
ENDLESS_BYTES = 256 << 20


def vm_hwm() -> int:
    """This process's peak resident memory since the last reset, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


@contextlib.contextmanager
def peak_growth() -> Iterator[list[int]]:
    """Yields a list that holds, once the block is over, how far the block raised the process's peak RSS (bytes)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the present RSS (Linux 4.0+)
    before = vm_hwm()
    out: list[int] = []
    yield out
    out.append(vm_hwm() - before)


class HostileHttp:
    """An HTTP/1.1 server on 127.0.0.1 that reads a request's headers (and a body of its Content-Length), then
    answers 200 with a JSON-typed body in the way `mode` names:

    - `endless`: no Content-Length, `ENDLESS_BYTES` as fast as the client takes them, then nothing more, the
      connection held open;
    - `trickle`: a byte every `interval` seconds, forever;
    - `huge`: a Content-Length of 1 TiB, then the `endless` body.
    """

    def __init__(self, mode: str, interval: float = 0.2) -> None:
        self.mode, self.interval = mode, interval
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> HostileHttp:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (a close alone does not)
        self.sock.close()
        self.thread.join(10)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            if self.mode == "huge":
                head += f"Content-Length: {1 << 40}\r\n"
            else:
                head += "Connection: close\r\n"
            conn.sendall((head + "\r\n").encode())
            if self.mode == "trickle":
                conn.sendall(b"{")
                while not self.stop.wait(self.interval):
                    conn.sendall(b" ")
                return
            block = b"[" + b"0," * (1 << 19)  # 1 MiB of a JSON array that never closes
            sent = 0
            while sent < ENDLESS_BYTES and not self.stop.is_set():
                conn.sendall(block)
                sent += len(block)
                self.sent += len(block)
            self.stop.wait()  # held open: the answer never ends


def oversized_message(size: int) -> bytes:
    """A protobuf message of `size` bytes that any message type parses: one unknown length-delimited field (15)."""
    body = b"x" * size
    n, varint = len(body), bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return bytes([15 << 3 | 2]) + bytes(varint) + body


@contextlib.contextmanager
def oversized_grpc(size: int) -> Iterator[str]:
    """A gRPC server on 127.0.0.1 answering every unary call with one message of `size` bytes; yields host:port."""
    import grpc

    answer = oversized_message(size)

    class Everything(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            handler: Callable[[bytes, Any], bytes] = lambda request, context: answer  # noqa: E731
            return grpc.unary_unary_rpc_method_handler(handler)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.max_send_message_length", -1)])
    server.add_generic_rpc_handlers((Everything(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait(10)


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the peer closed `sock` (EOF, a reset, or a TLS alert), None if it did not within `seconds`."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(4096):
                return time.monotonic() - start
    except (ConnectionError, ssl.SSLError):
        return time.monotonic() - start
    except TimeoutError:
        return None


@contextlib.contextmanager
def over_the_cap(port: int, cap: int, extra: int) -> Iterator[list[socket.socket]]:
    """`cap` connections to 127.0.0.1:`port` held open, then `extra` more, each of which the server must close at once
    (within 2 s). Yields the held ones; every socket is closed on exit."""
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(cap)]
    over = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(extra)]
    try:
        closed = [s for s in over if closed_within(s, 2.0) is not None]
        assert len(closed) == extra, f"{extra - len(closed)} of {extra} connections over the cap of {cap} were kept"
        yield held
    finally:
        for s in held + over:
            s.close()
