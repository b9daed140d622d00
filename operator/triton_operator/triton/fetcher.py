"""A pool replica's `fetch-server` sidecar (`agent.fetch_server`), as the pool's reconcile asks it: what it
holds, fetch a uri model at a digest, prune the digests no longer served, delete a model's files. Beside Triton in
the replica's pod, so here with Triton's clients; every request carries the pool's repository key. The fetch itself
runs in the sidecar: `fetch` only starts it and returns, and a later round reads how it went from `holdings`.

Bounds (issue 39, M1): an answer is read up to `MAX_ANSWER` bytes (`rest.read_capped`) and each call, connect to last
byte, ends within its timeout; an answer over the cap, or not the JSON object expected, is a `FetcherError`, which the
pool's round takes for a sidecar that did not answer (it asks again next round). The sidecar runs the operator's own
code, but in a pod whose other container runs the image the pool's author chose, sharing its network namespace."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from ..api.pod import FETCH_MODELS_PATH, FETCH_PRUNE, FETCH_SERVER_PORT, KEY_HEADER
from ..render.pool import FetchRequest
from .rest import AnswerTooLarge, read_capped

#: The largest answer read from a sidecar: `holdings` is about 200 bytes per model held, so 4 MiB is some 20,000
#: models, many more than a replica holds.
MAX_ANSWER = 4 << 20


class FetcherError(Exception):
    """The sidecar did not answer, or refused."""


@dataclass(frozen=True)
class Held:
    """What the sidecar says of one model: the digest its link points at (None: none), the digest being fetched, and
    the last failure (digest, message, attempt number: a new attempt has a new number)."""

    digest: str | None
    fetching: str | None
    failed_digest: str | None = None
    failed_message: str = ""
    failed_attempt: int = 0


def _url(ip: str, path: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{FETCH_SERVER_PORT}{path}"


async def _call(ip: str, method: str, path: str, key: str | None, body: Any = None,
                timeout: float = 10.0) -> tuple[int, Any]:
    headers = {KEY_HEADER: key} if key else {}
    try:
        async with asyncio.timeout(timeout), \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout), trust_env=False) as session, \
                session.request(method, _url(ip, path), json=body, headers=headers) as resp:
            answer = await read_capped(resp, MAX_ANSWER)
            return resp.status, json.loads(answer) if answer else None
    except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError, AnswerTooLarge) as exc:
        raise FetcherError(f"the fetch-server sidecar at {ip}:{FETCH_SERVER_PORT} did not answer: {exc!r}") from exc


async def holdings(ip: str, key: str | None) -> dict[str, Held]:
    """Every model the replica's sidecar holds, fetches or failed to fetch, by Triton name."""
    status, body = await _call(ip, "GET", FETCH_MODELS_PATH, key)
    if status != 200:
        raise FetcherError(f"the fetch-server sidecar at {ip} answered {status}: {body}")
    out: dict[str, Held] = {}
    try:
        for name, m in ((body or {}).get("models") or {}).items():
            f = m.get("failed") or {}
            out[str(name)] = Held(m.get("digest"), m.get("fetching"), f.get("digest"), str(f.get("message") or ""),
                                  int(f.get("attempt") or 0))
    except (AttributeError, TypeError, ValueError) as exc:
        raise FetcherError(f"the fetch-server sidecar at {ip} answered something else than its holdings: "
                           f"{exc!r}") from exc
    return out


async def fetch(ip: str, key: str | None, name: str, digest: str, request: FetchRequest,
                volume_bytes: int | None = None) -> bool:
    """Asks the sidecar to place `name` at `digest`; True when it holds it already (else it fetches meanwhile).
    `volume_bytes`: the sizeLimit of the replica's repository volume, which the sidecar keeps the sum of every model's
    files under (a fetch that would overflow it fails, InsufficientPoolCapacity, instead of the pod's eviction)."""
    body: Mapping[str, Any] = {
        "digest": digest, "sources": [dict(s) for s in request.sources],
        "files": {p: base64.b64encode(c).decode() for p, c in request.files.items()},
        **({"volumeBytes": volume_bytes} if volume_bytes is not None else {}),
    }
    status, answer = await _call(ip, "PUT", f"{FETCH_MODELS_PATH}/{quote(name, safe='')}", key, body)
    if status not in (200, 202, 409):
        raise FetcherError(f"the fetch-server sidecar at {ip} refused to fetch {name}: {status} {answer}")
    return status == 200


async def prune(ip: str, key: str | None, name: str) -> None:
    """Removes every digest of `name` but the one linked (Triton serves it now)."""
    status, answer = await _call(ip, "POST", f"{FETCH_MODELS_PATH}/{quote(name, safe='')}/{FETCH_PRUNE}", key)
    if status != 200:
        raise FetcherError(f"the fetch-server sidecar at {ip} refused to prune {name}: {status} {answer}")


async def delete(ip: str, key: str | None, name: str) -> int:
    """Removes `name`'s files: 200 (removed), 404 (it held none) or 409 (a fetch of it runs: ask again later)."""
    status, answer = await _call(ip, "DELETE", f"{FETCH_MODELS_PATH}/{quote(name, safe='')}", key)
    if status not in (200, 404, 409):
        raise FetcherError(f"the fetch-server sidecar at {ip} refused to delete {name}: {status} {answer}")
    return status
