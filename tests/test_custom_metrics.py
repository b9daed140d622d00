"""The custom metrics API (`servers.custom_metrics`) against the requests of issue 32's findings: an encoded
slash in a path segment, a model that does not exist, and bearer tokens that each cost a TokenReview.

The API is served by aiohttp's test server on 127.0.0.1 (plain HTTP: no client certificate, so every caller
is a bearer token); the API server behind it is `FakeKube`, which answers TokenReviews, SubjectAccessReviews,
GETs and LISTs and counts them. The metrics themselves, through the real API server and HPA controller:
e2e/test_autoscaling.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from triton_operator.render.autoscaling import QUEUE_TIME
from triton_operator.servers import custom_metrics
from triton_operator.servers.custom_metrics import PREFIX, CustomMetricsApi, _Ttl

GOOD = "good"  # the token FakeKube's TokenReview accepts
MODELS = f"{PREFIX}/namespaces/team-a/tritonmodels.serving.triton-operator.dev"


class FakeKube:
    """Reviews say yes to the token "good" and to every access; TritonModels: `models`; every call counted."""

    def __init__(self, models: set[tuple[str, str]] | None = None) -> None:
        self.models = models or set()
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.release.set()

    def _count(self, what: str) -> None:
        with self.lock:
            self.calls[what] += 1

    def review(self, group_version: str, plural: str, spec: dict[str, Any]) -> dict[str, Any]:
        self._count(plural)
        self.release.wait(10)
        if plural == "tokenreviews":
            return {"authenticated": True, "user": {"username": "alice"}} if spec["token"] == GOOD else {}
        return {"allowed": True}

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        self._count(f"get {kind}")
        return {"metadata": {"name": name, "namespace": namespace}} if (namespace, name) in self.models else None

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str | None = None) -> list[dict]:
        self._count(f"list {kind} {namespace}")
        return []


class Arrivals:
    """Counts the requests that reached the server; `wait(n)` until n have."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.count += 1
        self.changed.set()
        return await handler(request)

    async def wait(self, n: int) -> None:
        while self.count < n:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)


def _serve(kube: FakeKube, requests: Any, arrivals: Arrivals | None = None) -> Any:
    """Runs `requests(session, base_url, api)` against the API served for `kube`; its result."""
    async def run() -> Any:
        api = CustomMetricsApi(kube, lambda ns: True)  # type: ignore[arg-type]
        app = web.Application(middlewares=[arrivals.middleware] if arrivals else [])
        api.routes(app)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with ClientSession() as session:
                return await requests(session, str(server.make_url("")).rstrip("/"), api)
        finally:
            await api.stop()
            await server.close()

    return asyncio.run(run())


async def _get(session: ClientSession, url: str, token: str = GOOD) -> tuple[int, dict]:
    async with session.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.json()


def test_an_encoded_slash_in_a_segment_is_refused_before_any_review_or_list() -> None:
    kube = FakeKube()

    async def requests(session: ClientSession, base: str, api: CustomMetricsApi) -> list[tuple[int, dict]]:
        return [await _get(session, base + path) for path in (
            f"{PREFIX}/namespaces/team-a%2Fother/pods/*/{QUEUE_TIME}",
            f"{PREFIX}/namespaces/kube-system/pods/..%2Fx/{QUEUE_TIME}",
            f"{MODELS}/a%2Fb/{QUEUE_TIME}",
            f"{PREFIX}/namespaces/team-a/pods/*/{QUEUE_TIME}%2Fx")]

    answers = _serve(kube, requests)
    assert [status for status, _ in answers] == [400, 400, 400, 400], answers
    assert all("encoded /" in a["message"] for _, a in answers), answers
    assert not kube.calls, f"a path with %2F reached the API server: {dict(kube.calls)}"


def test_a_model_that_does_not_exist_starts_no_sampler() -> None:
    kube = FakeKube(models={("team-a", "real")})

    async def requests(session: ClientSession, base: str, api: CustomMetricsApi) -> tuple[int, dict, list]:
        status, answer = await _get(session, f"{base}{MODELS}/missing/{QUEUE_TIME}")
        return status, answer, list(api.collector.models)

    status, answer, sampled = _serve(kube, requests)
    assert status == 404, answer
    assert sampled == [], f"a query for a missing model started samplers: {sampled}"
    assert kube.calls["list Pod team-a"] == 0, dict(kube.calls)


def test_one_new_token_asked_at_once_costs_one_token_review() -> None:
    kube = FakeKube(models={("team-a", "real")})
    kube.release.clear()  # the API server answers once every request has arrived
    arrivals = Arrivals()

    async def requests(session: ClientSession, base: str, api: CustomMetricsApi) -> list[int]:
        url = f"{base}{PREFIX}"
        tasks = [asyncio.create_task(_get(session, url)) for _ in range(20)]
        await arrivals.wait(20)
        kube.release.set()
        return [status for status, _ in await asyncio.gather(*tasks)]

    statuses = _serve(kube, requests, arrivals)
    assert statuses == [200] * 20, statuses
    assert kube.calls["tokenreviews"] == 1, f"20 requests with one token cost {kube.calls['tokenreviews']} TokenReviews"


def test_made_up_tokens_cost_no_more_token_reviews_than_the_rate_allows() -> None:
    kube = FakeKube()

    async def requests(session: ClientSession, base: str, api: CustomMetricsApi) -> Counter[int]:
        statuses: Counter[int] = Counter()
        for i in range(300):
            status, _ = await _get(session, f"{base}{PREFIX}", token=f"made-up-{i}")
            statuses[status] += 1
        return statuses

    statuses = _serve(kube, requests)
    reviews = kube.calls["tokenreviews"]
    assert statuses[401] == reviews and statuses[429] == 300 - reviews, statuses
    # The burst, and the rate over the time the 300 requests took (well under 10 s here; bounded either way).
    assert reviews <= custom_metrics.NEW_TOKENS_BURST + 10 * custom_metrics.NEW_TOKENS_PER_SECOND, reviews


def test_the_verdict_caches_stay_bounded() -> None:
    cache = _Ttl()
    for i in range(3 * custom_metrics.CACHE_ENTRIES):
        cache.put(f"token-{i}", False)
    assert len(cache.items) == custom_metrics.CACHE_ENTRIES
    assert cache.get(f"token-{3 * custom_metrics.CACHE_ENTRIES - 1}") is False and cache.get("token-0") is None
