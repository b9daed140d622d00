"""The replica pod contract: what the renderer writes on a replica's pod, and what the planner, the gate, reloads,
heals, the custom metrics API and the CLI read back from it. Names only, and the parsers of the annotations that
need one; no rendering, no decisions.

- annotations (`ANNOTATION_*`): the config digest a pod was created for and the one its Triton loaded, the Triton
  model and its ensemble steps and versions that the gate checks, its poll interval, and the in-place reload's
  instructions and outcome (`plan.rollout`);
- the readiness-gate condition type (`WARMED_CONDITION`) and the model-config parameter that carries a rendered
  repository's digest into Triton (`DIGEST_PARAMETER`), which the gate compares with `ANNOTATION_DIGEST`;
- the containers (`TRITON_CONTAINER`, `FETCH_CONTAINER`, `PROBE_CONTAINER`, `FETCH_SERVER_CONTAINER`) and the volume
  that mounts the repository ConfigMap (`REPOSITORY_VOLUME`);
- the contract with the programs that run in the pod (`triton_operator.agent`): their ports (`PROBE_PORT`,
  `FETCH_SERVER_PORT`) and tritonserver's, the replica key's variable and header (`REPOSITORY_KEY_ENV`,
  `KEY_HEADER`), the probe's paths and the words its `/status` says a model is missing with (`NOT_LOADED`), and the
  fetch-server's paths. The renderer writes the containers' ports and args from them, the `triton-operator` command
  takes its defaults from them, and the operator's clients (`triton.probe`, `triton.fetcher`) call them.

Standard library only, and nothing of `api` at run time but the group (`api.GROUP`): the probe and the fetch step read
this contract and start without pydantic (tests/test_agent.py).

The label that ties a replica to its TritonModel (`LABEL_MODEL`) is not here: every child carries it, and the table
of kinds selects by it (`api.kinds`).

Where the warm-up gate lives, by part (each module's docstring says more):

- the pod: `render.kubernetes` writes the readiness gate (`WARMED_CONDITION` in `readinessGates`), these
  annotations, and the `probe` container that holds the kubelet's readiness probe;
- the calls to the replica: `triton.replica` asks Triton whether it serves the desired config, `agent.probe` is
  the probe container's server (its `/status` says what is broken), and `triton.probe` the operator's client of it
  (`probe_status`, and `notify_gate`, which tells it the gate is set);
- the verdicts, pure: `plan.readiness` (which condition a pod should carry for Triton's answer), `plan.status`
  (what the gate's conditions mean for the model's status);
- the loop, and what it does about a replica: `controller.gate` (one task per pod, the condition writes),
  `controller.heal` (reloading broken models, or deleting the pod), `controller.reload` (in-place reloads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import GROUP

if TYPE_CHECKING:
    from .v1alpha1 import TritonModel

ANNOTATION_DIGEST = f"{GROUP}/config-digest"
ANNOTATION_TRITON_NAME = f"{GROUP}/triton-model"
ANNOTATION_STEPS = f"{GROUP}/triton-steps"
ANNOTATION_POLL_MS = f"{GROUP}/poll-interval-ms"
#: The versions the gate checks, for the models (own and steps) that serve more than version 1 alone:
#: `name=1,2;step=3` (Triton names hold no `=`, `;` or `,`). A model not named serves version 1.
ANNOTATION_VERSIONS = f"{GROUP}/triton-versions"
#: What a pod template holds apart from the model's own config: equal digests, and a change can be loaded in place.
ANNOTATION_POD_DIGEST = f"{GROUP}/pod-digest"
# In-place reloads (`plan.rollout`), on pods only, written by the operator; the gate reads them:
#: swap: the digest the replica served before, approved too while the new one loads beside it
ANNOTATION_PREVIOUS = f"{GROUP}/config-digest-previous"
#: `Swap` or `Drain`: the replica is to load ANNOTATION_DIGEST's config, found in ANNOTATION_RELOAD_FROM
ANNOTATION_RELOAD = f"{GROUP}/reload"
#: the repository ConfigMap (named by content, immutable) whose config.pbtxt the reload loads
ANNOTATION_RELOAD_FROM = f"{GROUP}/reload-from"
#: Drain: the longest wait for the replica's requests to stop, in seconds
ANNOTATION_DRAIN_SECONDS = f"{GROUP}/drain-timeout-seconds"
#: a digest whose load failed on this replica, and Triton's message: the rollout stops there
ANNOTATION_RELOAD_FAILED = f"{GROUP}/reload-failed"
ANNOTATION_RELOAD_MESSAGE = f"{GROUP}/reload-failed-message"
#: written by the gate: the digest of the config the replica's Triton said it has loaded
ANNOTATION_LOADED = f"{GROUP}/loaded-config-digest"

#: Pod readiness-gate condition the operator sets once a replica has loaded the desired config and warmed up.
WARMED_CONDITION = f"{GROUP}/warmed"
#: `parameters` key carrying the digest of the rendered model repository.
DIGEST_PARAMETER = "triton-operator.config-digest"
#: `parameters` key carrying a pooled model's warmupGate.failedRequestThreshold, rendered only when it is not the pool
#: probe's default (other models' configs, and so their digests, stay as they were); the pool replica's probe
#: (`--every-model`) reads it from the config Triton loaded (`agent.confirm`).
THRESHOLD_PARAMETER = "triton-operator.failed-request-threshold"

TRITON_CONTAINER = "tritonserver"
FETCH_CONTAINER = "fetch"
PROBE_CONTAINER = "probe"
#: A pool replica's sidecar that fetches uri models into its repository volume on the operator's request.
FETCH_SERVER_CONTAINER = "fetch-server"
#: The pod volume of the repository ConfigMap (the one a pod template mounts: `repository_of`).
REPOSITORY_VOLUME = "repository"

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
#: The `probe` container's port (gated replicas, pool replicas): the kubelet's readiness probe, which it long-polls
#: tritonserver's HTTP port for, and the operator's calls (`agent.probe`).
PROBE_PORT = 8090
#: A pool replica's `fetch-server` sidecar (`agent.fetch_server`).
FETCH_SERVER_PORT = 8091

#: The variable, in tritonserver and in the probe and fetch-server containers, that holds the replica's repository key
#: (from the model's or the pool's Secret: `render.repository_key`).
REPOSITORY_KEY_ENV = "TRITON_OPERATOR_REPOSITORY_KEY"
#: The header the operator sends that key in: to tritonserver's restricted APIs (`render.repository_key`), to the
#: probe's STATUS_PATH and GATE_PATH, and to the fetch-server. A client without it is refused.
KEY_HEADER = "triton-operator-key"

# The probe's paths (`agent.probe`; the operator's client: `triton.probe`).
#: The kubelet's readiness probe: keyless, held while tritonserver is not up.
READY_PATH = "/ready"
#: What the probe found broken (JSON, held with `?since=N&wait=S`; with the key).
STATUS_PATH = "/status"
#: Where the operator tells the probe that it has set the readiness gate (POST; with the key).
GATE_PATH = "/gate"
#: How STATUS_PATH says a model is missing from Triton's statistics (not loaded, or not yet again after a reload):
#: the end of its reason, which the gate tells from a break.
NOT_LOADED = "is not loaded (Triton has no statistics for it)"

# The fetch-server's API (`agent.fetch_server`; the operator's client: `triton.fetcher`), every call with the key.
#: GET: what the volume holds; `<FETCH_MODELS_PATH>/<model>`: PUT (fetch a digest) and DELETE (remove its files).
FETCH_MODELS_PATH = "/v1/models"
#: POST `<FETCH_MODELS_PATH>/<model>/<FETCH_PRUNE>`: remove every digest of the model but the linked one.
FETCH_PRUNE = "prune"


def versions_annotation(models: list[TritonModel]) -> str:
    """ANNOTATION_VERSIONS for the models one replica loads: each that serves other than version 1 alone."""
    served = {m.triton_name: m.spec.served_versions for m in models}
    return ";".join(f"{name}={','.join(map(str, v))}" for name, v in sorted(served.items()) if v and v != [1])


def steps_of(annotations: Mapping[str, str] | None) -> tuple[str, ...]:
    """The Triton names of a replica's ensemble steps (ANNOTATION_STEPS), in the order the gate checks them."""
    return tuple(s for s in ((annotations or {}).get(ANNOTATION_STEPS) or "").split(",") if s)


def parse_versions_annotation(text: str | None) -> dict[str, tuple[int, ...]]:
    """The inverse of `versions_annotation`; malformed entries are skipped (the gate then checks the latest)."""
    out: dict[str, tuple[int, ...]] = {}
    for entry in (text or "").split(";"):
        name, _, nums = entry.partition("=")
        parts = [n for n in nums.split(",") if n.isdigit()]
        if name and parts:
            out[name] = tuple(int(n) for n in parts)
    return out


def config_digest(config: Any) -> str | None:
    """The rendered repository's digest a model config carries (DIGEST_PARAMETER), or None: `config` is a
    ModelConfig message, as Triton returns it or as parsed from a rendered config.pbtxt."""
    param = config.parameters.get(DIGEST_PARAMETER)
    return param.string_value if param is not None and param.string_value else None


def repository_of(template: Mapping[str, Any]) -> str | None:
    """The repository ConfigMap a pod template mounts."""
    for v in (template.get("spec") or {}).get("volumes") or ():
        if v.get("name") == REPOSITORY_VOLUME and "configMap" in v:
            return str(v["configMap"].get("name"))
    return None
