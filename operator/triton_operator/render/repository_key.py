"""The key that keeps each model's Triton repository API (load, unload, index) to the operator: what replicas are
told, the Secret that holds it, and how the operator derives it.

Why a key. Replicas run `--model-control-mode=explicit`: the repository API is how the operator loads a new config
in place (`controller.reload`) and how the gate learns why a model is not READY (`triton.replica`). Open, it lets
anyone who reaches a model's Service unload the model on every replica, or load a model of their own with `config`
and `file:` parameters, which with the Python backend runs their code inside tritonserver. So tritonserver restricts
that API, over HTTP and gRPC (`--http-restricted-api`, `--grpc-restricted-protocol`), to requests that carry the
model's key; only the operator has it, and sends it only on repository calls (`triton.rest`).

Where the key is. In a Secret per model, read by the tritonserver container as the variable REPOSITORY_KEY_ENV; its
args say `$(TRITON_OPERATOR_REPOSITORY_KEY)`, which the kubelet expands when it starts the container. So the key is in
no pod spec and no annotation: whoever may read pods or Deployments does not learn it.

Why derived. The operator needs each model's key whenever it calls a replica, and it must not read Secrets (a token
that reads Secrets reads every credential in the namespaces it serves). So it never reads the key back: each
model's key is an HMAC-SHA256, under a master key only the operator holds, of the model's namespace, name and uid.
The master key is a file (`run --repository-key-file`: the chart makes a Secret in the operator's own namespace,
kept across upgrades like the webhook's certificate, and mounts it). The RBAC on Secrets is `create` alone. A
model's key is its own: the model's code, which can read its own environment, learns neither another model's key
nor the master key. The uid makes a TritonModel deleted and created again a new key, in a Secret of a new name,
rather than one racing the garbage collection of the old.

Why named by content, immutable, created only. The Secret's name ends in a digest of the key, and it is immutable,
as the repository ConfigMaps are. The reconcile creates it before it applies the Deployment that names it, and
never updates it: a create that finds it there (409) is done. When the master key changes, every model's key and
Secret name change with it: the new Secret is created and the Deployment's template names it, so the replicas roll
to new pods that hold the new key, instead of staying up with a key the operator no longer has (in-place reloads
would fail on them, and the gate could not ask them why a model is not READY). The old Secret stays until its
TritonModel is deleted (owner reference): the operator may not delete Secrets.

Knowing that a Secret exists without reading it: the live Deployment names it (the operator created the Secret
before it applied that template, `plan.planner`). One deleted by hand shows on the replicas: a container that cannot
start because of it (`CreateContainerConfigError`, `secret "NAME" not found`) makes the reconcile create it again.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any

from ..api.pod import KEY_HEADER, REPOSITORY_KEY_ENV
from ..api.v1alpha1 import ALWAYS_RESTRICTED_API, OPENABLE_APIS

#: The key's header (`api.pod.KEY_HEADER`, the restriction's key name) in gRPC metadata: Triton 2.51 expects its
#: restricted-protocol keys under this prefix.
GRPC_KEY_HEADER = f"triton-grpc-protocol-{KEY_HEADER}"
#: The Secret's data key.
SECRET_KEY = "key"  # noqa: S105 - the name of the data key, not a key
#: The shortest master key accepted, in bytes.
MIN_MASTER_BYTES = 32
#: What the restriction covers unless a spec opens some by name (`spec.server.unrestrictedApis`): Triton's repository API
#: (load, unload, index), and its shared-memory, logging and trace APIs: nothing a client needs to infer.
RESTRICTED: tuple[str, ...] = (ALWAYS_RESTRICTED_API, *OPENABLE_APIS)


class RepositoryKeys:
    """Each model's key, derived from the master key (whose bytes never leave this object, nor show in its repr)."""

    def __init__(self, master: bytes) -> None:
        if len(master) < MIN_MASTER_BYTES:
            raise ValueError(f"the repository master key has {len(master)} bytes; at least {MIN_MASTER_BYTES} are needed")
        self._master = master

    def key(self, namespace: str, name: str, uid: str) -> str:
        """The key of the TritonModel `namespace/name` with this uid: 64 hex digits."""
        message = b"\0".join((b"triton-operator repository key v1", namespace.encode(), name.encode(), uid.encode()))
        return hmac.new(self._master, message, hashlib.sha256).hexdigest()

    @property
    def fingerprint(self) -> str:
        """A short digest of the master key, for logs: which key a process holds, not the key."""
        return hashlib.sha256(b"fingerprint\0" + self._master).hexdigest()[:12]

    def __repr__(self) -> str:
        return f"RepositoryKeys(fingerprint={self.fingerprint})"


def secret_name(model: str, key: str | None) -> str:
    """`<model>-repository-key-<digest of the key>`. Without a key (`render --objects`, which has no master key):
    `<model>-repository-key`, the name the operator's ends with its digest."""
    suffix = "-repository-key" + (f"-{hashlib.sha256(key.encode()).hexdigest()[:10]}" if key else "")
    return model[: 253 - len(suffix)].rstrip("-.") + suffix


def restricted(opened: Iterable[str] | None = None) -> tuple[str, ...]:
    """The API categories a replica restricts to its key: RESTRICTED but those `opened` (`spec.server.unrestrictedApis`;
    never the repository API)."""
    left = set(opened or ()) - {ALWAYS_RESTRICTED_API}
    return tuple(c for c in RESTRICTED if c not in left)


def restriction_args(opened: Iterable[str] | None = None) -> list[str]:
    """tritonserver's flags: the `restricted(opened)` API categories, over HTTP and gRPC, only with the key (from the
    container's env). One flag per protocol restricts them all with one key (verified on Triton 2.51: each answers
    403 over HTTP and UNAVAILABLE "This protocol is restricted" over gRPC without it).

    The key is in tritonserver's command line once the kubelet has expanded it (Triton 2.51 reads the restriction
    only from its flags: no variable or file), so `/proc/<pid>/cmdline` shows it to the processes of the pod that
    share its process namespace: the model's own code, which reads the same key in its environment anyway, and the
    operator's own containers. Nothing outside the pod sees it."""
    value = f"$({REPOSITORY_KEY_ENV})"
    categories = ",".join(restricted(opened))
    return [f"--http-restricted-api={categories}:{KEY_HEADER}={value}",
            f"--grpc-restricted-protocol={categories}:{KEY_HEADER}={value}"]


def key_env(secret: str) -> dict[str, Any]:
    """The tritonserver container's variable that holds the key, read from the model's Secret."""
    return {"name": REPOSITORY_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": SECRET_KEY}}}


def render_secret(metadata: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The model's key Secret: `metadata` (labels and owner reference of its children) with its name."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": dict(metadata),
        "type": "Opaque",
        "immutable": True,
        "stringData": {SECRET_KEY: key},
    }


def secret_missing(pod: Mapping[str, Any], secret: str) -> bool:
    """Whether the pod's tritonserver cannot start because the Secret `secret` is not there (deleted by hand)."""
    missing = f'secret "{secret}" not found'
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CreateContainerConfigError" and missing in (waiting.get("message") or ""):
            return True
    return False
