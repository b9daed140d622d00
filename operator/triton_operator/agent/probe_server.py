"""The probe container's HTTP server (`agent.probe` says what it answers): connections, deadlines and the cap, in
one thread that owns every socket, so that what other clients do cannot keep the kubelet's readiness probe from
its answer (issue 39, M2).

The threat. Anything that reaches the pod reaches this port, without credentials: the kubelet cannot send a secret.
The server before this one gave each connection a thread, 32 at most, with a 5 s timeout on each read: 32 clients
that each sent a byte every 3 s held every slot forever, and the kubelet's probe was closed unanswered. With the
probe's `failureThreshold: 1`, one such failure takes the replica (on a pool, every model on it) out of its
Services.

What the kubelet does, and so what must hold. It connects to the pod's address, sends `GET /ready` at once (one
small write, within a millisecond of the connect on the node), and waits up to the probe's timeout (the hold plus
2 s). So a connection that has not sent its whole request a moment after its connect is not the kubelet's, and an
answer to a complete `GET /ready` is all the kubelet needs, whenever it comes within the hold.

How. Sockets are non-blocking, in one `selectors` loop: a connection costs a few hundred bytes, never a thread.
- Whole-request deadline: the request line, the headers and a body (at most `MAX_BODY` bytes; only `POST /gate` has
  one, empty) must all arrive within `REQUEST_SECONDS` of the connect, however the client paces them; a head over
  `MAX_HEAD` bytes is refused. An answer must be taken within `WRITE_SECONDS` (it is a few hundred bytes: the kernel
  takes it at once).
- The cap (`MAX_CONNECTIONS`, 1024) never refuses a newcomer: when it is reached, the connection with least claim
  goes. That is one whose request is not complete, from the source address that holds the most such connections,
  the oldest of those; and before it goes, what it has sent is read: a request complete in the kernel's buffer is
  served, not evicted. So an attacker in another pod evicts only its own connections, however many it opens: the
  kubelet's (from the node's address) is never the victim while another address holds as many unfinished ones. An
  attacker on the node's own address (host network: it could do far worse) is told apart only by time: the kubelet's
  connection goes only if more than the cap of connections arrive between its connect and its request's arrival,
  and the loop accepts a few thousand a second, so its request has a tenth of a second or more, where it needs a
  millisecond. A full server with no unfinished connection answers the oldest held `GET /ready` now (below).
  Sockets stay under twice the cap (answers being written), and the soft limit on open files is raised for them.
- Held requests. A complete `GET /ready` is held by `Readiness` up to the hold, in a worker thread (one of
  `MAX_HELD`: the kubelet holds one at a time). When a new one comes with every worker busy, the oldest held is
  answered now, with the verdict it would give at the end of its hold: ready if the replica passes, not ready and
  why if not (`Work.now`: from the last check of tritonserver's port, in the loop, no I/O; the held worker stops
  and its answer is dropped). That is a correct answer for the kubelet, which then asks again on its next period;
  only the long poll's speed (a pass or a break seen within milliseconds rather than on the next period) is lost,
  and only while someone floods the port with complete requests. A flood of those costs its sender as much as it costs us.
- The operator's requests (`POST /gate`, `GET /status`) need the replica's key (`agent.probe`); they have workers
  of their own (`MAX_OPERATOR`), so the kubelet's held probes and the operator's never wait on each other, and an
  outsider cannot take the operator's.

Why not a path token for `/ready`. The kubelet sends only what the pod spec says (a path, `httpHeaders`), and the
pod spec is readable by whoever may read pods: a token there is public to the cluster's readers and secret from
no attacker who matters. It would not stop the attack either: slots are taken by connections that never send a
request, token or not. `/ready` changes nothing (the gate notice is `/gate`, keyed), and an outsider's probe cannot
take the kubelet's news from it nor hold its pass back (`Readiness.answer` judges each probe by what its client
address was last told), so it stays keyless; its answer says no more than the pod's Ready condition and its
Events do.

Standard library only: the probe runs in every replica, and starts in a fraction of a second.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

#: The request line, headers and body must all have arrived within this long of the connect.
REQUEST_SECONDS = 2.0
#: A client must take its answer within this long.
WRITE_SECONDS = 2.0
#: Connections open at once; past it, a newcomer evicts the one with least claim (see the module's docstring). At
#: most twice as many sockets are open (answers still being written); the file limit is raised for them.
MAX_CONNECTIONS = 1024
#: Held `GET /ready` requests (a worker thread each); past it, the oldest is answered now with its verdict.
MAX_HELD = 8
#: The operator's requests in progress (a worker thread each); past it, 503.
MAX_OPERATOR = 4
#: The request line and headers, in bytes.
MAX_HEAD = 8192
#: A request body, in bytes.
MAX_BODY = 1024
#: The listen backlog: connections the kernel completes while the loop is busy.
BACKLOG = 1024

READING, WORKING, WRITING, CLOSED = "reading", "working", "writing", "closed"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    peer: str = ""  # the client's address


@dataclass(frozen=True)
class Answer:
    code: int
    text: str
    content_type: str = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Work:
    """An answer that takes time, made in a worker thread: `run(cut)` returns it, and returns early once `cut` is set
    (`wake` is called after setting it). `held`: a kubelet-style probe (MAX_HELD), which may be cut short: it is then
    answered at once, in the loop, with `now()` (quick: no I/O), and its worker's answer is dropped. Otherwise the
    operator's (MAX_OPERATOR)."""

    run: Callable[[threading.Event], Answer]
    held: bool = False
    wake: Callable[[], None] | None = None
    now: Callable[[], Answer] | None = None


Route = Callable[[Request], Answer | Work]

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 409: "Conflict", 413: "Content Too Large", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}


def encode(answer: Answer) -> bytes:
    body = (answer.text + "\n").encode()
    head = (f"HTTP/1.1 {answer.code} {REASONS.get(answer.code, 'Status')}\r\nContent-Type: {answer.content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def parse(buf: bytes) -> Request | Answer | None:
    """The request in `buf`: a Request, an Answer refusing it, or None while it is incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return Answer(431, "request head too large") if len(buf) > MAX_HEAD else None
    if end > MAX_HEAD:
        return Answer(431, "request head too large")
    lines = buf[:end].decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return Answer(400, "bad request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return Answer(400, "bad header")
        headers[name.lower()] = value.strip()
    if "transfer-encoding" in headers:
        return Answer(501, "no chunked bodies here")
    length = headers.get("content-length", "0")
    if not length.isdigit():  # a negative or malformed length
        return Answer(400, "bad Content-Length")
    if int(length) > MAX_BODY:
        return Answer(413, "body too large")
    body = buf[end + 4:end + 4 + int(length)]
    if len(body) < int(length):
        return None
    return Request(parts[0], parts[1], headers, bytes(body))


def fd_budget(connections: int) -> int:
    """The connections this process can hold (twice as many sockets, and room for the rest), raising its soft limit
    on open files toward the hard one when it is lower (a container's default may be 1024)."""
    import resource

    need = 2 * connections + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        except (ValueError, OSError):
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return connections if soft == resource.RLIM_INFINITY else max(8, min(connections, (soft - 64) // 2))


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    source: str
    started: float
    buf: bytearray = field(default_factory=bytearray)
    state: str = READING
    out: bytes = b""
    write_by: float = 0.0
    cut: threading.Event | None = None
    work: Work | None = None


class ProbeServer:
    """The loop (`serve_forever`, one thread) and its workers. `route` turns each complete request into an Answer
    (written at once) or Work (done by a worker). `shutdown` from any thread."""

    def __init__(self, listen: tuple[str, int], route: Route, max_connections: int = MAX_CONNECTIONS,
                 max_held: int = MAX_HELD, max_operator: int = MAX_OPERATOR, request_seconds: float = REQUEST_SECONDS,
                 write_seconds: float = WRITE_SECONDS) -> None:
        self.route = route
        max_connections = fd_budget(max_connections)
        self.max_connections, self.max_held, self.max_operator = max_connections, max_held, max_operator
        self.request_seconds, self.write_seconds = request_seconds, write_seconds
        self.listener = socket.create_server(listen, backlog=BACKLOG)
        self.listener.setblocking(False)
        self.address = self.listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.conns: set[Conn] = set()
        self.reading: OrderedDict[Conn, None] = OrderedDict()  # in connect order: the front's deadline comes first
        self.reading_from: dict[str, OrderedDict[Conn, None]] = {}
        self.held: OrderedDict[Conn, None] = OrderedDict()
        self.writing: OrderedDict[Conn, None] = OrderedDict()
        self.operator_busy = 0
        self.evicted = 0  # connections closed to make room (for tests and logs)
        # Two pools of workers: the held probes' and the operator's never wait on each other.
        self._jobs: queue.SimpleQueue[tuple[Conn, Work] | None] = queue.SimpleQueue()
        self._operator_jobs: queue.SimpleQueue[tuple[Conn, Work] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[Conn, Work, Answer]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._workers = [threading.Thread(target=self._work, args=(self._jobs,), daemon=True, name=f"probe-held-{i}")
                         for i in range(max_held)]
        self._workers += [threading.Thread(target=self._work, args=(self._operator_jobs,), daemon=True,
                                           name=f"probe-operator-{i}") for i in range(max_operator)]
        for t in self._workers:
            t.start()

    # -- the loop ------------------------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                for key, events in self.sel.select(self._timeout()):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._drain_wake()
                    else:
                        conn = key.data
                        if events & selectors.EVENT_READ:
                            self._pull(conn)
                        if events & selectors.EVENT_WRITE:
                            self._flush(conn)
                self._finish_work()
                self._expire(time.monotonic())
        finally:
            for conn in list(self.conns):
                self._close(conn)
            for _ in range(self.max_held):
                self._jobs.put(None)
            for _ in range(self.max_operator):
                self._operator_jobs.put(None)
            self.sel.close()
            self.listener.close()
            self._wake_r.close()
            self._wake_w.close()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()

    def _timeout(self) -> float:
        now = time.monotonic()
        at = now + 0.5
        if self.reading:
            at = min(at, next(iter(self.reading)).started + self.request_seconds)
        if self.writing:
            at = min(at, next(iter(self.writing)).write_by)
        return max(0.0, at - now)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (the loop wakes anyway) or closed (shut down)
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    # -- connections ---------------------------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(64):  # then the others' reads get their turn
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors: make room, and take it on the next turn
                self._make_room()
                return
            sock.setblocking(False)
            if len(self.conns) >= self.max_connections and not self._make_room():
                sock.close()  # only the operator's and answers being written are open: never the kubelet's case
                continue
            conn = Conn(sock, str(peer[0]), time.monotonic())
            self.conns.add(conn)
            self.reading[conn] = None
            self.reading_from.setdefault(conn.source, OrderedDict())[conn] = None
            self.sel.register(sock, selectors.EVENT_READ, conn)
            self._pull(conn)  # a local client's request is often there already

    def _make_room(self) -> bool:
        """Closes the unfinished connection with least claim (its request, if complete in the buffer, is served
        instead, and the next one is tried), or cuts the oldest held probe short. False if neither was possible."""
        while self.reading_from:
            crowd = max(self.reading_from.values(), key=len)
            victim = next(iter(crowd))
            self._pull(victim)
            if victim.state == CLOSED:  # it had gone
                return True
            if victim.state == READING:
                self.evicted += 1
                self._close(victim)
                return True
        if self.held:
            self._cut(next(iter(self.held)))
            return len(self.conns) < 2 * self.max_connections
        return False

    def _pull(self, conn: Conn) -> None:
        """Reads what `conn` has sent; a complete request is routed. EOF closes (and cuts its work short)."""
        for _ in range(16):
            if conn.state == CLOSED:
                return
            try:
                data = conn.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(conn)
                return
            if not data:
                self._close(conn)
                return
            if conn.state != READING:
                continue  # nothing more is read once the request is complete
            conn.buf += data
            request = parse(bytes(conn.buf))
            if request is not None:
                self._unread(conn)
                self._dispatch(conn, replace(request, peer=conn.source) if isinstance(request, Request) else request)

    def _unread(self, conn: Conn) -> None:
        self.reading.pop(conn, None)
        mine = self.reading_from.get(conn.source)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.reading_from[conn.source]

    def _dispatch(self, conn: Conn, request: Request | Answer) -> None:
        conn.buf = bytearray()
        try:
            routed = request if isinstance(request, Answer) else self.route(request)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the loop
            routed = Answer(500, f"error: {exc}")
        if isinstance(routed, Answer):
            self._respond(conn, routed)
            return
        if not routed.held:
            if self.operator_busy >= self.max_operator:
                self._respond(conn, Answer(503, "busy"))
                return
            self.operator_busy += 1
        else:
            if len(self.held) >= self.max_held:
                self._cut(next(iter(self.held)))
            self.held[conn] = None
        conn.state, conn.work, conn.cut = WORKING, routed, threading.Event()
        (self._jobs if routed.held else self._operator_jobs).put((conn, routed))

    def _cut(self, conn: Conn, answer: bool = True) -> None:
        """Its held request is answered now (`answer`), with its current verdict; its worker stops early."""
        self.held.pop(conn, None)
        if conn.cut is None or conn.cut.is_set() or conn.work is None:
            return
        conn.cut.set()
        if conn.work.wake is not None:
            conn.work.wake()
        if answer and conn.work.now is not None and conn.state == WORKING:
            try:
                now = conn.work.now()
            except Exception as exc:  # noqa: BLE001 - answered, and the loop lives on
                now = Answer(500, f"error: {exc}")
            self._respond(conn, now)

    def _respond(self, conn: Conn, answer: Answer) -> None:
        if conn.state == CLOSED:
            return
        conn.state, conn.out = WRITING, encode(answer)
        conn.write_by = time.monotonic() + self.write_seconds
        self._flush(conn)
        if conn.state == WRITING:
            self.writing[conn] = None
            self.sel.modify(conn.sock, selectors.EVENT_WRITE, conn)

    def _flush(self, conn: Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._close(conn)

    def _expire(self, now: float) -> None:
        while self.reading:
            conn = next(iter(self.reading))
            if conn.started + self.request_seconds > now:
                break
            self._unread(conn)
            try:  # best effort: a client that sends this slowly may not read either
                conn.sock.send(encode(Answer(408, f"the request must arrive whole within {self.request_seconds:g} s")))
            except OSError:
                pass
            self._close(conn)
        while self.writing:
            conn = next(iter(self.writing))
            if conn.write_by > now:
                break
            self._close(conn)

    def _close(self, conn: Conn) -> None:
        if conn.state == CLOSED:
            return
        if conn.state == WORKING:
            self._cut(conn, answer=False)  # its worker stops early; the answer is dropped
        conn.state = CLOSED
        self._unread(conn)
        self.held.pop(conn, None)
        self.writing.pop(conn, None)
        self.conns.discard(conn)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    # -- workers -------------------------------------------------------------------------------------------------

    def _work(self, jobs: queue.SimpleQueue[tuple[Conn, Work] | None]) -> None:
        while (job := jobs.get()) is not None:
            conn, work = job
            assert conn.cut is not None
            if conn.cut.is_set() and work.now is not None:
                answer = Answer(500, "cut short")  # answered by the loop already (or its client has gone): dropped
            else:
                try:
                    answer = work.run(conn.cut)
                except Exception as exc:  # noqa: BLE001 - answered, and the worker lives on
                    answer = Answer(500, f"error: {exc}")
            self._done.put((conn, work, answer))
            self._wake()

    def _finish_work(self) -> None:
        while True:
            try:
                conn, work, answer = self._done.get_nowait()
            except queue.Empty:
                return
            if not work.held:
                self.operator_busy -= 1
            self.held.pop(conn, None)
            if conn.state == WORKING:
                self._respond(conn, answer)
