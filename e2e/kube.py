"""A small JSON client for the Kubernetes API, used by the fixtures and tests.

Owns turning a kubeconfig into authenticated HTTP calls (via the official client's kubeconfig
loader, so certificates, tokens and exec plugins all work) and speaking plain dicts: get, list,
create, patch (strategic / merge / JSON / apply), delete and watch. Dicts keep the agent and
tests close to what `kubectl get -o json` shows, with no model classes in between.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from tests.timing import poll

PATCH_TYPES = {
    "strategic": "application/strategic-merge-patch+json",
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}

# Resource path segments for the kinds the e2e code touches: (group/version prefix, plural, namespaced).
_CORE = "/api/v1"
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "Namespace": (_CORE, "namespaces", False),
    "Node": (_CORE, "nodes", False),
    "Pod": (_CORE, "pods", True),
    "Service": (_CORE, "services", True),
    "ServiceAccount": (_CORE, "serviceaccounts", True),
    "ConfigMap": (_CORE, "configmaps", True),
    "Endpoints": (_CORE, "endpoints", True),
    "Secret": (_CORE, "secrets", True),
    "PersistentVolume": (_CORE, "persistentvolumes", False),
    "PersistentVolumeClaim": (_CORE, "persistentvolumeclaims", True),
    "Event": (_CORE, "events", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "HorizontalPodAutoscaler": ("/apis/autoscaling/v2", "horizontalpodautoscalers", True),
    "APIService": ("/apis/apiregistration.k8s.io/v1", "apiservices", False),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
}


class ApiError(Exception):
    """A non-2xx answer from the API server; `status` is the HTTP code, `body` the Status object."""

    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{method} {path}: {status} {message}")

    @property
    def reason(self) -> str:
        return self.body.get("reason", "") if isinstance(self.body, dict) else ""


class Kube:
    """Authenticated JSON access to one cluster, built from a kubeconfig file."""

    def __init__(self, kubeconfig: str | Path, context: str | None = None, timeout: float = 30.0) -> None:
        self.kubeconfig = Path(kubeconfig)
        cfg = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=str(kubeconfig), context=context, client_configuration=cfg)
        self.host = cfg.host.rstrip("/")
        self._cfg = cfg
        self.timeout = timeout
        kwargs: dict[str, Any] = {"maxsize": 8, "retries": False}
        if self.host.startswith("https"):
            if cfg.verify_ssl:
                kwargs["cert_reqs"] = "CERT_REQUIRED"
                if cfg.ssl_ca_cert:
                    kwargs["ca_certs"] = cfg.ssl_ca_cert
            else:
                kwargs["cert_reqs"] = "CERT_NONE"
            if cfg.cert_file:
                kwargs["cert_file"] = cfg.cert_file
                kwargs["key_file"] = cfg.key_file
        self._http = urllib3.PoolManager(**kwargs)

    # -- plumbing ---------------------------------------------------------------------------

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._cfg.get_api_key_with_prefix("authorization") or self._cfg.get_api_key_with_prefix(
            "BearerToken"
        )
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        url = self.host + path
        if params:
            url += "?" + urlencode({k: v for k, v in params.items() if v is not None})
        data = None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
        resp = self._http.request(
            method,
            url,
            body=data,
            headers=self._headers(content_type if body is not None else None),
            timeout=timeout or self.timeout,
        )
        text = resp.data.decode() if resp.data else ""
        try:
            payload = json.loads(text) if text else None
        except ValueError:
            payload = text
        if resp.status >= 400:
            raise ApiError(resp.status, payload, method, path)
        return payload

    def request_text(self, method: str, path: str, timeout: float | None = None) -> str:
        """A plain-text answer (a container log through `pods/log`), never parsed as JSON."""
        resp = self._http.request(method, self.host + path, headers={"Accept": "*/*", **{
            k: v for k, v in self._headers().items() if k != "Accept"}}, timeout=timeout or self.timeout)
        text = resp.data.decode(errors="replace") if resp.data else ""
        if resp.status >= 400:
            raise ApiError(resp.status, text, method, path)
        return text

    @staticmethod
    def path(kind: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        prefix, plural, namespaced = RESOURCES[kind]
        p = prefix
        if namespaced and namespace:
            p += f"/namespaces/{quote(namespace)}"
        p += f"/{plural}"
        if name:
            p += f"/{quote(name)}"
        if sub:
            p += f"/{sub}"
        return p

    # -- verbs ------------------------------------------------------------------------------

    def get(self, kind: str, name: str, namespace: str | None = None, sub: str | None = None) -> dict:
        return self.request("GET", self.path(kind, namespace, name, sub))

    def get_or_none(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        try:
            return self.get(kind, name, namespace)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str | None = None, **params: Any) -> dict:
        return self.request("GET", self.path(kind, namespace), params=_selectors(params))

    def items(self, kind: str, namespace: str | None = None, **params: Any) -> list[dict]:
        return self.list(kind, namespace, **params)["items"]

    def create(self, obj: dict, namespace: str | None = None, sub: str | None = None, name: str | None = None) -> dict:
        ns = namespace or obj.get("metadata", {}).get("namespace")
        return self.request("POST", self.path(obj["kind"], ns, name, sub), obj)

    def replace(self, obj: dict, sub: str | None = None) -> dict:
        md = obj["metadata"]
        return self.request("PUT", self.path(obj["kind"], md.get("namespace"), md["name"], sub), obj)

    def patch(
        self,
        kind: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        sub: str | None = None,
        type: str = "strategic",
        field_manager: str | None = None,
        force: bool | None = None,
    ) -> dict:
        params = {"fieldManager": field_manager, "force": None if force is None else str(force).lower()}
        return self.request(
            "PATCH", self.path(kind, namespace, name, sub), patch, params=params, content_type=PATCH_TYPES[type]
        )

    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
        propagation: str | None = None,
        missing_ok: bool = True,
    ) -> dict | None:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        if propagation:
            body["propagationPolicy"] = propagation
        try:
            return self.request("DELETE", self.path(kind, namespace, name), body)
        except ApiError as e:
            if missing_ok and e.status in (404, 409):
                return None
            raise

    def apply(self, obj: dict, field_manager: str = "e2e", sub: str | None = None) -> dict:
        md = obj["metadata"]
        return self.patch(
            obj["kind"], md["name"], obj, md.get("namespace"), sub, type="apply", field_manager=field_manager, force=True
        )

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A bound token of the ServiceAccount `namespace/name` (TokenRequest), valid for `seconds`."""
        return self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}},
        )["status"]["token"]

    def watch(
        self,
        kind: str,
        namespace: str | None = None,
        resource_version: str | None = None,
        timeout_seconds: int = 60,
        **params: Any,
    ) -> Iterator[dict]:
        """Yields watch events ({"type": ..., "object": ...}) until the server closes the stream."""
        query = _selectors(params)
        query.update(
            {
                "watch": "true",
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(timeout_seconds),
                "resourceVersion": resource_version,
            }
        )
        url = self.host + self.path(kind, namespace) + "?" + urlencode({k: v for k, v in query.items() if v})
        resp = self._http.request(
            "GET",
            url,
            headers=self._headers(),
            preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=timeout_seconds + 15),
        )
        try:
            if resp.status >= 400:
                raise ApiError(resp.status, resp.data.decode(errors="replace"), "WATCH", url)
            buf = b""
            for chunk in resp.stream(65536, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()

    # -- waiting ------------------------------------------------------------------------------

    def wait_for(
        self,
        what: str,
        probe: Callable[[], Any],
        timeout: float = 60.0,
        interval: float = 0.25,
    ) -> Any:
        """Polls `probe` until it returns something truthy; raises TimeoutError naming `what`."""
        return wait_for(what, probe, timeout, interval)


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25) -> Any:
    """Polls `probe` until it returns something truthy; raises TimeoutError naming `what`.

    `timeout` is the wait on a quiet reference machine: it is stretched by the machine's measured time scale
    (tests/timing.py). Transient API errors (connection refused while a component restarts, 404 before an object
    exists) count as "not yet"; the last one is reported on timeout.
    """
    return poll(what, probe, timeout, interval, transient=(ApiError, urllib3.exceptions.HTTPError, OSError),
                error=TimeoutError)


def _selectors(params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        camel = {"label_selector": "labelSelector", "field_selector": "fieldSelector"}.get(key, key)
        if isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        out[camel] = value
    return out


def condition(obj: dict, type_: str) -> dict | None:
    """The status condition of `type_` on an object, or None."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None
