"""The operator's TLS server (`AdmissionWebhook`, with its self-issued certificate) running in a thread of its own on
127.0.0.1, for tests that talk to it as clients do; and `FakeModelsApi`, the stand-in for the API server it reads
TritonModels (and the TritonPool a pooled model names) from (what `Kube` is asked: list, get, list+watch, the
configuration's apply).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import ssl
import threading
from collections.abc import Iterator
from typing import Any

from triton_operator.api.v1alpha1 import GROUP, VERSION
from triton_operator.render.webhook import WebhookTarget
from triton_operator.servers.webhook import AdmissionWebhook
from triton_operator.triton.local import free_port


class _Held:
    """A watch response the informer can shut down."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def shutdown(self) -> None:
        self.closed.set()


class FakeModelsApi:
    """The TritonModels of each namespace, as `Kube` returns them; every call recorded in `calls`."""

    def __init__(self, models: list[dict[str, Any]] | None = None, pools: list[dict[str, Any]] | None = None) -> None:
        self.models: dict[tuple[str, str], dict[str, Any]] = {}
        for m in models or ():
            self.models[(m["metadata"]["namespace"], m["metadata"]["name"])] = m
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}
        for p in pools or ():
            self.pools[(p["metadata"]["namespace"], p["metadata"]["name"])] = p
        self.calls: list[str] = []
        self.configuration: dict[str, Any] | None = None
        self.watches: list[_Held] = []
        self.lock = threading.Lock()

    def _record(self, call: str) -> None:
        with self.lock:
            self.calls.append(call)

    def count(self, prefix: str) -> int:
        with self.lock:
            return sum(1 for c in self.calls if c.startswith(prefix))

    def _check(self, api_version: str, kind: str, pools: bool = False) -> None:
        kinds = ("TritonModel", "TritonPool") if pools else ("TritonModel",)
        assert api_version == f"{GROUP}/{VERSION}" and kind in kinds, (api_version, kind)

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str | None = None) -> list[dict]:
        self._check(api_version, kind)
        self._record(f"list {namespace}")
        return [copy.deepcopy(m) for (ns, _), m in self.models.items() if ns == namespace]

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        self._check(api_version, kind, pools=True)
        if kind == "TritonPool":
            self._record(f"get pool {namespace}/{name}")
            pool = self.pools.get((namespace, name))
            return copy.deepcopy(pool) if pool else None
        self._record(f"get {namespace}/{name}")
        found = self.models.get((namespace, name))
        return copy.deepcopy(found) if found else None

    def list_versioned(self, api_version: str, kind: str, namespace: str | None) -> tuple[list[dict], str]:
        self._check(api_version, kind)
        self._record(f"informer-list {namespace or '*'}")
        return [copy.deepcopy(m) for (ns, _), m in self.models.items() if namespace in (None, ns)], "1"

    def watch(self, api_version: str, kind: str, namespace: str | None, resource_version: str, timeout_seconds: int,
              opened: Any = None) -> Iterator[dict]:
        """A watch that delivers nothing (the test changes `models` behind the cache's back) until shut down."""
        held = _Held()
        self.watches.append(held)
        if opened is not None:
            opened(held)
        held.closed.wait(timeout_seconds)
        raise ConnectionError("watch shut down")
        yield {}  # a generator, as Kube.watch

    def apply_cluster(self, obj: dict[str, Any], plural: str) -> dict[str, Any]:
        self.configuration = obj
        return obj

    def delete_cluster(self, group_version: str, plural: str, name: str) -> None:
        self.configuration = None


class RunningWebhook:
    """An `AdmissionWebhook` serving on 127.0.0.1 from a thread of its own; `context` trusts its CA."""

    def __init__(self, api: FakeModelsApi, **kw: Any) -> None:
        self.api = api
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="webhook-loop", daemon=True)
        self.hook = AdmissionWebhook(api, WebhookTarget(url=f"https://127.0.0.1:{self.port}"),  # type: ignore[arg-type]
                                     configuration="t", failure_policy="Fail", namespaces=[], clusterwide=True,
                                     address="127.0.0.1", port=self.port, **kw)
        self.context = ssl.create_default_context()

    def call(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> RunningWebhook:
        self.thread.start()
        self.call(self.hook.start())
        assert self.api.configuration is not None
        ca = base64.b64decode(self.api.configuration["webhooks"][0]["clientConfig"]["caBundle"])
        self.context = ssl.create_default_context(cadata=ca.decode())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self.hook.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
