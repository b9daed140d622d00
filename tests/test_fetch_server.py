"""The pool replica's `fetch-server` sidecar (triton_operator.agent.fetch_server) over real HTTP, fetching from a REAL
HTTPS server on 127.0.0.1 (tests/https_server.py) into a real directory: the key is required, a digest's files
appear whole behind the model's link, a new digest swaps the link and leaves the served copy's files until pruned, a
bad pin or a 404 is reported with the field and a redacted uri and leaves the linked copy alone, and a delete frees
the model's files."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fetch_server_client import KEY
from tests.fetch_server_client import ask as _ask
from tests.fetch_server_client import settled as _settled
from tests.hostile_servers import closed_within, over_the_cap
from tests.https_server import HttpsServer, serve, tgz
from tests.timing import scaled
from triton_operator.agent.fetch_server import STORE, FetchServer, Limits
from triton_operator.agent.fetch_server import serve as fetch_serve
from triton_operator.api.pod import KEY_HEADER as KEY_HEADER_NAME


@pytest.fixture
def https(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpsServer]:
    gen = serve(tmp_path_factory.mktemp("https"))
    server = next(gen)
    monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
    yield server
    gen.close()


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[FetchServer]:
    server = fetch_serve(("127.0.0.1", 0), tmp_path / "models", Limits(1 << 20, 100, 30), KEY)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


def _put(server: FetchServer, name: str, digest: str, uri: str, sha: str, **extra: Any) -> int:
    status, _ = _ask(server, "PUT", f"/v1/models/{name}", {
        "digest": digest, "sources": [{"field": "spec.source.uri", "version": "1", "uri": uri, "sha256": sha}],
        **extra})
    return status


def test_every_request_needs_the_key(sidecar: FetchServer, tmp_path: Path) -> None:
    for key in (None, "wrong", KEY[:-1]):
        assert _ask(sidecar, "GET", "/v1/models", key=key)[0] == 401
        assert _ask(sidecar, "PUT", "/v1/models/m", {"digest": "ab" * 8, "sources": []}, key=key)[0] == 401
        assert _ask(sidecar, "DELETE", "/v1/models/m", key=key)[0] == 401
    assert _ask(sidecar, "GET", "/v1/models")[0] == 200
    keyless = fetch_serve(("127.0.0.1", 0), tmp_path / "other", Limits(1 << 20, 100, 30), None)
    thread = threading.Thread(target=keyless.serve_forever, daemon=True)
    thread.start()
    try:
        assert _ask(keyless, "GET", "/v1/models", key="")[0] == 403  # no key configured: nothing is answered
        assert _ask(keyless, "GET", "/v1/models")[0] == 403
    finally:
        keyless.shutdown()
        keyless.server_close()


def test_a_name_or_path_that_is_not_a_model_is_refused(sidecar: FetchServer) -> None:
    assert _ask(sidecar, "PUT", "/v1/models/..", {"digest": "ab" * 8, "sources": []})[0] == 404
    assert _ask(sidecar, "PUT", "/v1/models/m", {"digest": "../x", "sources": []})[0] == 400
    assert _ask(sidecar, "PUT", "/v1/models/m", {"digest": "ab" * 8, "sources": [{"uri": "x", "version": "../1"}]})[0] == 400
    assert _ask(sidecar, "GET", "/v1/other")[0] == 404


def test_a_digest_is_fetched_behind_the_link_swapped_in_place_and_deleted(sidecar: FetchServer, https: HttpsServer,
                                                                         tmp_path: Path) -> None:
    repo = tmp_path / "models"
    one, two = tgz({"model.py": b"# one\n"}), tgz({"model.py": b"# two\n", "extra.txt": b"x"})
    https["/one.tgz"], https["/two.tgz"] = one, two
    d1, d2 = "a1" * 16, "b2" * 16
    assert _put(sidecar, "m", d1, https.url("/one.tgz?sig=secret"), hashlib.sha256(one).hexdigest(),
                files={"warmup/in": base64.b64encode(b"\0" * 16).decode()}) == 202
    assert _settled(sidecar, "m") == {"digest": d1, "fetching": None, "failed": None}
    assert os.readlink(repo / "m") == f"{STORE}/m/{d1}"
    assert (repo / "m" / "1" / "model.py").read_bytes() == b"# one\n"
    assert (repo / "m" / "warmup" / "in").read_bytes() == b"\0" * 16
    assert _put(sidecar, "m", d1, https.url("/one.tgz"), hashlib.sha256(one).hexdigest()) == 200  # held: no fetch
    assert https.requests.count("/one.tgz?sig=secret") == 1

    # A new pin: the link swaps to the new digest; the old one's files stay (Triton may serve them) until pruned.
    assert _put(sidecar, "m", d2, https.url("/two.tgz"), hashlib.sha256(two).hexdigest()) == 202
    assert _settled(sidecar, "m")["digest"] == d2
    assert (repo / "m" / "1" / "model.py").read_bytes() == b"# two\n"
    assert (repo / STORE / "m" / d1 / "1" / "model.py").is_file()
    assert _ask(sidecar, "POST", "/v1/models/m/prune")[0] == 200
    assert sorted(p.name for p in (repo / STORE / "m").iterdir() if not p.name.startswith(".")) == [d2]

    # A restarted sidecar reads what it holds back from the volume.
    again = fetch_serve(("127.0.0.1", 0), repo, Limits(1 << 20, 100, 30), KEY)
    assert again.store.state()["models"]["m"]["digest"] == d2
    again.server_close()

    assert _ask(sidecar, "DELETE", "/v1/models/m")[0] == 200
    assert sorted(p.name for p in repo.iterdir()) == [STORE]
    assert list((repo / STORE).iterdir()) == []


@pytest.mark.parametrize("problem", ["sha256", "404", "over budget"])
def test_a_failed_fetch_says_which_field_and_uri_and_leaves_the_linked_copy(sidecar: FetchServer, https: HttpsServer,
                                                                            tmp_path: Path, problem: str) -> None:
    repo = tmp_path / "models"
    good = tgz({"model.py": b"# good\n"})
    https["/good.tgz"] = good
    d1, d2 = "c3" * 16, "d4" * 16
    assert _put(sidecar, "m", d1, https.url("/good.tgz"), hashlib.sha256(good).hexdigest()) == 202
    assert _settled(sidecar, "m")["digest"] == d1
    big = os.urandom(2 << 20)
    https["/big.bin"] = big
    uri, sha = {"sha256": (https.url("/good.tgz?token=hush"), "0" * 64),
                "404": (https.url("/missing.tgz?token=hush"), "0" * 64),
                "over budget": (https.url("/big.bin?token=hush"), hashlib.sha256(big).hexdigest())}[problem]
    assert _put(sidecar, "m", d2, uri, sha) == 202
    state = _settled(sidecar, "m")
    assert state["digest"] == d1, state  # the served copy is left alone
    failed = state["failed"]
    assert failed["digest"] == d2
    assert failed["message"].startswith("spec.source.uri: "), failed
    assert "hush" not in failed["message"] and "<redacted>" in failed["message"], failed
    assert {"sha256": "sha256", "404": "404", "over budget": "maxBytes"}[problem] in failed["message"], failed
    assert (repo / "m" / "1" / "model.py").read_bytes() == b"# good\n"
    assert sorted(p.name for p in (repo / STORE / "m").iterdir() if p.is_dir()) == [d1]  # nothing half-written


def test_a_fetch_blocked_past_its_deadline_is_given_up_in_its_thread(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A fetch runs in a thread of its own, where no SIGALRM reaches: one blocked in a read (here the open of a
    fifo on a claim, as a stuck file system blocks) is reported failed at its deadline, and the model can be deleted
    (issue 39: it stayed `fetching` forever, and DELETE answered 409)."""
    from triton_operator.agent import fetch

    claim = tmp_path / "pvc" / "claim"
    claim.mkdir(parents=True)
    os.mkfifo(claim / "model.onnx")
    monkeypatch.setattr(fetch, "PVC_ROOT", tmp_path / "pvc")
    server = fetch_serve(("127.0.0.1", 0), tmp_path / "models", Limits(1 << 20, 100, 1), KEY)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        status, _ = _ask(server, "PUT", "/v1/models/m", {"digest": "e5" * 16, "sources": [
            {"field": "spec.source.uri", "version": "1", "uri": "pvc://claim/model.onnx"}]})
        assert status == 202
        state = _settled(server, "m", timeout=30)
        assert state["failed"] is not None and "timeoutSeconds" in state["failed"]["message"], state
        assert _ask(server, "DELETE", "/v1/models/m")[0] == 200
    finally:
        fd = os.open(claim / "model.onnx", os.O_WRONLY | os.O_NONBLOCK)  # lets the blocked open return (EOF)
        os.close(fd)
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_negative_content_length_is_refused_before_the_body_is_read(sidecar: FetchServer) -> None:
    """`Content-Length: -1` read the body to its end, past the 4 MiB cap (issue 39); now a 400 before any of it."""
    import json
    import socket

    from triton_operator.agent.fetch_server import MAX_BODY
    from triton_operator.api.pod import KEY_HEADER

    body = json.dumps({"digest": "f6" * 16, "sources": [], "pad": "x" * (MAX_BODY + 1)}).encode()
    with socket.create_connection(("127.0.0.1", sidecar.server_address[1]), timeout=20) as sock:
        sock.sendall(f"PUT /v1/models/m HTTP/1.1\r\nHost: x\r\n{KEY_HEADER}: {KEY}\r\n"
                     "Content-Length: -1\r\n\r\n".encode())
        sock.sendall(body[:65536])
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert "m" not in _ask(sidecar, "GET", "/v1/models")[1]["models"]




#: Closed "within seconds": the server's deadline for the stage, and this much more for a busy machine.
MARGIN = 4.0


def test_slow_clients_are_closed_within_seconds_before_the_key_is_checked(sidecar: FetchServer) -> None:
    """Issue 39, M4: the sidecar started a thread per connection and never timed one out, before it checked the key.
    Now an idle connection, headers a line at a time and a body a byte at a time are each cut off within seconds."""
    import select
    import socket

    from triton_operator.servers import tls_server

    port = sidecar.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
        took = closed_within(idle, tls_server.IDLE_SECONDS + MARGIN + 10)
    assert took is not None and took < tls_server.IDLE_SECONDS + MARGIN, took
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.sendall(b"PUT /v1/models/m HTTP/1.1\r\nHost: x\r\n")
        closed = None
        for i in range(60):  # a header line every half second, for up to 30 s
            try:
                slow.sendall(f"X-Slow-{i}: y\r\n".encode())
            except ConnectionError:
                closed = i * 0.5
                break
            if closed_within(slow, 0.5) is not None:
                closed = i * 0.5
                break
    assert closed is not None and closed < tls_server.IDLE_SECONDS + MARGIN, closed
    with socket.create_connection(("127.0.0.1", port), timeout=10) as trickle:
        trickle.sendall(b"PUT /v1/models/m HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
                        + f"{KEY_HEADER_NAME}: {KEY}\r\n\r\n{{".encode())
        answer = b""
        for _ in range(60):  # a byte every half second, for up to 30 s
            try:
                trickle.sendall(b" ")
                readable, _, _ = select.select([trickle], [], [], 0.5)
                chunk = trickle.recv(4096) if readable else None
            except ConnectionError:
                break
            if chunk == b"":
                break
            answer += chunk or b""
            if b"\r\n\r\n" in answer:
                break
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_connections_over_the_cap_are_reset_and_hold_no_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from triton_operator.agent import fetch_server

    cap, extra = 8, 8
    monkeypatch.setattr(fetch_server, "MAX_CONNECTIONS", cap)
    server = fetch_serve(("127.0.0.1", 0), tmp_path / "models", Limits(1 << 20, 100, 30), KEY)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert _ask(server, "GET", "/v1/models")[0] == 200
        threads = threading.active_count()
        port = server.server_address[1]
        with over_the_cap(port, cap, extra):
            assert threading.active_count() == threads, "connections started threads"
        deadline = time.monotonic() + scaled(20)
        while True:  # their places are free again once they close
            try:
                assert _ask(server, "GET", "/v1/models")[0] == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "the sidecar refused requests after the others had gone"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_models_whose_files_together_exceed_the_volume_fail_to_fetch_instead_of_filling_it(
        sidecar: FetchServer, https: HttpsServer, tmp_path: Path) -> None:
    """Issue 39, M5: each fetch kept under its own cap, but the sum of every model's files could pass the volume's
    sizeLimit, and the kubelet evicted the pool pod. Now the fetch that would overflow it fails with the figures, the
    files already there stay, and once room is freed the same fetch succeeds."""
    repo = tmp_path / "models"
    blob = os.urandom(600 << 10)
    https["/w.bin"] = blob
    sha = hashlib.sha256(blob).hexdigest()
    volume = 1 << 20  # room for one model of 600 KiB, not for two

    def put(name: str, digest: str) -> int:
        status, _ = _ask(sidecar, "PUT", f"/v1/models/{name}", {"digest": digest, "volumeBytes": volume, "sources": [
            {"field": "spec.source.uri", "version": "1", "uri": https.url("/w.bin"), "sha256": sha}]})
        return status

    assert put("a", "a1" * 16) == 202
    assert _settled(sidecar, "a")["digest"] == "a1" * 16
    assert put("b", "b1" * 16) == 202
    failed = _settled(sidecar, "b")["failed"]
    assert failed is not None and "InsufficientPoolCapacity" in failed["message"], failed
    assert "repositorySizeLimit" in failed["message"], failed
    assert (repo / "a" / "1" / "w.bin").read_bytes() == blob  # the model already there is untouched
    assert not (repo / STORE / "b").exists() or not any(p.is_dir() for p in (repo / STORE / "b").iterdir())
    assert _ask(sidecar, "DELETE", "/v1/models/a")[0] == 200
    assert put("b", "b1" * 16) == 202  # room again
    assert _settled(sidecar, "b")["digest"] == "b1" * 16
