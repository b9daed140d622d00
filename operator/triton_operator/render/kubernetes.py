"""Pure rendering of a TritonModel's Kubernetes children: ConfigMap, Deployment, Service, PodDisruptionBudget and
HorizontalPodAutoscaler, and the Secret of its repository key.

`render_children(model, rendered, uid, namespace, options)` -> plain dicts ready for server-side
apply. No client, no I/O: the controller applies what this returns. The repository a replica loads (the model and
its ensemble steps, `modelconfig.Repository`) is computed once per render and handed to each builder. `render_key_secret` is the Secret the
controller creates (never applies: see `render.repository_key`).

The replica pod (`render_deployment`) is built from `render.pod`, which a TritonPool's replicas share: tritonserver,
its probes, the `probe` sidecar, the volumes, the pod's security and placement. What is the model's own is here: the
`fetch` init step of its uri sources, the repository ConfigMap volume, the warm-up gate's part (the readiness gate
`WARMED_CONDITION`, the annotations the gate reads, the `probe` container of a gated replica and the probes it
holds), and the pod digest. Those names are the replica pod contract, `api.pod`, whose docstring says where the
other parts of the gate live.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api.kinds import LABEL_MODEL, OWNED
from ..api.pod import (
    ANNOTATION_DIGEST,
    ANNOTATION_POD_DIGEST,
    ANNOTATION_POLL_MS,
    ANNOTATION_STEPS,
    ANNOTATION_TRITON_NAME,
    ANNOTATION_VERSIONS,
    FETCH_CONTAINER,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    REPOSITORY_VOLUME,
    WARMED_CONDITION,
    repository_of,
    versions_annotation,
)
from ..api.v1alpha1 import API_VERSION, KIND, ModelFiles, Server, TritonModel, quantity_bytes
from ..uris import pvc_claim
from .autoscaling import hpa_metric
from .modelconfig import RenderedModel, Repository
from .pod import (
    FETCH_RESOURCES,
    MODELS_VOLUME,
    REPO_DIR,
    gated_probes,
    models_volume,
    own_probes,
    placement,
    pod_security_context,
    pod_settings,
    probe_container,
    shm_volume,
    sidecar_security,
    termination_grace_period,
    tmp_volume,
    triton_args,
    triton_container,
    user_env,
)
from .pod import Options as Options  # noqa: PLC0414 - re-exported: the controller and the CLI render with it
from .repository_key import render_secret, secret_name
from .service import session_affinity

#: ConfigMap data is limited to 1 MiB by the API server; keep headroom for keys and metadata.
CONFIGMAP_LIMIT = 1024 * 1024 - 16 * 1024

#: Where the `fetch` step reads the repository ConfigMap.
CONFIG_DIR = "/config"


class RepositoryTooLarge(ValueError):
    def __init__(self, size: int) -> None:
        super().__init__(
            f"the rendered model repository is {size} bytes, over the ConfigMap limit of {CONFIGMAP_LIMIT} bytes; "
            "move large files to spec.source.uri (https://, pvc://, s3:// or gs://)"
        )
        self.size = size


Objects = list[dict[str, Any]]


def labels(model: TritonModel) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "triton",
        "app.kubernetes.io/instance": model.name,
        **OWNED,
        LABEL_MODEL: model.name,
    }


def selector(model: TritonModel) -> dict[str, str]:
    return {LABEL_MODEL: model.name}


def selector_string(model: TritonModel) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector(model).items()))


def owner_reference(model: TritonModel, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": model.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(model: TritonModel, name: str, uid: str, namespace: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(model),
        "ownerReferences": [owner_reference(model, uid)],
    }


def repository_key(model: TritonModel, uid: str, namespace: str, options: Options) -> str | None:
    """The model's repository key, or None without a master key."""
    keys = options.repository_keys
    return keys.key(namespace, model.name, uid) if keys is not None else None


def key_secret_name(model: TritonModel, uid: str, namespace: str, options: Options) -> str:
    """The name of the Secret holding the model's repository key (a digest of the key ends it)."""
    return secret_name(model.name, repository_key(model, uid, namespace, options))


def render_key_secret(model: TritonModel, uid: str, namespace: str, options: Options) -> dict[str, Any] | None:
    """The Secret the replicas read their repository key from; None without a master key (nothing to hold)."""
    key = repository_key(model, uid, namespace, options)
    if key is None:
        return None
    return render_secret(_meta(model, secret_name(model.name, key), uid, namespace), key)


def configmap_key(path: str) -> str:
    """A ConfigMap key for a repository path: keys allow [-._a-zA-Z0-9] only, so flatten and disambiguate."""
    flat = re.sub(r"[^-._a-zA-Z0-9]", "_", path)
    return f"{flat[-200:]}.{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def repository_name(model: TritonModel, repository: Repository) -> str:
    """`<model>-repository-<hash>`: named by its content (and the model's name, so no two models share one).

    A pod template names the ConfigMap it was made for, and that ConfigMap never changes (`immutable`): a pod
    re-created for an old ReplicaSet fetches the old files, not whatever the model holds now.
    """
    h = hashlib.sha256(model.name.encode())
    for path, content in repository.files.items():
        h.update(b"\0" + path.encode() + b"\0" + hashlib.sha256(content).digest())
    suffix = f"-repository-{h.hexdigest()[:10]}"
    return model.name[: 253 - len(suffix)].rstrip("-.") + suffix


def render_configmap(
    model: TritonModel, repository: Repository, uid: str, namespace: str
) -> dict[str, Any]:
    """The model repository (the model plus, for ensembles, its steps) as one immutable ConfigMap named by its
    content (`repository_name`).

    Keys are flattened paths; the volume's `items` puts each back at its repository path.
    """
    files = repository.files
    data: dict[str, str] = {}
    binary: dict[str, str] = {}
    size = 0
    for path, content in files.items():
        key = configmap_key(path)
        size += len(key) + len(content)
        try:
            data[key] = content.decode("utf-8")
        except UnicodeDecodeError:
            binary[key] = base64.b64encode(content).decode()
    if size > CONFIGMAP_LIMIT:
        raise RepositoryTooLarge(size)
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(model, repository_name(model, repository), uid, namespace),
        "immutable": True,
        "data": data,
    }
    if binary:
        cm["binaryData"] = binary
    return cm


def unused_repositories(
    configmaps: Iterable[Mapping[str, Any]], replicasets: Iterable[Mapping[str, Any]], desired: str,
    template: str | None = None,
) -> list[str]:
    """Names of a model's repository ConfigMaps that no pod can need any more: to delete.

    Kept: `desired` (applied before the Deployment, so no ReplicaSet may name it yet) and the ConfigMap of
    every ReplicaSet that can still create pods (`spec.replicas` > 0) or still has some (`status.replicas`).
    A ReplicaSet scaled to zero comes back only when the Deployment's template is its own again, which only
    the reconcile writes, and it applies that template's ConfigMap first. Also kept: `template`, the ConfigMap
    the Deployment's template mounts when that is not `desired` (an in-place rollout keeps the template): a pod
    the Deployment creates later mounts it.
    """
    keep = {desired} | ({template} if template else set())
    for rs in replicasets:
        active = int((rs.get("spec") or {}).get("replicas") or 0) or int((rs.get("status") or {}).get("replicas") or 0)
        name = repository_of((rs.get("spec") or {}).get("template") or {})
        if active and name:
            keep.add(name)
    return sorted(cm["metadata"]["name"] for cm in configmaps if cm["metadata"]["name"] not in keep)


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def volume_name(prefix: str, name: str) -> str:
    """A pod volume's name (a DNS label: at most 63 of `[-a-z0-9]`) for the claim or Secret `name`: `<prefix>-<name>`
    when that is one, else what fits of the name with a hash of all of it, `<prefix>-<name, dots as dashes>-<hash>`.
    A claim or Secret may be named as a DNS subdomain (with dots, up to 253 characters), which no volume may be."""
    plain = f"{prefix}-{name}"
    if len(plain) <= 63 and _DNS_LABEL.fullmatch(name):
        return plain
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9]+", "-", name.lower())[: 63 - len(prefix) - len(digest) - 2].strip("-")
    return "-".join(p for p in (prefix, stem, digest) if p)


def _uri_args(repository: Repository) -> tuple[list[str], Objects, Objects, Objects]:
    """fetch arguments, extra volumes, mounts and env for the models in the closure whose source is a uri."""
    args: list[str] = []
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    env: list[dict[str, Any]] = []
    # Every model's versions first, then every model's own files (a stable sort): the order the arguments have
    # always had, so that a model's pod template does not change with this code.
    fetched = sorted((pair for r in repository.models for pair in r.model.uri_sources),
                     key=lambda pair: isinstance(pair[1], ModelFiles))
    for key, src in fetched:
        assert src.uri is not None
        args += ["--uri", f"{key}={src.uri}"]
        if src.sha256 is not None:
            args += ["--sha256", f"{key}={src.sha256}"]
        if src.object_version is not None:
            args += ["--object-version", f"{key}={src.object_version}"]
        if src.uri.startswith("pvc://"):
            claim = pvc_claim(src.uri)
            vol = volume_name("pvc", claim)
            if not any(v["name"] == vol for v in volumes):
                volumes.append({"name": vol, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
                mounts.append({"name": vol, "mountPath": f"/sources/pvc/{claim}", "readOnly": True})
        if src.credentials_secret:
            secret = src.credentials_secret
            if src.uri.startswith("s3://"):
                for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION"):
                    entry = {"name": var, "valueFrom": {"secretKeyRef": {
                        "name": secret, "key": var, "optional": var not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}}}
                    if entry not in env:  # (several versions fetched with one Secret)
                        env.append(entry)
            elif src.uri.startswith("gs://"):
                vol = volume_name("gcs", secret)
                if not any(v["name"] == vol for v in volumes):
                    volumes.append({"name": vol, "secret": {"secretName": secret}})
                    mounts.append({"name": vol, "mountPath": "/var/run/secrets/gcs", "readOnly": True})
                gac = {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/run/secrets/gcs/key.json"}
                if gac not in env:
                    env.append(gac)
    return args, volumes, mounts, env


def _server_args(model: TritonModel, repository: Repository, options: Options) -> list[str]:
    closure = [r.model for r in repository.models]
    cached = [quantity_bytes(m.spec.server.cache_size) for m in closure if m.spec.response_cache]
    return triton_args(model.spec.server, options, load_model=model.triton_name, strict_readiness=True,
                       cache_bytes=max(cached) if cached else None)


def replica_gpus(model: TritonModel, repository: Repository) -> int:
    """`nvidia.com/gpu` per replica: `server.gpus`, or the most any model the replica loads needs."""
    if model.spec.server.gpus is not None:
        return model.spec.server.gpus
    return max(r.model.spec.gpus_needed for r in repository.models)


@dataclass(frozen=True)
class _Fetch:
    """What the `fetch` init step brings into a replica: its arguments for the uri sources, and the volumes, mounts
    and env those need (`_uri_args`). None of it without a uri source: then there is no fetch step."""

    args: list[str]
    volumes: Objects
    mounts: Objects
    env: Objects

    @property
    def needed(self) -> bool:
        # The `fetch` init step assembles the repository when some of it is not in the ConfigMap: a uri source (a
        # custom batching library in the repository is one too: inline files are text). Otherwise tritonserver reads
        # the ConfigMap volume itself, with no init container, so the kubelet starts tritonserver in the pod's first
        # sync instead of after the relist (every 1 s) that notices fetch's exit (issue 17). Triton follows the
        # volume's symbolic links, and its `..data` entries are no model it is told to load (explicit mode,
        # --load-model).
        return bool(self.args)


def _triton_container(model: TritonModel, repository: Repository, key_secret: str, fetch: _Fetch,
                      options: Options) -> dict[str, Any]:
    """The `tritonserver` container, with its probes: the gate's (held by the `probe` container), or Triton's own."""
    server = model.spec.server
    probes = gated_probes(server, options) if model.spec.warmup_gate.enabled else own_probes(server, options)
    # The repository: the `fetch` step's copy, or the ConfigMap itself when there is nothing to fetch.
    return triton_container(server, _server_args(model, repository, options), key_secret,
                            MODELS_VOLUME if fetch.needed else REPOSITORY_VOLUME, replica_gpus(model, repository),
                            probes, options)


def _fetch_container(server: Server, fetch: _Fetch, options: Options) -> dict[str, Any]:
    """The `fetch` init container: it copies the ConfigMap's files and downloads the uri sources into `models`."""
    container: dict[str, Any] = {
        "name": FETCH_CONTAINER,
        "image": options.operator_image,
        # The caps fetch enforces itself, within the volume's sizeLimit (validation refuses a larger maxBytes).
        "args": ["fetch", "--from", CONFIG_DIR, "--to", REPO_DIR, "--max-bytes", str(server.fetch_max_bytes),
                 "--max-files", str(server.fetch.max_files), "--timeout", str(server.fetch.timeout_seconds), *fetch.args],
        "volumeMounts": [
            {"name": REPOSITORY_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": MODELS_VOLUME, "mountPath": REPO_DIR},
            *fetch.mounts,
        ],
        "resources": json.loads(json.dumps(FETCH_RESOURCES)),
        "securityContext": sidecar_security(),
        # Its failure (`error: fetch failed: ...`, also written to the termination message file) reaches the pod's
        # status, and from there the TritonModel's (Degraded, SourceFetchFailed); a crash's last log lines too.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # tritonserver's server.env and envFrom too (ambient credentials reach fetch), in a copy of its own: the two
    # containers share no object.
    env = user_env(server)
    if fetch.env or "env" in env:
        container["env"] = [*fetch.env, *env.get("env", ())]
    if "envFrom" in env:
        container["envFrom"] = env["envFrom"]
    return container


def _probe_container(model: TritonModel, repository: Repository, key_secret: str, options: Options) -> dict[str, Any]:
    """The `probe` container of a gated replica: it holds the kubelet's readiness probe of tritonserver (see
    `render.pod.gated_probes`), and checks that every model the replica serves can serve (its statistics; with the
    Python backend, its stubs): a break fails the held probe at once, and the operator heals the replica (issue 33;
    see triton_operator.agent.probe)."""
    served = [model.triton_name, *(r.model.triton_name for r in repository.steps)]
    return probe_container(served, model.spec.warmup_gate.failed_request_threshold, key_secret, options)


def _pod_spec(model: TritonModel, repository: Repository, triton: dict[str, Any], fetch: _Fetch, key_secret: str,
              options: Options) -> dict[str, Any]:
    """The replica's pod spec around the tritonserver container: the fetch step, the probe beside it (gated), the
    volumes, the pod's security context, its grace period and spec.server's placement."""
    server = model.spec.server
    items = [{"key": configmap_key(p), "path": p} for p in repository.files]
    pod_spec: dict[str, Any] = {
        **({"initContainers": [_fetch_container(server, fetch, options)]} if fetch.needed else {}),
        "containers": [triton],
        "volumes": [
            {"name": REPOSITORY_VOLUME, "configMap": {"name": repository_name(model, repository), "items": items}},
            *([models_volume(server)] if fetch.needed else []),
            tmp_volume(server),
            shm_volume(server),
            *fetch.volumes,
        ],
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": termination_grace_period(triton["args"], options),
        **pod_settings(server, selector(model)),
    }
    if model.spec.warmup_gate.enabled:
        pod_spec["readinessGates"] = [{"conditionType": WARMED_CONDITION}]
        # The probe sees the Python backend's stubs in the pod's shared process namespace.
        if any(r.model.spec.backend == "python" for r in repository.models):
            pod_spec["shareProcessNamespace"] = True
        pod_spec["containers"].append(_probe_container(model, repository, key_secret, options))
    pod_spec.update(placement(server, replica_gpus(model, repository)))
    return pod_spec


def _pod_annotations(model: TritonModel, repository: Repository, pod_spec: Mapping[str, Any]) -> dict[str, str]:
    """The pod template's annotations, but the pod digest: what the gate and the reloads read of a replica."""
    server = model.spec.server
    annotations = {
        **(server.pod_annotations or {}),  # validation keeps them off the operator's own keys
        ANNOTATION_DIGEST: repository.own.digest,
        ANNOTATION_TRITON_NAME: model.triton_name,
        ANNOTATION_POLL_MS: str(model.spec.warmup_gate.poll_interval_milliseconds),
    }
    steps = [r.model.triton_name for r in repository.steps]
    if steps:
        annotations[ANNOTATION_STEPS] = ",".join(steps)
    if len(pod_spec["containers"]) > 1:
        # `kubectl logs` and `kubectl exec` without -c pick tritonserver, not the `probe` beside it.
        annotations["kubectl.kubernetes.io/default-container"] = pod_spec["containers"][0]["name"]
    versions = versions_annotation([r.model for r in repository.models])
    if versions:
        annotations[ANNOTATION_VERSIONS] = versions
    return annotations


def render_deployment(
    model: TritonModel,
    rendered: Mapping[str, RenderedModel],
    uid: str,
    namespace: str,
    options: Options = Options(),
    repository: Repository | None = None,
) -> dict[str, Any]:
    """The model's Deployment. `repository`: the one `rendered` holds for the model, when the caller has it."""
    if repository is None:
        repository = Repository.of(model.name, rendered)
    fetch = _Fetch(*_uri_args(repository))
    key_secret = key_secret_name(model, uid, namespace, options)
    triton = _triton_container(model, repository, key_secret, fetch, options)
    pod_spec = _pod_spec(model, repository, triton, fetch, key_secret, options)
    annotations = _pod_annotations(model, repository, pod_spec)
    pod_labels = {**(model.spec.server.pod_labels or {}), **labels(model)}
    annotations[ANNOTATION_POD_DIGEST] = pod_digest(model, repository, annotations, pod_spec, pod_labels)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(model, model.name, uid, namespace),
        "spec": {
            "replicas": model.spec.replicas,
            "selector": {"matchLabels": selector(model)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": pod_spec},
        },
    }


def pod_digest(model: TritonModel, repository: Repository, annotations: Mapping[str, str],
               pod_spec: Mapping[str, Any], pod_labels: Mapping[str, str]) -> str:
    """A digest of everything a replica is made of except the model's own config: the pod spec, labels and
    annotations without the config digest and the repository ConfigMap's name, and every repository file but the
    model's own config.pbtxt. Two renders with equal pod digests differ at most in that config, which Triton can
    load into a running server (`plan.rollout`); any other change of the template (server.podLabels too) makes new
    pods."""
    own_config = f"{model.triton_name}/config.pbtxt"
    spec = json.loads(json.dumps(pod_spec))
    for v in spec.get("volumes") or ():
        if v.get("name") == REPOSITORY_VOLUME:
            v["configMap"]["name"] = ""
    h = hashlib.sha256(json.dumps(
        [spec, {k: v for k, v in annotations.items() if k not in (ANNOTATION_DIGEST, ANNOTATION_POD_DIGEST)},
         dict(pod_labels)], sort_keys=True).encode())
    for path, content in repository.files.items():
        if path != own_config:
            h.update(b"\0" + path.encode() + b"\0" + hashlib.sha256(content).digest())
    return h.hexdigest()[:16]


def render_service(model: TritonModel, uid: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(model, model.name, uid, namespace),
        "spec": {
            "selector": selector(model),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
            **session_affinity(model),
        },
    }


def render_pdb(model: TritonModel, uid: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(model, model.name, uid, namespace),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(model)}},
    }


def render_hpa(model: TritonModel, uid: str, namespace: str) -> dict[str, Any]:
    """The HorizontalPodAutoscaler of spec.autoscaling: it scales the TritonModel (its scale subresource) on an
    Object metric of the TritonModel itself, which the operator serves (custom.metrics.k8s.io)."""
    a = model.spec.autoscaling
    assert a is not None
    metric = hpa_metric(a.target)
    ref = {"apiVersion": API_VERSION, "kind": KIND, "name": model.name}
    target = {"type": metric.target_type, "value" if metric.target_type == "Value" else "averageValue": metric.value}
    spec: dict[str, Any] = {
        "scaleTargetRef": ref,
        "minReplicas": a.min_replicas,
        "maxReplicas": a.max_replicas,
        "metrics": [{"type": "Object", "object": {
            "describedObject": ref, "metric": {"name": metric.name}, "target": target}}],
    }
    if a.behavior is not None:
        spec["behavior"] = a.behavior
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(model, model.name, uid, namespace),
        "spec": spec,
    }


def render_children(
    model: TritonModel,
    rendered: Mapping[str, RenderedModel],
    uid: str,
    namespace: str,
    options: Options = Options(),
) -> list[dict[str, Any]]:
    """Every child, in apply order (the ConfigMap before the Deployment that mounts it)."""
    repository = Repository.of(model.name, rendered)
    children = [
        render_configmap(model, repository, uid, namespace),
        render_deployment(model, rendered, uid, namespace, options, repository),
        render_service(model, uid, namespace),
    ]
    if model.spec.replicas > 1:
        children.append(render_pdb(model, uid, namespace))
    if model.spec.autoscaling is not None:
        children.append(render_hpa(model, uid, namespace))
    return children

