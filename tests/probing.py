"""The replica's probe asked as the kubelet asks it (`get`: one request, its status, body and time)."""

from __future__ import annotations

import http.client
import time

from triton_operator.api.pod import KEY_HEADER

#: The replica key the tests' probe servers are started with (variable REPOSITORY_KEY_ENV).
KEY = "k" * 64


def get(port: int, path: str = "/ready", key: str | None = None, timeout: float = 10) -> tuple[int, str, float]:
    """One kubelet-like probe: the status, the body and when the answer came (monotonic). `key`: the replica's,
    which the probe's /status and /gate need (header KEY_HEADER)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"User-Agent": "kube-probe/1.35", **({KEY_HEADER: key} if key else {})})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(), time.monotonic()
    finally:
        conn.close()
