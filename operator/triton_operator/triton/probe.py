"""The operator's client of a replica's probe server (the `probe` container, `agent.probe`): it tells the probe that
the operator has set the pod's readiness gate (`notify_gate`, POST GATE_PATH) and reads what the probe found broken
(`probe_status`, `probe_news`: GET STATUS_PATH, held until it changes). The gate's loop (`controller.gate`) and the
pool's (`controller.pool`) call it; the paths, the key's header and the port are the pod contract's (`api.pod`).

Plain HTTP/1.1 over asyncio streams, one connection a call (the probe closes it after its answer), every call bounded
by its timeout, a `/status` answer read up to 1 MiB.
"""

from __future__ import annotations

import asyncio
import json

from ..api.pod import GATE_PATH, KEY_HEADER, STATUS_PATH


def _key_line(key: str | None) -> str:
    return f"{KEY_HEADER}: {key}\r\n" if key else ""


async def notify_gate(host: str, port: int, key: str | None = None, timeout: float = 1.0) -> int:
    """Tells a replica's probe server that the operator has just set its readiness gate True (`POST /gate`, with
    the replica's `key`); the answer's status code (200: probes pass `settle` from now; 409: tritonserver's port is
    closed there; 401: not the replica's key)."""

    async def post() -> int:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"POST {GATE_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 0\r\n{_key_line(key)}"
                         "Connection: close\r\n\r\n".encode())
            await writer.drain()
            status = (await reader.readline()).split()
            if len(status) < 2 or not status[1].isdigit():
                raise ConnectionError(f"not an HTTP answer: {b' '.join(status)!r}")
            return int(status[1])
        finally:
            writer.close()

    return await asyncio.wait_for(post(), timeout)


async def probe_status(host: str, port: int, key: str | None = None, timeout: float = 1.0) -> dict[str, str]:
    """What a replica's probe server found broken (`GET /status`, with the replica's `key`): model name (or
    "tritonserver") -> why."""
    return (await probe_news(host, port, key=key, timeout=timeout))[1]


async def probe_news(host: str, port: int, since: int | None = None, wait: float = 0.0, key: str | None = None,
                     timeout: float = 1.0) -> tuple[int, dict[str, str]]:
    """`GET /status` (with the replica's `key`), held up to `wait` seconds until what is broken changes from version
    `since`: (version, model name (or "tritonserver") -> why)."""
    query = f"?since={since}&wait={wait:g}" if since is not None and wait > 0 else ""

    async def get() -> tuple[int, dict[str, str]]:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"GET {STATUS_PATH}{query} HTTP/1.1\r\nHost: {host}:{port}\r\n{_key_line(key)}"
                         "Connection: close\r\n\r\n".encode())
            await writer.drain()
            data = b""
            while len(data) < 1 << 20:  # to the end: the server closes the connection after its answer
                chunk = await reader.read(1 << 16)
                if not chunk:
                    break
                data += chunk
        finally:
            writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or status[1] != b"200":
            raise ConnectionError(f"the probe answered {b' '.join(status)!r}")
        answer = json.loads(body)
        broken = answer.get("broken") or {}
        return int(answer.get("version") or 0), {str(k): str(v) for k, v in broken.items()}

    return await asyncio.wait_for(get(), timeout + wait)
