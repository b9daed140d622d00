"""Pure rendering of a TritonPool's children and of its pooled models' traffic objects (issue 29; the design is
`plan.placement`'s docstring):

- `render_pool_deployment`: the pool's replicas, tritonserver in explicit model control with no model at start
  (no `--load-model`), its repository API restricted to the pool's key as a model's own replicas' is
  (`render.repository_key`), and the `probe` sidecar holding the kubelet's readiness probe until tritonserver
  answers. No readiness gate: a pool pod's readiness says its tritonserver is up, nothing per model. The pod is
  built from `render.pod`, as a model's own replicas' is; the `fetch-server` sidecar is the pool's own.
- `render_model_service`: a pooled model's Service, with no selector, so that only the operator's EndpointSlices
  route to it.
- `render_endpoint_slices`: a pooled model's EndpointSlices, from its placement, each replica's pod (IP, Ready,
  terminating) and the replicas where the model is READY at the desired digest and warm (the gate's verdict).
- `render_model_hpa`, `render_pool_hpa`: the HPAs of a pooled model's copies and of a pool's replicas
  (`render.autoscaling` says which metric each reads).
- `load_request`: what loads a model into a pool replica: its config as JSON, and an inline model's files as Triton's
  `file:<path>` load parameters, with nothing of it on disk (TRITON_NOTES.md, verified on 2.51;
  `tests/test_pool_load.py` loads examples/pool.yaml so into a real tritonserver); a uri model's sources, pins and
  rendered files go to the replica's `fetch-server` sidecar instead, and the load carries the config alone.

No client, no I/O: the controller applies what these return.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from ..api.kinds import LABEL_MODEL, OWNED
from ..api.pod import (
    FETCH_SERVER_CONTAINER,
    FETCH_SERVER_PORT,
    GRPC_PORT,
    HTTP_PORT,
    TRITON_CONTAINER,
)
from ..api.pool import (
    ANNOTATION_LEAVING,
    ENDPOINTSLICE_MANAGER,
    HANDOVER_CONDITION,
    LABEL_POOL,
    LABEL_POOL_TEMPLATE,
    POOL_KIND,
    TritonPool,
)
from ..api.v1alpha1 import (
    API_VERSION,
    KIND,
    POOL_FAILED_REQUEST_THRESHOLD,
    ModelFiles,
    Source,
    TritonModel,
    quantity_bytes,
)
from .autoscaling import HpaMetric, pool_hpa_metric, pooled_hpa_metric
from .modelconfig import RenderedModel
from .pod import (
    FETCH_RESOURCES,
    MODELS_VOLUME,
    REPO_DIR,
    TMP_DIR,
    Options,
    models_volume,
    placement,
    pod_security_context,
    pod_settings,
    pool_probes,
    probe_container,
    shm_volume,
    sidecar_security,
    termination_grace_period,
    tmp_volume,
    triton_args,
    triton_container,
    user_env,
)
from .repository_key import key_env, render_secret, secret_name
from .service import session_affinity

#: The label Kubernetes' proxies and DNS select a Service's EndpointSlices by.
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
#: The label that says which controller manages an EndpointSlice (the built-in ones leave others' alone).
LABEL_SLICE_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
#: The ports a pooled model's Service and slices carry: Triton's HTTP and gRPC (metrics are per server, not per model).
MODEL_PORTS = (("http", HTTP_PORT), ("grpc", GRPC_PORT))


def pool_labels(pool: TritonPool) -> dict[str, str]:
    return {"app.kubernetes.io/name": "triton", "app.kubernetes.io/instance": pool.name, **OWNED, LABEL_POOL: pool.name}


def pool_selector(pool: TritonPool) -> dict[str, str]:
    return {LABEL_POOL: pool.name}


def pool_owner_reference(pool: TritonPool, uid: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": POOL_KIND, "name": pool.name, "uid": uid, "controller": True,
            "blockOwnerDeletion": True}


#: What a pool's Deployment is named after the pool (`pool_deployment_name`).
POOL_DEPLOYMENT_SUFFIX = "-pool"


def pool_deployment_name(pool: TritonPool) -> str:
    """The pool's Deployment: `<pool>-pool`, apart from a TritonModel's own Deployment of the pool's name."""
    return f"{pool.name}{POOL_DEPLOYMENT_SUFFIX}"


def pool_key_secret_name(pool: TritonPool, key: str | None) -> str:
    """The Secret holding the pool's repository key: named apart from a model's of the same name."""
    return secret_name(f"{pool.name}-pool", key)


def pool_key(pool: TritonPool, uid: str, namespace: str, options: Options) -> str | None:
    """The pool's repository key (one for every model it carries: a pool is a trust boundary), or None without a
    master key."""
    keys = options.repository_keys
    return keys.key(namespace, pool_deployment_name(pool), uid) if keys is not None else None


def render_pool_key_secret(pool: TritonPool, uid: str, namespace: str, options: Options) -> dict[str, Any] | None:
    """The Secret the pool's replicas read their repository key from (created once, never read back by the
    operator); None without a master key."""
    key = pool_key(pool, uid, namespace, options)
    if key is None:
        return None
    meta = _pool_meta(pool, uid, namespace)
    meta["name"] = pool_key_secret_name(pool, key)
    return render_secret(meta, key)


def _pool_triton_container(pool: TritonPool, key_secret: str, options: Options) -> dict[str, Any]:
    server = pool.spec.server
    # No --load-model: the operator loads each placed model. Triton's server readiness is 400 while any model is
    # LOADING: one model's load would take every other model on the replica out. Readiness is per model here, in
    # each model's EndpointSlice. One cache for every pooled model with responseCache (Triton's is per server); none
    # with cacheSize 0: Triton 2.51 fails to initialize a local cache of size 0 and then stays not ready, refusing
    # every load ("Server not ready"), so such a pool served no model at all.
    cache = quantity_bytes(server.cache_size)
    args = triton_args(server, options, load_model=None, strict_readiness=False, cache_bytes=cache or None)
    # Its repository is what the `fetch-server` sidecar writes on request (uri models; each a link to its digest's
    # files, swapped atomically: `triton_operator.agent.fetch_server`); inline models come in the load request.
    return triton_container(server, args, key_secret, MODELS_VOLUME, server.gpus or 0, pool_probes(options), options)


def _fetch_server_container(pool: TritonPool, key_secret: str, options: Options) -> dict[str, Any]:
    """The `fetch-server` sidecar: it fetches a uri model's files into `models` when the operator asks (with the
    pool's key), with the fetch step's code, caps (spec.server.fetch, per model) and credentials: the pool's
    spec.server.env and envFrom, and its ServiceAccount's workload identity."""
    server = pool.spec.server
    env = user_env(server)
    container: dict[str, Any] = {
        "name": FETCH_SERVER_CONTAINER,
        "image": options.operator_image,
        "args": ["fetch-server", "--listen", f":{FETCH_SERVER_PORT}", "--repository", REPO_DIR,
                 "--max-bytes", str(server.fetch_max_bytes), "--max-files", str(server.fetch.max_files),
                 "--timeout", str(server.fetch.timeout_seconds)],
        "ports": [{"name": "fetch", "containerPort": FETCH_SERVER_PORT, "protocol": "TCP"}],
        "env": [{"name": "HOME", "value": TMP_DIR}, key_env(key_secret), *env.get("env", ())],
        **({"envFrom": env["envFrom"]} if "envFrom" in env else {}),
        "volumeMounts": [{"name": MODELS_VOLUME, "mountPath": REPO_DIR}, {"name": "tmp", "mountPath": TMP_DIR}],
        # Idle but for a fetch: a small request, and the fetch step's limits for the fetch itself.
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": dict(FETCH_RESOURCES["limits"])},
        "securityContext": sidecar_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return container


def _pool_probe(key_secret: str, options: Options) -> dict[str, Any]:
    """The probe sidecar, watching every model the replica's Triton serves (`--every-model`: failed requests, dead
    Python stubs) for the operator, which takes a broken copy out of its model's slices and reloads it; the pod's
    readiness still says only that tritonserver is up."""
    # The default threshold; a pooled model that sets another carries it in its config, where the probe reads it
    # (`api.pod.THRESHOLD_PARAMETER`): the pod template is the same whatever its models set.
    return probe_container((), POOL_FAILED_REQUEST_THRESHOLD, key_secret, options, every_model=True)


def _pool_pod_spec(pool: TritonPool, triton: dict[str, Any], fetcher: dict[str, Any], key_secret: str,
                   options: Options) -> dict[str, Any]:
    server = pool.spec.server
    spec: dict[str, Any] = {
        # The probe watches tritonserver alone: which models a replica serves changes without a restart.
        "containers": [triton, _pool_probe(key_secret, options), fetcher],
        # The probe sees the Python backend's stubs in the pod's shared process namespace.
        "shareProcessNamespace": True,
        "volumes": [models_volume(server), tmp_volume(server), shm_volume(server)],
        # Ready only once the operator says so: at once, but in a rollout only once the copies of the replica this
        # one replaces serve elsewhere (`plan.pool.rollout`).
        "readinessGates": [{"conditionType": HANDOVER_CONDITION}],
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": termination_grace_period(triton["args"], options),
        **pod_settings(server, pool_selector(pool)),
        **placement(server, server.gpus or 0),
    }
    return spec


def _pool_meta(pool: TritonPool, uid: str, namespace: str) -> dict[str, Any]:
    return {"name": pool_deployment_name(pool), "namespace": namespace, "labels": pool_labels(pool),
            "ownerReferences": [pool_owner_reference(pool, uid)]}


def render_pool_pdb(pool: TritonPool, uid: str, namespace: str) -> dict[str, Any]:
    """At most one replica of the pool down at a time to voluntary disruptions (a node drain): each carries copies
    of many models."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _pool_meta(pool, uid, namespace),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pool_selector(pool)}},
    }


def render_pool_children(pool: TritonPool, uid: str, namespace: str, options: Options | None = None) -> list[dict[str, Any]]:
    """The pool's children, in apply order: its Deployment, and its PodDisruptionBudget with more than one replica."""
    children = [render_pool_deployment(pool, uid, namespace, options)]
    if pool.spec.replicas > 1:
        children.append(render_pool_pdb(pool, uid, namespace))
    return children


def render_pool_deployment(pool: TritonPool, uid: str, namespace: str, options: Options | None = None) -> dict[str, Any]:
    """The pool's Deployment: `spec.replicas` tritonservers with no model, waiting for the operator's loads."""
    options = options if options is not None else Options()
    key_secret = pool_key_secret_name(pool, pool_key(pool, uid, namespace, options))
    triton = _pool_triton_container(pool, key_secret, options)
    fetcher = _fetch_server_container(pool, key_secret, options)
    labels = {**(pool.spec.server.pod_labels or {}), **pool_labels(pool)}
    annotations = {**(pool.spec.server.pod_annotations or {}),
                   "kubectl.kubernetes.io/default-container": TRITON_CONTAINER}
    template: dict[str, Any] = {"metadata": {"labels": labels, "annotations": annotations},
                                "spec": _pool_pod_spec(pool, triton, fetcher, key_secret, options)}
    labels[LABEL_POOL_TEMPLATE] = template_digest(template)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _pool_meta(pool, uid, namespace),
        "spec": {
            "replicas": pool.spec.replicas,
            "selector": {"matchLabels": pool_selector(pool)},
            # One new replica at a time, and an old one goes only once the new one is Ready, which its handover gate
            # holds until the old one's copies serve elsewhere (`plan.pool.rollout`).
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": template,
        },
    }


def template_digest(template: Mapping[str, Any]) -> str:
    """A digest of a pod template (16 hex digits): what LABEL_POOL_TEMPLATE says of the template it labels."""
    return hashlib.sha256(json.dumps(template, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _model_meta(model: TritonModel, name: str, uid: str, namespace: str) -> dict[str, Any]:
    assert model.spec.pool is not None
    return {
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/name": "triton", "app.kubernetes.io/instance": model.name, **OWNED,
                   LABEL_MODEL: model.name, LABEL_POOL: model.spec.pool},
        "ownerReferences": [{"apiVersion": API_VERSION, "kind": KIND, "name": model.name, "uid": uid,
                             "controller": True, "blockOwnerDeletion": True}],
    }


def render_model_service(model: TritonModel, uid: str, namespace: str) -> dict[str, Any]:
    """A pooled model's Service: no selector, so Kubernetes' EndpointSlice controller leaves it to the operator's
    slices. Clients call `<model>.<namespace>.svc:8000` as they would a model's own Service."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _model_meta(model, model.name, uid, namespace),
        "spec": {"ports": [{"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                           for name, port in MODEL_PORTS],
                 **session_affinity(model)},
    }


def _hpa(meta: dict[str, Any], ref: dict[str, str], min_replicas: int, max_replicas: int, metric: HpaMetric,
         behavior: dict[str, Any] | None) -> dict[str, Any]:
    """An HPA of `ref`'s scale subresource on an Object metric of `ref` itself (the operator serves it)."""
    spec: dict[str, Any] = {
        "scaleTargetRef": ref,
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "metrics": [{"type": "Object", "object": {"describedObject": ref, "metric": {"name": metric.name},
                                                  "target": {"type": "AverageValue", "averageValue": metric.value}}}],
    }
    if behavior is not None:
        spec["behavior"] = behavior
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta, "spec": spec}


def render_model_hpa(model: TritonModel, uid: str, namespace: str) -> dict[str, Any]:
    """A pooled model's HPA (spec.autoscaling): it sets the model's copies (spec.replicas, through the TritonModel's
    scale subresource) on its metric over the pool replicas where a copy serves (`pooled_hpa_metric`)."""
    a = model.spec.autoscaling
    assert a is not None
    ref = {"apiVersion": API_VERSION, "kind": KIND, "name": model.name}
    return _hpa(_model_meta(model, model.name, uid, namespace), ref, a.min_replicas, a.max_replicas,
                pooled_hpa_metric(a.target), a.behavior)


def render_pool_hpa(pool: TritonPool, uid: str, namespace: str) -> dict[str, Any]:
    """The pool's HPA (spec.autoscaling), `<pool>-pool` like its Deployment: it sets the pool's replicas (through the
    TritonPool's scale subresource) so that its models' demand is targetFreeFraction short of its capacity."""
    a = pool.spec.autoscaling
    assert a is not None
    ref = {"apiVersion": API_VERSION, "kind": POOL_KIND, "name": pool.name}
    return _hpa(_pool_meta(pool, uid, namespace), ref, a.min_replicas, a.max_replicas,
                pool_hpa_metric(a.target_bytes(pool.spec.replica_bytes)), a.behavior)


@dataclass(frozen=True)
class ReplicaPod:
    """What a pooled model's slice needs of a pool replica's pod."""

    name: str
    uid: str
    ip: str | None  # status.podIP: none yet, no endpoint
    node: str | None
    ready: bool  # the pod's Ready condition
    terminating: bool  # metadata.deletionTimestamp is set
    triton: str = ""  # the running tritonserver container's ID: another one after each restart ("" while none runs)
    # Its ContainersReady condition. `ready` adds the pod's readiness gates: a pod of this operator's template is
    # Ready once its handover is done too (`plan.pool.rollout`).
    containers_ready: bool = False
    handed_over: bool = False  # its HANDOVER_CONDITION is True
    template: str = ""  # its LABEL_POOL_TEMPLATE ("" for a pod of a template without it)
    leaving: bool = False  # ANNOTATION_LEAVING is set: the rollout replaces it next
    replica_set: str = ""  # the ReplicaSet that owns it (ownerReferences): a rollout scales the oldest one down first

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> ReplicaPod:
        """From a Pod object as the API server returns it."""
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        conditions = {str(c.get("type")): c.get("status") == "True" for c in status.get("conditions") or ()}
        triton = next((str(c.get("containerID") or "") for c in status.get("containerStatuses") or ()
                       if c.get("name") == TRITON_CONTAINER and "running" in (c.get("state") or {})), "")
        containers, handed_over = conditions.get("ContainersReady", False), conditions.get(HANDOVER_CONDITION, False)
        # Ready as the kubelet will say once it has seen its gate open (its status sync lags the operator's write):
        # the slices list a replica handed over at once, and a pod event in between does not take it out again.
        ready = conditions.get("Ready", False) or (containers and handed_over)
        return cls(str(meta.get("name")), str(meta.get("uid") or ""), status.get("podIP") or None,
                   spec.get("nodeName") or None, ready, bool(meta.get("deletionTimestamp")),
                   triton, containers, handed_over,
                   str((meta.get("labels") or {}).get(LABEL_POOL_TEMPLATE) or ""),
                   ANNOTATION_LEAVING in (meta.get("annotations") or {}),
                   next((str(o.get("name") or "") for o in meta.get("ownerReferences") or ()
                         if o.get("kind") == "ReplicaSet"), ""))

    @property
    def up(self) -> bool:
        """Whether tritonserver answers (its containers are Ready): the replica takes loads, Ready or not yet."""
        return self.ready or self.containers_ready


def _endpoint(pod: ReplicaPod, namespace: str, serves: bool) -> dict[str, Any]:
    endpoint: dict[str, Any] = {
        "addresses": [pod.ip],
        "conditions": {
            # As Kubernetes' own controller sets them for a pod, with the model's verdict beside the pod's Ready.
            "ready": pod.ready and serves and not pod.terminating,
            "serving": pod.ready and serves,
            "terminating": pod.terminating,
        },
        "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod.name, "uid": pod.uid},
    }
    if pod.node:
        endpoint["nodeName"] = pod.node
    return endpoint


def render_endpoint_slices(model: TritonModel, uid: str, namespace: str, placement: Sequence[str],
                           pods: Mapping[str, ReplicaPod], serving: Collection[str]) -> list[dict[str, Any]]:
    """A pooled model's EndpointSlices: one endpoint per replica of its `placement` (pod names) that has an IP, in
    placement order, ready only where its pod is Ready and not terminating and the replica is in `serving` (the
    model, and every step it loads, READY there at the desired digest, warm-up done). One slice per address family
    (`<model>-ipv4`, `<model>-ipv6`); the IPv4 one is there even empty."""
    by_family: dict[str, list[dict[str, Any]]] = {"IPv4": []}
    seen: set[str] = set()
    for name in placement:
        pod = pods.get(name)
        if pod is None or pod.ip is None or name in seen:
            continue
        seen.add(name)
        by_family.setdefault("IPv6" if ":" in pod.ip else "IPv4", []).append(
            _endpoint(pod, namespace, name in serving))
    slices = []
    for family, endpoints in by_family.items():
        meta = _model_meta(model, f"{model.name}-{family.lower()}", uid, namespace)
        meta["labels"] |= {LABEL_SERVICE_NAME: model.name, LABEL_SLICE_MANAGED_BY: ENDPOINTSLICE_MANAGER}
        slices.append({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": meta,
            "addressType": family,
            "ports": [{"name": name, "port": port, "protocol": "TCP"} for name, port in MODEL_PORTS],
            "endpoints": endpoints,
        })
    return slices


@dataclass(frozen=True)
class FetchRequest:
    """What a pool replica's `fetch-server` sidecar places on its disk before a uri model's load: each fetched source
    (the field it comes from, the version directory it fills, `.` for spec.modelFiles, the uri and its pins) and the
    rendered files beside them (warm-up data, inline versions), by path under the model's directory."""

    sources: tuple[Mapping[str, str], ...]
    files: Mapping[str, bytes]


@dataclass(frozen=True)
class LoadRequest:
    """One model's load into a pool replica through Triton's repository API. An inline model has nothing on the
    replica's disk: Triton writes `files` into a directory of its own and loads `config` over them. A uri model
    (`fetch` set) is fetched into the replica's repository volume first, and loaded from there with `config` alone."""

    name: str  # the Triton model name
    config: str  # the model config as the JSON a load takes (the rendered config, digest parameter included)
    files: Mapping[str, bytes]  # `file:<path under the model directory>` -> content
    fetch: FetchRequest | None = None


def _fetched(model: TritonModel) -> tuple[Mapping[str, str], ...]:
    spec = model.spec
    given: list[tuple[str, str, Source | ModelFiles | None]] = [
        *([(f"spec.versions[{i}].source", str(v.version), v.source) for i, v in enumerate(spec.versions)]
          if spec.versions else [("spec.source", "1", spec.source)]),
        ("spec.modelFiles", ".", spec.model_files)]
    out = []
    for path, version, src in given:
        if src is None or src.uri is None:
            continue
        out.append({"field": f"{path}.uri", "version": version, "uri": src.uri,
                    **({"sha256": src.sha256} if src.sha256 else {}),
                    **({"objectVersion": src.object_version} if src.object_version else {})})
    return tuple(out)


def load_request(rendered: RenderedModel) -> LoadRequest:
    """The load of a rendered model: its config as JSON, and its files in the request when all are inline, else
    (a uri source) in a `FetchRequest` for the replica's sidecar. An ensemble's only file is the placeholder that
    makes its version directory exist."""
    model = rendered.model
    prefix, own_config = f"{rendered.name}/", f"{rendered.name}/config.pbtxt"
    files = {path.removeprefix(prefix): content for path, content in sorted(rendered.files.items())
             if path.startswith(prefix) and path != own_config}
    config = json_format.MessageToJson(rendered.config, preserving_proto_field_name=True, indent=None, sort_keys=True)
    fetched = _fetched(model)
    if fetched:
        return LoadRequest(rendered.name, config, {}, FetchRequest(fetched, files))
    return LoadRequest(rendered.name, config, {f"file:{p}": c for p, c in files.items()})
