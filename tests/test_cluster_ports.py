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
        # the listener's port twice, then random picks as usual: a fixed third port can be taken on a busy machine
        # (CI once saw busy + 1 taken, and the mock ran out of picks)
        randint = ports.random.randint
        picks = iter([busy, busy])
        calls = []

        def pick(a: int, b: int) -> int:
            calls.append((a, b))
            return next(picks, None) or randint(a, b)

        monkeypatch.setattr(ports.random, "randint", pick)
        monkeypatch.setattr(ports, "PORT_RANGE", (1024, 65535))
        monkeypatch.setattr(ports, "_ephemeral_floor", lambda: 65536)
        assert ports.free_port() != busy
        assert len(calls) >= 3, calls  # the busy port was tried, twice, and skipped


def test_a_port_handed_out_is_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller picks several ports before it binds any (a cluster's seven, `cluster.Ports.allocate`): a bench run drew
    the same free port for kube-apiserver and kube-controller-manager, and the second exited on its bind."""
    randint = ports.random.randint
    first = ports.free_port()
    picks = iter([first, first])

    def pick(a: int, b: int) -> int:
        return next(picks, None) or randint(a, b)

    monkeypatch.setattr(ports.random, "randint", pick)
    assert ports.free_port() != first, "the port handed out a moment ago, still unbound, came again"
