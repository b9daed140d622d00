"""kopf wiring: watches, the drift loop, the warm-up gate, liveness and metrics.

Handlers are kopf `on.event` handlers only, so kopf writes nothing of its own
(no progress annotations, no finalizers): every write the operator makes comes
from `Reconciler` or `WarmupGate`. Drift correction is a plain asyncio task,
not a kopf timer: kopf puts a finalizer on every object a timer runs for. Each
round it first resyncs the cache with the API (`Reconciler.resync`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import kopf
from aiohttp import web

from ..api.kinds import CHILDREN, ENDPOINT_SLICE, HPA, LABEL_MODEL, OWNED, POD, POOL_POD, TRITON_MODEL, TRITON_POOL
from ..api.pool import ENDPOINTSLICE_MANAGER, LABEL_POOL
from ..api.v1alpha1 import GROUP, VERSION
from ..platform.kube import Kube
from ..platform.kubeconfig import Credentials, CredentialSource
from ..platform.leader import ElectionSettings, LeaderElection
from ..platform.namespaces import has_patterns
from ..render.kubernetes import Options
from ..render.webhook import WebhookTarget
from ..servers.webhook import AdmissionWebhook
from . import metrics
from .cache import Cache
from .gate import WarmupGate
from .namespaces import NamespaceSet
from .pool import PoolReconciler, pool_of
from .reconcile import Reconciler
from .tasks import detached

log = logging.getLogger("triton_operator")


@dataclass(frozen=True)
class WebhookSettings:
    target: WebhookTarget
    configuration: str = "triton-operator"
    failure_policy: str = "Fail"
    address: str = "0.0.0.0"  # noqa: S104 - the API server calls in from outside the pod
    port: int = 9443
    # A directory holding tls.crt and tls.key (the chart's Secret, shared by every replica): served as is,
    # reloaded when it changes; the configuration's caBundle is then the chart's. None: self-issued.
    cert_dir: str | None = None
    # Also serve the custom metrics API (custom.metrics.k8s.io/v1beta2) on this port, for autoscaling.
    custom_metrics: bool = False
    # Connections the port serves at once (`servers.tls_server`); more are refused at accept.
    max_connections: int = 256
    # The configuration also reviews this operator's own writes, failing closed (the chart's
    # admissionPolicies.operator.reviewWrites): a new leader waits for the Service's first ready endpoint.
    reviews_own_writes: bool = False


class State:
    namespace_set: NamespaceSet | None = None  # only with glob patterns: kopf then discovers the namespaces
    kube: Kube
    cache: Cache
    reconciler: Reconciler
    pools: PoolReconciler
    gate: WarmupGate
    drift: asyncio.Task[None]
    webhook: AdmissionWebhook | None = None


STATE = State()


class NoEssence(kopf.DiffBaseStorage):
    """No diff base: kopf deep-copies every watched object on every event to build its "essence" and diff it against
    the last handled one, but only on.create/on.update/on.field handlers read that diff, and this operator has
    on.event handlers only. At 1000 new models that copying was about 12% of the operator's CPU (py-spy, issue 17).
    Every essence is empty, so every diff is empty, and nothing is stored on the objects."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return kopf.BodyEssence()

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


def build_registry(drift_interval: float) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True
        # No CRD/namespace discovery (the chart's RBAC grants neither): only glob namespace patterns need it.
        settings.scanning.disabled = STATE.namespace_set is None
        settings.posting.enabled = False
        settings.persistence.diffbase_storage = NoEssence()
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.request_timeout = 30
        # kopf keeps a worker task and queue per watched object until it has had no event for idle_timeout (5 s by
        # default): while 1000 models and their 3000 children were created, most of them were alive at once. At
        # 0.5 s the operator's peak RSS at 1000 models fell from 271-279 MB (three runs) to 247 MB, converging as
        # fast (bench.scale phases, issue 17). A later event for the object just starts a new worker.
        settings.queueing.idle_timeout = 0.5
        STATE.gate = WarmupGate(STATE.kube, on_change=lambda ns, name: STATE.reconciler.request(ns, name),
                                key_of=_repository_key, budget_of=_max_unavailable)
        STATE.drift = detached(_drift_loop(drift_interval), name="drift")

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(**_: Any) -> None:
        STATE.drift.cancel()
        await STATE.gate.stop()

    @kopf.on.event(TRITON_MODEL.group, TRITON_MODEL.version, TRITON_MODEL.plural, registry=registry)
    async def _model_event(event: kopf.RawEvent, **_: Any) -> None:
        body = event["object"]
        deleted = event["type"] == "DELETED"
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        old = STATE.cache.model(ns, name)
        STATE.cache.put_model(body, deleted=deleted)
        STATE.reconciler.model_changed(ns, old or (body if deleted else None), None if deleted else body)
        for pool in {pool_of(old), pool_of(body)} - {None}:
            STATE.pools.request(ns, str(pool))
        if deleted:
            log.info("Observed TritonModel deletion namespace=%s name=%s", ns, name)
            for dep in STATE.reconciler.dependents(ns, name):
                STATE.reconciler.request(ns, dep)
            return
        STATE.reconciler.request(ns, name)

    def _child_handler(group: str, version: str, plural: str) -> None:
        @kopf.on.event(group, version, plural, labels=OWNED, registry=registry)
        async def _child_event(event: kopf.RawEvent, **_: Any) -> None:
            body = event["object"]
            meta = body["metadata"]
            old = STATE.cache.children.get((body["kind"], meta["namespace"], meta["name"]))
            STATE.cache.put_child(body, deleted=event["type"] == "DELETED")
            owner = (meta.get("labels") or {}).get(LABEL_MODEL)
            if LABEL_POOL in (meta.get("labels") or {}):  # the pool's, or a pooled model's
                pool = STATE.pools.observe_child(body, deleted=event["type"] == "DELETED")
                if pool and not status_only(old, body, event["type"] or ""):  # an HPA's sync: no round
                    STATE.pools.request(meta["namespace"], pool)
                return
            if owner and not status_only(old, body, event["type"] or ""):
                STATE.reconciler.request(meta["namespace"], owner)

    for child in CHILDREN:
        _child_handler(child.group, child.version, child.plural)

    _add_pool_handlers(registry)

    @kopf.on.event(POD.group, POD.version, POD.plural, labels={LABEL_MODEL: kopf.PRESENT}, registry=registry)
    async def _pod_event(event: kopf.RawEvent, **_: Any) -> None:
        body: dict[str, Any] = dict(event["object"])
        deleted = event["type"] == "DELETED"
        model = STATE.cache.put_pod(body, deleted=deleted)
        STATE.gate.observe(body, deleted=deleted)
        if model:
            STATE.reconciler.request(body["metadata"]["namespace"], model)

    return registry


def _add_pool_handlers(registry: kopf.OperatorRegistry) -> None:
    """TritonPools, their replicas and the EndpointSlices of their models: each event asks for the pool's round."""

    @kopf.on.event(ENDPOINT_SLICE.group, ENDPOINT_SLICE.version, ENDPOINT_SLICE.plural,
                   labels={"endpointslice.kubernetes.io/managed-by": ENDPOINTSLICE_MANAGER}, registry=registry)
    async def _slice_event(event: kopf.RawEvent, **_: Any) -> None:
        body = event["object"]
        pool = STATE.pools.observe_child(body, deleted=event["type"] == "DELETED")
        if pool:
            STATE.pools.request(body["metadata"]["namespace"], pool)

    @kopf.on.event(TRITON_POOL.group, TRITON_POOL.version, TRITON_POOL.plural, registry=registry)
    async def _pool_event(event: kopf.RawEvent, **_: Any) -> None:
        body = event["object"]
        STATE.pools.put_pool(body, deleted=event["type"] == "DELETED")
        if event["type"] == "DELETED":
            log.info("Observed TritonPool deletion namespace=%s name=%s", body["metadata"]["namespace"],
                     body["metadata"]["name"])
        STATE.pools.request(body["metadata"]["namespace"], body["metadata"]["name"])

    @kopf.on.event(POOL_POD.group, POOL_POD.version, POOL_POD.plural, labels={LABEL_POOL: kopf.PRESENT},
                   registry=registry)
    async def _pool_pod_event(event: kopf.RawEvent, **_: Any) -> None:
        meta = event["object"]["metadata"]
        STATE.pools.pod_changed(event["object"], deleted=event["type"] == "DELETED")
        STATE.pools.request(meta["namespace"], (meta.get("labels") or {})[LABEL_POOL])


def _repository_key(namespace: str, name: str) -> str | None:
    """The repository key of the cached TritonModel `namespace/name` (its uid is part of it), or None."""
    keys = STATE.reconciler.options.repository_keys
    models = STATE.cache.models.get(namespace)
    if keys is None or models is None or name not in models:
        return None
    uid = models.uid(name)
    return keys.key(namespace, name, uid) if uid else None


def _max_unavailable(namespace: str, name: str) -> int:
    """rollout.maxUnavailable of the cached TritonModel `namespace/name` (1, its default, when not cached)."""
    body = STATE.cache.model(namespace, name) or {}
    value = ((body.get("spec") or {}).get("rollout") or {}).get("maxUnavailable", 1)
    return value if isinstance(value, int) and value > 0 else 1


def status_only(old: Mapping[str, Any] | None, new: Mapping[str, Any], event: str) -> bool:
    """An update of an HPA's status alone (its controller writes one every sync) that leaves its ScalingActive
    condition as it was: nothing the plan reads changed, so no reconcile. Any other kind's status counts (a
    Deployment's says how many replicas are ready), and so does ScalingActive (the model's status restates it)."""
    if event == "DELETED" or old is None or new.get("kind") != HPA.kind:
        return False
    o, n = old["metadata"], new["metadata"]
    return bool(o.get("generation") == n.get("generation") and o.get("labels") == n.get("labels")
                and o.get("ownerReferences") == n.get("ownerReferences")
                and o.get("annotations") == n.get("annotations")
                and _scaling_active(old) == _scaling_active(new))


def _scaling_active(hpa: Mapping[str, Any]) -> tuple[str | None, str | None]:
    conditions: Sequence[Mapping[str, Any]] = (hpa.get("status") or {}).get("conditions") or ()
    c: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "ScalingActive"), {})
    return c.get("status"), c.get("reason")


async def _drift_loop(interval: float) -> None:
    """Every `interval` seconds: serve the matching namespaces kopf's namespace watch missed (glob patterns
    only), forget what the API no longer has (deletions a restarted watch never reported), then a reconcile
    of every TritonModel seen: corrects drift no event reported."""
    while True:
        await asyncio.sleep(interval)
        if STATE.namespace_set is not None:
            try:
                await STATE.namespace_set.revise()
            except Exception as exc:  # noqa: BLE001 - the API server may be away; the next round retries
                log.warning("Failed to check the watched namespaces error=%r", exc)
        try:
            for pod in await STATE.reconciler.resync():
                STATE.gate.observe(pod, deleted=True)
            await STATE.pools.resync()
        except Exception as exc:  # noqa: BLE001 - the API server may be away; the next round retries
            log.warning("Failed to resync the cache with the API error=%r", exc)
        for namespace, models in list(STATE.cache.models.items()):
            for name in list(models):
                STATE.reconciler.request(namespace, name)
        STATE.pools.request_all()


def kopf_session(creds: Credentials) -> kopf.AiohttpSession:
    """kopf's HTTP session, connecting as our own client does (`kube.Transport`): the same server, CA, client
    certificate, proxy, TLS server name, Authorization and impersonation headers.

    kopf's ConnectionInfo has no setting for impersonation headers or a TLS server name, so the login returns a
    session of our own (kopf's `AiohttpSession`, its documented way for these). The credentials go on each request
    (a client middleware), not on the session: aiohttp also sends a session's default headers to the proxy in its
    CONNECT request, and Authorization there as Proxy-Authorization. The proxy is ours, never aiohttp's own reading
    of the environment (`kubeconfig` reads it as client-go does)."""
    ssl_context = kopf.ConnectionInfo(
        server=creds.server, ca_path=creds.ca_path, insecure=creds.insecure,
        certificate_path=creds.certificate_path, private_key_path=creds.private_key_path,
    ).as_ssl_context()
    headers = creds.headers()
    server_name = None if creds.insecure else creds.tls_server_name

    async def credentials(req: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        for name in {name for name, _ in headers}:
            req.headers.popall(name, None)
        for name, value in headers:
            req.headers.add(name, value)
        if server_name:
            req.server_hostname = server_name  # SNI and the certificate check, through a proxy too
        return await handler(req)

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ssl=ssl_context), proxy=creds.proxy_url,
                                    middlewares=(credentials,), trust_env=False)
    return kopf.AiohttpSession(aiohttp_session=session, server=creds.server, expiration=creds.expiration)


#: How often the operator looks for its CRD while it is not there yet.
CRD_POLL_SECONDS = 2.0


async def wait_for_crd(kube: Kube, liveness: str | None, stop_flag: asyncio.Event | None) -> bool:
    """Returns once the API server serves TritonModels (False if asked to stop first).

    Helm, Argo CD and Flux do not promise to create the CRD before the operator starts, and kopf
    only looks for its resources once at start-up (it can re-scan only with permission to watch
    CRDs, which a namespaced install lacks). So the operator waits for the CRD first, answering its
    liveness endpoint meanwhile (it is alive: waiting is its job), and hands the port to kopf after.
    """
    try:
        if await asyncio.to_thread(kube.serves_tritonmodels):
            return True
    except Exception as exc:  # noqa: BLE001 - the API server may be unreachable for a while: keep waiting
        log.warning("Could not look up TritonModels in API discovery: %s", exc)
    log.info("Waiting for the TritonModel CRD group=%s version=%s poll=%.0fs", GROUP, VERSION, CRD_POLL_SECONDS)
    server = await _serve_liveness(liveness, "waiting for the TritonModel CRD")
    try:
        while not (stop_flag is not None and stop_flag.is_set()):
            try:
                if await asyncio.to_thread(kube.serves_tritonmodels):
                    log.info("Found the TritonModel CRD group=%s version=%s", GROUP, VERSION)
                    return True
            except Exception as exc:  # noqa: BLE001
                log.warning("Could not look up TritonModels in API discovery: %s", exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop_flag.wait() if stop_flag else asyncio.sleep(CRD_POLL_SECONDS),
                                       CRD_POLL_SECONDS)
        return False
    finally:
        if server is not None:
            await server.cleanup()


async def _serve_liveness(liveness: str | None, state: str) -> web.AppRunner | None:
    """The liveness endpoint while kopf (which serves it otherwise) is not running yet: alive, and why waiting."""
    if not liveness:
        return None
    url = urlsplit(liveness)

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"state": state})

    app = web.Application()
    app.router.add_get(url.path or "/", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, url.hostname, url.port or 80).start()
    return runner


def _admission_webhook(webhook: WebhookSettings | None, namespaces: list[str], clusterwide: bool,
                       options: Options) -> AdmissionWebhook | None:
    """The admission webhook (and the custom metrics it serves) for `webhook`'s settings; None without them."""
    return None if webhook is None else AdmissionWebhook(
        STATE.kube, webhook.target, configuration=webhook.configuration, failure_policy=webhook.failure_policy,
        namespaces=namespaces, clusterwide=clusterwide, address=webhook.address, port=webhook.port,
        cert_dir=webhook.cert_dir, custom_metrics=webhook.custom_metrics, max_connections=webhook.max_connections,
        options=options,
    )


async def _acquire(elector: LeaderElection, liveness: str | None, stop: asyncio.Event) -> bool:
    """Follows until this replica holds the leader Lease (True) or is stopped (False); liveness answers meanwhile."""
    server = await _serve_liveness(liveness, "following: another replica leads")
    try:
        return await elector.acquire(stop)
    finally:
        if server is not None:
            await server.cleanup()


async def _await_webhook(webhook: AdmissionWebhook, liveness: str | None, stop: asyncio.Event) -> None:
    """Before the leader's first write: the webhook reachable through its Service (`AdmissionWebhook.wait_reachable`),
    liveness answering meanwhile (the pod turns Ready on it, and only then is it an endpoint)."""
    server = await _serve_liveness(liveness, "leading: waiting for the webhook Service's first ready endpoint")
    try:
        await webhook.wait_reachable(stop)
    finally:
        if server is not None:
            await server.cleanup()


async def _relay(stop: asyncio.Event, lost: asyncio.Event, kopf_stop: asyncio.Event) -> None:
    """kopf stops on either: asked to, or no longer the leader."""
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(lost.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()
    kopf_stop.set()


def _add_login(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.login(registry=registry)
    async def _login(**_: Any) -> kopf.AiohttpSession:
        # The same credentials our writes use (--kubeconfig, KUBECONFIG or in-cluster), re-read on every
        # login (kopf logs in again after a 401 or at an exec credential's expiration): kopf's own
        # login_via_client would need the `kubernetes` package, which the operator process never imports.
        # Async: the session belongs to kopf's event loop (a sync handler runs in a thread).
        return kopf_session(await asyncio.to_thread(STATE.kube.credentials.reload))


async def run_operator(
    *,
    kubeconfig: str | None,
    namespaces: list[str],
    clusterwide: bool,
    liveness: str | None,
    options: Options,
    drift_interval: float = 60.0,
    stop_flag: asyncio.Event | None = None,
    webhook: WebhookSettings | None = None,
    election: ElectionSettings | None = None,
    credentials: CredentialSource | None = None,
    max_upgrade_rollouts: int = 0,
) -> int:
    """Runs until `stop_flag` (0), or until this replica loses the leader Lease (1: the process exits and
    the kubelet restarts it as a follower, as client-go's controllers do). `credentials`: already loaded (the CLI
    loads them first, to refuse a bad kubeconfig before anything starts), else loaded from `kubeconfig`.
    `max_upgrade_rollouts`: at most this many model Deployments in an upgrade rollout at once (`plan.upgrade`), 0: no
    bound."""
    stop = stop_flag or asyncio.Event()
    STATE.kube = Kube(credentials) if credentials is not None else Kube.from_environment(kubeconfig)
    if not await wait_for_crd(STATE.kube, liveness, stop):
        return 0
    globs = has_patterns(namespaces) and not clusterwide
    STATE.namespace_set = NamespaceSet(STATE.kube, namespaces) if globs else None
    STATE.cache = Cache()
    metrics.forget_objects()  # the objects' gauges are the new cache's (empty until the watches deliver)
    STATE.reconciler = Reconciler(STATE.kube, STATE.cache, options, max_upgrade_rollouts=max_upgrade_rollouts)
    STATE.reconciler.upgrade_scopes = [None] if clusterwide or globs else list(namespaces)
    STATE.pools = PoolReconciler(STATE.kube, STATE.cache, options)
    STATE.reconciler.on_pooled = STATE.pools.request
    STATE.pools.slots = STATE.reconciler  # a pool's Deployment counts against the same bound on upgrade rollouts
    STATE.reconciler.on_unpooled = STATE.pools.unpooled
    STATE.webhook = _admission_webhook(webhook, namespaces, clusterwide, options)
    elector = None if election is None else LeaderElection(STATE.kube, election)
    lost = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    if STATE.webhook is not None:  # every replica, leader or not, and before kopf's watches: it has a watch of its own
        await STATE.webhook.start()
    try:
        if elector is not None:
            if not await _acquire(elector, liveness, stop):
                return 0
            tasks.append(asyncio.create_task(elector.hold(lost), name="lease"))
        if STATE.webhook is not None and webhook is not None and webhook.reviews_own_writes:
            await _await_webhook(STATE.webhook, liveness, stop)
        kopf_stop = asyncio.Event()
        tasks.append(asyncio.create_task(_relay(stop, lost, kopf_stop), name="stop-relay"))
        registry = build_registry(drift_interval)
        _add_login(registry)
        await kopf.operator(
            registry=registry,
            insights=None if STATE.namespace_set is None else STATE.namespace_set.insights,
            clusterwide=clusterwide,
            namespaces=namespaces,
            liveness_endpoint=liveness,
            standalone=True,
            stop_flag=kopf_stop,
        )
    finally:
        for t in tasks:
            t.cancel()
        if elector is not None and not lost.is_set():
            await asyncio.to_thread(elector.release)
        if STATE.webhook is not None:
            await STATE.webhook.stop()
    if lost.is_set():
        log.error("Exiting: no longer the leader (the kubelet restarts this replica as a follower)")
        return 1
    return 0
