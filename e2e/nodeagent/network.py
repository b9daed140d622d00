"""Pod networking for the node agent: one network namespace per pod on a host bridge.

Owns the bridge `trop0` (198.18.0.1/16, the RFC 2544 benchmarking range), address allocation
for pods (lock files under /run, so several agents on one machine never hand out the same
address), creating and removing a pod's namespace + veth pair, and a TCP relay that lets pods
reach the API server (which listens on 127.0.0.1 only) at 198.18.0.1.

Pods get no default route: from inside a pod only 198.18.0.0/16 is reachable, so a process that
tries to dial anything else fails at once instead of leaving the machine. DNS points at the pod's
own loopback and is refused immediately.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

log = logging.getLogger("nodeagent.network")

BRIDGE = "trop0"
GATEWAY = "198.18.0.1"
SUBNET = ipaddress.ip_network("198.18.0.0/16")
IPAM_DIR = Path("/run/triton-e2e/ipam")
NETNS_PREFIX = "trop-"


class NetworkError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)  # noqa: S603,S607 - argument array
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def netns_supported() -> bool:
    """True when this process may create network namespaces (root, iproute2 present)."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    name = f"{NETNS_PREFIX}probe-{os.getpid()}"
    ok = _ip("netns", "add", name, check=False).returncode == 0
    _ip("netns", "del", name, check=False)
    return ok


def ensure_bridge() -> None:
    """Creates the host bridge with the gateway address unless it already exists."""
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        with contextlib.suppress(NetworkError):  # another agent may have won the race
            _ip("link", "add", BRIDGE, "type", "bridge")
            log.info("Created bridge name=%s", BRIDGE)
    addrs = _ip("-o", "addr", "show", "dev", BRIDGE).stdout
    if f"{GATEWAY}/" not in addrs:
        _ip("addr", "add", f"{GATEWAY}/{SUBNET.prefixlen}", "dev", BRIDGE, check=False)
    _ip("link", "set", BRIDGE, "up")


def bridge_in_use() -> bool:
    return bool(_ip("-o", "link", "show", "master", BRIDGE, check=False).stdout.strip())


def remove_bridge_if_unused() -> None:
    if _ip("link", "show", BRIDGE, check=False).returncode == 0 and not bridge_in_use():
        _ip("link", "del", BRIDGE, check=False)
        log.info("Removed bridge name=%s", BRIDGE)


# -- address allocation -------------------------------------------------------------------------


def allocate_ip(owner: str) -> str:
    """Claims the lowest free pod address; `owner` (a netns name) is written into the claim."""
    IPAM_DIR.mkdir(parents=True, exist_ok=True)
    for host in SUBNET.hosts():
        if host.packed[2] == 0 or host.packed[3] in (0, 255):  # 198.18.0.x: gateway side; no .0/.255
            continue
        path = IPAM_DIR / str(host)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _stale_claim(path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    continue
            else:
                continue
        with os.fdopen(fd, "w") as f:
            f.write(owner)
        return str(host)
    raise NetworkError(f"No free pod address left in {SUBNET}")


def _stale_claim(path: Path) -> bool:
    """A claim whose network namespace no longer exists (its agent died without cleaning up)."""
    try:
        owner = path.read_text().strip()
        age = time.time() - path.stat().st_mtime
    except OSError:
        return False
    return bool(owner) and age > 5 and not Path(f"/run/netns/{owner}").exists()


def release_ip(ip: str, owner: str) -> None:
    path = IPAM_DIR / ip
    with contextlib.suppress(OSError):
        if path.read_text().strip() == owner:
            path.unlink()


# -- sandboxes ----------------------------------------------------------------------------------


def veth_name(netns: str) -> str:
    import hashlib

    return "trv" + hashlib.sha256(netns.encode()).hexdigest()[:10]


def create_sandbox(netns: str, ip: str, hostname: str) -> None:
    """A network namespace with `eth0` = ip/16 bridged to the host, loopback up, no default route."""
    teardown_sandbox(netns, quiet=True)
    etc = Path("/etc/netns") / netns
    etc.mkdir(parents=True, exist_ok=True)
    # `ip netns exec` bind-mounts these over /etc/hosts and /etc/resolv.conf inside the pod.
    (etc / "resolv.conf").write_text("# pods have no DNS in the e2e node agent\nnameserver 127.0.0.1\n")
    (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{ip}\t{hostname}\n")
    _ip("netns", "add", netns)
    ensure_bridge()  # another agent on this machine removes it when it stops with no pod attached
    veth = veth_name(netns)
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    _ip("link", "set", veth, "master", BRIDGE)
    _ip("link", "set", veth, "up")
    _ip("-n", netns, "link", "set", "lo", "up")
    _ip("-n", netns, "addr", "add", f"{ip}/{SUBNET.prefixlen}", "dev", "eth0")
    _ip("-n", netns, "link", "set", "eth0", "up")


def netns_pids(netns: str) -> list[int]:
    out = _ip("netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_netns_processes(netns: str, timeout: float = 5.0) -> None:
    """SIGKILLs every process still inside the namespace and waits until they are gone."""
    deadline = time.monotonic() + timeout
    while True:
        pids = netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise NetworkError(f"Processes survived SIGKILL in netns {netns}: {pids}")
        time.sleep(0.05)


def teardown_sandbox(netns: str, quiet: bool = False) -> None:
    if Path(f"/run/netns/{netns}").exists():
        kill_netns_processes(netns)
    _ip("link", "del", veth_name(netns), check=False)
    _ip("netns", "del", netns, check=False)
    shutil.rmtree(Path("/etc/netns") / netns, ignore_errors=True)
    if not quiet:
        log.info("Removed pod network namespace netns=%s", netns)


def list_netns(prefix: str) -> list[str]:
    try:
        return sorted(p.name for p in Path("/run/netns").iterdir() if p.name.startswith(prefix))
    except FileNotFoundError:
        return []


# -- API server relay -----------------------------------------------------------------------------


class TcpRelay:
    """Forwards connections accepted on (listen_host, port) to (target_host, target_port).

    Pods reach the API server through this relay at https://198.18.0.1:<port>; TLS passes through
    untouched (the API server certificate carries 198.18.0.1 as a SAN).
    """

    def __init__(self, listen_host: str, target: tuple[str, int], port: int = 443) -> None:
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((listen_host, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            self.sock.bind((listen_host, 0))
        self.sock.listen(64)
        self.address = self.sock.getsockname()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="apiserver-relay", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.address[1]

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                r, _, _ = select.select([self.sock], [], [], 0.5)
                if not r:
                    continue
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        socks = [client, upstream]
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select(socks, [], [], 1.0)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    (upstream if s is client else client).sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.close()
