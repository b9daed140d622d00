"""The replica's probe asked as the kubelet asks it (`get`: one request, its status, body and time)."""

from __future__ import annotations

import http.client
import time


def get(port: int, path: str = "/ready") -> tuple[int, str, float]:
    """One kubelet-like probe: the status, the body and when the answer came (monotonic)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"User-Agent": "kube-probe/1.35"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(), time.monotonic()
    finally:
        conn.close()
