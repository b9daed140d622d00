"""Where the copies of pooled models go: the placement of TritonModels on the replicas of their TritonPool, pure.

This module's docstring is the design of pools (issue 29); `docs/concepts/pools.md` is the user's side of it.

# Why a pool

A TritonModel of its own runs a Deployment of its own: a GPU per replica, however small the model. A TritonPool is a
fleet of tritonserver replicas that many models share: each model (`spec.pool: <pool>`) is loaded into as many
replicas as its `spec.replicas` asks, and traffic reaches a model on a replica only once that model, not the server,
is READY there at the desired config digest and warm.

# How a pool replica runs

- One Deployment per pool, `<pool>-pool` (`render.pool.render_pool_deployment`; the suffix keeps it apart from a
  TritonModel's own Deployment of the same name), and a PodDisruptionBudget of one with more than one replica: each
  replica carries copies of many models. Its pods are the pool's replicas; a replica is named by its pod, the name
  placements record. A pod that goes (node lost, scale-down, a new pod template) takes its copies with it, and they
  are placed again on the replicas left. Which pod a scale-down removes is the ReplicaSet's choice; the operator
  steers it to the emptiest replica with `controller.kubernetes.io/pod-deletion-cost` (`plan.pool.deletion_costs`).
- tritonserver runs `--model-control-mode=explicit` with no `--load-model`: it starts with no model and opens its
  ports at once. Models come and go through the repository API (load, unload), so adding, updating or removing
  one model never restarts a replica or touches the others.
- `--exit-on-error=false` (a model that fails to load does not take the server with it) and
  `--strict-readiness=false`: with strict readiness, Triton's `/v2/health/ready` is 400 while any model is LOADING,
  so one model loading would mark the whole replica unready for every other model.
- Loading (`controller.pool`, `triton.pool`): an inline model's config and files go in the load request itself
  (Triton's `config` and `file:<path>` load parameters, `render.pool.load_request`), so nothing of it is on the
  replica's disk. A `uri` model is fetched by the replica's `fetch-server` sidecar (`agent.fetch_server`,
  asked by `triton.fetcher`) into the replica's repository volume, with the fetch step's pins and refusals, each
  digest behind a link swapped atomically, then loaded with its config alone (no `pvc://`, no model's own
  credentialsSecret on a pool: rule `pool-source`). Measured on 2.51 (`tests/test_pool_load.py`):
  - an ensemble's load looks its steps up in the repository on disk: over steps loaded from requests, the load
    answers INTERNAL "failed to poll from model repository" and yet the ensemble is loaded, READY, and serves. So a
    load's answer is never trusted alone: after every load the operator asks again, and READY at the desired config
    digest is the verdict, as the gate has it (the steps could go on disk instead, through that sidecar);
  - models loaded from requests are not in the repository index (it lists the repository on disk): the gate reads
    their state from model readiness and config, not from the index.
- The repository API is restricted to a key (`render.repository_key`), as for a model's own replicas. A pool has one
  key: one tritonserver process holds every model's code, and a Python model's code can read the server's
  environment. So a pool is a trust boundary: models that must not be able to unload one another go in different
  pools.
- The `probe` sidecar holds the kubelet's readiness probe until tritonserver answers, as for a model's own replicas,
  but with no `--model`: which models a replica serves changes without a restart, so the operator (not the pod
  spec) watches the models (`controller.pool` asks each replica's Triton every round; the probe only holds the
  pod's readiness until tritonserver answers).

# What a pool pod's readiness means

Triton's `/v2/health/ready` is per server, so it can say nothing per model. A pool pod is Ready when its tritonserver
process is up and answers (its HTTP port, through the probe sidecar), nothing more: "it can take loads and requests".
A pool pod's one readiness gate is its handover in a rollout (`plan.pool.rollout`: open at once for a replica that
replaces none; otherwise once the copies of the replica it replaces serve elsewhere), never a model's: readiness is
per model, in the slices. Pod readiness still matters:
a pod that is not Ready is `ready: false` at once in every model's EndpointSlice (so a dead or stalled replica leaves
every model), and the Deployment's rollout and the pool's PodDisruptionBudget count Ready pods.

# How models are placed (`place`)

- The unit of capacity is a replica. A replica holds `spec.capacity.memoryPerReplica` (CPU pools), or
  `spec.capacity.memoryPerGpu` times `spec.server.gpus` (GPU pools). A model declares what it takes on one replica,
  in total over the GPUs it uses (`spec.memory`). Per-GPU packing would need each replica to load a config with its
  own instance-group GPU indices, a different config digest per replica; one digest per model is what the gate
  checks, so a replica is one bin.
- A placement unit is a model and its step closure: an ensemble is loaded with every step it reaches, on the same
  replicas (Triton resolves steps within one server). A step shared by several units on one replica is counted once
  there: a replica's use is the sum over the distinct models it loads.
- Copies of one model go on distinct replicas (`spec.replicas` copies), never two on one.
- Among the replicas a copy fits, the choice is, in order: the node with the fewest copies of this model (spread
  across nodes where it can, the way a topology spread constraint with `whenUnsatisfiable: ScheduleAnyway`
  prefers); the fewest new bytes (a step already loaded there costs nothing); then the pool's strategy
  (`spec.placement.strategy`, issue 41):
  - `Spread`: the fewest models loaded there (its closure members, steps included), then the least used bytes. A
    pool of fixed size serves every model's traffic from every replica it has: best fit had put 5 models on one
    replica of the demo's pool of 3, 4 on another and none on the third, and 6 more of 64Mi all on one.
  - `Pack`: the least room left after it (best fit), so that replicas left empty can be given back by a scale-down.
  Unset, a pool spreads while its replica count is fixed and packs while it autoscales
  (`TritonPoolSpec.placement_strategy`, the one place that decides it: the CRD stores no default, which would stay
  Spread once autoscaling is added). Last, the replica's name (deterministic). Units are placed largest first
  under either strategy (best fit decreasing, for Pack; for Spread, the large ones spread before the small fill in).
  The strategy only chooses where new copies go: changing it moves nothing that is placed (below).
- Sticky: a copy recorded in the model's status (`status.placement`) stays on its replica as long as the replica
  exists and the copy still fits there; only copies whose replica is gone (or that no longer fit: a closure grew,
  the pool shrank) are placed again. So a restarted operator, which reads the placements back from the statuses,
  never moves a model that is serving, nor does a change of strategy: a spread pool that was packed stays packed
  until its copies are placed again. When `spec.replicas` falls, the copies placed last are dropped first.
- A copy that fits nowhere is a shortfall (`Shortfall`): the model reports `Ready=False`, reason
  `InsufficientPoolCapacity`, with the figures (what one copy needs, the largest room any replica without a copy
  has, how many copies are placed of how many).
- The webhook refuses what can never fit (`validate.pool`): a model whose closure is larger than a replica of its
  pool, and a pool change that would strand placed models (a replica smaller than what is placed on one, fewer
  replicas than a model's copies, less room in all than is placed).

# How traffic is gated per model

- Each pooled model has a Service with no selector (`render.pool.render_model_service`): clients keep calling
  `<model>.<namespace>.svc:8000/v2/models/<model>/infer`. With no selector, Kubernetes' EndpointSlice controller
  leaves the Service alone: its syncService returns early for a Service without a selector, and it never touches a
  slice whose `endpointslice.kubernetes.io/managed-by` label is not its own (`endpointslice-controller.k8s.io`).
  Source: the EndpointSlice API KEP, "Additional EndpointSlice Controllers" (kubernetes/enhancements,
  keps/sig-network/0752-endpointslices, first 20190603-EndpointSlice-API.md): the label was added so that other
  controllers can manage slices without the built-in one deleting or changing them. KEP-4770 reserves values ending
  in `k8s.io` for Kubernetes' own controllers, so ours is `api.pool.ENDPOINTSLICE_MANAGER`, under our API group.
- The EndpointSliceMirroring controller mirrors an Endpoints object of a selectorless Service into slices of its own
  (managed-by `endpointslicemirroring-controller.k8s.io`, `kubernetes.io/service-name` set, owned by the Endpoints;
  the same KEP's "EndpointSliceMirroring Controller" and kubernetes/pkg/controller/endpointslicemirroring). It acts
  only when an Endpoints object exists, so the operator writes none: an Endpoints written by hand for a pooled
  model's Service would be mirrored into a second slice, and kube-proxy takes the union of a Service's slices,
  which would let traffic past the gate.
- The operator writes each model's slices (`render.pool.render_endpoint_slice`), labelled
  `kubernetes.io/service-name: <model>` (what kube-proxy and DNS select a Service's slices by) and managed-by ours,
  owned by the TritonModel. One slice per model and address family: a model has at most as many endpoints as its
  pool has replicas (at most 1000, the most one slice may hold).
- An endpoint per placed replica that has a pod IP. `ready` is true only when the pod is Ready and not
  terminating, and Triton on that replica says the model (and every step of its closure) is READY at the desired
  config digest, warm-up done (`plan.readiness`'s verdict, per model instead of per pod). `serving` is the same
  without the terminating test, as Kubernetes' controller sets it; `terminating` is the pod's deletion. A replica
  that is reloading the model (Drain) is `ready: false` before the unload.
- Endpoints that are not ready stay listed (as Kubernetes lists pods that are not Ready), so `kubectl get
  endpointslices` shows where a model is placed and why it is held back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..api.pool import PlacementStrategy, TritonPool, closure_bytes, format_bytes
from ..api.v1alpha1 import TritonModel

#: The condition reason of a pooled model with copies that fit no replica.
INSUFFICIENT_CAPACITY = "InsufficientPoolCapacity"

@dataclass(frozen=True)
class PoolReplica:
    """A replica of the pool as the operator sees it: its pod's name, and the node it runs on (None: not yet
    scheduled)."""

    name: str
    node: str | None = None

    @property
    def domain(self) -> str:
        """Where the replica counts for node spread: its node, or itself while it has none."""
        return self.node if self.node is not None else f"\0{self.name}"


@dataclass(frozen=True)
class Demand:
    """One pooled model to place: how many copies, and what a copy loads on a replica (the model and every step its
    ensemble reaches, by TritonModel name, each with its declared memory in bytes)."""

    name: str
    copies: int
    closure: Mapping[str, int]

    @property
    def size(self) -> int:
        return sum(self.closure.values())


@dataclass(frozen=True)
class Shortfall:
    """Copies of a model that fit no replica: the figures its `InsufficientPoolCapacity` condition states."""

    model: str
    wanted: int
    placed: int
    needed: int  # bytes one copy loads (its closure), on a replica that has none of it
    largest_free: int  # the most room on a replica that has no copy of it (0: there is none)
    replicas: int  # replicas the pool has

    @property
    def message(self) -> str:
        head = f"{self.placed} of {self.wanted} copies placed"
        if self.placed >= self.replicas:  # every replica has a copy
            return (f"{head}: copies go on distinct replicas, and the pool has {self.replicas}; scale the pool or "
                    "lower replicas")
        return (f"{head}: a copy needs {format_bytes(self.needed)}, and the most any replica without one has free is "
                f"{format_bytes(self.largest_free)} (pool of {self.replicas} replicas); scale the pool, raise its "
                "capacity, or lower replicas")


@dataclass(frozen=True)
class Placement:
    """Where each pooled model's copies are (replica names, first placed first), what each replica loads (every
    copy's closure), what that takes, and the copies that fit nowhere."""

    capacity: int
    copies: Mapping[str, tuple[str, ...]]
    loaded: Mapping[str, frozenset[str]]
    used: Mapping[str, int]
    shortfalls: Mapping[str, Shortfall] = field(default_factory=dict)

    def free(self, replica: str) -> int:
        return self.capacity - self.used.get(replica, 0)


class _State:
    """The placement being built: what each replica loads and what that takes."""

    def __init__(self, capacity: int, replicas: Sequence[PoolReplica], strategy: PlacementStrategy,
                 leaving: frozenset[str] = frozenset()) -> None:
        self.capacity = capacity
        self.strategy = strategy
        self.leaving = leaving
        self.replicas = {r.name: r for r in replicas}
        self.loaded: dict[str, set[str]] = {r.name: set() for r in replicas}
        self.used: dict[str, int] = dict.fromkeys(self.replicas, 0)
        self.copies: dict[str, list[str]] = {}

    def new_bytes(self, replica: str, demand: Demand) -> int:
        """The bytes a copy of `demand` adds on `replica`: its closure's models not loaded there yet."""
        have = self.loaded[replica]
        return sum(size for name, size in demand.closure.items() if name not in have)

    def fits(self, replica: str, demand: Demand) -> bool:
        return replica not in self.copies.get(demand.name, ()) and \
            self.used[replica] + self.new_bytes(replica, demand) <= self.capacity

    def staying(self, model: str) -> int:
        """The copies of `model` placed so far on replicas that are not leaving: those its `copies` count."""
        return sum(1 for r in self.copies.get(model, ()) if r not in self.leaving)

    def put(self, replica: str, demand: Demand) -> None:
        self.used[replica] += self.new_bytes(replica, demand)
        self.loaded[replica].update(demand.closure)
        self.copies.setdefault(demand.name, []).append(replica)

    def best(self, demand: Demand) -> str | None:
        """The replica the next copy of `demand` goes on, or None where none fits (see the module docstring)."""
        here = self.copies.get(demand.name, [])
        per_domain: dict[str, int] = {}
        for name in here:
            per_domain[self.replicas[name].domain] = per_domain.get(self.replicas[name].domain, 0) + 1
        candidates = [name for name in self.replicas if name not in self.leaving and self.fits(name, demand)]
        if not candidates:
            return None
        return min(candidates, key=lambda name: (
            per_domain.get(self.replicas[name].domain, 0),
            self.new_bytes(name, demand),
            *self.rank(name, demand),
            name,
        ))

    def rank(self, replica: str, demand: Demand) -> tuple[int, ...]:
        """The strategy's order among replicas equal in node spread and new bytes: Spread, the fewest models loaded
        there, then the least used; Pack, the least room left after the copy (best fit)."""
        if self.strategy == "Spread":
            return (len(self.loaded[replica]), self.used[replica])
        return (self.capacity - self.used[replica] - self.new_bytes(replica, demand),)

    def shortfall(self, demand: Demand) -> Shortfall:
        here = set(self.copies.get(demand.name, ()))
        room = [self.capacity - self.used[name] for name in self.replicas if name not in here]
        return Shortfall(demand.name, demand.copies, self.staying(demand.name), demand.size, max(room, default=0),
                         len(self.replicas) - len(self.leaving))


def place_demands(capacity: int, replicas: Sequence[PoolReplica], demands: Iterable[Demand],
                  previous: Mapping[str, Sequence[str]], strategy: PlacementStrategy = "Pack",
                  leaving: frozenset[str] = frozenset()) -> Placement:
    """The placement of `demands` on `replicas` of `capacity` bytes each, keeping `previous` where it still holds:
    first every recorded copy whose replica exists and that still fits there (by model name, each model's copies in
    their recorded order, up to its copies), then the copies still missing, largest closure first, each on the best
    replica (node spread, fewest new bytes, then by `strategy`: Spread, fewest models then least used; Pack, best
    fit; then name).

    `leaving`: replicas about to go (a pool's rollout, `plan.pool.rollout`). A recorded copy on one stays there, and
    serves until its pod goes, but does not count: each model gets its `copies` on the other replicas as well, and no
    new copy goes on a leaving replica. So a model on a leaving replica holds one copy more until it goes."""
    state = _State(capacity, replicas, strategy, leaving)
    ordered = sorted(demands, key=lambda d: d.name)
    for demand in ordered:
        for name in previous.get(demand.name, ()):
            if name not in state.replicas or not state.fits(name, demand):
                continue
            if name in leaving or state.staying(demand.name) < demand.copies:
                state.put(name, demand)
    shortfalls: dict[str, Shortfall] = {}
    for demand in sorted(ordered, key=lambda d: (-d.size, d.name)):
        while state.staying(demand.name) < demand.copies:
            target = state.best(demand)
            if target is None:
                shortfalls[demand.name] = state.shortfall(demand)
                break
            state.put(target, demand)
    return Placement(
        capacity=capacity,
        copies={d.name: tuple(state.copies.get(d.name, ())) for d in ordered},
        loaded={name: frozenset(models) for name, models in state.loaded.items()},
        used=dict(state.used),
        shortfalls=shortfalls,
    )


def demands(pool: str, models: Iterable[TritonModel]) -> list[Demand]:
    """The demands of the models on `pool` (among `models`, a namespace's): each with its closure, whose steps are
    found among `models` (`api.pool.closure_bytes`)."""
    by_name = {m.name: m for m in models}
    return [Demand(m.name, m.spec.replicas, closure_bytes(m, by_name))
            for m in sorted(by_name.values(), key=lambda m: m.name) if m.spec.pool == pool]


def place(pool: TritonPool, replicas: Sequence[PoolReplica], models: Iterable[TritonModel],
          previous: Mapping[str, Sequence[str]], leaving: frozenset[str] = frozenset()) -> Placement:
    """Where the models on `pool` go (`models`: the pool's namespace's, others are steps or ignored) on its
    `replicas`, keeping `previous` (each model's status.placement) where it still holds, by the pool's strategy;
    `leaving`: see `place_demands`."""
    return place_demands(pool.spec.replica_bytes, replicas, demands(pool.name, models), previous,
                         pool.spec.placement_strategy, leaving)


def replica_status(placement: Placement, replicas: Sequence[PoolReplica]) -> list[dict[str, object]]:
    """The pool's status.replicaModels: per replica, the models it loads and its capacity used and free."""
    return [{"pod": r.name, **({"node": r.node} if r.node else {}),
             "models": sorted(placement.loaded.get(r.name, ())),
             "used": format_bytes(placement.used.get(r.name, 0)), "free": format_bytes(placement.free(r.name))}
            for r in replicas]
