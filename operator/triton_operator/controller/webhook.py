"""The validating admission webhook for TritonModels, served by the operator over TLS.

Every replica serves `POST /validate-tritonmodels`. Which certificate it serves, and who puts the CA
into the ValidatingWebhookConfiguration, depends on how the operator runs:
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

Each review reads the TritonModels around the object live from the API server, with one LIST of
the namespace's TritonModels: the ensembles that use the object (its dependents) and every model
their steps and its own reach. Never the watch cache, which may lag a `kubectl apply` of a step and
its ensemble by milliseconds, or a restarting watch by longer. The verdict itself is
`validate.admission.review`, pure. A namespace this operator does not watch is not its business:
allowed.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import ssl
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

from ..api import steps as step_graph
from ..api.steps import steps_of
from ..api.v1alpha1 import GROUP, KIND, VERSION
from ..render.webhook import (
    WEBHOOK_NAME,
    WEBHOOK_PATH,
    WebhookTarget,
    render_webhook_configuration,
)
from ..validate.admission import needs_review, reachable, review
from . import metrics
from .certificates import CERT_VALIDITY, RENEW_AFTER, Issued, issue_certificate
from .custom_metrics import PREFIX as CUSTOM_METRICS_PREFIX
from .custom_metrics import CustomMetricsApi
from .kube import Kube
from .namespaces import exact_namespaces, watches

log = logging.getLogger("triton_operator.webhook")




# -- the server -----------------------------------------------------------------------------------


class AdmissionWebhook:
    def __init__(self, kube: Kube, target: WebhookTarget, *, configuration: str, failure_policy: str,
                 namespaces: list[str], clusterwide: bool, address: str, port: int, cert_dir: str | None = None,
                 custom_metrics: bool = False) -> None:
        self.kube = kube
        self.target = target
        self.configuration = configuration
        self.failure_policy = failure_policy
        self.selector = exact_namespaces(namespaces, clusterwide)
        self.watched = watches(namespaces, clusterwide)
        self.address, self.port = address, port
        self._dir = tempfile.TemporaryDirectory(prefix="triton-operator-webhook-")
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ssl.minimum_version = ssl.TLSVersion.TLSv1_2
        self._runner: web.AppRunner | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._ca_bundle: bytes = b""
        self.cert_dir = Path(cert_dir) if cert_dir else None
        self._cert_stamp: tuple[float, float] | None = None
        # The custom metrics API, on the same port and certificate (the chart's APIService names this Service).
        self.custom_metrics = CustomMetricsApi(kube, self.watched) if custom_metrics else None

    # lifecycle

    async def start(self) -> None:
        """Serve, then publish the CA (a self-issued certificate) or watch the mounted one (`cert_dir`)."""
        issued: Issued | None = None
        if self.cert_dir is not None:
            self._load_mounted()
        else:
            issued = self._load(issue_certificate(self.target.hosts()))
        if self._runner is None:
            app = web.Application(client_max_size=8 * 1024 * 1024)
            app.router.add_post(WEBHOOK_PATH, self._handle)
            if self.custom_metrics is not None:
                await self.custom_metrics.start(self._ssl)
                self.custom_metrics.routes(app)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, self.address, self.port, ssl_context=self._ssl).start()
            self._runner = runner
            log.info("Serving the admission webhook address=%s port=%d path=%s custom_metrics=%s", self.address,
                     self.port, WEBHOOK_PATH, CUSTOM_METRICS_PREFIX if self.custom_metrics else "off")
        if self.cert_dir is not None:
            if self._renewal is None:
                self._renewal = asyncio.create_task(self._reload_loop(), name="webhook-certificate")
            return
        assert issued is not None
        await self._publish(issued.ca_pem)
        if self._renewal is None:
            self._renewal = asyncio.create_task(self._renew_loop(issued), name="webhook-certificate")

    async def stop(self) -> None:
        if self._renewal:
            self._renewal.cancel()
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
        try:
            body = await request.json()
            req = body["request"]
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "expected an AdmissionReview"}, status=400)
        response: dict[str, Any] = {"uid": req.get("uid"), "allowed": True}
        try:
            response.update(await self._review(req))
        except Exception as exc:
            # The API server applies the failurePolicy to errors, not to a denial: say what broke, refuse.
            log.exception("Admission review failed uid=%s", req.get("uid"))
            metrics.ADMISSIONS.labels(verdict="error").inc()
            response.update({"allowed": False, "status": {
                "code": 500, "reason": "InternalError", "message": f"triton-operator could not review: {exc}"}})
        return web.json_response({"apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
                                  "kind": "AdmissionReview", "response": response})

    async def _review(self, req: dict[str, Any]) -> dict[str, Any]:
        namespace, operation = req.get("namespace") or "", req.get("operation", "")
        obj, old = req.get("object"), req.get("oldObject")
        if not self.watched(namespace) or not needs_review(operation, obj, old):
            metrics.ADMISSIONS.labels(verdict="skipped").inc()
            return {}
        assert obj is not None
        name = obj["metadata"].get("name") or ""
        listed = await asyncio.to_thread(self.kube.list, f"{GROUP}/{VERSION}", KIND, namespace)
        live = {b["metadata"]["name"]: b for b in listed if b["metadata"]["name"] != name}
        dependents = step_graph.dependents(name, live)
        neighbours = reachable(live, [*steps_of(obj), *dependents])
        verdict = review(obj, old, neighbours, dependents)
        out: dict[str, Any] = {}
        if verdict.warnings:
            out["warnings"] = verdict.warnings[:10]
        if verdict.allowed:
            metrics.ADMISSIONS.labels(verdict="allowed").inc()
            return out
        metrics.ADMISSIONS.labels(verdict="denied").inc()
        log.info("Denied %s namespace=%s name=%s errors=%d", operation, namespace, name, len(verdict.errors))
        # kubectl prints the causes ("* field: message"), else the message.
        causes = [{"field": e.path, "message": e.message, "reason": "FieldValueInvalid"} if e.model == verdict.subject
                  else {"message": line, "reason": "FieldValueInvalid"}
                  for e, line in zip(verdict.errors, verdict.message.splitlines()[1:], strict=True)]
        out.update({"allowed": False, "status": {
            "code": 422, "reason": "Invalid", "message": verdict.message,
            "details": {"group": GROUP, "kind": KIND, "name": name, "causes": causes}}})
        return out
