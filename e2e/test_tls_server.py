"""The operator's TLS port (admission webhook and custom metrics API) against slow and numerous clients, on the
real node (issue 32): the operator installed by the chart, its pod run by a real kubelet under the chart's
512 Mi limit.

The finding: 3,000 half-open requests took a replica from 68 to 893 MiB, and with `failurePolicy: Fail`, two
killed replicas block every TritonModel edit. Here the test, from its own network namespace, opens to one
replica's pod address (198.18.0.0/15):

1. a burst of `BURST` TCP connections that never start TLS, four times the cap: all but the cap are refused at
   once, the rest are closed at the TLS handshake's deadline, and the container's memory (its cgroup's working
   set, as the kubelet counts it) stays far under the limit;
2. TLS clients whose headers, or whose body, trickle: closed within seconds of their handshake; while they are
   open, `kubectl apply` of a TritonModel passes admission and one the webhook must refuse is refused by it.

The unit-level tests of the same server: tests/test_tls_server.py.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import time
import urllib.request
from pathlib import Path

import pytest

from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import ChartOperator, as_stream, kubectl, load_examples, record
from e2e.testing import metric_samples, working_set
from triton_operator.servers import tls_server

pytestmark = pytest.mark.cluster

TEST_NET = ipaddress.ip_network("198.18.0.0/15")
PORT = 9443  # the chart's webhook.port
BURST = 1000  # four times the cap, within the listen backlog (tls_server.BACKLOG)
SLOW_HEADERS, SLOW_BODIES = 100, 50
MARGIN = 5.0
LIMIT = 512 * 1024 * 1024  # the chart's resources.limits.memory
MIB = 1024 * 1024


def _samples(ip: str, metric: str) -> float:
    """The sum of one metric family's samples on the operator pod at `ip`."""
    with urllib.request.urlopen(f"http://{ip}:8081/metrics", timeout=5) as resp:
        return sum(metric_samples(resp.read().decode(), metric).values())


def _refused(ip: str) -> float:
    return _samples(ip, "triton_operator_tls_connections_refused_total")


def _client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the test is the attacker: it trusts nothing and needs nothing trusted
    return ctx


async def _until_closed(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server closed the connection (EOF or a reset) within `seconds`, reading what it sends."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass
        return True
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


async def _burst(ip: str, pid: int) -> tuple[list[float | None], int]:
    """BURST connections that never send a byte; when each was closed (seconds after all were open, None: not
    within the deadline and a margin), and the highest working set seen meanwhile."""
    conns = await asyncio.gather(*(asyncio.open_connection(ip, PORT) for _ in range(BURST)), return_exceptions=True)
    opened = time.monotonic()
    peak = working_set(pid)
    closed_at: list[float | None] = [None] * len(conns)

    async def watch(i: int, conn: object) -> None:
        if isinstance(conn, BaseException):  # refused before it was even open: closed at once
            closed_at[i] = 0.0
            return
        reader, writer = conn  # type: ignore[misc]
        if await _until_closed(reader, tls_server.HANDSHAKE_SECONDS + MARGIN):
            closed_at[i] = time.monotonic() - opened
        writer.close()

    watchers = asyncio.gather(*(watch(i, c) for i, c in enumerate(conns)))
    while not watchers.done():  # a measurement while they are held, not a wait for a condition
        peak = max(peak, working_set(pid))
        await asyncio.wait([watchers], timeout=0.2)
    await watchers
    return closed_at, peak


async def _trickle(ip: str, ctx: ssl.SSLContext, body: bool) -> float | None:
    """A TLS client sending its headers (or, `body`, its body) a piece a second: seconds from its handshake until
    the server closed it, None if it was still open after 30 s."""
    reader, writer = await asyncio.open_connection(ip, PORT, ssl=ctx, server_hostname="webhook")
    shaken = time.monotonic()
    head = b"POST /validate-tritonmodels HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
    writer.write(head + (b"Content-Length: 100000\r\n\r\n{" if body else b""))
    try:
        for i in range(30):
            if await _until_closed(reader, 1.0):
                return time.monotonic() - shaken
            writer.write(b" " if body else f"X-Slow-{i}: y\r\n".encode())
            await writer.drain()
        return None
    except (ConnectionError, ssl.SSLError):
        return time.monotonic() - shaken
    finally:
        writer.close()


def test_slow_and_numerous_clients_are_closed_within_seconds_memory_stays_bounded_and_admission_goes_on(
        operator: ChartOperator, kube: Kube, kubeconfig: Path, namespace: str, nodes) -> None:  # type: ignore[no-untyped-def]
    pod = operator.pod()
    assert pod is not None
    ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(ip) in TEST_NET, f"the operator pod's address {ip} is not one of this project's"
    pid = operator.pid_of(pod)
    restarts = operator._operator_status(pod).get("restartCount", 0)
    before, refused_before = working_set(pid), _refused(ip)

    # 1. Half-open connections, far over the cap.
    closed_at, peak = asyncio.run(_burst(ip, pid))
    refused_now = sum(1 for t in closed_at if t is not None and t < 2.0)
    held_long = [t for t in closed_at if t is None]
    record("tls burst: connections, refused at once, peak working set MiB (before)",
           f"{BURST}, {refused_now}, {peak / MIB:.0f} ({before / MIB:.0f})")
    seen = f"working set {before / MIB:.0f} -> {peak / MIB:.0f} MiB, {refused_now} closed at once"
    assert not held_long, f"{len(held_long)} of {BURST} half-open connections were still open " \
                          f"{tls_server.HANDSHAKE_SECONDS + MARGIN:.0f}s after they opened ({seen})"
    assert refused_now >= BURST - tls_server.MAX_CONNECTIONS, \
        f"only {refused_now} of {BURST} connections were closed at once; the cap is {tls_server.MAX_CONNECTIONS}"
    assert _refused(ip) - refused_before >= BURST - tls_server.MAX_CONNECTIONS
    assert peak - before < 160 * MIB and peak < LIMIT // 2, \
        f"the working set went from {before / MIB:.0f} to {peak / MIB:.0f} MiB (limit {LIMIT / MIB:.0f})"

    # 2. Slow TLS clients; admission meanwhile.
    docs = load_examples("add-sub")
    docs[0]["spec"]["replicas"] = 0  # admission is what is tested, not a replica
    ensemble = next(d for d in load_examples("sentiment-ensemble") if d["metadata"]["name"] == "sentiment")

    async def slow_and_apply() -> tuple[list[float | None], list[float | None], tuple[str, str]]:
        ctx = _client_context()
        headers = [asyncio.create_task(_trickle(ip, ctx, body=False)) for _ in range(SLOW_HEADERS)]
        bodies = [asyncio.create_task(_trickle(ip, ctx, body=True)) for _ in range(SLOW_BODIES)]

        def apply() -> tuple[str, str]:
            good = kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=as_stream(docs), check=False)
            bad = kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=as_stream([ensemble]), check=False)
            return (good.stderr if good.returncode else ""), bad.stderr

        applied = await asyncio.to_thread(apply)
        open_meanwhile = sum(1 for t in headers + bodies if not t.done())
        assert open_meanwhile, "the slow clients were all gone before the applies ended: nothing was tested"
        return list(await asyncio.gather(*headers)), list(await asyncio.gather(*bodies)), applied

    header_times, body_times, (good_err, bad_err) = asyncio.run(slow_and_apply())
    assert not good_err, f"a valid TritonModel was refused while slow clients held the port: {good_err}"
    assert kube.get("TritonModel", "add-sub", namespace)
    assert "TritonModel 'tokenizer' is not defined" in bad_err, f"the webhook did not refuse the ensemble: {bad_err}"
    slow = [t for t in header_times if t is None or t > tls_server.IDLE_SECONDS + MARGIN]
    assert not slow, f"{len(slow)} of {SLOW_HEADERS} clients trickling headers were kept: {sorted(header_times)[-5:]}"
    slow = [t for t in body_times if t is None or t > tls_server.BODY_SECONDS + tls_server.IDLE_SECONDS + MARGIN]
    assert not slow, f"{len(slow)} of {SLOW_BODIES} clients trickling a body were kept: {sorted(body_times)[-5:]}"
    record("tls slow clients closed after (s, max): headers, bodies",
           f"{max(t for t in header_times if t is not None):.1f}, {max(t for t in body_times if t is not None):.1f}")

    after = operator.pods()
    same = next(p for p in after if p["metadata"]["name"] == pod["metadata"]["name"])
    assert operator._operator_status(same).get("restartCount", 0) == restarts, "the operator was restarted (OOM?)"


def test_every_replica_reviews_from_its_own_watch_of_tritonmodels(operator: ChartOperator, kube: Kube,
                                                                   kubeconfig: Path, namespace: str) -> None:
    """The webhook reads the models around a change from a list+watch of its own in each replica, leader or not
    (issue 32): once the steps are in every replica's watch, their ensemble is admitted without a GET."""
    ips = [p["status"]["podIP"] for p in operator.pods()]
    assert len(ips) == operator.replicas and all(ipaddress.ip_address(ip) in TEST_NET for ip in ips), ips
    docs = {d["metadata"]["name"]: d for d in load_examples("sentiment-ensemble")}
    docs["sentiment"]["spec"]["replicas"] = 0  # admission is what is tested, not a replica
    before = {ip: _samples(ip, "triton_operator_webhook_models") for ip in ips}
    steps = [docs["tokenizer"], docs["classifier"]]
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=as_stream(steps))
    wait_for("both steps in every replica's watch",
             lambda: all(_samples(ip, "triton_operator_webhook_models") >= before[ip] + 2 for ip in ips), 30)
    reads = {ip: _samples(ip, "triton_operator_admission_reads_total") for ip in ips}
    reviews = {ip: _samples(ip, "triton_operator_admission_reviews_total") for ip in ips}
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=as_stream([docs["sentiment"]]))
    reviewed = [ip for ip in ips if _samples(ip, "triton_operator_admission_reviews_total") > reviews[ip]]
    assert reviewed, "no replica reviewed the ensemble"
    assert all(_samples(ip, "triton_operator_admission_reads_total") == reads[ip] for ip in ips), \
        "the ensemble's review read its steps from the API server though the watch had them"
