"""Validation of TritonPools and of the models placed on them (issue 29), pure: (pool, models) -> [FieldError].

- `check_pool`: a pool alone: its capacity (one of memoryPerGpu with gpus, or memoryPerReplica without), and the
  rules of its spec.server that a TritonModel's server meets (`validate.rules.check_server`);
- `check_pool_fit`: a pooled model, with every step its ensemble reaches, larger than one replica of its pool is
  refused, naming spec.memory (an ensemble: spec.pool) and the figures; so is a step whose memory makes an ensemble
  that uses it (placed with its steps on the same replicas) larger than a replica, naming the step's spec.memory and
  the ensemble; and a model with responseCache on a pool whose replicas have no cache (`cache_problems`);
- `triton_name_clashes`, `triton_name_taken`: two models of one pool that load under one Triton name
  (spec.modelName) are refused, naming spec.modelName (or spec.pool);
- `pool_change_problems`: a pool change that would strand placed models (a replica would hold less than is placed
  on one, fewer replicas than a model has copies, less room in all than is placed) is refused, naming the field.
  The placements are what the models' statuses record (`status.placement`); the operator never moves a model that is
  serving, so it cannot make room by itself.

`validate.check_documents` runs the first two on the documents given to `triton-operator render` and `validate`.
The webhook (next step of issue 29) runs them against the pools and models of the namespace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..api.pool import TritonPool, closure_bytes, format_bytes, model_bytes
from ..api.v1alpha1 import TritonModel, quantity_bytes
from .errors import FieldError
from .rules import Collector, check_server

#: How a TritonPool is named in field errors.
POOL_IDENT = "TritonPool/{}"
#: The rule id of `pool_change_problems`' errors (a change between two objects: no corpus spec shows one alone).
POOL_CHANGE = "pool-change"


def capacity_problem(pool: TritonPool) -> tuple[str, str] | None:
    """(field path, message) when the pool's capacity is not one of its two forms, matching its gpus."""
    c, gpus = pool.spec.capacity, pool.spec.server.gpus or 0
    if (c.memory_per_gpu is None) == (c.memory_per_replica is None):
        return "spec.capacity", "set exactly one of memoryPerGpu (a GPU pool) or memoryPerReplica (a CPU pool)"
    if c.memory_per_gpu is not None and gpus < 1:
        return ("spec.capacity.memoryPerGpu",
                "capacity.memoryPerGpu needs server.gpus >= 1 (a replica holds memoryPerGpu times gpus)")
    if c.memory_per_replica is not None and gpus > 0:
        return ("spec.capacity.memoryPerReplica",
                "capacity.memoryPerReplica is for CPU pools: with server.gpus, set capacity.memoryPerGpu")
    return None


def check_pool(pool: TritonPool, ident: str) -> list[FieldError]:
    err = Collector(ident)
    problem = capacity_problem(pool)
    if problem is not None:
        err("pool-spec", *problem)
    err.errors.extend(check_server(pool.spec.server, ident))
    return err.errors


def check_pool_fit(pool: TritonPool, models: Sequence[tuple[str, TritonModel]]) -> list[FieldError]:
    """Each model on `pool` (among `models`, with the steps they reach) that no replica of it could hold, or that
    asks for a response cache its replicas do not have."""
    if capacity_problem(pool) is not None:
        return cache_problems(pool, models)  # check_pool says what is wrong with its capacity
    capacity = pool.spec.replica_bytes
    by_name = {m.name: m for _, m in models}
    errors: list[FieldError] = []
    for ident, model in models:
        if model.spec.pool != pool.name:
            continue
        closure = closure_bytes(model, by_name)
        need = sum(closure.values())
        if need <= capacity:
            continue
        err = Collector(ident)
        steps = {n: b for n, b in closure.items() if n != model.name}
        with_steps = f" with its steps ({', '.join(f'{n} {format_bytes(b)}' for n, b in sorted(steps.items()))})" if steps else ""
        err("pool-capacity", "spec.pool" if model.spec.is_ensemble else "spec.memory",
            f"a copy takes {format_bytes(need)}{with_steps}, more than a replica of pool {pool.name!r} holds "
            f"({pool.spec.capacity_path} gives {format_bytes(capacity)}): it could be placed nowhere")
        errors.extend(err.errors)
    return errors + [e for _, e in step_fit(pool, models)] + cache_problems(pool, models)


def cache_problems(pool: TritonPool, models: Sequence[tuple[str, TritonModel]]) -> list[FieldError]:
    """Each model on `pool` with responseCache while the pool's replicas have no response cache (its
    spec.server.cacheSize 0; a pooled model's own server.cacheSize is not used): Triton accepts such a config and
    caches nothing, so it is refused as a model's own server without a cache is (rule response-cache-size), naming
    spec.responseCache."""
    if quantity_bytes(pool.spec.server.cache_size) > 0:
        return []
    errors: list[FieldError] = []
    for ident, model in models:
        if model.spec.pool != pool.name or not model.spec.response_cache:
            continue
        err = Collector(ident)
        err("response-cache-size", "spec.responseCache",
            f"pool {pool.name!r} has no response cache (its spec.server.cacheSize is 0): Triton would accept the "
            "config and cache nothing; give the pool a cacheSize, or drop responseCache")
        errors.extend(err.errors)
    return errors


def step_fit(pool: TritonPool, models: Sequence[tuple[str, TritonModel]]) -> list[tuple[str, FieldError]]:
    """(ensemble, error) for each step (fitting a replica alone) of an ensemble on `pool` whose copy, with every step
    it reaches, does not fit one: the ensemble and its steps are placed together on the same replicas, so a step that
    grows (spec.memory) can strand the ensemble as surely as the ensemble's own change. Named at the step's
    spec.memory, with the ensemble."""
    if capacity_problem(pool) is not None:
        return []
    capacity = pool.spec.replica_bytes
    by_name = {m.name: m for _, m in models}
    errors: list[tuple[str, FieldError]] = []
    for ident, step in models:
        if step.spec.pool != pool.name or step.spec.is_ensemble or model_bytes(step) > capacity:
            continue  # not on the pool, an ensemble (its own check names it), or refused alone already
        for ensemble in sorted(by_name.values(), key=lambda m: m.name):
            if not ensemble.spec.is_ensemble or ensemble.spec.pool != pool.name:
                continue
            closure = closure_bytes(ensemble, by_name)
            need = sum(closure.values())
            if step.name not in closure or need <= capacity:
                continue
            err = Collector(ident)
            parts = ", ".join(f"{n} {format_bytes(b)}" for n, b in sorted(closure.items()))
            err("pool-capacity", "spec.memory",
                f"with {format_bytes(model_bytes(step))} here, a copy of ensemble {ensemble.name!r}, placed with its "
                f"steps on the same replicas, takes {format_bytes(need)} ({parts}), more than a replica of pool "
                f"{pool.name!r} holds ({pool.spec.capacity_path} gives {format_bytes(capacity)}): it could be placed "
                "nowhere; lower spec.memory, or give the pool larger replicas first")
            errors.extend((ensemble.name, e) for e in err.errors)
    return errors


def _name_path(model: TritonModel) -> str:
    """The field that gives a model its Triton name: spec.modelName when set; else the pool it joins with it."""
    return "spec.modelName" if model.spec.model_name else "spec.pool"


#: What a TritonPool's own objects (Deployment, PodDisruptionBudget, HorizontalPodAutoscaler) are named after it.
POOL_OBJECTS_SUFFIX = "-pool"


def pool_objects_clash(model: str, pool: str, ident: str, path: str = "metadata.name") -> list[FieldError]:
    """TritonModel `model` and TritonPool `pool` of one namespace, whose objects would share names (the model named
    `<pool>-pool`): the error, on `ident`'s `path`."""
    if model != f"{pool}{POOL_OBJECTS_SUFFIX}":
        return []
    err = Collector(ident)
    err("pool-object-names", path, f"TritonModel {model!r} and TritonPool {pool!r} would share their objects' names: "
        f"the pool's Deployment, PodDisruptionBudget and HorizontalPodAutoscaler are named {model!r}, as the model's "
        "are; rename one of them")
    return err.errors


def pool_name_clashes(models: Sequence[tuple[str, TritonModel]],
                      pools: Sequence[tuple[str, TritonPool]]) -> list[FieldError]:
    """Among documents (`render`, `validate`): every TritonModel named after a TritonPool's own objects."""
    names = {p.name for _, p in pools}
    return [e for ident, m in models if m.name.endswith(POOL_OBJECTS_SUFFIX)
            and (pool := m.name[: -len(POOL_OBJECTS_SUFFIX)]) in names
            for e in pool_objects_clash(m.name, pool, ident)]


def triton_name_clashes(models: Sequence[tuple[str, TritonModel]]) -> list[FieldError]:
    """Among documents (`render`, `validate`): every pooled model whose Triton name another model of its pool has too
    (documents have no order of arrival, so each of them is named)."""
    groups: dict[tuple[str, str], list[tuple[str, TritonModel]]] = {}
    for ident, model in models:
        if model.spec.pool is not None:
            groups.setdefault((model.spec.pool, model.triton_name), []).append((ident, model))
    errors: list[FieldError] = []
    for (pool, triton), group in sorted(groups.items()):
        if len(group) < 2:
            continue
        for ident, model in group:
            others = ", ".join(sorted(m.name for _, m in group if m is not model))
            err = Collector(ident)
            err("pool-triton-name", _name_path(model), f"Triton name {triton!r} is also TritonModel {others}'s on "
                f"pool {pool!r}: one tritonserver holds one model of a name; set spec.modelName to another name")
            errors.extend(err.errors)
    return errors


def triton_name_taken(model: TritonModel, ident: str, on_pool: Mapping[str, str],
                      previous: TritonModel | None) -> list[FieldError]:
    """The webhook's check of one model joining its pool: `on_pool` holds the Triton name of each other model of the
    namespace on that pool. A model that already had this name on this pool is not refused again (the operator's
    status says which of the two keeps it: the older)."""
    pool = model.spec.pool
    if pool is None or (previous is not None and previous.spec.pool == pool
                        and previous.triton_name == model.triton_name):
        return []
    taken = sorted(n for n, t in on_pool.items() if n != model.name and t == model.triton_name)
    if not taken:
        return []
    err = Collector(ident)
    err("pool-triton-name", _name_path(model), f"Triton name {model.triton_name!r} is taken on pool {pool!r} by "
        f"TritonModel {', '.join(taken)}: one tritonserver holds one model of a name; set spec.modelName to another "
        "name")
    return err.errors


def _replica_use(models: Mapping[str, TritonModel], placements: Mapping[str, Sequence[str]]) -> dict[str, dict[str, int]]:
    """Per replica, the models its placed copies load (closures) and their bytes."""
    use: dict[str, dict[str, int]] = {}
    for name, replicas in placements.items():
        model = models.get(name)
        if model is None:
            continue
        closure = closure_bytes(model, models)
        for replica in replicas:
            use.setdefault(replica, {}).update(closure)
    return use


def pool_change_problems(pool: TritonPool, models: Sequence[TritonModel],
                         placements: Mapping[str, Sequence[str]]) -> list[FieldError]:
    """What the pool as changed (`pool`) would strand of the models placed on it: `models` are the namespace's (the
    pool's and their steps), `placements` each pooled model's status.placement (replica pod names)."""
    ident = POOL_IDENT.format(pool.name)
    problem = capacity_problem(pool)
    if problem is not None:
        return [FieldError(ident, problem[0], problem[1], "pool-spec")]
    by_name = {m.name: m for m in models}
    on_pool = {n: r for n, r in placements.items() if n in by_name and by_name[n].spec.pool == pool.name and r}
    capacity, where = pool.spec.replica_bytes, pool.spec.capacity_path
    errors = []
    use = _replica_use(by_name, on_pool)
    for replica, loaded in sorted(use.items()):
        held = sum(loaded.values())
        if held > capacity:
            errors.append(FieldError(ident, where, (
                f"would strand placed models: replica {replica} holds {format_bytes(held)} of them ({', '.join(sorted(loaded))}), "
                f"more than the {format_bytes(capacity)} a replica would hold; the operator never moves a serving model: "
                "lower those models' replicas or delete them first"), POOL_CHANGE))
    for name, replicas in sorted(on_pool.items()):
        if len(replicas) > pool.spec.replicas:
            errors.append(FieldError(ident, "spec.replicas", (
                f"would strand placed models: {name} has {len(replicas)} copies on distinct replicas, more than "
                f"{pool.spec.replicas} replicas; lower its replicas first"), POOL_CHANGE))
    total = sum(sum(loaded.values()) for loaded in use.values())
    if total > pool.spec.replicas * capacity:
        errors.append(FieldError(ident, "spec.replicas", (
            f"would strand placed models: they take {format_bytes(total)} in all, more than {pool.spec.replicas} replicas of "
            f"{format_bytes(capacity)} hold"), POOL_CHANGE))
    return errors
