"""Ports for the local clusters' components and the local servers tests start (`free_port`): a random port below
the kernel's ephemeral range. Starts nothing; the unit tests check it (tests/test_cluster_ports.py)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Where `free_port` picks from: below the kernel's ephemeral range and the NodePort range (30000-32767).
PORT_RANGE = (20000, 29999)


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: The ports this process handed out: never handed out again (while fewer than half the range), because a caller often
#: picks several before it starts anything on them (`cluster.Ports.allocate`: seven and two per node), and a bind check
#: alone passes the same free port twice. A bench run drew 24924 for kube-apiserver and kube-controller-manager both,
#: and the controller-manager exited with "bind: address already in use".
_handed: set[int] = set()


def free_port() -> int:
    """A port nothing is bound to now, for a component to listen on a moment later.

    Not one the kernel hands out (port 0): those come from its ephemeral range, which every outgoing connection
    takes its local port from, so one could take it before the component binds it. A bench run saw exactly that:
    kube-apiserver exited with "bind: address already in use" on a port picked that way, while the previous
    cluster's clients were still connecting out. A random port below that range is taken only by a listener."""
    high = min(PORT_RANGE[1], _ephemeral_floor() - 1)
    if len(_handed) > (high - PORT_RANGE[0]) // 2:
        _handed.clear()
    for _ in range(500):
        port = random.randint(PORT_RANGE[0], high)
        if port in _handed:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))  # noqa: S104 - only a check, closed at once: the components bind all
            except OSError:
                continue
        _handed.add(port)
        return port
    raise RuntimeError(f"no free port in {PORT_RANGE[0]}-{high} after 500 tries")
