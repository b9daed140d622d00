"""`triton-operator fetch-server`: a pool replica's fetch sidecar (issue 29), which places a `uri` model's files in
the replica's repository volume when the operator asks, with the `fetch` step's own code (`agent.fetch.fetch_uri`:
the sha256 and objectVersion pins, the Budget, the archive defences, credentials from the environment, redacted uris).
Its port, paths and key header are the pod contract's (`api.pod`); the operator's client of it is `triton.fetcher`.

The volume (read-write here, read-only in tritonserver, mounted at the same path in both):

    <repo>/<name>                         a symbolic link, `.fetched/<name>/<digest>`: what Triton loads as <name>
    <repo>/.fetched/<name>/<digest>/      one digest's files (version directories, model files, warm-up files)
    <repo>/.fetched/<name>/.<digest>.<attempt>.part a fetch under way (renamed to <digest> once complete and checked)

A digest's directory appears whole (a rename) and the model's link is switched by renaming a new link over it, so
Triton sees either the old digest's files or the new one's, never a mix; a copy Triton serves keeps its files until
the operator has loaded the new digest and asks to `prune` the others. The link is relative: it resolves the same
wherever the volume is mounted. Triton reads a model through a linked directory (tests/test_fetch_server.py loads
one into the real tritonserver).

The API, every request with the pool's repository key in the `triton-operator-key` header (`api.pod.KEY_HEADER`,
compared in constant time; without a key configured every request is refused):

- `GET /v1/models`: `{"models": {name: {"digest", "fetching", "failed": {"digest", "message", "attempt"}}}}`: what
  the volume holds (read back from the links, so a restarted sidecar, or operator, knows), what is being fetched,
  and the last failure.
- `PUT /v1/models/<name>` with `{"digest", "sources": [{"field", "version", "uri", "sha256", "objectVersion"}],
  "files": {path: base64}, "volumeBytes"}` (the volume's sizeLimit, which all fetches share: `_Room`): 200 when
  the digest is held already, else 202 and the fetch runs in a thread of its own (the operator never waits on it);
  409 while another digest of that model is being fetched. The fetch's deadline (`Limits.timeout_seconds`) holds in
  that thread too: a watchdog gives up a fetch blocked past it (`Store._expire`).
- `POST /v1/models/<name>/prune`: removes every digest of the model but the linked one.
- `DELETE /v1/models/<name>`: removes the link and every digest (the operator has unloaded the model); 404 when it
  held none, 409 while it is being fetched.

Every request is bounded before its key is checked (issue 39, M4): aiohttp in one event loop, with the operator's TLS
port's connection cap and deadlines (`FetchServer`), not a thread per connection.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import os
import re
import shutil
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from aiohttp import web

from ..api.pod import FETCH_MODELS_PATH, FETCH_PRUNE, KEY_HEADER
from ..servers import tls_server
from ..uris import redact, shown
from .fetch import BLOCK, MODEL_DIR, Budget, FetchError, fetch_uri, human_size, write_file

log = logging.getLogger("triton_operator.agent.fetch_server")

#: Where a model's digests are kept, inside the repository (hidden: Triton is asked for models by name only).
STORE = ".fetched"
#: A Triton model name, a digest: what may be a path component here.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}$")
_DIGEST = re.compile(r"^[0-9a-f]{8,128}$")
#: The largest request body taken (inline files beside uri sources are small: they fit a ConfigMap).
MAX_BODY = 4 << 20
#: Request bodies being read at once, together: four of the largest (the operator asks a replica a few at a time).
BODY_BUDGET = 4 * MAX_BODY
#: Connections open at once: the operator's questions of a round, with room (more are reset at the accept and asked
#: again next round).
MAX_CONNECTIONS = 64
#: How long past a fetch's own deadline its watchdog gives it up: its Budget ends a fetch that is not blocked itself.
WATCHDOG_GRACE_SECONDS = 1.0


@dataclass
class _Failure:
    digest: str
    message: str
    attempt: int


@dataclass
class Limits:
    """What one fetch may write and how long it may take (the pool's spec.server.fetch)."""

    max_bytes: int
    max_files: int
    timeout_seconds: float


def _tree_bytes(path: Path) -> int:
    """What a tree takes, counted as a fetch's Budget counts: a block per file and directory, and each file's bytes
    (links not followed, not counted)."""
    if path.is_symlink() or not path.exists():
        return 0
    if not path.is_dir():
        return BLOCK + path.stat().st_size
    total = BLOCK
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            total += BLOCK + (st.st_size if name in files and not os.path.islink(os.path.join(root, name)) else 0)
    return total


class _Room(Budget):
    """One fetch's Budget that also charges the repository volume all fetches share (`Store.used`) against the
    `limit` the operator gives with the request (the pool's repositorySizeLimit, the volume's sizeLimit): issue 39,
    M5. Each model's own cap leaves the sum of all models' files (and of their previous digests, kept until pruned)
    to the kubelet, which evicts the whole pod once the emptyDir is over its sizeLimit; here the fetch that would
    overflow it fails instead, with the figures, and the pod and every model it serves stay."""

    def __init__(self, store: Store, limit: int | None, limits: Limits) -> None:
        super().__init__(limits.max_bytes, limits.max_files, limits.timeout_seconds)
        self.store, self.limit = store, limit

    def _full(self, n: int) -> FetchError:
        left = max((self.limit or 0) - self.store.used, 0)
        return FetchError(f"{self.source}: no room in the pool replica's repository volume for {human_size(n)} more "
                          f"(InsufficientPoolCapacity): {human_size(left)} left of its {human_size(self.limit or 0)}, "
                          "spec.server.repositorySizeLimit, which every model placed on the replica shares with the "
                          "previous copy of each until it is pruned")

    def charge(self, n: int) -> None:
        with self.store.volume_lock:
            if self.limit is not None and self.store.used + n > self.limit:
                raise self._full(n)
            self.store.used += n
        try:
            super().charge(n)
        except FetchError:
            with self.store.volume_lock:
                self.store.used -= n
            raise

    def expect(self, n: int) -> None:
        super().expect(n)
        with self.store.volume_lock:
            if self.limit is not None and self.store.used + n > self.limit:
                raise self._full(n)

    def give_back(self, n: int) -> None:
        super().give_back(n)
        with self.store.volume_lock:
            self.store.used -= n

    def release(self) -> None:
        """The fetch's files are gone (it failed, or was given up): what it charged is free again."""
        with self.store.volume_lock:
            self.store.used -= self.bytes


@dataclass
class Store:
    """The repository volume's fetched models, and the fetches under way."""

    repo: Path
    limits: Limits
    lock: threading.Lock = field(default_factory=threading.Lock)
    fetching: dict[str, str] = field(default_factory=dict)  # name -> digest
    running: dict[str, int] = field(default_factory=dict)  # name -> the attempt that fetches it
    failed: dict[str, _Failure] = field(default_factory=dict)
    attempts: int = 0
    used: int = 0  # what the volume holds (`_tree_bytes`), with what fetches under way have written so far
    volume_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        (self.repo / STORE).mkdir(parents=True, exist_ok=True)
        for part in (self.repo / STORE).glob("*/.*.part"):  # a fetch cut by a restart: never complete
            shutil.rmtree(part, ignore_errors=True)
        self.used = sum(_tree_bytes(p) for p in self.repo.iterdir())

    def _remove(self, path: Path) -> None:
        """Removes a tree of the volume, and its bytes from `used`."""
        freed = _tree_bytes(path)
        shutil.rmtree(path, ignore_errors=True)
        with self.volume_lock:
            self.used -= freed

    def _dir(self, name: str) -> Path:
        return self.repo / STORE / name

    def linked(self, name: str) -> str | None:
        """The digest `<repo>/<name>` links to, if it is one of ours."""
        link = self.repo / name
        if not link.is_symlink():
            return None
        target = PurePosixPath(os.readlink(link))
        if target.parts[:2] != (STORE, name) or len(target.parts) != 3 or not (self._dir(name) / target.name).is_dir():
            return None
        return target.name

    def state(self) -> dict[str, Any]:
        with self.lock:
            names = {p.name for p in (self.repo / STORE).iterdir() if p.is_dir()} | set(self.fetching) | set(self.failed)
            out: dict[str, Any] = {}
            for name in sorted(names):
                f = self.failed.get(name)
                out[name] = {"digest": self.linked(name), "fetching": self.fetching.get(name),
                             "failed": None if f is None else {"digest": f.digest, "message": f.message,
                                                               "attempt": f.attempt}}
            return {"models": out}

    def start(self, name: str, digest: str, sources: list[Mapping[str, Any]], files: Mapping[str, bytes],
              volume: int | None = None) -> int:
        """200: held already; 202: fetching (now or already); 409: another digest of it is being fetched."""
        with self.lock:
            if self.linked(name) == digest:
                return 200
            busy = self.fetching.get(name)
            if busy is not None:
                return 202 if busy == digest else 409
            self.fetching[name] = digest
            self.failed.pop(name, None)
            self.attempts += 1
            attempt = self.attempts
            self.running[name] = attempt
        watchdog = threading.Timer(self.limits.timeout_seconds + WATCHDOG_GRACE_SECONDS, self._expire,
                                   (name, digest, attempt))
        watchdog.daemon = True
        watchdog.start()
        budget = _Room(self, volume, self.limits)
        threading.Thread(target=self._fetch, args=(name, digest, sources, files, attempt, watchdog, budget),
                         daemon=True, name=f"fetch-{name}").start()
        return 202

    def _current(self, name: str, attempt: int) -> bool:
        """Whether `attempt` is still the fetch of `name` (not given up by its watchdog); under the lock."""
        return self.running.get(name) == attempt

    def _end(self, name: str, attempt: int, failure: _Failure | None) -> None:
        """Attempt `attempt` of `name` is over (with `failure`, or done); under the lock, and only if it is current."""
        if self._current(name, attempt):
            self.fetching.pop(name, None)
            self.running.pop(name, None)
            if failure is not None:
                self.failed[name] = failure

    def _expire(self, name: str, digest: str, attempt: int) -> None:
        """The fetch's deadline, kept from outside its thread: a thread cannot be interrupted (SIGALRM reaches the
        main thread only), so a fetch blocked in a read (a library that reads a whole chunk before it returns, a
        stuck file system) is given up here: reported failed, its model free for a new fetch or a delete. Its thread
        stops at its next chunk (its Budget's deadline has passed) and leaves nothing behind: its files are in a
        directory of its own attempt, never linked once it is not current."""
        with self.lock:
            if not self._current(name, attempt):
                return
            message = (f"not done within {self.limits.timeout_seconds:g} s, the deadline of the whole fetch "
                       "(spec.server.fetch.timeoutSeconds): given up while blocked")
            self._end(name, attempt, _Failure(digest, message, attempt))
        log.warning("Gave up a fetch past its deadline model=%s digest=%s timeoutSeconds=%g", name, digest,
                    self.limits.timeout_seconds)

    def _fetch(self, name: str, digest: str, sources: list[Mapping[str, Any]], files: Mapping[str, bytes],
               attempt: int, watchdog: threading.Timer, budget: _Room) -> None:
        base = self._dir(name)
        part = base / f".{digest}.{attempt}.part"
        kept = False
        try:
            base.mkdir(exist_ok=True)
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir()
            # One budget for the whole digest, as the fetch step has for a replica's whole repository (and the
            # volume's room, which every fetch shares).
            for src in sources:
                uri, where = str(src["uri"]), str(src.get("field") or "uri")
                log.info("Fetching model files model=%s digest=%s field=%s uri=%s", name, digest, where, shown(uri))
                try:
                    # Into part/<digest>/<version> (fetch_uri's layout: model, then version), moved up below.
                    fetch_uri(digest, uri, part, sha256=src.get("sha256"), object_version=src.get("objectVersion"),
                              version=str(src.get("version") or "1"), budget=budget)
                except (FetchError, OSError) as exc:
                    raise FetchError(f"{where}: {exc}") from exc
            tree = part / digest
            tree.mkdir(exist_ok=True)
            budget.source = "the model's inline files"
            for path, content in sorted(files.items()):
                rel = PurePosixPath(path)
                if rel.is_absolute() or ".." in rel.parts or not rel.parts:
                    raise FetchError(f"inline file {path!r} escapes the model directory")
                target = tree.joinpath(*rel.parts)
                if target.exists():
                    os.unlink(target)  # an inline file replaces a fetched one of its name, as on a model's own replicas
                view = memoryview(content)
                offset = [0]

                def read(n: int, view: memoryview = view, offset: list[int] = offset) -> bytes:
                    chunk = bytes(view[offset[0]:offset[0] + n])
                    offset[0] += len(chunk)
                    return chunk

                write_file(target, read, budget)
            final = base / digest
            with self.lock:
                if not self._current(name, attempt):
                    return  # given up by its watchdog: a newer fetch, or a delete, owns the model now
                self._remove(final)
                tree.rename(final)  # the digest's files appear whole
                kept = True
                self._link(name, digest)
                self._end(name, attempt, None)
                self._drop(name, keep={digest, *([] if (d := self._previous(name, digest)) is None else [d])})
            log.info("Fetched model files model=%s digest=%s bytes=%d files=%d", name, digest, budget.bytes,
                     budget.files)
        except Exception as exc:  # noqa: BLE001 - a fetch's failure is reported to the operator, whatever it is
            message = redact(str(exc) if isinstance(exc, FetchError) else f"{type(exc).__name__}: {exc}")
            log.warning("Failed to fetch model files model=%s digest=%s error=%s", name, digest, message)
            with self.lock:
                self._end(name, attempt, _Failure(digest, message[:1000], attempt))
        finally:
            watchdog.cancel()
            shutil.rmtree(part, ignore_errors=True)
            if not kept:
                budget.release()

    def _previous(self, name: str, digest: str) -> str | None:
        """The digest linked before `digest` (still served until the operator reloads): recorded beside the link."""
        mark = self._dir(name) / ".previous"
        return mark.read_text() if mark.is_file() else None

    def _link(self, name: str, digest: str) -> None:
        """Points `<repo>/<name>` at `digest` atomically (a new link renamed over the old one)."""
        before = self.linked(name)
        if before is not None and before != digest:
            (self._dir(name) / ".previous").write_text(before)
        tmp = self.repo / f".{name}.link"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(f"{STORE}/{name}/{digest}")
        os.replace(tmp, self.repo / name)

    def _drop(self, name: str, keep: set[str]) -> None:
        base = self._dir(name)
        for entry in base.iterdir() if base.is_dir() else ():
            if entry.is_dir() and not entry.name.startswith(".") and entry.name not in keep:
                self._remove(entry)
        mark = base / ".previous"
        if mark.is_file() and mark.read_text() not in keep:
            mark.unlink()

    def prune(self, name: str) -> None:
        with self.lock:
            linked = self.linked(name)
            self._drop(name, keep={linked} if linked else set())

    def delete(self, name: str) -> int:
        """Removes the model's link and files: 200; 404 when there were none; 409 while it is being fetched (asked
        again later)."""
        with self.lock:
            if name in self.fetching:
                return 409
            link, base = self.repo / name, self._dir(name)
            held = link.is_symlink() or base.exists()
            if link.is_symlink():
                link.unlink()
            self._remove(base)
            self.failed.pop(name, None)
            return 200 if held else 404


def _answer(status: int, body: Mapping[str, Any]) -> web.Response:
    return web.json_response(body, status=status)


def _refusal(request: web.Request, key: str | None) -> web.Response | None:
    """The answer to a request without the key (401), or to any when none is configured (403); None when it has it."""
    given = request.headers.get(KEY_HEADER)
    if key is None:
        return _answer(403, {"error": "no repository key is configured: this sidecar answers no request"})
    if given is None or not hmac.compare_digest(given.encode(), key.encode()):
        return _answer(401, {"error": f"a request needs the pool's key in header {KEY_HEADER}"})
    return None


def _named(request: web.Request) -> tuple[str | None, str]:
    """(model, the path after it) of `FETCH_MODELS_PATH/<name>[/<rest>]`, from the path as sent; (None, "") for
    another."""
    root = FETCH_MODELS_PATH.strip("/").split("/")
    parts = request.raw_path.split("?", 1)[0].strip("/").split("/")
    if len(parts) < len(root) + 1 or parts[:len(root)] != root or not _NAME.match(parts[len(root)]):
        return None, ""
    return parts[len(root)], "/".join(parts[len(root) + 1:])


def _put_body(body: Any) -> tuple[str, list[Mapping[str, Any]], dict[str, bytes], int | None] | web.Response:
    """(digest, sources, decoded files) of a PUT's body, or the 400 that refuses it."""
    if not isinstance(body, dict):
        return _answer(400, {"error": "the body is a JSON object"})
    digest, sources, files = body.get("digest"), body.get("sources"), body.get("files") or {}
    volume = body.get("volumeBytes")
    if (volume is not None and (not isinstance(volume, int) or isinstance(volume, bool) or volume < 0)) or (
            not isinstance(digest, str) or not _DIGEST.match(digest) or not isinstance(sources, list)
            or not all(isinstance(s, dict) and isinstance(s.get("uri"), str) for s in sources)
            or not all(str(s.get("version") or "1") == MODEL_DIR or str(s.get("version") or "1").isdigit()
                       for s in sources)
            or not isinstance(files, dict)):
        return _answer(400, {"error": "the body is {digest: hex, sources: [{uri, version, ...}], files: {}}"})
    try:
        decoded = {str(p): base64.b64decode(str(c), validate=True) for p, c in files.items()}
    except ValueError:
        return _answer(400, {"error": "files are base64"})
    return digest, sources, decoded, volume


class FetchServer:
    """The sidecar's HTTP server: bound at once (`server_address`), serving in an event loop of its own from
    `serve_forever` until `shutdown` (from another thread), as a socketserver is driven.

    Bounds (issue 39, M4): requests are read by aiohttp in one event loop on a `servers.tls_server.PlainSite`, as the
    operator's TLS port: at most `MAX_CONNECTIONS` open (more are reset at the accept), the request line and headers
    within `tls_server.IDLE_SECONDS`, a body within `tls_server.BODY_SECONDS`, at most `MAX_BODY` bytes (a
    Content-Length that is not a number of 0 or more is a 400 of aiohttp's parser), and `BODY_BUDGET` bytes of bodies
    at once. All of it before the key is checked, and no thread per connection: the store's file work runs in worker
    threads, a fetch in a thread of its own."""

    def __init__(self, address: tuple[str, int], store: Store, key: str | None) -> None:
        self.store = store
        self.key = key or None
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.create_server(address, family=family, backlog=tls_server.BACKLOG)
        self.server_address = self.socket.getsockname()
        self.bodies = tls_server.Budget(BODY_BUDGET)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._serving = threading.Event()
        self._done = threading.Event()

    def serve_forever(self) -> None:
        try:
            asyncio.run(self._serve())
        finally:
            self._done.set()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stops `serve_forever` (called from another thread) and waits for it to return."""
        if not self._serving.wait(timeout) or self._loop is None or self._stop is None:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._done.wait(timeout)

    def server_close(self) -> None:
        self.socket.close()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(app, **tls_server.runner_options())
        await runner.setup()
        host, port = self.server_address[:2]
        site = tls_server.PlainSite(runner, host, port, max_connections=MAX_CONNECTIONS, sock=self.socket)
        await site.start()
        self._serving.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    async def _dispatch(self, request: web.Request) -> web.Response:
        refused = _refusal(request, self.key)
        if refused is not None:
            return refused
        method = request.method
        if method == "GET":
            if request.raw_path.split("?", 1)[0].rstrip("/") != FETCH_MODELS_PATH:
                return _answer(404, {"error": "not found"})
            return _answer(200, await asyncio.to_thread(self.store.state))
        name, after = _named(request)
        if method not in ("PUT", "POST", "DELETE"):
            return _answer(405, {"error": f"{method} is not served"})
        if name is None or after != (FETCH_PRUNE if method == "POST" else ""):
            return _answer(404, {"error": "not found"})
        if method == "POST":
            await asyncio.to_thread(self.store.prune, name)
            return _answer(200, {"model": name})
        if method == "DELETE":
            status = await asyncio.to_thread(self.store.delete, name)
            return _answer(status, {"model": name, **({"error": f"model {name} is being fetched"}
                                                      if status == 409 else {})})
        return await self._put(request, name)

    async def _put(self, request: web.Request, name: str) -> web.Response:
        try:
            async with tls_server.body_of(request, limit=MAX_BODY, budget=self.bodies) as raw:
                try:
                    parsed = _put_body(json.loads(raw or b"{}"))
                except (ValueError, RecursionError):
                    parsed = _answer(400, {"error": "the body is a JSON object"})
        except tls_server.BodyRefused as exc:
            return _answer(exc.status, {"error": exc.reason})
        if isinstance(parsed, web.Response):
            return parsed
        digest, sources, files, volume = parsed
        status = await asyncio.to_thread(self.store.start, name, digest, sources, files, volume)
        return _answer(status, {"model": name, "digest": digest})


def serve(address: tuple[str, int], repo: Path, limits: Limits, key: str | None) -> FetchServer:
    """A server bound to `address` (not yet serving: call serve_forever)."""
    return FetchServer(address, Store(repo, limits), key)
