"""The one table of the Kubernetes kinds the operator reads and writes.

It drives the watches (`controller.operator`), the resync LISTs (`controller.reconcile`), the REST paths
(`platform.kube`) and the labels the children carry (`render.kubernetes`): a kind is added here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .pool import ENDPOINTSLICE_MANAGER, LABEL_POOL, POOL_KIND, POOL_PLURAL
from .v1alpha1 import GROUP, PLURAL, VERSION

#: The label every child and every replica carries: which TritonModel it belongs to.
LABEL_MODEL = f"{GROUP}/model"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
#: `LABEL_MANAGED_BY`'s value on every child the operator applies.
MANAGED_BY = "triton-operator"
#: The labels that mark a child as the operator's (kopf's `labels=` filter of the children's watches).
OWNED: Mapping[str, str] = MappingProxyType({LABEL_MANAGED_BY: MANAGED_BY})
#: The same as a label selector: the children's watches and resync LISTs.
OWNED_SELECTOR = ",".join(f"{k}={v}" for k, v in OWNED.items())


@dataclass(frozen=True)
class Kind:
    """A namespaced kind: its REST coordinates and how the operator selects the objects it cares about."""

    kind: str
    group: str  # "" for the core group
    version: str
    plural: str
    selector: str | None = None  # label selector of its watch and resync LIST; None: every object

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        """The REST path prefix: /api/v1 or /apis/<group>/<version>."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


TRITON_MODEL = Kind("TritonModel", GROUP, VERSION, PLURAL)
CONFIG_MAP = Kind("ConfigMap", "", "v1", "configmaps", OWNED_SELECTOR)
DEPLOYMENT = Kind("Deployment", "apps", "v1", "deployments", OWNED_SELECTOR)
SERVICE = Kind("Service", "", "v1", "services", OWNED_SELECTOR)
PDB = Kind("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", OWNED_SELECTOR)
HPA = Kind("HorizontalPodAutoscaler", "autoscaling", "v2", "horizontalpodautoscalers", OWNED_SELECTOR)
POD = Kind("Pod", "", "v1", "pods", LABEL_MODEL)  # the replicas: the Deployment's, labelled with their model
REPLICA_SET = Kind("ReplicaSet", "apps", "v1", "replicasets")  # read (repository garbage collection), not watched
EVENT = Kind("Event", "", "v1", "events")  # written only
#: Each model's repository key (`render.repository_key`): created only; the operator never reads a Secret.
SECRET = Kind("Secret", "", "v1", "secrets")
LEASE = Kind("Lease", "coordination.k8s.io", "v1", "leases")  # leader election, in the operator's own namespace

TRITON_POOL = Kind(POOL_KIND, GROUP, VERSION, POOL_PLURAL)
#: A pool's replicas, labelled with their pool (not with a model): watched for the pool's reconcile, listed live by it.
POOL_POD = Kind("Pod", "", "v1", "pods", LABEL_POOL)
#: A pooled model's EndpointSlices, written by the operator (`render.pool.render_endpoint_slices`).
ENDPOINT_SLICE = Kind("EndpointSlice", "discovery.k8s.io", "v1", "endpointslices",
                      f"endpointslice.kubernetes.io/managed-by={ENDPOINTSLICE_MANAGER}")
#: The Endpoints Kubernetes wrote for a model's Service while it had a selector: read and deleted once the model is on
#: a pool (`controller.pool`), never written.
ENDPOINTS = Kind("Endpoints", "", "v1", "endpoints")
#: The children a reconcile applies, owner-referenced to their TritonModel and labelled `OWNED`.
CHILDREN: tuple[Kind, ...] = (CONFIG_MAP, DEPLOYMENT, SERVICE, PDB, HPA)
#: What the operator watches (and the drift round re-lists): the models, their children and their replicas.
WATCHED: tuple[Kind, ...] = (TRITON_MODEL, *CHILDREN, POD)
#: Every kind the operator's client addresses.
ALL: tuple[Kind, ...] = (*WATCHED, REPLICA_SET, EVENT, LEASE, SECRET, TRITON_POOL, ENDPOINT_SLICE, ENDPOINTS)

_BY_API_VERSION = {(k.api_version, k.kind): k for k in ALL}


def kind_of(api_version: str, kind: str) -> Kind:
    """The table's entry for an apiVersion and kind (KeyError for a kind the operator never addresses)."""
    return _BY_API_VERSION[(api_version, kind)]
