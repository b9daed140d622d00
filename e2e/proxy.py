"""A CONNECT proxy on 127.0.0.1 for the credential tests (`tests/test_kubeconfig.py`, `e2e/test_credentials.py`):
it records every CONNECT it is asked for (target and headers) and tunnels it. `hosts` maps names only the proxy
can resolve to addresses: a client that reaches a server by such a name went through the proxy."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType


@dataclass(frozen=True)
class Connect:
    target: str  # host:port, as asked
    headers: dict[str, str]  # names in lower case

    @property
    def user_agent(self) -> str:
        return self.headers.get("user-agent", "")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: ConnectProxy


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        proxy = self.server.proxy
        request = self.rfile.readline(65536).decode("latin-1").split()
        headers: dict[str, str] = {}
        while (line := self.rfile.readline(65536).decode("latin-1")) not in ("\r\n", "\n", ""):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if len(request) != 3 or request[0] != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        proxy.record(Connect(request[1], headers))
        host, _, port = request[1].rpartition(":")
        host = host.strip("[]")
        try:
            upstream = socket.create_connection((proxy.hosts.get(host, host), int(port)), timeout=10)
        except (OSError, ValueError):
            self.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        upstream.settimeout(None)
        proxy.track(upstream, self.connection)
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        back = threading.Thread(target=_pump, args=(upstream.recv, self.connection), daemon=True)
        back.start()
        _pump(self.rfile.read1, upstream)  # read1: whatever the header reads buffered goes first
        back.join()
        upstream.close()


def _pump(read: Callable[[int], bytes], to: socket.socket) -> None:
    """Copies until `read` (socket.recv or BufferedReader.read1) ends, then ends the other way's writing."""
    with contextlib.suppress(OSError, ValueError):
        while data := read(65536):
            to.sendall(data)
    with contextlib.suppress(OSError):
        to.shutdown(socket.SHUT_WR)


class ConnectProxy:
    """`with ConnectProxy(hosts) as proxy:` serves on `proxy.url` until the block ends (every tunnel closed)."""

    def __init__(self, hosts: Mapping[str, str] | None = None) -> None:
        self.hosts = dict(hosts or {})
        self.connects: list[Connect] = []
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def record(self, connect: Connect) -> None:
        with self._lock:
            self.connects.append(connect)

    def track(self, *sockets: socket.socket) -> None:
        with self._lock:
            self._sockets.extend(sockets)

    def seen(self) -> list[Connect]:
        with self._lock:
            return list(self.connects)

    def __enter__(self) -> ConnectProxy:
        threading.Thread(target=self._server.serve_forever, name="connect-proxy", daemon=True).start()
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
