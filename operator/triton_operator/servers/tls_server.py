"""The operator's TLS server: one port for the admission webhook and the custom metrics API, bounded against
slow and numerous clients.

Every stage a client controls has a deadline, and the connections open at once have a cap:

- **Connections.** At most `max_connections` at once, counted from the TCP accept to the close, handshakes
  included. One more is aborted as soon as it is accepted (a TCP reset): before any TLS work or buffer is spent
  on it. A TLS connection costs about 300 KiB here, most of it the 256 KiB read buffer of asyncio's
  `SSLProtocol` (3,000 half-open requests took a replica from 68 to 893 MiB, issue 32), so the cap bounds the
  server's memory: 256 connections, under 100 MiB.
- **The TLS handshake**, `HANDSHAKE_SECONDS` from the accept. `loop.create_server(ssl=...)` has a
  `ssl_handshake_timeout`, but aiohttp's `TCPSite` does not pass one (asyncio's default is 60 s), and a server
  created with `ssl=` wraps every accepted socket in an `SSLProtocol` (and its buffer) before any code of ours
  can count it. So the listener here is plain TCP (`TlsSite`): its protocol counts the connection or refuses
  it, then upgrades it with `loop.start_tls(..., ssl_handshake_timeout=, ssl_shutdown_timeout=)`, both public
  asyncio, and hands the TLS transport to aiohttp's request handler.
- **The request line and headers**, `IDLE_SECONDS` from the handshake or from the previous response. aiohttp
  has no header-read timeout by that name, but its `keepalive_timeout` is one in effect: `RequestHandler` arms
  it in `connection_made`, re-arms it after each response, and when it fires closes the connection if the
  handler is still waiting for a complete request (its `_waiter`), which is the case until the parser has the
  last header line. A client that sends its headers a byte at a time is closed as one that sends nothing. The
  same timer closes a kept-alive connection that stays idle (the API server dials again: a POST it has not
  sent yet is retried by Go's transport when the server closed an idle connection).
- **The body**, `BODY_SECONDS` for the whole of it (`body_of`), each body at most `MAX_BODY` bytes, and the
  bodies being read at most `BODY_BUDGET` bytes together (over it: 503 at once): a slow trickle and many
  large bodies in parallel both end. A body no handler reads (a GET with one) is drained for at most
  `LINGER_SECONDS` after the answer (aiohttp's `lingering_time`), then the connection is closed.
- **Closing.** A TLS close waits at most `SHUTDOWN_SECONDS` for the peer's close_notify, then aborts.

What is left is the time our own handlers take (the webhook's reads, a metric's first samples), which no
client controls.

`PlainSite` is the same site without TLS (issue 39, M4): the operator's Prometheus port and a pool replica's
fetch-server sidecar get the connection cap and the deadlines of the request line, headers and body, in one event
loop: no thread per connection, so an idle socket costs a file descriptor and a protocol object, not a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from typing import Any

from aiohttp import web

from . import metrics

log = logging.getLogger("triton_operator.tls")

#: A client's TLS handshake must be over this long after the TCP accept.
HANDSHAKE_SECONDS = 5.0
#: A request's line and headers must be in this long after the handshake or the previous response (aiohttp's
#: keepalive_timeout: also how long an idle kept-alive connection stays).
IDLE_SECONDS = 5.0
#: A request body must be in this long after its headers.
BODY_SECONDS = 5.0
#: What a TLS close waits for the peer's close_notify.
SHUTDOWN_SECONDS = 2.0
#: How long a body no handler read is drained after the answer.
LINGER_SECONDS = 1.0
#: Connections open at once, handshakes included.
MAX_CONNECTIONS = 256
#: One request body, at most: an AdmissionReview holds the object and the old object, each under etcd's 1.5 MiB.
MAX_BODY = 4 * 1024 * 1024
#: The bodies being read, together.
BODY_BUDGET = 16 * 1024 * 1024
#: The listen backlog: connections the kernel completes before the accept (refused over the cap right after it).
#: A burst larger than this overflows it: the kernel then drops the client's last handshake packet, and the
#: connection, open as far as the client knows, waits for the kernel's retries before the server even sees it.
BACKLOG = 1024


async def _close_after(request: web.Request, response: web.StreamResponse) -> None:
    response.force_close()  # the handler ends the connection after this answer
    response.headers["Connection"] = "close"  # aiohttp has written its own headers by the time this signal runs


def close_after_each_response(app: web.Application) -> None:
    """Every answer of `app` says `Connection: close` and ends its connection: the client never sends a request on a
    connection this server may be closing. The idle deadline (`IDLE_SECONDS`, also the header deadline) is far
    shorter than the API server's own for its idle connections (90 s), so a kept-alive connection was closed by us
    just as the API server sent its next AdmissionReview on it: a POST, which Go's transport does not send again,
    and `kubectl apply` failed with "failed calling webhook ...: EOF" (a CI run, e2e/test_pool.py, 2026-11-29).
    Each review dials anew (a TLS handshake, a few ms), as it did whenever the connection had idled 5 s."""
    app.on_response_prepare.append(_close_after)


def runner_options() -> dict[str, Any]:
    """aiohttp's request-handler settings for this server (`web.AppRunner(app, **runner_options())`)."""
    return {"access_log": None, "keepalive_timeout": IDLE_SECONDS, "lingering_time": LINGER_SECONDS}


class _Connection(asyncio.Protocol):
    """The protocol under TLS of one accepted connection: holds its place under the cap until it closes, and hands
    the TLS transport to aiohttp's handler once the handshake is over.

    `start_tls` delivers data decrypted in the same read as the handshake's end before it returns the transport:
    that is kept until the handler is attached. After a failed handshake `connection_lost` may come with no
    handler: the place is freed either way, once."""

    def __init__(self, site: TlsSite) -> None:
        self.site = site
        self.inner: asyncio.Protocol | None = None
        self.early: list[bytes] = []
        self.held = True

    def attach(self, transport: asyncio.BaseTransport) -> None:
        inner = self.site.handler()
        self.inner = inner
        inner.connection_made(transport)
        for data in self.early:
            inner.data_received(data)
        self.early.clear()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.site.open -= 1

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
        else:
            self.early.append(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.release()
        if self.inner is not None:
            self.inner.connection_lost(exc)


class _Accept(asyncio.Protocol):
    """The TCP listener's protocol: refuses a connection over the cap at once, else starts its TLS handshake."""

    def __init__(self, site: TlsSite) -> None:
        self.site = site

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        site = self.site
        if site.open >= site.max_connections:
            transport.abort()
            site.refused()
            return
        site.open += 1
        if site.context is None:  # plain HTTP (`PlainSite`): the request handler takes the connection at once
            plain = _Connection(site)
            transport.set_protocol(plain)
            plain.attach(transport)
            return
        transport.pause_reading()  # the ClientHello waits in the socket for the TLS protocol (start_tls resumes)
        conn = _Connection(site)
        task = asyncio.get_running_loop().create_task(site.upgrade(transport, conn))
        site.upgrading.add(task)
        task.add_done_callback(site.upgrading.discard)

    def data_received(self, data: bytes) -> None:  # reading is paused until start_tls takes the transport
        pass


class TlsSite(web.BaseSite):
    """An aiohttp site listening on TCP and serving TLS, with the connection cap and the handshake deadline of
    this module (`web.TCPSite` with `ssl_context` has neither)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, ssl_context: ssl.SSLContext | None, *,
                 max_connections: int = MAX_CONNECTIONS, handshake_seconds: float = HANDSHAKE_SECONDS,
                 shutdown_seconds: float = SHUTDOWN_SECONDS, backlog: int = BACKLOG,
                 refused_metric: Any = metrics.TLS_REFUSED, sock: socket.socket | None = None) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self.host, self.port = host, port
        self.sock = sock
        self.context = ssl_context
        self.refused_metric = refused_metric
        self.max_connections = max_connections
        self.handshake_seconds, self.shutdown_seconds = handshake_seconds, shutdown_seconds
        self.open = 0
        self.upgrading: set[asyncio.Task[None]] = set()
        self._refused_logged = 0.0
        self._refused_since_log = 0

    @property
    def name(self) -> str:
        return f"{'http' if self.context is None else 'https'}://{self.host}:{self.port}"

    def handler(self) -> asyncio.Protocol:
        server = self._runner.server
        assert server is not None
        return server()

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        if self.sock is not None:  # a socket bound beforehand (its port known before the loop runs)
            self._server = await loop.create_server(lambda: _Accept(self), sock=self.sock, backlog=self._backlog)
        else:
            self._server = await loop.create_server(lambda: _Accept(self), self.host, self.port,
                                                   backlog=self._backlog, reuse_address=True)
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for task in list(self.upgrading):
            task.cancel()
        await super().stop()

    async def upgrade(self, transport: asyncio.Transport, conn: _Connection) -> None:
        loop = asyncio.get_running_loop()
        assert self.context is not None  # (a PlainSite never upgrades)
        try:
            tls = await loop.start_tls(transport, conn, self.context, server_side=True,
                                       ssl_handshake_timeout=self.handshake_seconds,
                                       ssl_shutdown_timeout=self.shutdown_seconds)
        except asyncio.CancelledError:
            conn.release()
            transport.abort()
            raise
        except Exception as exc:  # noqa: BLE001 - ssl.SSLError, the deadline, a reset: start_tls closed the socket
            conn.release()
            transport.abort()
            log.debug("Dropped a connection in its TLS handshake error=%r", exc)
            return
        if tls is None or tls.is_closing():
            conn.release()
            return
        conn.attach(tls)

    def refused(self) -> None:
        """Counts a connection refused over the cap; logs at most once a minute."""
        if self.refused_metric is not None:
            self.refused_metric.inc()
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._refused_logged >= 60:
            log.warning("Refused connections over the cap count=%d max_connections=%d port=%d",
                        self._refused_since_log, self.max_connections, self.port)
            self._refused_logged, self._refused_since_log = now, 0


class PlainSite(TlsSite):
    """An aiohttp site on plain TCP with the connection cap of this module: the request line, headers and body have
    the deadlines of `runner_options` and `body_of`, as on the TLS port."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, max_connections: int = MAX_CONNECTIONS,
                 backlog: int = BACKLOG, refused_metric: Any = None, sock: socket.socket | None = None) -> None:
        super().__init__(runner, host, port, None, max_connections=max_connections, backlog=backlog,
                         refused_metric=refused_metric, sock=sock)


class Budget:
    """Bytes of request bodies being read, together."""

    def __init__(self, total: int) -> None:
        self.total, self.used = total, 0

    def take(self, n: int) -> bool:
        if self.used + n > self.total:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


BODIES = Budget(BODY_BUDGET)


class BodyRefused(Exception):
    """A request body that was not read: the HTTP status and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@contextlib.asynccontextmanager
async def body_of(request: web.Request, *, limit: int = MAX_BODY, seconds: float = BODY_SECONDS,
                  budget: Budget | None = None) -> Any:
    """The request's whole body, read within `seconds` and at most `limit` bytes; its size counts against the
    bodies' budget until the block ends (the decoded review lives that long). `BodyRefused` otherwise."""
    b = budget or BODIES
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyRefused(413, f"the body is {declared} bytes; at most {limit}")
    held = 0
    chunks: list[bytes] = []
    try:
        if declared is not None:
            if not b.take(declared):
                raise BodyRefused(503, "too many large requests at once; retry")
            held = declared
        try:
            async with asyncio.timeout(seconds):
                size = 0
                while chunk := await request.content.readany():
                    size += len(chunk)
                    if size > limit:
                        raise BodyRefused(413, f"the body is over {limit} bytes")
                    if size > held:
                        if not b.take(size - held):
                            raise BodyRefused(503, "too many large requests at once; retry")
                        held = size
                    chunks.append(chunk)
        except TimeoutError:
            raise BodyRefused(408, f"the body did not arrive within {seconds:g}s") from None
        yield b"".join(chunks)
    finally:
        b.give(held)
