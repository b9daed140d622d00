"""The operator's API-server access: server-side apply, reads, status patches and Events.

Synchronous `kubernetes` client calls, run in threads by the async callers.
Every write is counted (metric `triton_operator_api_writes_total`) so tests can
prove that a second reconcile writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ..api.kinds import LEASE, kind_of
from ..api.timestamps import rfc3339, utc_now
from ..api.v1alpha1 import GROUP, PLURAL, VERSION
from . import metrics
from .errors import ApiCallError

FIELD_MANAGER = "triton-operator"


Items = list[dict[str, Any]]

#: A LIST answered with metadata only (no spec, status or data): what exists, cheaply.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


class Kube:
    """A thin dict-in, dict-out client over one ApiClient."""

    def __init__(self, api: client.ApiClient | None = None) -> None:
        self.api = api or client.ApiClient()

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None) -> Kube:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        return cls()

    # -- raw calls

    def _call(self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
              content_type: str = "application/json", accept: str = "application/json",
              what: tuple[str, str, str | None, str | None] | None = None) -> Any:
        """One request; an error answer raises `ApiCallError` with `what` (verb, kind, namespace, name) was asked
        and the API server's message."""
        headers = {"Accept": accept, "Content-Type": content_type}
        m, url, hdrs, ser_body, _ = self.api.param_serialize(
            method=method, resource_path=path, query_params=query or [], header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(m, url, header_params=hdrs, body=ser_body, _request_timeout=30)
        data: bytes = resp.read()
        if not 200 <= resp.status < 300:
            verb, kind, namespace, name = what or (method.lower(), path, None, None)
            raise ApiCallError(verb, kind, namespace, name, resp.status, resp.reason or "", _message(data))
        return json.loads(data) if data else None

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
        except ApiException as exc:
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
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str | None = None) -> Items:
        query = [("labelSelector", label_selector)] if label_selector else []
        items: Items = self._call("GET", self.path(api_version, kind, namespace), query=query,
                                  what=("list", kind, namespace, None))["items"]
        return items

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
        return created

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT an object read before: its metadata.resourceVersion makes it conditional (409 if it changed since)."""
        meta = obj["metadata"]
        _count_write(obj["kind"], "update")
        replaced: dict[str, Any] = self._call(
            "PUT", self.path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]), body=obj,
            query=[("fieldManager", FIELD_MANAGER)], what=("update", obj["kind"], meta["namespace"], meta["name"]))
        return replaced

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete one object; already gone is fine."""
        metrics.API_WRITES.labels(kind=kind, verb="delete").inc()
        try:
            self._call("DELETE", self.path(api_version, kind, namespace, name), what=("delete", kind, namespace, name))
        except ApiException as exc:
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
        except ApiException as exc:
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
        except ApiException as exc:
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
        except ApiException:
            pass  # events are best effort


def _message(data: bytes) -> str:
    """The `message` of the Status object an error answer carries (else the body's start)."""
    try:
        return str(json.loads(data).get("message") or "")
    except (ValueError, AttributeError):
        return data[:300].decode(errors="replace")


def _count_write(kind: str, verb: str) -> None:
    """The Lease's renewals (one every retry period, even when idle) are counted apart from the reconcile's writes."""
    if kind == LEASE.kind:
        metrics.LEASE_WRITES.labels(verb=verb).inc()
    else:
        metrics.API_WRITES.labels(kind=kind, verb=verb).inc()
