"""Every read of the operator from a replica or a sidecar is bounded (issue 39, M1): against real servers on
127.0.0.1 that answer as a hostile image would (tests/hostile_servers.py), each client call ends in the error its
callers take for a failed question, and the process's peak memory grows by a bounded amount, not by what the server
sends.

- HTTP (`triton.rest`: the gate's, heals', reloads' and the pool's questions to Triton; `triton.fetcher`: the pool's
  questions to its sidecar): an endless answer, a trickling one, one announcing a terabyte.
- gRPC (`triton.repository`: loads and unloads; `triton.client`: the CLI's): an answer of one 64 MiB message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.hostile_servers import ENDLESS_BYTES, HostileHttp, oversized_grpc, peak_growth
from triton_operator.triton import fetcher, repository, rest
from triton_operator.triton.fetcher import FetcherError
from triton_operator.triton.rest import TritonClient, TritonError

#: The growth of the peak RSS a bounded read may cause: the cap (4 MiB), aiohttp's buffers and the parse of what was
#: read, with room; an unbounded read of the endless answer takes more than `ENDLESS_BYTES` (256 MiB).
BOUND = 48 << 20
#: The deadline each call is given here.
SECONDS = 3.0


async def _rest(port: int, call: str) -> Any:
    async with TritonClient(f"127.0.0.1:{port}", key="k") as client:
        if call == "is_model_ready":
            return await client.is_model_ready("m", timeout=SECONDS)
        if call == "repository_index":
            return await client.repository_index(timeout=SECONDS)
        return await getattr(client, call)("m", timeout=SECONDS)


def _fetcher(call: str) -> Callable[[], Awaitable[Any]]:
    from triton_operator.render.pool import FetchRequest

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "holdings": lambda: fetcher.holdings("127.0.0.1", "k"),
        "fetch": lambda: fetcher.fetch("127.0.0.1", "k", "m", "ab" * 8, FetchRequest(sources=(), files={})),
        "prune": lambda: fetcher.prune("127.0.0.1", "k", "m"),
        "delete": lambda: fetcher.delete("127.0.0.1", "k", "m"),
    }
    return calls[call]


REST_CALLS = ["is_model_ready", "model_config", "repository_index", "statistics"]
FETCHER_CALLS = ["holdings", "fetch", "prune", "delete"]


def _run(server: HostileHttp, kind: str, call: str, monkeypatch: pytest.MonkeyPatch) -> BaseException:
    if kind == "rest":
        coro = _rest(server.port, call)
    else:
        monkeypatch.setattr(fetcher, "FETCH_SERVER_PORT", server.port)
        coro = _fetcher(call)()
    with pytest.raises((TritonError, FetcherError)) as caught:
        asyncio.run(asyncio.wait_for(coro, 60))  # (the test's own guard: a hang fails, not stalls)
    return caught.value


CASES = [("rest", c) for c in REST_CALLS] + [("fetcher", c) for c in FETCHER_CALLS]


@pytest.mark.parametrize(("kind", "call"), CASES)
def test_an_endless_answer_is_an_error_and_memory_stays_bounded(kind: str, call: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with HostileHttp("endless") as server, peak_growth() as grew:
        error = _run(server, kind, call, monkeypatch)
    assert grew[0] < BOUND, f"{call} raised the peak RSS by {grew[0] >> 20} MiB reading an endless answer ({error})"
    assert server.sent < ENDLESS_BYTES, "the client read the whole endless answer before it gave up"
    assert "at most" in str(error), error


@pytest.mark.parametrize(("kind", "call"), CASES)
def test_an_answer_announced_over_the_cap_is_refused_before_its_body_is_read(kind: str, call: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    with HostileHttp("huge") as server, peak_growth() as grew:
        error = _run(server, kind, call, monkeypatch)
    assert f"{1 << 40} bytes" in str(error), error
    assert grew[0] < BOUND, f"{call} raised the peak RSS by {grew[0] >> 20} MiB"


@pytest.mark.parametrize(("kind", "call"), [("rest", "model_config"), ("fetcher", "holdings")])
def test_a_trickling_answer_ends_at_the_calls_deadline(kind: str, call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetcher, "_call", _with_timeout(fetcher._call, SECONDS))
    with HostileHttp("trickle", interval=0.2) as server:
        error = _run(server, kind, call, monkeypatch)
    assert "within" in str(error) or "TimeoutError" in str(error), error


def _with_timeout(call: Callable[..., Awaitable[Any]], seconds: float) -> Callable[..., Awaitable[Any]]:
    """The sidecar client's `_call` with a shorter deadline than its 10 s (the same code path)."""
    async def shorter(*args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = seconds
        return await call(*args, **kwargs)
    return shorter


def test_a_rest_call_without_a_timeout_still_has_a_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rest, "DEFAULT_TIMEOUT", SECONDS)

    async def ask(port: int) -> None:
        async with TritonClient(f"127.0.0.1:{port}") as client:
            await client.model_config("m")

    with HostileHttp("trickle", interval=0.2) as server, pytest.raises(TritonError, match="within"):
        asyncio.run(asyncio.wait_for(ask(server.port), 60))


def test_a_grpc_load_answered_with_an_oversized_message_fails() -> None:
    with oversized_grpc(64 << 20) as address:
        with pytest.raises(TritonError) as caught:
            asyncio.run(repository.load_model(address, "m", timeout=30))
        assert "larger than max" in caught.value.message().lower() or "exhausted" in caught.value.message().lower(), \
            caught.value.message()
        with pytest.raises(TritonError):
            asyncio.run(repository.unload_model(address, "m", timeout=30))


def test_the_cli_clients_channel_refuses_an_oversized_answer() -> None:
    from tritonclient.utils import InferenceServerException

    from triton_operator.triton.client import connect

    with oversized_grpc(64 << 20) as address:
        client = connect(address)
        try:
            with pytest.raises(InferenceServerException) as caught:
                client.get_model_config("m", client_timeout=30)
        finally:
            client.close()
    assert "RESOURCE_EXHAUSTED" in str(caught.value) or "larger than max" in str(caught.value), caught.value


def test_the_probe_reads_an_endless_statistics_answer_no_further_than_its_cap() -> None:
    """issue 39, found on the real node (e2e/test_hostile_replica): the replica's own `probe` container read
    tritonserver's statistics whole, and an endless answer OOM-killed it at its 64Mi. It reads MAX_STATS_BYTES and
    more is an error (the replica is not ready), the connection closed."""
    import http.client

    from triton_operator.agent.probe import MAX_STATS_BYTES, fetch_counts

    with HostileHttp("endless") as server, peak_growth() as grew:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=SECONDS)
        with pytest.raises(TimeoutError, match=f"over {MAX_STATS_BYTES} bytes"):
            fetch_counts(conn)
        assert conn.sock is None, "the connection with an unread answer was kept"
    assert grew[0] < BOUND, f"the probe's peak RSS grew by {grew[0] >> 20} MiB"
    assert server.sent < ENDLESS_BYTES


@pytest.mark.parametrize("mode", ["endless", "huge"])
def test_a_replica_whose_answers_are_over_the_cap_is_oversized_and_its_gate_backs_off(mode: str) -> None:
    """A server that answers the gate's READY question with more than the cap (a hostile image): the verdict says
    so (TritonUnreachable, `oversized`), and the gate's next rounds wait twice as long each time, up to
    OVERSIZED_MAX_DELAY, instead of reading the cap again every poll interval. A plain refusal is no reason to wait
    longer: it keeps the poll interval, so that a replica coming up is seen at once."""
    from triton_operator.controller.gate import OVERSIZED_MAX_DELAY, oversized_delay
    from triton_operator.triton.replica import check_replica

    with HostileHttp(mode) as server:
        verdict = asyncio.run(asyncio.wait_for(check_replica(f"127.0.0.1:{server.port}", "m", (), "d", timeout=SECONDS),
                                               60))
    assert (verdict.ok, verdict.reason, verdict.oversized) == (False, "TritonUnreachable", True), verdict
    assert "at most" in verdict.message, verdict
    closed = asyncio.run(check_replica("127.0.0.1:1", "m", (), "d", timeout=SECONDS))
    assert (closed.reason, closed.oversized) == ("TritonUnreachable", False), closed
    waits = [oversized_delay(0.2, n) for n in range(10)]
    assert waits[:4] == [0.2, 0.4, 0.8, 1.6] and waits[-1] == OVERSIZED_MAX_DELAY
    assert waits == sorted(waits)
    assert oversized_delay(30.0, 3) == 30.0, "a poll interval over the cap is kept, never shortened"
