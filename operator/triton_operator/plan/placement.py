"""Where the copies of pooled models go: the placement of TritonModels on the replicas of their TritonPool, pure.

This module's docstring is the design of pools (issue 29); `docs/pool.md` is the user's side of it.

# Why a pool

A TritonModel of its own runs a Deployment of its own: a GPU per replica, however small the model. A TritonPool is a
fleet of tritonserver replicas that many models share: each model (`spec.pool: <pool>`) is loaded into as many
replicas as its `spec.replicas` asks, and traffic reaches a model on a replica only once that model, not the server,
is READY there at the desired config digest and warm.

# How a pool replica runs

- One Deployment per pool (`render.pool.render_pool_deployment`). Its pods are the pool's replicas; a replica is
  named by its pod, the name placements record. tritonserver runs `--model-control-mode=explicit` with no
  `--load-model`: it starts with no model and opens its ports at once. Models come and go through the repository
  API (load, unload), so adding, updating or removing one model never restarts a replica or touches the others.
- `--exit-on-error=false` (a model that fails to load does not take the server with it) and
  `--strict-readiness=false`: with strict readiness, Triton's `/v2/health/ready` is 400 while any model is LOADING,
  so one model loading would mark the whole replica unready for every other model.
- Loading (the next session wires it): an inline model's config and files go in the load request itself
  (Triton's `config` and `file:<version>/<name>` load parameters, verified on 2.51 in /work/shared/TRITON_NOTES.md),
  so nothing of it is on the replica's disk; a `uri` model is fetched into the replica's repository volume by a
  sidecar on request, with the fetch step's pins and refusals, then loaded by name.
- The repository API is restricted to a key (`render.repository_key`), as for a model's own replicas. A pool has one
  key: one tritonserver process holds every model's code, and a Python model's code can read the server's
  environment. So a pool is a trust boundary: models that must not be able to unload one another go in different
  pools.
- The `probe` sidecar holds the kubelet's readiness probe until tritonserver answers, as for a model's own replicas,
  but with no `--model`: which models a replica serves changes without a restart, so the operator (not the pod
  spec) tells the probe what to watch (next session).

# What a pool pod's readiness means

Triton's `/v2/health/ready` is per server, so it can say nothing per model. A pool pod is Ready when its tritonserver
process is up and answers (its HTTP port, through the probe sidecar), nothing more: "it can take loads and requests".
A pool pod has no readiness gate (a gate is per pod, and readiness is now per model). Pod readiness still matters:
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
  prefers); the fewest new bytes (a step already loaded there costs nothing); the least room left after it (best
  fit); the replica's name (deterministic). Units are placed largest first (best fit decreasing).
- Sticky: a copy recorded in the model's status (`status.placement`) stays on its replica as long as the replica
  exists and the copy still fits there; only copies whose replica is gone (or that no longer fit: a closure grew,
  the pool shrank) are placed again. So a restarted operator, which reads the placements back from the statuses,
  never moves a model that is serving. When `spec.replicas` falls, the copies placed last are dropped first.
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
  in `k8s.io` for Kubernetes' own controllers, so ours is `ENDPOINTSLICE_MANAGER`, under our API group.
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
