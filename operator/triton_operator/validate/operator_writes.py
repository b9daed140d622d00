"""Whether a Deployment or an EndpointSlice the operator's own ServiceAccount writes is one the operator would write. Pure.

The chart's ValidatingAdmissionPolicy `<release>-operator-writes` keeps the operator's token to objects labelled as
its own, with the pod security it renders and its images. What CEL cannot check is what needs another object: which
ServiceAccount, token, Secrets and claims a replica may use, which tritonserver image it may run, and which Service an
EndpointSlice may feed. A leaked operator token could otherwise run a pod as any ServiceAccount of a served namespace
(with its token and its cloud identity), mount any of its Secrets or claims, or add endpoints to any Service there.
The chart sends such writes (only the operator's: a matchCondition on the username) to the operator's webhook
(`servers/webhook.py`, path `OPERATOR_WRITES_PATH`), which reads the owner and decides here:

- a Deployment is controlled by a TritonModel or a TritonPool (its uid the stored one's) and named as the operator
  names that owner's Deployment; its pods run as the owner's spec.server.serviceAccountName, mount a token only when
  spec.server.automountServiceAccountToken says so, and reference only the Secrets and claims the
  owner's spec names (spec.server's env, envFrom and imagePullSecrets, the sources' credentialsSecret and pvc://
  claims of the model and of every ensemble step it carries) and the owner's repository key Secret; volumes only of
  the kinds the operator renders (configMap, emptyDir, secret, persistentVolumeClaim); tritonserver runs
  spec.server.image, or the operator's default when that is unset;
- an EndpointSlice names a Service that a pooled TritonModel controls (the same uid as the slice's owner).

`refusal` and `slice_refusal` return None for a write the operator would make, else why not (one line).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api.pod import TRITON_CONTAINER
from ..api.pool import TritonPool
from ..api.v1alpha1 import Server, TritonModel
from ..uris import pvc_claim

#: Where the operator's webhook answers these reviews (the chart's second webhook).
OPERATOR_WRITES_PATH = "/validate-operator-writes"
#: The volume kinds the operator renders in a replica's pod.
VOLUME_KINDS = frozenset({"configMap", "emptyDir", "secret", "persistentVolumeClaim"})
#: Fields of a volume that are no kind of it.
_VOLUME_FIELDS = frozenset({"name"})


@dataclass(frozen=True)
class Grants:
    """What the pods of one owner's Deployment may use, from the owner's spec."""

    owner: str  # "TritonModel/name" or "TritonPool/name", for messages
    deployment: str  # the Deployment's name the operator gives
    service_account: str | None  # None: the namespace's `default`
    automount: bool
    secrets: frozenset[str]
    claims: frozenset[str]
    triton_image: str


def _server_secrets(server: Server) -> set[str]:
    names = {s.name for s in server.image_pull_secrets or ()}
    names |= {v.value_from.secret_key_ref.name for v in server.env or ()
              if v.value_from is not None and v.value_from.secret_key_ref is not None}
    names |= {e.secret_ref.name for e in server.env_from or () if e.secret_ref is not None}
    return names


def _source_refs(models: Iterable[TritonModel]) -> tuple[set[str], set[str]]:
    """The credentialsSecrets and pvc:// claims of every source of `models` (versions, source, modelFiles)."""
    secrets: set[str] = set()
    claims: set[str] = set()
    for m in models:
        for _, src in m.uri_sources:  # as the renderer reads them (`render.kubernetes`)
            if src.credentials_secret:
                secrets.add(src.credentials_secret)
            if src.uri is not None and src.uri.startswith("pvc://"):
                claims.add(pvc_claim(src.uri))
    return secrets, claims


def model_grants(model: TritonModel, steps: Iterable[TritonModel], key_secret: str, default_image: str) -> Grants:
    """A TritonModel's Deployment: `steps`, the models its repository carries besides it (its ensemble's steps, all
    the way down); `key_secret`, its repository key Secret's name."""
    server = model.spec.server
    secrets, claims = _source_refs([model, *steps])
    return Grants(f"TritonModel/{model.name}", model.name, server.service_account_name,
                  server.automount_service_account_token, frozenset(secrets | _server_secrets(server) | {key_secret}),
                  frozenset(claims), server.image or default_image)


def pool_grants(pool: TritonPool, deployment: str, key_secret: str, default_image: str) -> Grants:
    """A TritonPool's Deployment (named `deployment`): its server's settings; its models come through the sidecar."""
    server = pool.spec.server
    return Grants(f"TritonPool/{pool.name}", deployment, server.service_account_name,
                  server.automount_service_account_token, frozenset(_server_secrets(server) | {key_secret}),
                  frozenset(), server.image or default_image)


def controller_of(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The object's controller owner reference, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return dict(ref)
    return None


@dataclass(frozen=True)
class PodRefs:
    """What a pod spec uses that a leaked token could abuse."""

    service_account: str | None
    automount: bool | None
    secrets: frozenset[str]
    claims: frozenset[str]
    volume_kinds: frozenset[str]
    triton_images: tuple[str, ...]


def pod_refs(spec: Mapping[str, Any]) -> PodRefs:
    secrets: set[str] = {str(s.get("name")) for s in spec.get("imagePullSecrets") or () if isinstance(s, Mapping)}
    claims: set[str] = set()
    kinds: set[str] = set()
    for vol in spec.get("volumes") or ():
        kinds |= {k for k in vol if k not in _VOLUME_FIELDS}
        if "secret" in vol:
            secrets.add(str((vol["secret"] or {}).get("secretName")))
        if "persistentVolumeClaim" in vol:
            claims.add(str((vol["persistentVolumeClaim"] or {}).get("claimName")))
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ()),
                  *(spec.get("ephemeralContainers") or ())]
    for c in containers:
        for var in c.get("env") or ():
            ref = (var.get("valueFrom") or {})
            if "secretKeyRef" in ref:
                secrets.add(str((ref["secretKeyRef"] or {}).get("name")))
        for source in c.get("envFrom") or ():
            if "secretRef" in source:
                secrets.add(str((source["secretRef"] or {}).get("name")))
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or None
    automount = spec.get("automountServiceAccountToken")
    images = tuple(str(c.get("image")) for c in spec.get("containers") or () if c.get("name") == TRITON_CONTAINER)
    return PodRefs(account, automount if isinstance(automount, bool) else None, frozenset(secrets),
                   frozenset(claims), frozenset(kinds), images)


def _names(values: Iterable[str]) -> str:
    return ", ".join(sorted(values))


def refusal(deployment: Mapping[str, Any], grants: Grants) -> str | None:
    """Why the operator would not write `deployment` for the owner `grants` describes; None when it would."""
    name = (deployment.get("metadata") or {}).get("name")
    where = f"Deployment {name} of {grants.owner}"
    if name != grants.deployment:
        return f"{grants.owner}'s Deployment is named {grants.deployment}, not {name}"
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    refs = pod_refs(spec)
    if (refs.service_account or "default") != (grants.service_account or "default"):
        return (f"{where} runs as ServiceAccount {refs.service_account or 'default'}; its spec.server."
                f"serviceAccountName is {grants.service_account or 'unset (default)'}")
    if refs.automount is not False and not grants.automount:
        return f"{where} mounts a ServiceAccount token; its spec.server.automountServiceAccountToken is false"
    if kinds := refs.volume_kinds - VOLUME_KINDS:
        return f"{where} has volumes of a kind the operator does not render: {_names(kinds)}"
    if extra := refs.secrets - grants.secrets:
        return f"{where} uses Secrets its spec does not name: {_names(extra)}"
    if extra := refs.claims - grants.claims:
        return f"{where} mounts PersistentVolumeClaims its spec does not name: {_names(extra)}"
    if refs.triton_images != (grants.triton_image,):
        return (f"{where} runs tritonserver image {_names(refs.triton_images) or '(none)'}; its spec.server.image "
                f"(or the operator's --default-triton-image) is {grants.triton_image}")
    return None


def slice_refusal(endpoint_slice: Mapping[str, Any], model: Mapping[str, Any] | None,
                  service: Mapping[str, Any] | None) -> str | None:
    """Why the operator would not write `endpoint_slice` (a pooled model's), given the TritonModel its controller
    reference names and the Service it feeds, as stored (None: not there)."""
    name = (endpoint_slice.get("metadata") or {}).get("name")
    labels = (endpoint_slice.get("metadata") or {}).get("labels") or {}
    service_name = labels.get("kubernetes.io/service-name")
    owner = controller_of(endpoint_slice)
    if owner is None or owner.get("kind") != "TritonModel":
        return f"EndpointSlice {name} has no TritonModel as its controller"
    if model is None or (model.get("metadata") or {}).get("uid") != owner.get("uid"):
        return f"EndpointSlice {name}'s controller, TritonModel {owner.get('name')} (uid {owner.get('uid')}), is not there"
    if not ((model.get("spec") or {}).get("pool")):
        return f"EndpointSlice {name}: TritonModel {owner.get('name')} is on no pool (its own Service selects its pods)"
    if service is None:
        return f"EndpointSlice {name} feeds Service {service_name}, which is not there"
    service_owner = controller_of(service)
    if service_owner is None or service_owner.get("uid") != owner.get("uid"):
        return (f"EndpointSlice {name} feeds Service {service_name}, which TritonModel {owner.get('name')} does not "
                "control")
    if (service.get("spec") or {}).get("selector"):
        return f"EndpointSlice {name} feeds Service {service_name}, which has a selector (its own endpoints)"
    return None
