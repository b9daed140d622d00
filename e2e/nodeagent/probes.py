"""Container probes the way the kubelet runs them: httpGet, tcpSocket, grpc and exec.

Owns one probe's execution (`run_probe`, returning success and a message) and its bookkeeping
(`ProbeTracker`: initialDelaySeconds, periodSeconds, timeoutSeconds, successThreshold and
failureThreshold, with the kubelet's initial results - readiness starts as failure, liveness and
startup as unknown). Network probes are sent from the host to the pod's address, as the kubelet
does; exec probes run inside the container's namespaces with nsenter.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
from dataclasses import dataclass, field


@dataclass
class ProbeResult:
    ok: bool
    message: str = ""


def _port(port: int | str, container: dict) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"port {port!r} is not a named port of container {container['name']!r}")


def run_probe(probe: dict, container: dict, pod_ip: str, pid: int | None, env: dict[str, str]) -> ProbeResult:
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            return http_get(probe["httpGet"], container, pod_ip, timeout)
        if "tcpSocket" in probe:
            t = probe["tcpSocket"]
            with socket.create_connection((t.get("host") or pod_ip, _port(t["port"], container)), timeout):
                return ProbeResult(True)
        if "grpc" in probe:
            return _grpc(probe["grpc"], pod_ip, timeout)
        if "exec" in probe:
            return exec_in_container(probe["exec"]["command"], pid, env, timeout)
    except (OSError, ValueError, http.client.HTTPException) as e:
        return ProbeResult(False, f"{type(e).__name__}: {e}")
    return ProbeResult(False, "probe has no handler")


def http_get(h: dict, container: dict, pod_ip: str, timeout: float) -> ProbeResult:
    """An httpGet handler (probe or lifecycle hook): success on any status in [200, 400)."""
    host = h.get("host") or pod_ip
    port = _port(h["port"], container)
    path = h.get("path") or "/"
    headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or []}
    headers.setdefault("User-Agent", "kube-probe/1.35")
    if h.get("scheme", "HTTP").upper() == "HTTPS":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=ssl._create_unverified_context()  # noqa: S323 - as the kubelet
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        body = resp.read(1024).decode(errors="replace")
    finally:
        conn.close()
    if 200 <= resp.status < 400:
        return ProbeResult(True)
    return ProbeResult(False, f"HTTP probe failed with statuscode: {resp.status} {body.strip()[:200]}")


def _grpc(g: dict, pod_ip: str, timeout: float) -> ProbeResult:
    import grpc  # noqa: PLC0415 - only when a gRPC probe is used

    service = (g.get("service") or "").encode()
    # grpc.health.v1.HealthCheckRequest{service} by hand: field 1, length-delimited.
    request = (b"\x0a" + bytes([len(service)]) + service) if service else b""
    with grpc.insecure_channel(f"{pod_ip}:{int(g['port'])}") as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        try:
            resp = check(request, timeout=timeout)
        except grpc.RpcError as e:
            return ProbeResult(False, f"gRPC probe failed: {e.code().name}")  # type: ignore[attr-defined]
    # HealthCheckResponse{status}: field 1 varint; SERVING == 1.
    status = resp[1] if len(resp) >= 2 and resp[0] == 0x08 else 0
    if status == 1:
        return ProbeResult(True)
    return ProbeResult(False, f"service unhealthy (responded with status {status})")


def exec_in_container(command: list[str], pid: int | None, env: dict[str, str], timeout: float) -> ProbeResult:
    """An exec handler (probe or lifecycle hook): `command` inside the container's mount and network namespaces."""
    if pid is None:
        return ProbeResult(False, "container is not running")
    argv = ["nsenter", f"--target={pid}", "--mount", "--net", "--", *command]
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, timeout=timeout)  # noqa: S603 - argument array
    except subprocess.TimeoutExpired:
        return ProbeResult(False, f"command timed out after {timeout:.0f}s")
    if proc.returncode == 0:
        return ProbeResult(True)
    out = (proc.stdout + proc.stderr).decode(errors="replace").strip()[:300]
    return ProbeResult(False, f"command exited with {proc.returncode}: {out}")


@dataclass
class ProbeTracker:
    """One probe of one container run: when it is due and what its thresholds make of results."""

    kind: str  # startup | readiness | liveness
    spec: dict
    started_at: float
    successes: int = 0
    failures: int = 0
    result: bool | None = None  # None: unknown (no decision yet)
    next_due: float = field(default=0.0)
    in_flight: bool = False
    last_message: str = ""

    def __post_init__(self) -> None:
        self.next_due = self.started_at + float(self.spec.get("initialDelaySeconds") or 0)
        if self.kind == "readiness":
            self.result = False

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds") or 10)

    def due(self, now: float) -> bool:
        return not self.in_flight and now >= self.next_due

    def record(self, res: ProbeResult, now: float) -> bool | None:
        """Applies one result; returns the new decided result when it changed, else None."""
        self.in_flight = False
        self.next_due = now + self.period
        self.last_message = res.message
        if res.ok:
            self.successes += 1
            self.failures = 0
            if self.successes >= int(self.spec.get("successThreshold") or 1) and self.result is not True:
                self.result = True
                return True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= int(self.spec.get("failureThreshold") or 3) and self.result is not False:
                self.result = False
                return False
        return None
