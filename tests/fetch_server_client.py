"""What the tests of the pool replica's `fetch-server` sidecar share: its key, and a client asking it over real HTTP
(tests/test_fetch_server.py, and tests/test_pool_load.py's real-tritonserver test of a uri model)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from tests.timing import scaled
from triton_operator.agent.fetch_server import FetchServer
from triton_operator.api.pod import KEY_HEADER

KEY = "k" * 43


def ask(server: FetchServer, method: str, path: str, body: Any = None, key: str | None = KEY) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.server_address[1]}{path}", data=data, method=method)
    if key is not None:
        req.add_header(KEY_HEADER, key)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - a loopback test server
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def settled(server: FetchServer, name: str, timeout: float = 30.0) -> dict[str, Any]:
    """The model's state once no fetch of it is under way (waited on, up to `timeout`)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        _, state = ask(server, "GET", "/v1/models")
        entry = state["models"].get(name)
        if entry is not None and entry["fetching"] is None:
            return dict(entry)
        assert time.monotonic() < deadline, f"the fetch of {name} did not end within {scaled(timeout):.0f} s: {state}"
        time.sleep(0.05)
