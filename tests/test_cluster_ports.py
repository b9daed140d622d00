"""Ports for the local clusters' components (`e2e.ports`, which starts nothing): never from the kernel's ephemeral
range, where an outgoing connection can take a port between its pick and the component's bind."""

from __future__ import annotations

import socket

import pytest

from e2e import ports


def test_free_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    floor = ports._ephemeral_floor()
    picked = {ports.free_port() for _ in range(50)}
    assert all(ports.PORT_RANGE[0] <= p <= ports.PORT_RANGE[1] and p < floor for p in picked), sorted(picked)
    assert len(picked) > 40, "picked at random, not the same few"
    for port in list(picked)[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_taken_by_a_listener_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # the wildcard bind of free_port's check conflicts with it
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([busy, busy, busy + 1 if busy < 65535 else busy - 1])
        monkeypatch.setattr(ports.random, "randint", lambda a, b: next(picks))
        monkeypatch.setattr(ports, "PORT_RANGE", (1024, 65535))
        monkeypatch.setattr(ports, "_ephemeral_floor", lambda: 65536)
        assert ports.free_port() != busy
