"""The validating admission webhook for TritonModels and TritonPools, served by the operator over TLS.

Every replica serves `POST /validate-tritonmodels` (both kinds: the review says which). Which certificate it
serves, and who puts the CA into the ValidatingWebhookConfiguration, depends on how the operator runs:
- In the chart (`--webhook-service ns/name --webhook-cert-dir DIR`): every replica serves the one
  certificate of the Secret `<fullname>-webhook-tls`, mounted at DIR (tls.crt, tls.key), and loads
  it again when the kubelet updates the files (checked every minute). The chart makes that Secret
  (Helm's genCA and genSignedCert, kept across upgrades) or cert-manager issues it, and the chart owns
  the configuration: its caBundle is written by Helm in the same render, or by cert-manager's
  cainjector. The operator writes nothing to the configuration.
- `--webhook-url https://127.0.0.1:port` (an operator run on a workstation or in tests): the operator
  issues itself a certificate (a fresh CA and a serving certificate for the URL's host), owns the whole
  configuration (applied server-side with that CA), renews both long before expiry, and deletes the
  configuration on exit.
- `--webhook-service` without `--webhook-cert-dir` (not what the chart runs): a self-issued
  certificate for the Service's names, its CA written into the existing configuration's caBundle with
  a JSON patch (replacing what is there). Only sound with one replica: each would write its own CA.

Each review reads the TritonModels around the object from this replica's own list+watch of them
(`informer.ModelInformer`: the reconcile's cache lives only in the leader), never with a LIST per review: the
ensembles that use the object (its dependents) and every model their steps and its own reach. A cache may lag
a `kubectl apply` of a step and its ensemble by milliseconds, or a restarting watch by longer, and that must
never refuse a good change: a step the object names that the cache lacks is read with a GET, and before a
refusal that other models caused, the models the object names and the ensembles it would break are read again
(GETs, at most `MAX_READS` per review). What a lagging cache can still do is allow a change that breaks an
ensemble created a moment ago; the reconcile then reports that ensemble `Degraded`. Until the first list is in
(at start), a review LISTs the namespace as before. The verdict itself is `validate.admission.review`, pure. A
namespace this operator does not watch is not its business: allowed.

Pools (issue 29). A pooled model is checked against one replica of the TritonPool it names, read with a GET (no
cache of pools); a pool not there yet refuses nothing (GitOps applies in any order; the operator reports the model
PoolNotFound). A TritonPool's create or update is checked on its own, and an update that changes what it holds
(replicas, capacity, gpus; through its scale subresource too: `kubectl scale`, an HPA) against the models placed
on it: their placements are in their status, which the cache does not keep, so such an update LISTs the
namespace's TritonModels (rare, unlike model changes). Deleting a pool is not reviewed. The verdicts are
`validate.admission.review` and `review_pool`.

Who may learn what. The API server presents no client certificate to a webhook unless its admin configures
one (AdmissionConfiguration's kubeConfigFile), so any client that reaches the port can send a review, naming any
namespace. The answer therefore names nothing the object itself does not name (`validate.admission.redacted`:
an error caused by another model keeps its field path and rule, not that model's tensors, types or versions;
an ensemble the change would break is not named), unless the review shows that its sender has read the
object: an UPDATE whose oldObject carries the uid of the stored object, which the API server always sends and
a caller without read access to the namespace cannot know. Then the answer is whole, as useful to the user
as `kubectl get` would be. What an unauthenticated caller can still learn is the verdict, one guess at a time
(does a model of this name exist); a NetworkPolicy that admits only the API server to the port, where the
cluster enforces NetworkPolicies, keeps such callers away.

Malformed reviews (not JSON, nested too deep, not an AdmissionReview v1, fields of the wrong type) get HTTP
400 with the reason: no traceback, a debug line, and `triton_operator_admission_reviews_total{verdict=
"malformed"}`. The server itself (deadlines, the connection cap) is `tls_server`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as dt
import json
import logging
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from ..api import steps as step_graph
from ..api.pool import POOL_KIND, POOL_PLURAL, TritonPool
from ..api.steps import steps_of
from ..api.v1alpha1 import GROUP, KIND, VERSION, TritonModel
from ..platform.certificates import CERT_VALIDITY, RENEW_AFTER, Issued, issue_certificate
from ..platform.errors import ApiError
from ..platform.kube import Kube
from ..platform.namespaces import exact_namespaces, watches
from ..render.kubernetes import Options, key_secret_name
from ..render.pool import pool_deployment_name, pool_key, pool_key_secret_name
from ..render.webhook import (
    WEBHOOK_NAME,
    WEBHOOK_PATH,
    WebhookTarget,
    render_webhook_configuration,
)
from ..validate import operator_writes
from ..validate.admission import MAX_NEIGHBOURS, AdmissionVerdict, needs_review, redacted, review, review_pool
from ..validate.pool import POOL_OBJECTS_SUFFIX
from . import metrics, tls_server
from .custom_metrics import PREFIX as CUSTOM_METRICS_PREFIX
from .custom_metrics import CustomMetricsApi
from .informer import ModelInformer, pool_and_triton_name
from .tls_server import BodyRefused, TlsSite, body_of

log = logging.getLogger("triton_operator.webhook")

#: GETs of other TritonModels one review may make (those the cache lacks or may hold stale).
MAX_READS = 8
#: How long a new leader waits for the webhook Service's first ready endpoint before it writes, and how often it looks.
REACHABLE_WAIT_SECONDS, REACHABLE_POLL_SECONDS = 60.0, 0.5
#: The ensemble steps one review of the operator's own Deployment reads (from the cache, else a GET each).
MAX_STEPS = 64
#: GETs of other TritonModels in flight at once, over every review.
CONCURRENT_READS = 8
#: How long after the start reviews wait for the first list of TritonModels; before it is in, a review LISTs the
#: namespace itself.
SYNC_WAIT_SECONDS = 2.0
#: Nesting a review may have: a TritonModel is about 10 deep; the API server's schema allows no more.
MAX_DEPTH = 64
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
REVIEW_VERSION = "admission.k8s.io/v1"


class BadReview(ValueError):
    """A request body that is not an AdmissionReview this webhook answers: why."""


def _depth(value: Any) -> int:
    """How deep JSON containers nest in `value` (iteratively: a deep value must not exhaust the stack here)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict):
            items: Any = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        deepest = max(deepest, d)
        if deepest > MAX_DEPTH:
            return deepest
        todo.extend((x, d + 1) for x in items)
    return deepest


def parse_review(data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The AdmissionReview in `data` and its request, checked for the shape this webhook reads; `BadReview` saying
    what is wrong otherwise."""
    try:
        body = json.loads(data)
    except RecursionError:
        raise BadReview(f"the JSON nests more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise BadReview(f"not JSON: {exc}") from None
    if _depth(body) > MAX_DEPTH:
        raise BadReview(f"the JSON nests more than {MAX_DEPTH} levels deep")
    if not isinstance(body, dict):
        raise BadReview("expected an AdmissionReview object")
    if body.get("apiVersion") != REVIEW_VERSION or body.get("kind") != "AdmissionReview":
        raise BadReview(f"expected apiVersion {REVIEW_VERSION}, kind AdmissionReview")
    req = body.get("request")
    if not isinstance(req, dict):
        raise BadReview("request: expected an object")
    for key in ("uid", "operation"):
        if not isinstance(req.get(key), str) or not req[key]:
            raise BadReview(f"request.{key}: expected a non-empty string")
    if req["operation"] not in OPERATIONS:
        raise BadReview(f"request.operation: expected one of {', '.join(OPERATIONS)}")
    if not isinstance(req.get("namespace", ""), str):
        raise BadReview("request.namespace: expected a string")
    for key in ("object", "oldObject"):
        _check_review_object(req, key)
    return body, req


def _check_review_object(req: dict[str, Any], key: str) -> None:
    """request.object or request.oldObject: null, or an object with a metadata.name (and a string uid, if any)."""
    obj = req.get(key)
    if obj is None:
        return
    if not isinstance(obj, dict):
        raise BadReview(f"request.{key}: expected an object or null")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise BadReview(f"request.{key}.metadata: expected an object")
    if not isinstance(meta.get("name"), str) or not meta["name"]:
        raise BadReview(f"request.{key}.metadata.name: expected a non-empty string")
    if not isinstance(meta.get("uid", ""), str):
        raise BadReview(f"request.{key}.metadata.uid: expected a string")


# -- the server -----------------------------------------------------------------------------------


class AdmissionWebhook:
    def __init__(self, kube: Kube, target: WebhookTarget, *, configuration: str, failure_policy: str,
                 namespaces: list[str], clusterwide: bool, address: str, port: int, cert_dir: str | None = None,
                 custom_metrics: bool = False, max_connections: int = tls_server.MAX_CONNECTIONS,
                 options: Options | None = None) -> None:
        self.kube = kube
        # What the operator renders with: its default tritonserver image and the repository keys' Secret names,
        # for the review of its own writes (`operator_writes`).
        self.options = options if options is not None else Options()
        self.target = target
        self.configuration = configuration
        self.failure_policy = failure_policy
        self.selector = exact_namespaces(namespaces, clusterwide)
        self.watched = watches(namespaces, clusterwide)
        self.address, self.port = address, port
        self.max_connections = max_connections
        self.informer = ModelInformer(kube, exact_namespaces(namespaces, clusterwide), self.watched)
        self._reads = asyncio.Semaphore(CONCURRENT_READS)
        self._sync_deadline = time.monotonic() + SYNC_WAIT_SECONDS
        self._dir = tempfile.TemporaryDirectory(prefix="triton-operator-webhook-")
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ssl.minimum_version = ssl.TLSVersion.TLSv1_2
        self._runner: web.AppRunner | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._ca_bundle: bytes = b""
        self.cert_dir = Path(cert_dir) if cert_dir else None
        self._cert_stamp: tuple[float, float] | None = None
        # The custom metrics API, on the same port and certificate (the chart's APIService names this Service).
        self.custom_metrics = CustomMetricsApi(kube, self.watched, models=_WatchedModels(self)) if custom_metrics \
            else None

    # lifecycle

    async def start(self) -> None:
        """Serve, then publish the CA (a self-issued certificate) or watch the mounted one (`cert_dir`)."""
        issued: Issued | None = None
        if self.cert_dir is not None:
            self._load_mounted()
        else:
            issued = self._load(issue_certificate(self.target.hosts()))
        if self._runner is None:
            self.informer.start()
            self._sync_deadline = time.monotonic() + SYNC_WAIT_SECONDS
            app = web.Application(client_max_size=tls_server.MAX_BODY)
            app.router.add_post(WEBHOOK_PATH, self._handle)
            app.router.add_post(operator_writes.OPERATOR_WRITES_PATH, self._handle_operator_write)
            if self.custom_metrics is not None:
                await self.custom_metrics.start(self._ssl)
                self.custom_metrics.routes(app)
            tls_server.close_after_each_response(app)
            runner = web.AppRunner(app, **tls_server.runner_options())
            await runner.setup()
            site = TlsSite(runner, self.address, self.port, self._ssl, max_connections=self.max_connections)
            await site.start()
            self.port = site.port
            self._runner = runner
            log.info("Serving the admission webhook address=%s port=%d path=%s custom_metrics=%s max_connections=%d",
                     self.address, self.port, WEBHOOK_PATH, CUSTOM_METRICS_PREFIX if self.custom_metrics else "off",
                     self.max_connections)
        if self.cert_dir is not None:
            if self._renewal is None:
                self._renewal = asyncio.create_task(self._reload_loop(), name="webhook-certificate")
            return
        assert issued is not None
        await self._publish(issued.ca_pem)
        if self._renewal is None:
            self._renewal = asyncio.create_task(self._renew_loop(issued), name="webhook-certificate")

    async def wait_reachable(self, stop: asyncio.Event, timeout: float = REACHABLE_WAIT_SECONDS) -> bool:
        """Until the webhook's Service has a ready endpoint (an operator replica that serves it, this one once the
        kubelet finds it Ready), at most `timeout`; whether it has. The chart's webhook for the operator's own writes
        fails closed: a leader that writes before the API server can reach any replica's webhook has every
        Deployment and EndpointSlice write refused ("no endpoints available for service"). With two replicas the
        follower's endpoint is there already. Only for `--webhook-service` (the chart); reads the Service's
        EndpointSlices (the chart's Role in its namespace allows it)."""
        ns, name = self.target.service_namespace, self.target.service_name
        if not ns or not name:
            return True
        deadline = time.monotonic() + timeout
        selector = f"kubernetes.io/service-name={name}"
        while True:
            try:
                slices = await asyncio.to_thread(self.kube.list, "discovery.k8s.io/v1", "EndpointSlice", ns, selector)
            except ApiError as exc:
                log.warning("Cannot read the webhook Service's endpoints; writing without waiting for them "
                            "service=%s/%s error=%s", ns, name, exc)
                return False
            if any((e.get("conditions") or {}).get("ready") for s in slices for e in s.get("endpoints") or ()):
                log.info("The webhook Service has a ready endpoint service=%s/%s", ns, name)
                return True
            if time.monotonic() >= deadline or stop.is_set():
                log.warning("The webhook Service has no ready endpoint after %.0f s; writing anyway (the operator's "
                            "own writes may be refused until it has) service=%s/%s", timeout, ns, name)
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REACHABLE_POLL_SECONDS)

    async def stop(self) -> None:
        if self._renewal:
            self._renewal.cancel()
        self.informer.stop()
        if self.custom_metrics is not None:
            await self.custom_metrics.stop()
        if self.target.url:  # ours alone: a configuration left behind would point at a closed port
            try:
                await asyncio.to_thread(self.kube.delete_cluster, "admissionregistration.k8s.io/v1",
                                        "validatingwebhookconfigurations", self.configuration)
                log.info("Deleted ValidatingWebhookConfiguration name=%s", self.configuration)
            except Exception as exc:  # noqa: BLE001 - shutting down: report, do not raise
                log.warning("Could not delete ValidatingWebhookConfiguration name=%s: %s", self.configuration, exc)
        if self._runner:
            await self._runner.cleanup()
        self._dir.cleanup()

    def _load_mounted(self) -> None:
        """Serve the certificate in `cert_dir` (tls.crt, tls.key), if it changed since last loaded."""
        assert self.cert_dir is not None
        cert, key = self.cert_dir / "tls.crt", self.cert_dir / "tls.key"
        stamp = (cert.stat().st_mtime, key.stat().st_mtime)
        if stamp != self._cert_stamp:
            self._ssl.load_cert_chain(cert, key)
            self._cert_stamp = stamp
            log.info("Loaded the webhook certificate dir=%s", self.cert_dir)

    async def _reload_loop(self) -> None:
        """A Secret's new content reaches the mounted files within the kubelet's sync period: pick it up."""
        while True:
            await asyncio.sleep(60)
            try:
                self._load_mounted()
            except Exception:
                log.exception("Reloading the webhook certificate failed; retrying in a minute")

    def _load(self, issued: Issued) -> Issued:
        """Serve `issued` from now on (new handshakes); files readable by this user only."""
        cert, key = Path(self._dir.name) / "tls.crt", Path(self._dir.name) / "tls.key"
        key.touch(mode=0o600)
        key.write_bytes(issued.key_pem)
        cert.write_bytes(issued.cert_pem)
        self._ssl.load_cert_chain(cert, key)
        return issued

    async def _publish(self, ca_pem: bytes) -> None:
        """Puts `ca_pem` (and the CA before it, until every serving certificate is the new one) in the configuration."""
        encoded = base64.b64encode(ca_pem + self._ca_bundle).decode()
        if self.target.url:
            obj = render_webhook_configuration(self.configuration, self.target, encoded, self.failure_policy,
                                               self.selector)
            await asyncio.to_thread(self.kube.apply_cluster, obj, "validatingwebhookconfigurations")
        else:
            patch = [{"op": "test", "path": "/webhooks/0/name", "value": WEBHOOK_NAME},
                     {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": encoded}]
            await asyncio.to_thread(self.kube.json_patch_cluster, "admissionregistration.k8s.io/v1",
                                    "validatingwebhookconfigurations", self.configuration, patch)
        self._ca_bundle = ca_pem
        log.info("Published the webhook CA ValidatingWebhookConfiguration=%s failurePolicy=%s", self.configuration,
                 self.failure_policy)

    async def _renew_loop(self, issued: Issued) -> None:
        while True:
            wait = (issued.not_after - CERT_VALIDITY + RENEW_AFTER) - dt.datetime.now(dt.UTC)
            await asyncio.sleep(max(wait.total_seconds(), 60))
            try:
                fresh = issue_certificate(self.target.hosts())
                await self._publish(fresh.ca_pem)  # trust the new CA first, then serve its certificate
                issued = self._load(fresh)
                log.info("Renewed the webhook certificate not_after=%s", issued.not_after.isoformat())
            except Exception:
                log.exception("Renewing the webhook certificate failed; retrying in a minute")

    # the review

    async def _handle(self, request: web.Request) -> web.Response:
        return await self._serve(request, self._review)

    async def _handle_operator_write(self, request: web.Request) -> web.Response:
        return await self._serve(request, self._review_operator_write)

    async def _serve(self, request: web.Request,
                     reviewer: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> web.Response:
        try:
            async with body_of(request) as data:
                body, req = parse_review(data)
                response = await self._respond(req, reviewer)
        except BodyRefused as exc:
            refused = web.json_response({"error": exc.reason}, status=exc.status)
            refused.force_close()
            return refused
        except BadReview as exc:
            log.debug("Refused a malformed admission review remote=%s reason=%s", request.remote, exc)
            metrics.ADMISSIONS.labels(verdict="malformed").inc()
            return web.json_response({"error": f"not an AdmissionReview this webhook answers: {exc}"}, status=400)
        return web.json_response({"apiVersion": body["apiVersion"], "kind": "AdmissionReview", "response": response})

    async def _respond(self, req: dict[str, Any],
                       reviewer: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
        try:
            response.update(await reviewer(req))
        except Exception as exc:
            # The API server applies the failurePolicy to errors, not to a denial: say what broke, refuse.
            if isinstance(exc, ApiError):
                log.warning("Admission review failed uid=%s error=%s", req["uid"], exc)
            else:
                log.exception("Admission review failed uid=%s", req["uid"])
            metrics.ADMISSIONS.labels(verdict="error").inc()
            response.update({"allowed": False, "status": {
                "code": 500, "reason": "InternalError",
                "message": "triton-operator could not review: " + ("the API server did not answer" if
                                                                     isinstance(exc, ApiError) else repr(exc))}})
        return response

    async def _review(self, req: dict[str, Any]) -> dict[str, Any]:
        namespace, operation = req.get("namespace") or "", req["operation"]
        obj, old = req.get("object"), req.get("oldObject")
        if not self.watched(namespace) or not needs_review(operation, obj, old):
            metrics.ADMISSIONS.labels(verdict="skipped").inc()
            return {}
        assert obj is not None
        if req.get("subResource") == "scale" and (req.get("resource") or {}).get("resource") == POOL_PLURAL:
            return await self._review_pool_scale(namespace, operation, obj, old)
        if obj.get("kind") == POOL_KIND:
            return await self._review_pool(namespace, operation, obj, old)
        name = obj["metadata"].get("name") or ""
        view = await self._view(namespace)
        named = [s for s in dict.fromkeys(steps_of(obj)) if s != name]
        await view.read([s for s in named if s not in view.graph])  # a step created a moment ago
        # The pool it names, read live (no cache of pools: one GET); none yet is fine, the operator says PoolNotFound.
        pool_name = (obj.get("spec") or {}).get("pool")
        view.pool = await self.get_object(POOL_KIND, namespace, pool_name) if isinstance(pool_name, str) else None
        triton = ((obj.get("spec") or {}).get("modelName"))
        if isinstance(pool_name, str) and isinstance(triton, str) and triton != name:
            await view.read([triton])  # the model whose name it takes, likely created a moment ago (rule pool-triton-name)
        # A new model named after a pool's own objects (`<pool>-pool`): one GET, for such names only.
        if operation == "CREATE" and name.endswith(POOL_OBJECTS_SUFFIX) and await self.get_object(
                POOL_KIND, namespace, pool_named := name[: -len(POOL_OBJECTS_SUFFIX)]) is not None:
            view.clashing_pool = pool_named
        verdict, dependents = view.verdict(obj, old, name)
        alone = {(e.path, e.message) for e in review(obj, None, {}).errors} if not verdict.allowed else set()
        if any(e.model != verdict.subject or (e.path, e.message) not in alone for e in verdict.errors):
            # Other models refused it: read the ones it names and the ensembles it breaks fresh, then decide.
            await view.read([*named, *dependents], why="refusal")
            verdict, _ = view.verdict(obj, old, name)
        shown = verdict if await self._has_read(view, name, obj, old) else redacted(verdict, obj)
        return self._answer(shown, operation, namespace, name, KIND)

    async def _review_pool(self, namespace: str, operation: str, obj: dict[str, Any],
                           old: dict[str, Any] | None) -> dict[str, Any]:
        """A TritonPool: its own rules, and on an update that changes what it holds (replicas, capacity, gpus), what
        it would strand of the models placed on it. Their placements are in their status, which the watch's cache
        does not keep: one LIST of the namespace's TritonModels, for such an update only (rare, unlike model
        changes), and only when the review proves itself the API server's: its old object carries the stored
        pool's uid (one GET first). Anyone who reaches the webhook can send a review, and a forged one must not
        make it LIST and parse a whole namespace (issue 39): it is answered on the pool's own rules."""
        name = obj["metadata"].get("name") or ""
        models: list[dict[str, Any]] = []
        uid = ((old or {}).get("metadata") or {}).get("uid")
        proven: bool | None = None  # None: not asked yet
        if old is not None and _holds(obj) != _holds(old):
            proven = await self._stored_uid_is(namespace, name, uid)
            if proven:
                models = await asyncio.to_thread(self.kube.list, f"{GROUP}/{VERSION}", KIND, namespace)
        # A new pool whose objects a TritonModel is named after already (`<pool>-pool`).
        clash = operation == "CREATE" and await _WatchedModels(self).exists(namespace, f"{name}{POOL_OBJECTS_SUFFIX}")
        verdict = review_pool(obj, old, models, clash)
        shown = verdict
        if not verdict.allowed and not (proven if proven is not None else await self._stored_uid_is(namespace, name, uid)):
            shown = redacted(verdict, obj)
        return self._answer(shown, operation, namespace, name, POOL_KIND)

    async def _stored_uid_is(self, namespace: str, name: str, uid: str | None) -> bool:
        """Whether the stored TritonPool `namespace/name` has this uid (what only a caller that read it can know)."""
        stored = await self.get_object(POOL_KIND, namespace, name) if uid else None
        return bool(uid) and ((stored or {}).get("metadata") or {}).get("uid") == uid

    async def _review_pool_scale(self, namespace: str, operation: str, obj: dict[str, Any],
                                 old: dict[str, Any] | None) -> dict[str, Any]:
        """`kubectl scale`, or an HPA, through the pool's scale subresource: the stored pool with the Scale's replicas,
        reviewed as that update (the uid that proves a read is the Scale's, not the stored pool's)."""
        name = obj["metadata"].get("name") or ""
        stored = await self.get_object(POOL_KIND, namespace, name)
        replicas = (obj.get("spec") or {}).get("replicas")
        if stored is None or not isinstance(replicas, int):
            return {}  # gone meanwhile, or no replicas to check: the API server decides
        changed = copy.deepcopy(stored)
        changed.setdefault("spec", {})["replicas"] = replicas
        before = copy.deepcopy(stored)
        before["metadata"]["uid"] = ((old or {}).get("metadata") or {}).get("uid")
        return await self._review_pool(namespace, operation, changed, before)

    # the operator's own writes

    async def _review_operator_write(self, req: dict[str, Any]) -> dict[str, Any]:
        """A Deployment or an EndpointSlice the operator's ServiceAccount writes (the chart sends only those): allowed
        only as the operator would write it for its owner, read here (`validate.operator_writes`)."""
        namespace, obj = req.get("namespace") or "", req.get("object")
        resource = (req.get("resource") or {}).get("resource")
        if req["operation"] not in ("CREATE", "UPDATE") or obj is None or req.get("subResource"):
            return {}
        if resource == "deployments":
            why = await self._deployment_refusal(namespace, obj)
        elif resource == "endpointslices":
            why = await self._slice_refusal(namespace, obj)
        else:
            return {}
        if why is None:
            metrics.ADMISSIONS.labels(verdict="allowed").inc()
            return {}
        metrics.ADMISSIONS.labels(verdict="denied").inc()
        log.warning("Refused a write of the operator's ServiceAccount operation=%s resource=%s namespace=%s name=%s "
                    "reason=%s", req["operation"], resource, namespace, obj["metadata"].get("name"), why)
        return {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": (
            f"the triton-operator webhook refuses this write of the operator's ServiceAccount: {why}")}}

    async def _deployment_refusal(self, namespace: str, obj: dict[str, Any]) -> str | None:
        name = obj["metadata"]["name"]
        owner = operator_writes.controller_of(obj)
        if owner is None or owner.get("kind") not in (KIND, POOL_KIND) \
                or not str(owner.get("apiVersion") or "").startswith(f"{GROUP}/"):
            return f"Deployment {name} has no TritonModel or TritonPool as its controller"
        kind, owner_name, uid = owner["kind"], str(owner.get("name") or ""), owner.get("uid")
        if kind == KIND:  # this replica's watch first; a refusal is decided again on fresh reads (a lagging cache)
            cached = self.informer.store.body(namespace, owner_name) if self.informer.synced() else None
            if cached is not None and (cached.get("metadata") or {}).get("uid") == uid and \
                    await self._deployment_grants_refusal(namespace, obj, kind, owner_name, uid, cached, False) is None:
                return None
        body = await self.get_object(kind, namespace, owner_name) if owner_name else None
        if body is None or (body.get("metadata") or {}).get("uid") != uid:
            return f"Deployment {name}'s controller, {kind} {owner_name} (uid {uid}), is not there"
        return await self._deployment_grants_refusal(namespace, obj, kind, owner_name, uid, body, fresh=True)

    async def _deployment_grants_refusal(self, namespace: str, obj: dict[str, Any], kind: str, owner_name: str,
                                         uid: Any, body: dict[str, Any], fresh: bool) -> str | None:
        """`operator_writes.refusal` of `obj` for its owner `body`; its ensemble steps read from the cache, or fresh."""
        image = self.options.default_triton_image
        try:
            if kind == POOL_KIND:
                pool = TritonPool.model_validate(body)
                key = pool_key_secret_name(pool, pool_key(pool, str(uid), namespace, self.options))
                grants = operator_writes.pool_grants(pool, pool_deployment_name(pool), key, image)
            else:
                model = TritonModel.model_validate(body)
                steps = [TritonModel.model_validate(b) for b in await self._steps(namespace, body, fresh)]
                grants = operator_writes.model_grants(model, steps,
                                                      key_secret_name(model, str(uid), namespace, self.options), image)
        except ValueError as exc:  # (pydantic's ValidationError): the stored owner is not one the operator renders
            return f"{kind} {owner_name} is not valid: {str(exc).splitlines()[0]}"
        return operator_writes.refusal(obj, grants)

    async def _steps(self, namespace: str, body: Mapping[str, Any], fresh: bool = False) -> list[dict[str, Any]]:
        """The TritonModels an ensemble's steps reach, all the way down (the models its repository carries): from
        this replica's watch (unless `fresh`), a GET for one it lacks; at most MAX_STEPS, those not there left out."""
        found: dict[str, dict[str, Any]] = {}
        todo, seen = list(steps_of(body)), {body["metadata"]["name"]}
        synced = self.informer.synced() and not fresh
        while todo and len(seen) <= MAX_STEPS:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            step = self.informer.store.body(namespace, name) if synced else None
            if step is None:
                step = await self.get_model(namespace, name)
            if step is not None:
                found[name] = step
                todo.extend(steps_of(step))
        return list(found.values())

    async def _slice_refusal(self, namespace: str, obj: dict[str, Any]) -> str | None:
        owner = operator_writes.controller_of(obj) or {}
        service = ((obj.get("metadata") or {}).get("labels") or {}).get("kubernetes.io/service-name")
        named = owner.get("kind") == KIND and isinstance(owner.get("name"), str) and owner["name"]
        model = None
        if named and self.informer.synced():  # this replica's watch, when it has that very model; else a GET
            cached = self.informer.store.body(namespace, owner["name"])
            model = cached if cached is not None and (cached.get("metadata") or {}).get("uid") == owner.get("uid") \
                else None
        if named and model is None:
            model = await self.get_model(namespace, owner["name"])
        stored = await asyncio.to_thread(self.kube.get, "v1", "Service", namespace, service) \
            if isinstance(service, str) and service else None
        return operator_writes.slice_refusal(obj, model, stored)

    @staticmethod
    def _answer(shown: AdmissionVerdict, operation: str, namespace: str, name: str, kind: str) -> dict[str, Any]:
        """The review's response for the verdict as told (warnings; a denial as the API server's 422 Invalid)."""
        out: dict[str, Any] = {}
        if shown.warnings:
            out["warnings"] = shown.warnings[:10]
        if shown.allowed:
            metrics.ADMISSIONS.labels(verdict="allowed").inc()
            return out
        metrics.ADMISSIONS.labels(verdict="denied").inc()
        log.info("Denied %s kind=%s namespace=%s name=%s errors=%d", operation, kind, namespace, name,
                 len(shown.errors))
        # kubectl prints the causes ("* field: message"), else the message.
        causes = [{"field": e.path, "message": e.message, "reason": "FieldValueInvalid"} if e.model == shown.subject
                  else {"message": line, "reason": "FieldValueInvalid"}
                  for e, line in zip(shown.errors, shown.message.splitlines()[1:], strict=True)]
        out.update({"allowed": False, "status": {
            "code": 422, "reason": "Invalid", "message": shown.message,
            "details": {"group": GROUP, "kind": kind, "name": name, "causes": causes}}})
        return out

    async def _view(self, namespace: str) -> _View:
        """The namespace's TritonModels as this replica's watch has them; a LIST until its first list is in."""
        if await self.informer.wait_synced(max(self._sync_deadline - time.monotonic(), 0.0)):
            store = self.informer.store
            return _View(self, namespace, store.graph(namespace), lambda n: store.body(namespace, n),
                         lambda n: store.uid(namespace, n), lambda p: store.on_pool(namespace, p))
        listed = await asyncio.to_thread(self.kube.list, f"{GROUP}/{VERSION}", KIND, namespace)
        bodies = {b["metadata"]["name"]: b for b in listed}
        pooled = {n: found for n, b in bodies.items() if (found := pool_and_triton_name(b)) is not None}
        return _View(self, namespace, {n: tuple(steps_of(b)) for n, b in bodies.items()}, bodies.get,
                     lambda n: (bodies.get(n) or {}).get("metadata", {}).get("uid"),
                     lambda p: {n: t for n, (q, t) in pooled.items() if q == p}, complete=True)

    async def _has_read(self, view: _View, name: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
        """Whether the review shows its sender has read the object: an UPDATE whose old object carries the stored
        object's uid (the API server's always does; nobody else can know it without reading the namespace)."""
        if old is None or not name:
            return False
        uid = old["metadata"].get("uid")
        if not isinstance(uid, str) or not uid or obj["metadata"].get("uid") not in (None, uid):
            return False
        if view.uid(name) != uid:  # not in the cache yet, or an object of that name deleted and made again
            await view.read([name], why="uid")
        return view.uid(name) == uid

    async def get_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.get_object(KIND, namespace, name)

    async def get_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A GET of one object of our group (a TritonModel or a TritonPool); None when there is none."""
        async with self._reads:
            return await asyncio.to_thread(self.kube.get, f"{GROUP}/{VERSION}", kind, namespace, name)


def _holds(pool: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a TritonPool's spec decides what it can hold: replicas, capacity, gpus per replica."""
    spec = pool.get("spec") or {}
    return spec.get("replicas"), spec.get("capacity"), (spec.get("server") or {}).get("gpus")


class _View:
    """The TritonModels one review reads: the cache's (or a LIST's), with what it read fresh on top."""

    def __init__(self, webhook: AdmissionWebhook, namespace: str, graph: dict[str, tuple[str, ...]],
                 body: Callable[[str], dict[str, Any] | None], uid: Callable[[str], str | None],
                 on_pool: Callable[[str], dict[str, str]], complete: bool = False) -> None:
        self.webhook, self.namespace = webhook, namespace
        self.graph = graph
        self._body, self._uid, self._on_pool = body, uid, on_pool
        self.fresh: dict[str, dict[str, Any] | None] = {}
        self.complete = complete  # a LIST of this moment: nothing to read again
        self.reads = 0
        self.pool: dict[str, Any] | None = None  # the TritonPool the object names, read live
        self.clashing_pool: str | None = None  # the TritonPool whose objects a new model is named after

    async def read(self, names: list[str], why: str = "missing") -> None:
        """GETs of `names` not read yet in this review, within MAX_READS in all: of those the cache lacks
        (`why` "missing"), or of all of them (before a refusal, "refusal"; an UPDATE's uid to check, "uid")."""
        if self.complete:
            return
        todo = [n for n in dict.fromkeys(names) if n not in self.fresh and (why != "missing" or n not in self.graph)]
        todo = todo[:max(MAX_READS - self.reads, 0)]
        self.reads += len(todo)
        if todo:
            metrics.ADMISSION_READS.labels(why=why).inc(len(todo))
        found = await asyncio.gather(*(self.webhook.get_model(self.namespace, n) for n in todo))
        for n, body in zip(todo, found, strict=True):
            self.fresh[n] = body
            if body is None:
                self.graph.pop(n, None)
            else:
                self.graph[n] = tuple(steps_of(body))

    def body(self, name: str) -> dict[str, Any] | None:
        return self.fresh[name] if name in self.fresh else self._body(name)

    def uid(self, name: str) -> str | None:
        if name in self.fresh:
            return ((self.fresh[name] or {}).get("metadata") or {}).get("uid")
        found: str | None = self._uid(name)
        return found

    def verdict(self, obj: Mapping[str, Any], old: Mapping[str, Any] | None, name: str
                ) -> tuple[AdmissionVerdict, list[str]]:
        """The verdict with the models as this view has them, and the ensembles that use the object."""
        graph = {n: steps for n, steps in self.graph.items() if n != name}
        dependents = sorted(n for n, steps in graph.items() if name in steps)
        reached, _ = step_graph.closure([*steps_of(obj), *dependents], lambda n: list(graph[n]) if n in graph
                                        else None)
        neighbours = {n: b for n in reached[:MAX_NEIGHBOURS] if (b := self.body(n)) is not None}
        return review(obj, old, neighbours, dependents, self.pool, self.on_pool(obj), self.clashing_pool), dependents

    def on_pool(self, obj: Mapping[str, Any]) -> dict[str, str]:
        """The Triton names of the other models on the pool `obj` names (none: not pooled), with the models read
        fresh in this review in place of the cache's."""
        mine = pool_and_triton_name(obj)
        if mine is None:
            return {}
        names = self._on_pool(mine[0])
        for n, body in self.fresh.items():
            found = pool_and_triton_name(body) if body is not None else None
            names.pop(n, None)
            if found is not None and found[0] == mine[0]:
                names[n] = found[1]
        return names


class _WatchedModels:
    """Which TritonModels exist, for the custom metrics API: the watch's, and a GET for a name it lacks."""

    def __init__(self, webhook: AdmissionWebhook) -> None:
        self.webhook = webhook

    async def exists(self, namespace: str, name: str) -> bool:
        informer = self.webhook.informer
        if informer.synced() and informer.store.uid(namespace, name) is not None:
            return True
        return await self.webhook.get_model(namespace, name) is not None

    async def names(self, namespace: str) -> list[str]:
        informer = self.webhook.informer
        if informer.synced():
            return sorted(informer.store.graph(namespace))
        listed = await asyncio.to_thread(self.webhook.kube.list, f"{GROUP}/{VERSION}", KIND, namespace)
        return sorted(b["metadata"]["name"] for b in listed)
