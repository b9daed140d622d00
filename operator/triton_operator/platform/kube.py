"""The operator's API-server access: server-side apply, reads, status patches and Events.

Synchronous HTTP calls (urllib3, one pool shared by the executor's threads), run in threads by the async callers;
the credentials are `kubeconfig`'s (not the `kubernetes` package's: importing it costs ~32 MB of RSS, issue 17).
Every write is counted (metric `triton_operator_api_writes_total`) so tests can prove that a second reconcile
writes nothing.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

import urllib3

from .. import __version__
from ..api.kinds import LEASE, kind_of
from ..api.timestamps import rfc3339, utc_now
from ..api.v1alpha1 import GROUP, PLURAL, VERSION
from . import kubeconfig, metrics
from .errors import ApiCallError, ApiError

log = logging.getLogger("triton_operator.kube")

FIELD_MANAGER = "triton-operator"


Items = list[dict[str, Any]]

#: A LIST answered with metadata only (no spec, status or data): what exists, cheaply.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

#: Every request's limit, connecting and reading together.
TIMEOUT_SECONDS = 30.0
#: Connections kept per host: more than the threads of asyncio's default executor that call at once.
POOL_SIZE = 16
#: What the audit log and bench/clients.py know the operator's own requests by.
USER_AGENT = f"triton-operator/{__version__}"


class Transport:
    """HTTP requests to the API server with the current credentials: one urllib3 pool (through the credentials'
    proxy, if any), safe to share between threads; a new pool when what a connection depends on changes (a rotated
    client certificate); a 401 reads the credentials again and retries once (a rotated token, an expired exec
    credential)."""

    def __init__(self, source: kubeconfig.CredentialSource, headers: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.headers = {"User-Agent": USER_AGENT, **(headers or {})}
        self._lock = threading.Lock()
        self._pool: urllib3.PoolManager | None = None
        self._pool_key: tuple[Any, ...] | None = None

    def _pool_for(self, creds: kubeconfig.Credentials) -> urllib3.PoolManager:
        with self._lock:
            if self._pool is None or self._pool_key != creds.connection():
                old = self._pool
                kw: dict[str, Any] = {}
                if creds.insecure:
                    kw.update(cert_reqs="CERT_NONE", assert_hostname=False)
                else:
                    kw.update(cert_reqs="CERT_REQUIRED", ca_certs=creds.ca_path)
                    if creds.tls_server_name:
                        kw.update(server_hostname=creds.tls_server_name, assert_hostname=creds.tls_server_name)
                if creds.certificate_path:
                    kw.update(cert_file=creds.certificate_path, key_file=creds.private_key_path)
                kw.update(num_pools=4, maxsize=POOL_SIZE, block=False, timeout=urllib3.Timeout(total=TIMEOUT_SECONDS),
                          retries=urllib3.Retry(total=3, redirect=False))
                if creds.proxy_url:
                    # Only the proxy's own credentials go to the proxy (its CONNECT); ours go inside the tunnel.
                    proxy = urlsplit(creds.proxy_url)
                    proxy_headers = {"User-Agent": self.headers["User-Agent"]}
                    if proxy.username is not None:
                        proxy_headers.update(urllib3.make_headers(
                            proxy_basic_auth=f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"))
                    self._pool = urllib3.ProxyManager(proxy._replace(netloc=proxy.netloc.rpartition("@")[2]).geturl(),
                                                      proxy_headers=proxy_headers, **kw)
                else:
                    self._pool = urllib3.PoolManager(**kw)
                self._pool_key = creds.connection()
                if old is not None:
                    old.clear()
            return self._pool

    def _send(self, creds: kubeconfig.Credentials, method: str, url: str, body: bytes | None,
              headers: dict[str, str], **kw: Any) -> urllib3.BaseHTTPResponse:
        sent = urllib3.HTTPHeaderDict(headers)
        for name, value in creds.headers():  # Authorization, Impersonate-* (a header per group: add, not set)
            sent.add(name, value)
        kw.setdefault("preload_content", True)
        return self._pool_for(creds).request(method, creds.server + url, body=body, headers=sent, **kw)

    def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None, body: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> tuple[int, str, bytes]:
        """(status, reason, body) of one request; urllib3's exceptions when no answer came."""
        url = path + ("?" + urlencode(query) if query else "")
        hdrs = {**self.headers, **(headers or {})}
        resp = self._send(self.source.current(), method, url, body, hdrs)
        if resp.status == 401:
            resp = self._send(self.source.reload(), method, url, body, hdrs)
        return resp.status, resp.reason or "", resp.data

    def stream(self, path: str, query: list[tuple[str, str]], read_seconds: float) -> urllib3.BaseHTTPResponse:
        """A GET whose answer is read as it comes (a watch): the response, unread, each read waiting at most
        `read_seconds`; not retried. The caller releases it (`release_conn`), or `shutdown`s it from another
        thread."""
        url = path + "?" + urlencode(query)
        hdrs = {**self.headers, "Accept": "application/json"}
        kw: dict[str, Any] = {"preload_content": False, "retries": urllib3.Retry(total=0, redirect=False),
                              "timeout": urllib3.Timeout(connect=TIMEOUT_SECONDS, read=read_seconds)}
        resp = self._send(self.source.current(), "GET", url, None, hdrs, **kw)
        if resp.status == 401:
            resp.drain_conn()
            resp.release_conn()
            resp = self._send(self.source.reload(), "GET", url, None, hdrs, **kw)
        return resp


class Kube:
    """A thin dict-in, dict-out client over one `Transport`."""

    def __init__(self, source: kubeconfig.CredentialSource, headers: Mapping[str, str] | None = None) -> None:
        self.transport = Transport(source, headers)

    @classmethod
    def from_environment(cls, kubeconfig_path: str | None = None) -> Kube:
        """The kubeconfig asked for, else in-cluster, else `$KUBECONFIG` or ~/.kube/config."""
        return cls(kubeconfig.load(kubeconfig_path))

    @property
    def credentials(self) -> kubeconfig.CredentialSource:
        return self.transport.source

    # -- raw calls

    def _call(self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
              content_type: str = "application/json", accept: str = "application/json",
              what: tuple[str, str, str | None, str | None] | None = None) -> Any:
        """One request; an error answer raises `ApiCallError` with `what` (verb, kind, namespace, name) was asked
        and the API server's message."""
        headers = {"Accept": accept, "Content-Type": content_type}
        data = None if body is None else json.dumps(body).encode()
        status, reason, answer = self.transport.request(method, path, query, data, headers)
        if not 200 <= status < 300:
            verb, kind, namespace, name = what or (method.lower(), path, None, None)
            raise ApiCallError(verb, kind, namespace, name, status, reason, _message(answer))
        return json.loads(answer) if answer else None

    def review(self, group_version: str, plural: str, spec: dict[str, Any]) -> dict[str, Any]:
        """POST a TokenReview or SubjectAccessReview (authentication.k8s.io, authorization.k8s.io); its status."""
        group, _, version = group_version.partition("/")
        kind = {"tokenreviews": "TokenReview", "subjectaccessreviews": "SubjectAccessReview"}[plural]
        body = {"apiVersion": group_version, "kind": kind, "spec": spec}
        out = self._call("POST", f"/apis/{group}/{version}/{plural}", body, what=("create", kind, None, None))
        return dict((out or {}).get("status") or {})

    def serves_tritonmodels(self) -> bool:
        """Whether the API server serves TritonModels yet (discovery, readable by every authenticated user:
        no CRD permission needed)."""
        try:
            found = self._call("GET", f"/apis/{GROUP}/{VERSION}")
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == PLURAL for r in (found or {}).get("resources") or [])

    @staticmethod
    def path(api_version: str, kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        k = kind_of(api_version, kind)
        p = f"{k.prefix}/namespaces/{namespace}/{k.plural}"
        if name:
            p += f"/{name}"
        if sub:
            p += f"/{sub}"
        return p

    # -- reads

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._call("GET", self.path(api_version, kind, namespace, name),
                                               what=("get", kind, namespace, name))
            return found
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str | None = None) -> Items:
        query = [("labelSelector", label_selector)] if label_selector else []
        items: Items = self._call("GET", self.path(api_version, kind, namespace), query=query,
                                  what=("list", kind, namespace, None))["items"]
        return items

    def list_versioned(self, api_version: str, kind: str, namespace: str | None,
                       label_selector: str | None = None) -> tuple[Items, str]:
        """Every object of the kind in `namespace` (None: in every namespace), and the list's resourceVersion (where
        a watch of what changed since starts)."""
        k = kind_of(api_version, kind)
        path = self.path(api_version, kind, namespace) if namespace else f"{k.prefix}/{k.plural}"
        query = [("labelSelector", label_selector)] if label_selector else []
        listed = self._call("GET", path, query=query, what=("list", kind, namespace, None))
        return listed.get("items") or [], str(listed["metadata"].get("resourceVersion") or "")

    def watch(self, api_version: str, kind: str, namespace: str | None, resource_version: str, timeout_seconds: int,
              opened: Callable[[urllib3.BaseHTTPResponse], None] | None = None) -> Iterator[dict[str, Any]]:
        """The events of a watch from `resource_version` (bookmarks included) for at most `timeout_seconds`.
        `opened` gets the response first (to `shutdown` it from another thread). An error answer raises
        `ApiCallError`; an expired resourceVersion comes as an ERROR event with code 410, as the API server sends
        it."""
        k = kind_of(api_version, kind)
        path = self.path(api_version, kind, namespace) if namespace else f"{k.prefix}/{k.plural}"
        query = [("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(timeout_seconds))]
        resp = self.transport.stream(path, query, read_seconds=timeout_seconds + TIMEOUT_SECONDS)
        try:
            if opened is not None:
                opened(resp)
            if resp.status != 200:
                raise ApiCallError("watch", kind, namespace, None, resp.status, resp.reason or "",
                                   _message(resp.read()))
            pending = b""
            for chunk in resp.stream(64 * 1024):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()

    def list_uids(self, api_version: str, kind: str, namespace: str, label_selector: str | None = None) -> set[str]:
        """The uids of the objects a LIST returns, fetched as metadata only."""
        query = [("labelSelector", label_selector)] if label_selector else []
        listed = self._call("GET", self.path(api_version, kind, namespace), query=query, accept=METADATA_LIST,
                            what=("list", kind, namespace, None))
        return {item["metadata"]["uid"] for item in listed.get("items") or ()}  # an empty list has "items": null

    def list_namespaces(self) -> dict[str, bool]:
        """Every namespace's name -> whether it is being deleted, fetched as metadata only."""
        listed = self._call("GET", "/api/v1/namespaces", accept=METADATA_LIST)
        return {item["metadata"]["name"]: bool(item["metadata"].get("deletionTimestamp"))
                for item in listed.get("items") or ()}

    # -- writes

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply with our one field manager, forcing ownership of the fields we set."""
        meta = obj["metadata"]
        path = self.path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        metrics.API_WRITES.labels(kind=obj["kind"], verb="apply").inc()
        applied: dict[str, Any] = self._call(
            "PATCH", path, body=obj, query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml", what=("apply", obj["kind"], meta["namespace"], meta["name"]),
        )
        return applied

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """POST a new object; a 409 (it exists) raises ApiCallError like any refusal."""
        meta = obj["metadata"]
        _count_write(obj["kind"], "create")
        created: dict[str, Any] = self._call("POST", self.path(obj["apiVersion"], obj["kind"], meta["namespace"]), body=obj,
                                             query=[("fieldManager", FIELD_MANAGER)],
                                             what=("create", obj["kind"], meta["namespace"], meta["name"]))
        _count_lease_write(obj["kind"], "create")
        return created

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        """POST a new object; whether it was created (False: one of that name exists, which is not read). The answer's
        body is dropped: for a Secret it holds what was just sent."""
        try:
            self.create(obj)
        except ApiCallError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT an object read before: its metadata.resourceVersion makes it conditional (409 if it changed since)."""
        meta = obj["metadata"]
        _count_write(obj["kind"], "update")
        replaced: dict[str, Any] = self._call(
            "PUT", self.path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]), body=obj,
            query=[("fieldManager", FIELD_MANAGER)], what=("update", obj["kind"], meta["namespace"], meta["name"]))
        _count_lease_write(obj["kind"], "update")
        return replaced

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete one object; already gone is fine."""
        metrics.API_WRITES.labels(kind=kind, verb="delete").inc()
        try:
            self._call("DELETE", self.path(api_version, kind, namespace, name), what=("delete", kind, namespace, name))
        except ApiError as exc:
            if exc.status != 404:
                raise

    def apply_cluster(self, obj: dict[str, Any], plural: str) -> dict[str, Any]:
        """Server-side apply of a cluster-scoped object (e.g. a ValidatingWebhookConfiguration)."""
        group_version, name = obj["apiVersion"], obj["metadata"]["name"]
        metrics.API_WRITES.labels(kind=obj["kind"], verb="apply").inc()
        applied: dict[str, Any] = self._call(
            "PATCH", f"/apis/{group_version}/{plural}/{name}", body=obj,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")], content_type="application/apply-patch+yaml",
        )
        return applied

    def json_patch_cluster(self, group_version: str, plural: str, name: str, patch: Items) -> None:
        """A JSON patch (RFC 6902) of a cluster-scoped object: the fields it names, nothing else."""
        metrics.API_WRITES.labels(kind=plural, verb="patch").inc()
        self._call("PATCH", f"/apis/{group_version}/{plural}/{name}", body=patch,
                   query=[("fieldManager", FIELD_MANAGER)], content_type="application/json-patch+json")

    def delete_cluster(self, group_version: str, plural: str, name: str) -> None:
        metrics.API_WRITES.labels(kind=plural, verb="delete").inc()
        try:
            self._call("DELETE", f"/apis/{group_version}/{plural}/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise

    def patch_custom_status(self, group: str, version: str, plural: str, namespace: str, name: str,
                            status: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patch the status subresource; None when the object is gone."""
        metrics.API_WRITES.labels(kind="TritonModel", verb="patch-status").inc()
        try:
            updated: dict[str, Any] = self._call(
                "PATCH", f"/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status",
                body={"status": status}, query=[("fieldManager", FIELD_MANAGER)],
                content_type="application/merge-patch+json", what=("patch", "TritonModel status", namespace, name),
            )
            return updated
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_pod_condition(self, namespace: str, name: str, condition: dict[str, Any]) -> None:
        """Set one pod condition (strategic merge on `type`), keeping the kubelet's own."""
        metrics.API_WRITES.labels(kind="Pod", verb="patch-status").inc()
        self._call(
            "PATCH", self.path("v1", "Pod", namespace, name, "status"),
            body={"status": {"conditions": [condition]}}, query=[("fieldManager", FIELD_MANAGER)],
            content_type="application/strategic-merge-patch+json", what=("patch", "Pod status", namespace, name),
        )

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None],
                              expect: Mapping[str, str | None] | None = None) -> dict[str, Any] | None:
        """Set (None: remove) pod annotations. With `expect`, only if those annotations still hold those values
        (None: absent), as one JSON patch with `test` operations; None when they no longer do, or the pod is gone."""
        metrics.API_WRITES.labels(kind="Pod", verb="patch").inc()
        path = self.path("v1", "Pod", namespace, name)
        what = ("patch", "Pod", namespace, name)
        if not expect:
            try:
                out: dict[str, Any] = self._call("PATCH", path, body={"metadata": {"annotations": dict(annotations)}},
                                                 query=[("fieldManager", FIELD_MANAGER)],
                                                 content_type="application/merge-patch+json", what=what)
            except ApiCallError as exc:
                if exc.status == 404:
                    return None
                raise
            return out
        current = self.get("v1", "Pod", namespace, name)
        if current is None:
            return None
        have = current["metadata"].get("annotations") or {}
        if any(have.get(k) != v for k, v in expect.items()):
            return None
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                      "value": current["metadata"]["resourceVersion"]}]
        if not have:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        for k, v in annotations.items():
            pointer = "/metadata/annotations/" + k.replace("~", "~0").replace("/", "~1")
            if v is not None:
                ops.append({"op": "add", "path": pointer, "value": v})
            elif k in have:
                ops.append({"op": "remove", "path": pointer})
        try:
            patched: dict[str, Any] = self._call("PATCH", path, body=ops, query=[("fieldManager", FIELD_MANAGER)],
                                                 content_type="application/json-patch+json", what=what)
        except ApiCallError as exc:
            if exc.status in (404, 409, 422):  # gone, or changed since it was read: the next round decides again
                return None
            raise
        return patched

    def event(self, involved: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        meta = involved["metadata"]
        at = utc_now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"], "kind": involved["kind"], "name": meta["name"],
                "namespace": meta["namespace"], "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": rfc3339(at),
            "lastTimestamp": rfc3339(at),
            "eventTime": rfc3339(at, micro=True),
            "reportingInstance": FIELD_MANAGER,
            "action": reason,
            "count": 1,
        }
        metrics.API_WRITES.labels(kind="Event", verb="create").inc()
        try:
            self._call("POST", self.path("v1", "Event", meta["namespace"]), body=body)
        except ApiError as exc:  # events are best effort: said in the log, not raised
            log.warning("Failed to record Event reason=%s object=%s/%s status=%s error=%s", reason, meta["namespace"],
                        meta["name"], exc.status, exc)


def _message(data: bytes) -> str:
    """The `message` of the Status object an error answer carries (else the body's start)."""
    try:
        return str(json.loads(data).get("message") or "")
    except (ValueError, AttributeError):
        return data[:300].decode(errors="replace")


def _count_write(kind: str, verb: str) -> None:
    """A write sent (the Lease's are counted apart, once they succeed: `_count_lease_write`)."""
    if kind != LEASE.kind:
        metrics.API_WRITES.labels(kind=kind, verb=verb).inc()


def _count_lease_write(kind: str, verb: str) -> None:
    """A write of the Lease that succeeded (one every retry period while leading, even when idle). Counted once it
    succeeds, not when sent: the chart's TritonOperatorNoLeader fires when none succeeds for a while, and replicas
    whose writes are refused (RBAC, an admission policy) try again every retry period: counted when sent, those
    refusals kept it quiet in the one case it is for."""
    if kind == LEASE.kind:
        metrics.LEASE_WRITES.labels(verb=verb).inc()
