"""The TritonPool API, version v1alpha1: a fleet of shared tritonservers that pooled TritonModels are placed on, and
the single source of its CRD (`api.crd`). The design, placement and gating included: `plan.placement`.

A pool carries what a TritonModel's `spec.server` carries (the same `Server` model, described for replicas that
load many models), its replica count and the capacity the operator places models against. Its status says, replica
by replica, which models are loaded there and how much capacity is used and free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from . import steps as step_graph
from .v1alpha1 import (
    GROUP,
    INT32_MAX,
    JSON_INT_MAX,
    MODEL_NAME_RULE,
    Condition,
    ObjectMeta,
    QuantityStr,
    Server,
    TritonModel,
    _Model,
    quantity_bytes,
)

POOL_KIND = "TritonPool"
POOL_PLURAL = "tritonpools"
POOL_SINGULAR = "tritonpool"
POOL_SHORT_NAMES = ["tpool"]
#: The most replicas a pool has: a pooled model's EndpointSlice lists each replica once, and one slice holds at
#: most 1000 endpoints (so one slice per model and address family always suffices).
MAX_POOL_REPLICAS = 1000
#: The `endpointslice.kubernetes.io/managed-by` value of every EndpointSlice the operator writes for a pooled model
#: (values ending in `k8s.io` are Kubernetes' own controllers', KEP-4770).
ENDPOINTSLICE_MANAGER = f"triton-operator.{GROUP}"
#: The managers of the slices Kubernetes writes for a Service: from its selector, and mirrored from its Endpoints. A
#: pooled model's Service keeps those its selector left when the model moved onto a pool; the operator deletes them.
KUBERNETES_SLICE_MANAGERS = ("endpointslice-controller.k8s.io", "endpointslicemirroring-controller.k8s.io")
#: How Kubernetes' endpoints controller labels the Endpoints it writes from a Service's selector (the operator deletes
#: it too once the Service is a pooled model's: the mirroring controller would mirror it into a slice again).
LABEL_ENDPOINTS_MANAGED_BY, ENDPOINTS_CONTROLLER = "endpoints.kubernetes.io/managed-by", "endpoint-controller"
#: The label every pool replica and every pooled model's Service carries: the pool's name.
LABEL_POOL = f"{GROUP}/pool"
#: A pool pod template's label: a digest of the rest of its template. A pod whose label is not the Deployment's is a
#: replica of an older template, which the rollout replaces (`plan.pool.rollout`).
LABEL_POOL_TEMPLATE = f"{GROUP}/pool-template"
#: A pool pod's readiness gate: the operator sets it once the replica may take traffic, that is once every copy of the
#: replica it replaces in a rollout serves elsewhere (at once when it replaces none).
HANDOVER_CONDITION = f"{GROUP}/handover"
#: A pool pod's annotation: the replica the rollout replaces next; its copies are placed elsewhere as well.
ANNOTATION_LEAVING = f"{GROUP}/leaving"
POOL_NAME_RULE = MODEL_NAME_RULE.replace("the model's Service and labels its pods", "the pool's Deployment and "
                                         "labels its pods")


class PoolCapacity(_Model):
    """What one replica holds, the figure the operator places models against (their spec.memory)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {
            "rule": "has(self.memoryPerGpu) != has(self.memoryPerReplica)",
            "message": "set exactly one of memoryPerGpu (a GPU pool) or memoryPerReplica (a CPU pool)",
        },
    ]})

    memory_per_gpu: QuantityStr | None = Field(
        default=None,
        description=(
            "A GPU pool: the memory of each GPU that models may take (`80Gi` on an 80 GB GPU, less what CUDA and "
            "tritonserver keep). A replica holds this times server.gpus (at least 1): a model's memory is its total "
            "on the replica, over the GPUs it uses."
        ),
    )
    memory_per_replica: QuantityStr | None = Field(
        default=None,
        description="A CPU pool (server.gpus unset or 0): the memory each replica's models may take in all.",
    )


class PoolAutoscaling(_Model):
    """A HorizontalPodAutoscaler of the pool's replicas on the capacity its models leave free."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.minReplicas <= self.maxReplicas", "message": "minReplicas must be <= maxReplicas",
         "fieldPath": ".minReplicas"},
    ]})

    min_replicas: int = Field(default=1, ge=1, le=MAX_POOL_REPLICAS, description="The fewest replicas the HPA scales "
                              "to. Keep it at least the most copies one of its models has.")
    max_replicas: int = Field(ge=1, le=MAX_POOL_REPLICAS, description="The most replicas the HPA scales to.")
    target_free_fraction: float = Field(
        default=0.2,
        ge=0,
        le=0.9,
        description=(
            "The share of the pool's capacity to keep free for models to come: the HPA keeps the memory its models "
            "demand (placed, and copies that fit no replica yet) at capacityPerReplica x (1 - this) per replica "
            "(metric triton_pool_demand_bytes of the TritonPool). A pool with a model of more copies than replicas "
            "demands a replica per copy."
        ),
    )
    behavior: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The HPA's behavior (autoscaling/v2 HorizontalPodAutoscalerBehavior), passed to it as is. Unset: "
            "Kubernetes' defaults (scale down after a 300 s stabilisation window). A replica scaled away takes its "
            "models' copies with it: they are placed again on the replicas left."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )

    def target_bytes(self, replica_bytes: int) -> int:
        """The demand the HPA keeps per replica, in whole bytes: a replica's capacity less the free share."""
        return int(replica_bytes * (1 - self.target_free_fraction))


#: How a pool places its models' copies (`plan.placement`): spread over its replicas, or packed onto the fewest.
PlacementStrategy = Literal["Spread", "Pack"]


class PoolPlacement(_Model):
    """How the operator chooses a replica for each copy of a pooled model."""

    strategy: PlacementStrategy | None = Field(
        default=None,
        description=(
            "Spread: a copy goes on the replica with the fewest models (then the least memory used), so that a "
            "pool of fixed size shares the traffic among its replicas. Pack: on the replica it fills best (the least "
            "room left), so that replicas left empty can be scaled away. Before either: copies of one model go on "
            "distinct replicas spread over nodes, and a replica that already loads a copy's ensemble steps is "
            "preferred; a copy that serves is never moved to follow the strategy, which only chooses where new "
            "copies go. Unset: Spread while the pool's replica count is fixed, Pack while it sets autoscaling. The "
            "CRD stores no default on purpose: a stored Spread would stay when autoscaling is added later."
        ),
    )


class TritonPoolSpec(_Model):
    """Desired state of a pool of tritonservers that pooled TritonModels share."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {
            "rule": "!has(self.capacity.memoryPerGpu) || (has(self.server.gpus) && self.server.gpus >= 1)",
            "message": "capacity.memoryPerGpu needs server.gpus >= 1 (a replica holds memoryPerGpu times gpus)",
            "fieldPath": ".capacity.memoryPerGpu",
        },
        {
            "rule": "!has(self.capacity.memoryPerReplica) || !has(self.server.gpus) || self.server.gpus == 0",
            "message": "capacity.memoryPerReplica is for CPU pools: with server.gpus, set capacity.memoryPerGpu",
            "fieldPath": ".capacity.memoryPerReplica",
        },
    ]})

    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_POOL_REPLICAS,
        description=(
            "Number of tritonserver replicas (pods of the pool's Deployment). Each pooled model's copies go on "
            "distinct replicas, so a model with more copies than the pool has replicas is short of capacity. A "
            "change that would strand placed models (fewer replicas than a model's copies, or less room in all "
            "than is placed) is refused."
        ),
    )
    capacity: PoolCapacity = Field(
        description=(
            "What one replica holds. Lowering it below what is placed on a replica is refused: the operator never "
            "moves a model that is serving."
        ),
    )
    autoscaling: PoolAutoscaling | None = Field(
        default=None,
        description=(
            "Scale the replicas on the capacity the pool's models leave: the operator renders a "
            "HorizontalPodAutoscaler (<pool>-pool, owned by the pool) that sets spec.replicas through the scale "
            "subresource, on a metric the operator serves through the custom metrics API (the chart's "
            "customMetrics.enabled). Leave spec.replicas out of manifests that set this: the HPA owns it."
        ),
    )
    placement: PoolPlacement | None = Field(
        default=None,
        description="How copies are placed on the replicas (unset: see placement.strategy).",
    )
    server: Server = Field(
        default_factory=Server,
        description=(
            "The tritonserver container of every replica, and the pod around it: what a TritonModel's spec.server "
            "is for its own replicas. tritonserver runs in explicit model control with no model at start: the "
            "operator loads each pooled model into the replicas it is placed on. gpus: per replica (unset: 0, a CPU "
            "pool). cacheSize: the replica's response cache, which every pooled model with responseCache shares."
        ),
        json_schema_extra={"default": {}},
    )

    @property
    def replica_bytes(self) -> int:
        """What one replica holds, in bytes: memoryPerReplica, or memoryPerGpu times the GPUs of a replica."""
        c = self.capacity
        if c.memory_per_replica is not None:
            return quantity_bytes(c.memory_per_replica)
        assert c.memory_per_gpu is not None
        return quantity_bytes(c.memory_per_gpu) * max(1, self.server.gpus or 0)

    @property
    def placement_strategy(self) -> PlacementStrategy:
        """How this pool places copies: spec.placement.strategy, or, unset, Pack while the pool autoscales (an empty
        replica can be given back) and Spread while its replica count is fixed (every replica takes its share of the
        traffic). Decided here only, never stored as a CRD default, so that adding autoscaling later changes it."""
        chosen = self.placement.strategy if self.placement is not None else None
        if chosen is not None:
            return chosen
        return "Pack" if self.autoscaling is not None else "Spread"

    @property
    def capacity_path(self) -> str:
        """The field that sets a replica's capacity, as errors name it."""
        per_gpu = self.capacity.memory_per_gpu is not None
        return "spec.capacity.memoryPerGpu" if per_gpu else "spec.capacity.memoryPerReplica"


class PoolLoadStatus(_Model):
    """A load the operator has sent a replica's Triton and not yet seen answered."""

    digest: str = Field(description="The config digest the load carries.")
    since: str = Field(description="When the operator sent it (RFC 3339).")


class PoolReplicaStatus(_Model):
    """One replica of a pool: the models placed on it and what they take."""

    pod: str = Field(description="Pod name (the name placements record).")
    node: str | None = Field(default=None, description="The node it runs on.")
    models: list[str] | None = Field(
        default=None, description="TritonModels placed on it (an ensemble's steps included), by name.")
    used: str | None = Field(default=None, description="Memory its models take, by their spec.memory (bytes).")
    free: str | None = Field(default=None, description="Capacity left for more models (bytes).")
    loaded: dict[str, str] | None = Field(
        default=None,
        description=(
            "What the operator has loaded there and Triton said READY, by Triton model name: the config digest each "
            "serves. Read back after a restart of the operator: a model it no longer places there is unloaded."
        ),
    )
    loading: dict[str, PoolLoadStatus] | None = Field(
        default=None,
        description=(
            "Loads sent there and not answered yet, by Triton model name, written before they are sent. A restarted "
            "operator waits for such a load at the desired digest (Triton does not list a model loaded from a request "
            "in its repository index, loading or not) instead of sending it again, and sends it again once Triton "
            "has not heard of the model or the load has not answered for 120 s."
        ),
    )


class TritonPoolStatus(_Model):
    """Observed state, written by the operator."""

    model_config = ConfigDict(frozen=False)

    observed_generation: int | None = Field(default=None, ge=0, le=JSON_INT_MAX)
    conditions: list[Condition] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description=(
            "Ready (every replica is Ready and every placed model is loaded where it is placed), Progressing "
            "(replicas or loads under way), Degraded (a replica or a load failed); reason CamelCase."
        ),
    )
    replicas: int | None = Field(default=None, ge=0, le=INT32_MAX, description="Replicas that exist.")
    ready_replicas: int | None = Field(default=None, ge=0, le=INT32_MAX, description="Replicas that are Ready.")
    models: int | None = Field(default=None, ge=0, le=INT32_MAX, description="Pooled TritonModels placed on it.")
    selector: str | None = Field(default=None, description="Pod label selector, for the scale subresource.")
    capacity_per_replica: str | None = Field(default=None, description="What one replica holds (bytes).")
    placement_strategy: PlacementStrategy | None = Field(default=None, description=(
        "How new copies are placed: spec.placement.strategy, or the default it leaves (Spread with a fixed replica "
        "count, Pack with autoscaling)."))
    used: str | None = Field(default=None, description="Memory placed models take over all replicas (bytes).")
    free: str | None = Field(default=None, description="Capacity left over all replicas (bytes).")
    unplaced: str | None = Field(default=None, description="Memory of the copies that fit no replica (bytes).")
    most_copies: int | None = Field(default=None, ge=0, le=INT32_MAX, description=(
        "The most copies one of its models wants: the fewest replicas that can hold them (copies go on distinct "
        "replicas)."))
    replica_models: list[PoolReplicaStatus] | None = Field(
        default=None,
        max_length=MAX_POOL_REPLICAS,
        description="Per replica: the models placed on it, and its capacity used and free.",
    )


class TritonPool(BaseModel):
    """A TritonPool as read from YAML or the API server."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    api_version: Literal["serving.triton-operator.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["TritonPool"]
    metadata: ObjectMeta
    spec: TritonPoolSpec

    @property
    def name(self) -> str:
        return self.metadata.name



def model_bytes(model: TritonModel) -> int:
    """What one copy of a pooled model takes on a replica by itself: its spec.memory (an ensemble's own: 0 unset)."""
    return quantity_bytes(model.spec.memory) if model.spec.memory is not None else 0


def closure_bytes(model: TritonModel, models: Mapping[str, TritonModel]) -> dict[str, int]:
    """What a copy of `model` loads on a pool replica: the model and every step its ensemble reaches (found among
    `models`, by name; a missing one counts nothing, validation refuses it), each with its memory in bytes."""
    by_name = {**models, model.name: model}
    reached, _ = step_graph.closure(model.name, step_graph.of_models(by_name))
    return {name: model_bytes(by_name[name]) for name in reached}


_BINARY = (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))


def format_bytes(n: int) -> str:
    """`n` bytes as a Kubernetes quantity, in the largest binary unit that holds it whole (`1536Mi`, `2Gi`, `100`)."""
    for suffix, unit in _BINARY:
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)
