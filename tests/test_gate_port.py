"""The warm-up gate's wait for Triton's port: real sockets on 127.0.0.1, no Kubernetes.

tritonserver opens its ports only once the models it loads at start are loaded and warm, so while a replica
refuses connections the gate tries cheap TCP connects and asks over HTTP as soon as one is accepted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from triton_operator.controller import gate as gate_module
from triton_operator.controller.gate import WarmupGate, _PodGate
from triton_operator.triton.local import free_port
from triton_operator.triton.replica import port_open


def _pod_gate() -> _PodGate:
    return _PodGate("ns", "pod", {"metadata": {"name": "pod", "namespace": "ns"}, "status": {"podIP": "127.0.0.1"}})


async def _serve(port: int) -> asyncio.Server:
    return await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)


def test_port_open_tells_a_listening_port_from_a_refusing_one() -> None:
    async def run() -> tuple[bool, bool]:
        port = free_port()
        refused = await port_open(f"127.0.0.1:{port}")
        server = await _serve(port)
        try:
            return refused, await port_open(f"127.0.0.1:{port}")
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(run()) == (False, True)


def test_wait_for_port_returns_once_the_port_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setattr(gate_module, "HTTP_PORT", port)

    async def run() -> dict[str, Any]:
        gate = WarmupGate(kube=None)  # type: ignore[arg-type] - the wait never talks to the API server
        pod = _pod_gate()
        opened: dict[str, Any] = {}

        async def open_later() -> None:
            await asyncio.sleep(0.3)
            opened["server"] = await _serve(port)
            opened["probing while closed"] = gate.probing

        opener = asyncio.create_task(open_later())
        result = await asyncio.wait_for(gate._wait_for_port(pod), timeout=10)
        await opener
        opened["result"] = result
        opened["probing after"] = gate.probing
        opened["open at return"] = await port_open(f"127.0.0.1:{port}")
        # Open already: no wait, the caller polls at its usual interval (Triton took too long to answer).
        opened["when open already"] = await asyncio.wait_for(gate._wait_for_port(pod), timeout=10)
        opened["server"].close()
        await opened["server"].wait_closed()
        return opened

    out = asyncio.run(run())
    assert out["result"] is True and out["open at return"] is True
    assert out["probing while closed"] == 1 and out["probing after"] == 0
    assert out["when open already"] is False


def test_wait_for_port_returns_on_a_pod_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod event (the container died, the pod is going) ends the wait although nothing ever listens."""
    monkeypatch.setattr(gate_module, "HTTP_PORT", free_port())

    async def run() -> tuple[bool, bool, int]:
        gate = WarmupGate(kube=None)  # type: ignore[arg-type]
        pod = _pod_gate()
        waiter = asyncio.create_task(gate._wait_for_port(pod))
        await asyncio.sleep(0.2)
        still_waiting = not waiter.done()
        pod.wake.set()
        return still_waiting, await asyncio.wait_for(waiter, timeout=10), gate.probing

    assert asyncio.run(run()) == (True, True, 0)
