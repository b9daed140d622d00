"""The custom metrics API (custom.metrics.k8s.io/v1beta2): Triton's own statistics for HorizontalPodAutoscalers.

An aggregated API, served on the webhook's TLS port by every operator replica (the APIService points at the
webhook's Service). The API server proxies `/apis/custom.metrics.k8s.io/v1beta2/...` to us, presenting its
front-proxy client certificate and the caller in headers (X-Remote-User, X-Remote-Group, X-Remote-Extra-*),
as the ConfigMap kube-system/extension-apiserver-authentication describes. What this serves:

- `GET .../namespaces/NS/tritonmodels.<group>/NAME/METRIC`: the model's metric (`plan.autoscaling`), over
  its warmed replicas (`*` for every TritonModel of the namespace with a warmed replica);
- `GET .../namespaces/NS/pods/NAME/METRIC` (or `*` and `?labelSelector=`): each warmed replica's own;
- `GET .../namespaces/NS/tritonpools.<group>/NAME/triton_pool_demand_bytes`: the memory a pool's models demand,
  from its status (`plan.autoscaling.pool_demand`).

A pooled model (spec.pool) has no pods of its own: its replicas are the pool replicas of its status.placement where
its EndpointSlices list the copy ready (the operator's verdict that it serves there at the desired config, warm, as
a replica's gate is for a model's own), and only its own statistics are read there (Triton's are per model).

Authentication, as Kubernetes' delegated authentication does it: a client certificate signed by the
front-proxy CA, with a name the API server allows, vouches for the headers; otherwise a bearer token is
checked with a TokenReview; otherwise 401. Authorization: a SubjectAccessReview of the caller for `get` on the
metric (resource `tritonmodels.<group>`, subresource the metric name). Both verdicts are cached for 10 s, at
most `CACHE_ENTRIES` of each (the oldest go first); requests that ask the same at once share one review; at most
`CONCURRENT_REVIEWS` reviews are in flight; and a TokenReview of a token not in the cache is spent at most
`NEW_TOKENS_PER_SECOND` times a second (bursts of `NEW_TOKENS_BURST`), so that a stream of made-up tokens costs
the API server that much and no more; over it, 429. The API server's own calls (front-proxy certificate) need
no TokenReview.

Paths are checked before anything else: a namespace must be a DNS label and a name a DNS subdomain (or `*`),
decoded; so an encoded slash (`%2F`), which aiohttp decodes inside a segment, is refused with 400 before it
could reach an access review or a LIST. A TritonModel that does not exist gets 404 without starting a sampler:
its existence is read from the webhook's watch of TritonModels (`Models`).

The samples are this replica's own (followers too: the Service may send the HPA to any replica). A model is
sampled from the first time it is asked about until nobody asked for `IDLE_SECONDS`: its pods are listed and
every warmed one's statistics read over HTTP each `SAMPLE_SECONDS`. The first request for a model waits for
two samples. Only this module and `triton.stats` do this; `plan.autoscaling` computes, pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import re
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

from aiohttp import web
from multidict import MultiMapping

from ..api.kinds import ENDPOINT_SLICE, LABEL_MODEL, POD, TRITON_POOL
from ..api.pod import ANNOTATION_TRITON_NAME, HTTP_PORT
from ..api.pool import POOL_KIND, POOL_PLURAL, PoolAutoscaling, TritonPool
from ..api.v1alpha1 import API_VERSION as MODEL_API_VERSION
from ..api.v1alpha1 import GROUP, KIND, PLURAL
from ..plan.autoscaling import WINDOW_SECONDS, Sample, delta, model_metrics, pool_demand, replica_metrics, trim
from ..plan.status import warmed
from ..platform.kube import Kube
from ..render.autoscaling import METRICS, MODEL_METRICS, POOL_METRICS, quantity
from ..triton.stats import model_counters

log = logging.getLogger("triton_operator.custom_metrics")

API_GROUP = "custom.metrics.k8s.io"
API_VERSION = "v1beta2"
PREFIX = f"/apis/{API_GROUP}/{API_VERSION}"
MODEL_RESOURCE = f"{PLURAL}.{GROUP}"
POOL_RESOURCE = f"{POOL_PLURAL}.{GROUP}"
#: What each resource serves.
SERVED = {MODEL_RESOURCE: MODEL_METRICS, "pods": METRICS, POOL_RESOURCE: POOL_METRICS}
AUTH_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
SAMPLE_SECONDS = 2.0
IDLE_SECONDS = 600.0
CACHE_SECONDS = 10.0
CACHE_ENTRIES = 4096
CONCURRENT_REVIEWS = 4
NEW_TOKENS_PER_SECOND = 10.0
NEW_TOKENS_BURST = 50
REFRESH_SECONDS = 300.0
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


# -- who is asking ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    uid: str = ""


@dataclass
class FrontProxy:
    """The API server's requestheader settings (ConfigMap extension-apiserver-authentication)."""

    ca_pem: str = ""
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)

    @classmethod
    def from_configmap(cls, data: Mapping[str, str]) -> FrontProxy:
        def names(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
            text = data.get(key)
            return tuple(json.loads(text) or ()) if text else default

        return cls(data.get("requestheader-client-ca-file", ""), names("requestheader-allowed-names", ()),
                   names("requestheader-username-headers", ("X-Remote-User",)),
                   names("requestheader-group-headers", ("X-Remote-Group",)),
                   names("requestheader-extra-headers-prefix", ("X-Remote-Extra-",)))

    def user(self, common_name: str, headers: MultiMapping[str]) -> User | None:
        """The user the headers name, if the certificate's name may vouch for them; None otherwise."""
        if self.allowed_names and common_name not in self.allowed_names:
            return None
        name = next((headers[h] for h in self.username_headers if headers.get(h)), "")
        if not name:
            return None
        groups = [g for h in self.group_headers for g in headers.getall(h, ())]
        extra: dict[str, list[str]] = {}
        for key in headers:
            for prefix in self.extra_prefixes:
                if key.lower().startswith(prefix.lower()):
                    extra.setdefault(unquote(key[len(prefix):]).lower(), []).extend(headers.getall(key))
        return User(name, _authenticated(groups), tuple((k, tuple(v)) for k, v in sorted(extra.items())))


def _authenticated(groups: list[str]) -> tuple[str, ...]:
    """Every authenticated user is in system:authenticated, as the API server's own authentication adds it."""
    return tuple(dict.fromkeys([*groups, "system:authenticated"]))


def _common_name(peercert: Mapping[str, Any] | None) -> str | None:
    for rdn in (peercert or {}).get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class _Ttl:
    """Verdicts, each kept `CACHE_SECONDS`, at most `entries` of them (the least recently stored go first);
    concurrent lookups of one key share one computation."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self.entries = entries
        self.items: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self.pending: dict[str, asyncio.Future[Any]] = {}

    def get(self, key: str) -> Any:
        hit = self.items.get(key)
        return hit[1] if hit and hit[0] > time.monotonic() else None

    def put(self, key: str, value: Any) -> None:
        self.items.pop(key, None)
        self.items[key] = (time.monotonic() + CACHE_SECONDS, value)
        while len(self.items) > self.entries:
            self.items.popitem(last=False)

    async def get_or_compute(self, key: str, compute: Callable[[], Awaitable[Any]]) -> Any:
        cached = self.get(key)
        if cached is not None:
            return cached
        if key in self.pending:
            return await asyncio.shield(self.pending[key])
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[key] = fut
        try:
            value = await compute()
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            self.pending.pop(key, None)
        self.put(key, value)
        fut.set_result(value)
        return value


class _Rate:
    """A token bucket: `take` is True at most `per_second` times a second on average, `burst` at once."""

    def __init__(self, per_second: float, burst: int) -> None:
        self.per_second, self.burst = per_second, burst
        self.tokens, self.at = float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.per_second)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class TooManyTokens(Exception):
    """More new bearer tokens than `NEW_TOKENS_PER_SECOND`: no TokenReview was spent on this one."""


class Models(Protocol):
    """Which TritonModels exist (the webhook's watch of them, `KubeModels` without one)."""

    async def exists(self, namespace: str, name: str) -> bool: ...

    async def names(self, namespace: str) -> list[str]: ...


class KubeModels:
    """`Models` read from the API server: a GET or a LIST per question."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def exists(self, namespace: str, name: str) -> bool:
        return await asyncio.to_thread(self.kube.get, MODEL_API_VERSION, KIND, namespace, name) is not None

    async def names(self, namespace: str) -> list[str]:
        listed = await asyncio.to_thread(self.kube.list, MODEL_API_VERSION, KIND, namespace)
        return sorted(b["metadata"]["name"] for b in listed)


# -- the samples ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Replica:
    """A replica a model's statistics are read from: a pod of its own, or a pool replica with a copy of it."""

    name: str  # pod name
    uid: str
    ip: str | None
    triton_name: str  # the model's name in that Triton
    warmed: bool  # it serves the desired config, warm: counted

    @classmethod
    def of_pod(cls, pod: Mapping[str, Any], model: str) -> _Replica:
        meta = pod["metadata"]
        return cls(meta["name"], meta["uid"], (pod.get("status") or {}).get("podIP"),
                   (meta.get("annotations") or {}).get(ANNOTATION_TRITON_NAME) or model, warmed(pod))


def pooled_copies(model: Mapping[str, Any], slices: list[dict[str, Any]]) -> list[_Replica]:
    """A pooled model's copies that serve: the pool replicas of its status.placement that its EndpointSlices list
    ready (pure: the model and its slices as the API server returns them)."""
    placed = set((model.get("status") or {}).get("placement") or ())
    triton_name = (model.get("spec") or {}).get("modelName") or model["metadata"]["name"]
    copies: dict[str, _Replica] = {}
    for s in slices:
        for e in s.get("endpoints") or ():
            ref = e.get("targetRef") or {}
            name, addresses = str(ref.get("name") or ""), e.get("addresses") or ()
            if ref.get("kind") != "Pod" or name not in placed or not addresses or name in copies:
                continue
            ready = bool((e.get("conditions") or {}).get("ready"))
            copies[name] = _Replica(name, str(ref.get("uid") or name), addresses[0], triton_name, ready)
    return sorted(copies.values(), key=lambda r: r.name)


@dataclass
class _Model:
    namespace: str
    name: str
    asked: float = field(default_factory=time.monotonic)
    pods: list[_Replica] = field(default_factory=list)  # as last listed
    samples: dict[str, list[Sample]] = field(default_factory=dict)  # by pod uid
    rounds: int = 0
    sampled: asyncio.Event = field(default_factory=asyncio.Event)  # set after each round
    task: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class Reading:
    """A model's metrics now: over its warmed replicas, and each replica's own."""

    model: dict[str, float] | None
    replicas: dict[str, dict[str, float]]  # pod name -> metrics


class Collector:
    def __init__(self, kube: Kube, interval: float = SAMPLE_SECONDS, window: float = WINDOW_SECONDS,
                 max_concurrent: int = 32) -> None:
        self.kube = kube
        self.interval, self.window = interval, window
        self.models: dict[tuple[str, str], _Model] = {}
        self.sem = asyncio.Semaphore(max_concurrent)

    async def stop(self) -> None:
        tasks = [m.task for m in self.models.values() if m.task]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def read(self, namespace: str, name: str) -> Reading:
        """The model's metrics, sampling it from now on if it was not yet (then after two rounds)."""
        m = self.models.get((namespace, name))
        if m is None or m.task is None or m.task.done():
            m = _Model(namespace, name)
            self.models[(namespace, name)] = m
            m.task = asyncio.create_task(self._run(m), name=f"custom-metrics-{namespace}/{name}")
            log.info("Sampling Triton statistics for the custom metrics API namespace=%s model=%s", namespace, name)
        m.asked = time.monotonic()
        deadline = time.monotonic() + 3 * self.interval + 5
        while m.rounds < 2 and time.monotonic() < deadline:
            m.sampled.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(m.sampled.wait(), max(deadline - time.monotonic(), 0.01))
        return self._reading(m)

    def _reading(self, m: _Model) -> Reading:
        now = time.monotonic()
        deltas, replicas = [], {}
        for pod in m.pods:
            if not pod.warmed:
                continue
            d = delta(m.samples.get(pod.uid, []), now, self.window)
            if d is not None:
                deltas.append(d)
                replicas[pod.name] = replica_metrics(d)
        return Reading(model_metrics(deltas), replicas)

    async def _run(self, m: _Model) -> None:
        while time.monotonic() - m.asked < IDLE_SECONDS:
            try:
                await self._round(m)
            except Exception as exc:  # noqa: BLE001 - the API server or a replica may be away: next round
                log.warning("Sampling failed namespace=%s model=%s error=%r", m.namespace, m.name, exc)
            m.rounds += 1
            m.sampled.set()
            await asyncio.sleep(self.interval)
        log.info("Stopped sampling (nobody asked for %.0fs) namespace=%s model=%s", IDLE_SECONDS, m.namespace, m.name)
        self.models.pop((m.namespace, m.name), None)

    async def _replicas(self, m: _Model) -> list[_Replica]:
        """The model's own pods; with none, the pool replicas its copies serve on, if it is a pooled model."""
        pods = await asyncio.to_thread(self.kube.list, POD.api_version, POD.kind, m.namespace,
                                       f"{LABEL_MODEL}={m.name}")
        if pods:
            return [_Replica.of_pod(p, m.name) for p in pods if not p["metadata"].get("deletionTimestamp")]
        body = await asyncio.to_thread(self.kube.get, MODEL_API_VERSION, KIND, m.namespace, m.name)
        if body is None or not (body.get("spec") or {}).get("pool"):
            return []
        slices = await asyncio.to_thread(self.kube.list, ENDPOINT_SLICE.api_version, ENDPOINT_SLICE.kind,
                                         m.namespace, f"{ENDPOINT_SLICE.selector},kubernetes.io/service-name={m.name}")
        return pooled_copies(body, slices)

    async def _round(self, m: _Model) -> None:
        m.pods = await self._replicas(m)
        live = {p.uid for p in m.pods}
        for uid in [u for u in m.samples if u not in live]:
            del m.samples[uid]

        async def sample(pod: _Replica) -> None:
            if not pod.ip:
                return
            async with self.sem:
                try:
                    counters = await model_counters(f"{pod.ip}:{HTTP_PORT}", pod.triton_name)
                except Exception as exc:  # noqa: BLE001 - one replica not answering: its samples wait
                    log.debug("No statistics from pod=%s error=%r", pod.name, exc)
                    return
            at = time.monotonic()
            m.samples[pod.uid] = [*trim(m.samples.get(pod.uid, []), at, self.window), Sample(at, counters)]

        await asyncio.gather(*(sample(p) for p in m.pods if p.warmed))


# -- the API ------------------------------------------------------------------------------------------


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class CustomMetricsApi:
    def __init__(self, kube: Kube, watched: Callable[[str], bool], collector: Collector | None = None,
                 models: Models | None = None) -> None:
        self.kube = kube
        self.watched = watched
        self.collector = collector or Collector(kube)
        self.models = models or KubeModels(kube)
        self.front_proxy = FrontProxy()
        self._tokens = _Ttl()
        self._access = _Ttl()
        self._reviews = asyncio.Semaphore(CONCURRENT_REVIEWS)
        self._new_tokens = _Rate(NEW_TOKENS_PER_SECOND, NEW_TOKENS_BURST)
        self._refresh: asyncio.Task[None] | None = None

    def routes(self, app: web.Application) -> None:
        app.router.add_get(PREFIX, self._discovery)
        app.router.add_get(PREFIX + "/namespaces/{namespace}/{resource}/{name}/{metric}", self._metric)

    async def start(self, context: ssl.SSLContext) -> None:
        """Trust the API server's front-proxy CA for client certificates (optional ones: the webhook's
        callers present none), and read it again every few minutes."""
        try:
            await self._load(context)
        except Exception as exc:  # noqa: BLE001 - serve tokens meanwhile; the refresh loop tries again
            log.error("Could not read %s/%s (the chart binds extension-apiserver-authentication-reader): the "
                      "custom metrics API accepts bearer tokens only until it can error=%r", *AUTH_CONFIGMAP, exc)
        self._refresh = asyncio.create_task(self._refresh_loop(context), name="custom-metrics-front-proxy")

    async def stop(self) -> None:
        if self._refresh:
            self._refresh.cancel()
        await self.collector.stop()

    async def _load(self, context: ssl.SSLContext) -> None:
        cm = await asyncio.to_thread(self.kube.get, "v1", "ConfigMap", *AUTH_CONFIGMAP)
        proxy = FrontProxy.from_configmap((cm or {}).get("data") or {})
        if not proxy.ca_pem:
            log.warning("The API server has no front-proxy CA (%s/%s has no requestheader-client-ca-file): the "
                        "custom metrics API accepts bearer tokens only; enable the aggregation layer", *AUTH_CONFIGMAP)
        elif proxy.ca_pem != self.front_proxy.ca_pem:
            context.load_verify_locations(cadata=proxy.ca_pem)
            context.verify_mode = ssl.CERT_OPTIONAL
            log.info("Loaded the API server's front-proxy CA allowed_names=%s", list(proxy.allowed_names))
        self.front_proxy = proxy

    async def _refresh_loop(self, context: ssl.SSLContext) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            try:
                await self._load(context)
            except Exception as exc:  # noqa: BLE001 - keep the settings read last
                log.warning("Could not read %s/%s error=%r", *AUTH_CONFIGMAP, exc)

    # authentication and authorization

    async def _user(self, request: web.Request) -> User | None:
        cn = _common_name(request.transport.get_extra_info("peercert") if request.transport else None)
        if cn is not None:
            return self.front_proxy.user(cn, request.headers)
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            return None
        token = auth[7:].strip()
        key = hashlib.sha256(token.encode()).hexdigest()

        async def token_review() -> User | bool:
            if not self._new_tokens.take():
                raise TooManyTokens
            async with self._reviews:
                status = await asyncio.to_thread(self.kube.review, "authentication.k8s.io/v1", "tokenreviews",
                                                 {"token": token})
            u = status.get("user") or {}
            return User(u.get("username", ""), _authenticated(list(u.get("groups") or ())),
                        tuple((k, tuple(v)) for k, v in sorted((u.get("extra") or {}).items())),
                        u.get("uid", "")) if status.get("authenticated") else False

        user = await self._tokens.get_or_compute(key, token_review)
        return user or None

    async def _allowed(self, user: User, attributes: dict[str, Any], non_resource: bool = False) -> bool:
        key = json.dumps([user.name, user.groups, user.extra, user.uid, attributes], sort_keys=True)

        async def access_review() -> bool:
            spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups),
                                    "extra": {k: list(v) for k, v in user.extra}, "uid": user.uid,
                                    "nonResourceAttributes" if non_resource else "resourceAttributes": attributes}
            async with self._reviews:
                status = await asyncio.to_thread(self.kube.review, "authorization.k8s.io/v1",
                                                 "subjectaccessreviews", spec)
            return bool(status.get("allowed")) and not status.get("denied")

        return bool(await self._access.get_or_compute(key, access_review))

    async def _guard(self, request: web.Request, attributes: dict[str, Any], non_resource: bool = False
                     ) -> web.Response | None:
        try:
            user = await self._user(request)
        except TooManyTokens:
            refused = _status(429, "TooManyRequests", "too many new bearer tokens at once; retry")
            refused.headers["Retry-After"] = "1"
            return refused
        except Exception as exc:  # noqa: BLE001 - the API server could not say: refuse, say why
            log.warning("TokenReview failed error=%r", exc)
            return _status(500, "InternalError", f"could not authenticate: {exc}")
        if user is None:
            return _status(401, "Unauthorized", "Unauthorized: present the API server's front-proxy client "
                           "certificate with the user in its headers, or a valid bearer token")
        try:
            if not await self._allowed(user, attributes, non_resource):
                what = attributes.get("path") or f"{attributes.get('resource')}/{attributes.get('subresource')}"
                return _status(403, "Forbidden", f'User "{user.name}" cannot get {what} in API group '
                               f'"{API_GROUP}" in the namespace "{attributes.get("namespace", "")}"')
        except Exception as exc:  # noqa: BLE001
            log.warning("SubjectAccessReview failed error=%r", exc)
            return _status(500, "InternalError", f"could not authorize: {exc}")
        return None

    # handlers

    async def _discovery(self, request: web.Request) -> web.Response:
        refused = await self._guard(request, {"path": request.path, "verb": "get"}, non_resource=True)
        if refused is not None:
            return refused
        resources = [{"name": f"{what}/{metric}", "singularName": "", "namespaced": True, "kind": "MetricValueList",
                      "verbs": ["get"]} for what, metrics in SERVED.items() for metric in metrics]
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                  "groupVersion": f"{API_GROUP}/{API_VERSION}", "resources": resources})

    async def _metric(self, request: web.Request) -> web.Response:
        ns, resource = request.match_info["namespace"], request.match_info["resource"]
        name, metric = request.match_info["name"], request.match_info["metric"]
        if not DNS_LABEL.fullmatch(ns):
            return _status(400, "BadRequest", "the namespace must be a DNS label (an encoded / is not one)")
        if name != "*" and not DNS_SUBDOMAIN.fullmatch(name):
            return _status(400, "BadRequest", "the name must be * or a DNS subdomain (an encoded / is not one)")
        if "/" in resource or "/" in metric:
            return _status(400, "BadRequest", "an encoded / is not part of a resource or a metric name")
        refused = await self._guard(request, {"namespace": ns, "verb": "get", "group": API_GROUP,
                                              "version": API_VERSION, "resource": resource, "subresource": metric,
                                              "name": "" if name == "*" else name})
        if refused is not None:
            return refused
        if resource not in SERVED:
            return _status(404, "NotFound", f"no metrics for {resource}: only {', '.join(SERVED)}")
        if metric not in SERVED[resource]:
            return _status(404, "NotFound", f"no metric {metric!r} of {resource}: this server serves "
                           f"{', '.join(SERVED[resource])}")
        if not self.watched(ns):
            return _status(404, "NotFound", f"namespace {ns!r} is not watched by this triton-operator")
        try:
            if resource == MODEL_RESOURCE:
                items = await self._models(ns, name, metric)
            elif resource == POOL_RESOURCE:
                items = await self._pools(ns, name, metric)
            else:
                items = await self._pods(ns, name, metric, request.query.get("labelSelector"))
        except Exception as exc:  # noqa: BLE001
            log.warning("Reading metric=%s namespace=%s name=%s failed error=%r", metric, ns, name, exc)
            return _status(500, "InternalError", f"could not read {metric}: {exc}")
        if name != "*" and not items:
            return _status(404, "NotFound", self._missing(resource, ns, name, metric))
        return web.json_response({"kind": "MetricValueList", "apiVersion": f"{API_GROUP}/{API_VERSION}",
                                  "metadata": {}, "items": items})

    def _missing(self, resource: str, ns: str, name: str, metric: str) -> str:
        if resource == POOL_RESOURCE:
            return f"{metric} of TritonPool {ns}/{name}: no such pool, or the operator has not written its status yet"
        what = f"TritonModel {ns}/{name}" if resource == MODEL_RESOURCE else f"pod {ns}/{name}"
        return (f"{metric} of {what}: no warmed replica with statistics over the last {self.collector.window:.0f}s "
                "(not a TritonModel replica, not warmed, or just started)")

    def _item(self, kind: str, api_version: str, ns: str, name: str, metric: str, value: float) -> dict[str, Any]:
        return {"describedObject": {"kind": kind, "namespace": ns, "name": name, "apiVersion": api_version},
                "metric": {"name": metric, "selector": None}, "timestamp": _now(),
                "windowSeconds": int(self.collector.window), "value": quantity(value)}

    async def _models(self, ns: str, name: str, metric: str) -> list[dict[str, Any]]:
        if name == "*":
            names = await self.models.names(ns)
        elif await self.models.exists(ns, name):
            names = [name]
        else:
            return []  # no sampler for a model that is not there: 404
        readings = await asyncio.gather(*(self.collector.read(ns, n) for n in names))
        return [self._item(KIND, MODEL_API_VERSION, ns, n, metric, r.model[metric])
                for n, r in zip(names, readings, strict=True) if r.model is not None]

    async def _pools(self, ns: str, name: str, metric: str) -> list[dict[str, Any]]:
        """The pools' demand, read from their status (each GET or LIST is the API server's freshest)."""
        if name == "*":
            bodies = await asyncio.to_thread(self.kube.list, TRITON_POOL.api_version, POOL_KIND, ns)
        else:
            body = await asyncio.to_thread(self.kube.get, TRITON_POOL.api_version, POOL_KIND, ns, name)
            bodies = [body] if body is not None else []
        items = []
        for body in bodies:
            try:
                pool = TritonPool.model_validate(body)
            except ValueError:
                continue
            a = pool.spec.autoscaling or PoolAutoscaling(max_replicas=1, target_free_fraction=0)
            demand = pool_demand(body.get("status") or {}, a.target_bytes(pool.spec.replica_bytes))
            if demand is not None:
                items.append(self._item(POOL_KIND, MODEL_API_VERSION, ns, pool.name, metric, demand))
        return items

    async def _pods(self, ns: str, name: str, metric: str, selector: str | None) -> list[dict[str, Any]]:
        pods = await asyncio.to_thread(self.kube.list, POD.api_version, POD.kind, ns, selector)
        if name != "*":
            pods = [p for p in pods if p["metadata"]["name"] == name]
        models = sorted({m for p in pods if (m := (p["metadata"].get("labels") or {}).get(LABEL_MODEL))})
        wanted = {p["metadata"]["name"] for p in pods}
        readings = await asyncio.gather(*(self.collector.read(ns, m) for m in models))
        return [self._item("Pod", "v1", ns, pod, metric, values[metric])
                for reading in readings for pod, values in sorted(reading.replicas.items()) if pod in wanted]
