"""The replica pod builder: every part of a Triton replica's pod that a TritonModel's own replicas
(`render.kubernetes`) and a TritonPool's (`render.pool`) have in common, written once.

Both kinds run the same pod around tritonserver: the same container (image, ports, the repository key and HOME in
its env, spec.server's env, security context, resources and GPUs, preStop sleep, probes), the same `probe` sidecar,
the same /dev/shm, /tmp and repository volumes, the same pod security context and grace period, and spec.server's
placement and pod settings. A hardening, a probe's timing or a new pod setting is made here, so that the two never
drift apart. What differs stays with each kind: a model's `fetch` init step, its readiness gate and annotations
(`render.kubernetes`); a pool's `fetch-server` sidecar (`render.pool`). Each kind lays out its own dicts and
calls the builders below for the parts, so that each keeps the key order it has always been rendered in (the golden
files compare objects byte for byte, tests/golden/).

`Options` are the operator-wide settings the pod is shaped by (images, probe and drain timings, repository keys).

No client, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import DEFAULT_OPERATOR_IMAGE, DEFAULT_TRITON_IMAGE
from ..api.pod import GRPC_PORT, HTTP_PORT, METRICS_PORT, PROBE_CONTAINER, PROBE_PORT, READY_PATH, TRITON_CONTAINER
from ..api.v1alpha1 import Server
from .modelconfig import REPOSITORY_ROOT
from .repository_key import RepositoryKeys, key_env, restriction_args

REPO_DIR = REPOSITORY_ROOT  # the config names files here (a custom batching strategy's)
TMP_DIR = "/tmp"  # noqa: S108 - an emptyDir of the pod's own
#: A memory-backed emptyDir sized by spec.server.shmSize: the Python backend's tensors pass through it.
SHM_DIR = "/dev/shm"  # noqa: S108 - an emptyDir of the pod's own
#: The repository tritonserver reads when something is fetched into it (a model's uri sources, a pool's models).
MODELS_VOLUME = "models"
#: The unprivileged user every container runs as (distroless' "nonroot").
RUN_AS = 65532
#: What every container gets: enough for the Pod Security Standards' "restricted" profile, which hardened
#: clusters enforce (`pod-security.kubernetes.io/enforce=restricted`). The pod adds runAsNonRoot and seccomp.
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
#: The `fetch` init container's resources. It streams every download in 1 MiB chunks, so its memory does not grow
#: with the model: peak RSS measured at 24 MiB for a 400 MiB https:// file, 51 MiB for a 200 MiB s3:// object
#: (boto3) and 57 MiB for a 200 MiB gs:// one (google-cloud-storage). No ephemeral-storage limit: what it writes
#: goes to the `models` emptyDir, bounded by its sizeLimit (an init container's ephemeral-storage limit would cap
#: the whole pod's usage, emptyDirs included). A pool's `fetch-server` takes its limits.
FETCH_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}


@dataclass(frozen=True)
class Options:
    """Operator-wide settings that shape children."""

    operator_image: str = DEFAULT_OPERATOR_IMAGE
    # What a model or pool that names no spec.server.image runs (`run --default-triton-image`).
    default_triton_image: str = DEFAULT_TRITON_IMAGE
    # Without the gate, the kubelet's probes decide when a warmed replica turns Ready (tritonserver opens its
    # ports only once the model is loaded and warm): probe at the kubelet's shortest period.
    startup_probe_period: int = 1
    # Graceful termination. A deleted pod leaves its Service's ready endpoints at once, but clients learn it
    # later (kube-proxy's rule sync, meshes, ingress controllers): tritonserver keeps serving through a preStop
    # sleep, and only then gets SIGTERM. On SIGTERM it refuses new connections and drains: it serves the
    # connections already open and finishes in-flight requests for up to --exit-timeout-secs, then unloads.
    # The grace period covers both plus a margin, so SIGKILL never cuts a drain short.
    pre_stop_sleep_seconds: int = 5
    exit_timeout_seconds: int = 20
    termination_margin_seconds: int = 5
    # Gated replicas: the `probe` container holds the kubelet's readiness probe while tritonserver is not up (the
    # probe's timeout is 2 s more), and passes it `probe_gate_settle_seconds` after the operator tells it that the
    # gate is set, so that the kubelet syncs the gate before the probe's success; without that notice,
    # `probe_head_start_seconds` after tritonserver's HTTP port opened (see triton_operator.agent.probe).
    probe_hold_seconds: int = 8
    probe_head_start_seconds: float = 0.5
    probe_gate_settle_seconds: float = 0.03
    # Each model's repository key, derived from the operator's master key (`render.repository_key`). None (unit
    # tests, `render --objects`): the replicas are restricted all the same, and name the Secret without its digest.
    repository_keys: RepositoryKeys | None = None


def triton_args(server: Server, options: Options, *, load_model: str | None, strict_readiness: bool,
                cache_bytes: int | None) -> list[str]:
    """tritonserver's arguments: explicit model control over REPO_DIR, loading `load_model` at start (a pool's
    replicas start with none: the operator loads each placed model), no exit on a model's error, the drain's exit
    timeout, the contract's ports, the restricted APIs, a response cache of `cache_bytes`, and server.args last (a
    user's flag wins)."""
    return [
        f"--model-repository={REPO_DIR}",
        "--model-control-mode=explicit",
        *([f"--load-model={load_model}"] if load_model is not None else []),
        f"--strict-readiness={'true' if strict_readiness else 'false'}",
        "--exit-on-error=false",
        f"--exit-timeout-secs={options.exit_timeout_seconds}",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        # The repository, shared-memory, logging and trace APIs answer only the operator (`render.repository_key`).
        *restriction_args(server.unrestricted_apis),
        *([f"--cache-config=local,size={cache_bytes}"] if cache_bytes is not None else []),
        *(server.args or ()),
    ]


def exit_timeout(args: list[str], default: int) -> int:
    """tritonserver's --exit-timeout-secs in `args`: the last one wins, as in Triton's own parser."""
    value = default
    for i, arg in enumerate(args):
        if arg.startswith("--exit-timeout-secs="):
            text = arg.split("=", 1)[1]
        elif arg == "--exit-timeout-secs" and i + 1 < len(args):
            text = args[i + 1]
        else:
            continue
        if text.strip().isdigit():
            value = int(text)
    return value


def termination_grace_period(triton_args: list[str], options: Options) -> int:
    """The pod's grace period: the preStop sleep, tritonserver's drain and a margin. A user's own
    --exit-timeout-secs (in server.args, after ours) is the drain Triton will take: it makes room for it."""
    return (options.pre_stop_sleep_seconds + exit_timeout(triton_args, options.exit_timeout_seconds)
            + options.termination_margin_seconds)


@dataclass(frozen=True)
class TritonProbes:
    """The kubelet's probes of tritonserver, by container field (`livenessProbe`, ...). `lead` goes before the
    container's preStop hook and `trail` after its resources: the places a model's and a pool's replicas have always
    listed them in (the renders stay byte for byte)."""

    lead: Mapping[str, dict[str, Any]]
    trail: Mapping[str, dict[str, Any]] = field(default_factory=dict)


def _http_probe(path: str) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}}


def _liveness() -> dict[str, Any]:
    return {**_http_probe("/v2/health/live"), "periodSeconds": 10, "failureThreshold": 3}


def _held_readiness(options: Options) -> dict[str, Any]:
    """The readiness probe the `probe` sidecar holds (its timeout outlasts the hold)."""
    return {"httpGet": {"path": READY_PATH, "port": PROBE_PORT}, "periodSeconds": 1,
            "timeoutSeconds": options.probe_hold_seconds + 2, "failureThreshold": 1}


def gated_probes(server: Server, options: Options) -> TritonProbes:
    """The probes of a gated model's tritonserver: readiness held by the `probe` sidecar, liveness after the load."""
    # With the gate, the gate admits a replica; the container's own readiness only says that tritonserver is up.
    # It opens its ports only once the models it loads at start are loaded and warm (gRPC first, then HTTP), and
    # the readiness probe keeps a restarted container out until then whatever a stale gate says: after a crash,
    # the kubelet may sync the restarted container with the pod as it was before the operator turned the gate
    # False (seen in e2e/test_faults.py with no readiness probe).
    # A TCP probe would pass only on the kubelet's next tick (period 1 s, the shortest), up to a second after
    # READY. The `probe` container answers instead: it holds each probe while tritonserver's HTTP port refuses
    # connections and passes it just after the operator has set the gate, leaving the gate's pod sync a head
    # start (the kubelet runs at most one sync of a pod per PLEG relist, 1 s, and a probe's success is one; see
    # triton_operator.agent.probe). It answers at once when the port closes after a success, so one failure is news.
    # No startupProbe: its success is one more pod sync next to READY. Liveness waits out the load (kubelet
    # 1.35, issue 17).
    return TritonProbes(lead={"livenessProbe": {**_liveness(), "initialDelaySeconds": server.startup_timeout_seconds}},
                        trail={"readinessProbe": _held_readiness(options)})


def own_probes(server: Server, options: Options) -> TritonProbes:
    """The probes of an ungated model's tritonserver: Triton's own readiness, and a startup probe."""
    # Without the gate, Triton's own readiness is what admits a replica to the Service, and the startup probe
    # holds liveness off while the model loads.
    return TritonProbes(lead={"livenessProbe": _liveness()}, trail={
        "startupProbe": {
            **_http_probe("/v2/health/live"),
            "periodSeconds": options.startup_probe_period,
            "failureThreshold": max(1, server.startup_timeout_seconds // options.startup_probe_period),
        },
        "readinessProbe": {**_http_probe("/v2/health/ready"), "periodSeconds": 1, "failureThreshold": 2},
    })


def pool_probes(options: Options) -> TritonProbes:
    """The probes of a pool replica's tritonserver: the probe sidecar holds the readiness probe until tritonserver
    answers (it opens its ports at once: no model at start), and fails it at once when it stops answering."""
    return TritonProbes(lead={"readinessProbe": _held_readiness(options), "livenessProbe": _liveness()})


def user_env(server: Server) -> dict[str, Any]:
    """server.env and server.envFrom as a container's `env` and `envFrom` (for tritonserver and fetch alike), new
    objects at each call: no two containers share one."""
    out: dict[str, Any] = {}
    if server.env:
        out["env"] = [v.model_dump(by_alias=True, exclude_none=True) for v in server.env]
    if server.env_from:
        out["envFrom"] = [v.model_dump(by_alias=True, exclude_none=True) for v in server.env_from]
    return out


def triton_resources(server: Server, gpus: int) -> dict[str, Any]:
    """The tritonserver container's resources: spec.server.resources, and the replica's GPUs as a limit."""
    resources: dict[str, Any] = {}
    if server.resources is not None:
        if server.resources.requests:
            resources["requests"] = dict(server.resources.requests)
        if server.resources.limits:
            resources["limits"] = dict(server.resources.limits)
    if gpus > 0:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = str(gpus)
    return resources


def triton_container(server: Server, args: list[str], key_secret: str, repository_volume: str, gpus: int,
                     probes: TritonProbes, options: Options) -> dict[str, Any]:
    """The `tritonserver` container: `args`, its repository read-only at REPO_DIR from `repository_volume`, the
    repository key from the Secret `key_secret`, `gpus` GPUs, and `probes`."""
    env = user_env(server)
    triton: dict[str, Any] = {
        "name": TRITON_CONTAINER,
        "image": server.image or options.default_triton_image,
        "command": ["tritonserver"],
        "args": args,
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        # HOME too: NVIDIA's image has no home for this user, and libraries cache there (torch, numba). The
        # repository key before the user's variables: the args name it, and validation keeps env off its name.
        "env": [{"name": "HOME", "value": TMP_DIR}, key_env(key_secret), *env.get("env", ())],
        **({"envFrom": env["envFrom"]} if "envFrom" in env else {}),
        "volumeMounts": [
            {"name": repository_volume, "mountPath": REPO_DIR, "readOnly": True},
            # The root filesystem is read-only: the Python backend makes /tmp/python_env_* at start.
            {"name": "tmp", "mountPath": TMP_DIR},
            shm_mount(),
        ],
        "securityContext": dict(CONTAINER_SECURITY),
        **probes.lead,
        # The kubelet's own sleep: no shell, no binary in the image. On by default since Kubernetes 1.30 (stable in
        # 1.34), hence the chart's kubeVersion >=1.30.
        "lifecycle": {"preStop": {"sleep": {"seconds": options.pre_stop_sleep_seconds}}},
    }
    resources = triton_resources(server, gpus)
    if resources:
        triton["resources"] = resources
    triton.update(probes.trail)
    return triton


def sidecar_security() -> dict[str, Any]:
    """The security context of the operator's own containers beside tritonserver (fetch, probe, fetch-server)."""
    return {"runAsNonRoot": True, "runAsUser": RUN_AS, **CONTAINER_SECURITY}


def probe_container(served: Iterable[str], fail_threshold: int, key_secret: str, options: Options,
                    every_model: bool = False) -> dict[str, Any]:
    """The `probe` container watching the Triton models `served` (none: tritonserver alone; `every_model`: every
    model the replica's Triton serves, as a pool's does). It holds the replica's repository key, from the Secret
    `key_secret` as tritonserver does: its `GET /status` and `POST /gate` answer only the operator (issue 39)."""
    return {
        "name": PROBE_CONTAINER,
        "image": options.operator_image,
        "args": ["probe", "--listen", f":{PROBE_PORT}", "--target", f"127.0.0.1:{HTTP_PORT}",
                 "--hold", str(options.probe_hold_seconds), "--gate-settle", f"{options.probe_gate_settle_seconds:g}",
                 "--head-start", f"{options.probe_head_start_seconds:g}", "--repository", REPO_DIR,
                 "--fail-threshold", str(fail_threshold),
                 *(arg for name in served for arg in ("--model", name)),
                 *(["--every-model"] if every_model else [])],
        "ports": [{"name": "probe", "containerPort": PROBE_PORT, "protocol": "TCP"}],
        "env": [key_env(key_secret)],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": sidecar_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def shm_volume(server: Server) -> dict[str, Any]:
    """The shared memory volume: tmpfs, capped at shmSize."""
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": server.effective_shm_size}}


def shm_mount() -> dict[str, Any]:
    """The tritonserver container's mount of the shared memory volume at SHM_DIR."""
    return {"name": "dshm", "mountPath": SHM_DIR}


def tmp_volume(server: Server) -> dict[str, Any]:
    """The pod's /tmp (the root filesystems are read-only), capped at tmpSizeLimit."""
    return {"name": "tmp", "emptyDir": {"sizeLimit": server.tmp_size_limit}}


def models_volume(server: Server) -> dict[str, Any]:
    """The repository fetched into (MODELS_VOLUME), capped at repositorySizeLimit."""
    return {"name": MODELS_VOLUME, "emptyDir": {"sizeLimit": server.repository_size_limit}}


def pod_security_context() -> dict[str, Any]:
    """The pod's security context: every container as RUN_AS, never root, the runtime's default seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_settings(server: Server, own: Mapping[str, str]) -> dict[str, Any]:
    """The pod spec's fields that a server sets as they are: identity, pull secrets, priority, spreading. A spread
    constraint without labelSelector counts the pods `own` selects (a model's replicas, a pool's)."""
    out: dict[str, Any] = {"automountServiceAccountToken": server.automount_service_account_token}
    if server.service_account_name:
        out["serviceAccountName"] = server.service_account_name
    if server.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": s.name} for s in server.image_pull_secrets]
    if server.priority_class_name:
        out["priorityClassName"] = server.priority_class_name
    if server.topology_spread_constraints:
        out["topologySpreadConstraints"] = [
            {**c.model_dump(by_alias=True, exclude_none=True),
             "labelSelector": c.label_selector if c.label_selector is not None else {"matchLabels": dict(own)}}
            for c in server.topology_spread_constraints]
    return out


def tolerations(server: Server, gpus: int) -> list[dict[str, Any]]:
    """spec.server.tolerations, and NVIDIA's GPU taint tolerated when the replica asks for GPUs."""
    out = [t.model_dump(by_alias=True, exclude_none=True) for t in server.tolerations or ()]
    if gpus > 0 and not any(t.get("key") == "nvidia.com/gpu" for t in out):
        out.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    return out


def placement(server: Server, gpus: int) -> dict[str, Any]:
    """The pod spec's placement fields that spec.server sets (none when unset): nodeSelector, tolerations (GPU
    replicas tolerate NVIDIA's taint) and affinity."""
    out: dict[str, Any] = {}
    if server.node_selector:
        out["nodeSelector"] = dict(server.node_selector)
    tolerated = tolerations(server, gpus)
    if tolerated:
        out["tolerations"] = tolerated
    if server.affinity:
        out["affinity"] = dict(server.affinity)
    return out
