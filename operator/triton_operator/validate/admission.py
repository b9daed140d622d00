"""The admission verdict on one TritonModel change, given the TritonModels around it. Pure.

The CRD schema and its CEL rules refuse what one object shows on its own. What needs
other objects is decided here, for the validating webhook (`servers/webhook.py`):

- the new object passes every rule in `rules.py`, checked together with the models its
  ensemble steps reach (step references, tensor names, types and shapes, batch sizes,
  cycles);
- a change to a model used as an ensemble step does not break an ensemble that uses it
  (an error the ensemble did not have before the change is the change's fault);
- a pooled model (spec.pool), with every step its ensemble reaches, fits one replica of its pool
  (`validate.pool.check_pool_fit`), when the pool exists: a model may be applied before its pool (GitOps
  applies in any order), and the operator then reports it PoolNotFound.

`review_pool` is the verdict on one TritonPool change: the pool alone (`validate.pool.check_pool`), and on an
update, what it would strand of the models placed on it (`validate.pool.pool_change_problems`, against their
status.placement). Deleting a pool is never refused: its models report PoolNotFound (docs/concepts/pools.md).

Metadata-only updates and objects being deleted are always allowed: garbage collection
and namespace deletion must never be blocked by a model whose step went missing later.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from .. import MINIMUM_TRITON_RELEASE
from ..api import steps as step_graph
from ..api.pool import TritonPool
from ..api.v1alpha1 import Server, TritonModel
from .errors import FieldError, from_pydantic
from .pool import (
    POOL_CHANGE,
    POOL_IDENT,
    POOL_OBJECTS_SUFFIX,
    check_pool,
    check_pool_fit,
    pool_change_problems,
    pool_objects_clash,
    step_fit,
    triton_name_taken,
)
from .rules import RULES, check_models

#: How a TritonModel is named in field errors here (the same as the operator's conditions).
IDENT = "TritonModel/{}"


@dataclass(frozen=True)
class AdmissionVerdict:
    allowed: bool
    errors: list[FieldError] = field(default_factory=list)  # the change's own, then those of ensembles it breaks
    warnings: list[str] = field(default_factory=list)
    subject: str = ""

    @property
    def message(self) -> str:
        """One line per error, field path first; what kubectl prints after "denied the request: "."""
        if self.allowed:
            return ""
        lines = [f"{len(self.errors)} error(s) in {self.subject}:"]
        for e in self.errors:
            if e.model == self.subject:
                lines.append(f"{e.path}: {e.message}")
            else:
                lines.append(f"would break ensemble {e.model.split('/', 1)[-1]}: {e.path}: {e.message}")
        return "\n".join(lines)


def needs_review(operation: str, obj: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> bool:
    """Whether a change is checked at all: a create, or an update that changes the spec of a live object."""
    if operation not in ("CREATE", "UPDATE") or not obj:
        return False
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return not (operation == "UPDATE" and old is not None and old.get("spec") == obj.get("spec"))


def _parse(name: str, body: Mapping[str, Any]) -> tuple[TritonModel | None, list[FieldError]]:
    try:
        return TritonModel.model_validate(body), []
    except ValidationError as exc:
        return None, from_pydantic(IDENT.format(name), exc)


def review(
    obj: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    neighbours: Mapping[str, Mapping[str, Any]],
    dependents: Sequence[str] = (),
    pool: Mapping[str, Any] | None = None,
    on_pool: Mapping[str, str] | None = None,
    clashing_pool: str | None = None,
) -> AdmissionVerdict:
    """The verdict on `obj` replacing `old` (None on create).

    `neighbours`: the current bodies of the other TritonModels of the namespace that matter, by
    name: every model reachable through ensemble steps from `obj` and from each of `dependents`.
    `dependents`: names of ensembles whose steps use `obj`.
    `pool`: the body of the TritonPool `obj` names in spec.pool, if it exists.
    `on_pool`: the Triton name of each other TritonModel of the namespace on the pool `obj` names (rule
    pool-triton-name).
    `clashing_pool`: the TritonPool of the namespace whose own objects a new `obj` is named after (`<pool>-pool`,
    rule pool-object-names), if there is one.
    """
    name = obj["metadata"]["name"]
    subject = IDENT.format(name)
    new, errors = _parse(name, obj)
    if new is None:
        return AdmissionVerdict(False, errors, subject=subject)

    others: dict[str, TritonModel] = {}
    warnings: list[str] = []
    for other, body in neighbours.items():
        if other == name:
            continue
        parsed, errs = _parse(other, body)
        if parsed is None:
            warnings.append(f"TritonModel {other} is not valid itself and was left out: {errs[0].path}: {errs[0].message}")
            continue
        others[other] = parsed
    previous = _parse(name, old)[0] if old else None

    def errors_with(model: TritonModel | None) -> list[FieldError]:
        pool = [(IDENT.format(n), m) for n, m in sorted(others.items())]
        if model is not None:
            pool.insert(0, (subject, model))
        return check_models(pool)

    after = errors_with(new)
    own = [e for e in after if e.model == subject]  # a cycle through `obj` always starts there too
    wanted = {IDENT.format(d) for d in dependents if d in others}
    before = {(e.model, e.path, e.message) for e in errors_with(previous) if e.model in wanted}
    broken = [e for e in after if e.model in wanted and (e.model, e.path, e.message) not in before
              and e.rule != "ensemble-cycle"]
    errors = own + broken + _pool_fit(new, subject, others, pool, previous) + triton_name_taken(
        new, subject, on_pool or {}, previous) + (pool_objects_clash(name, clashing_pool, subject)
                                                  if clashing_pool is not None else [])
    return AdmissionVerdict(not errors, errors, [*server_warnings(new.spec.server), *warnings], subject)


_NGC_TAG = re.compile(r"(?:^|/)tritonserver:(?P<yy>\d{2})\.(?P<mm>\d{2})(?:-|$)")


def triton_release_warning(image: str, where: str) -> str | None:
    """A warning if `image` is an NGC tritonserver:YY.MM before the minimum supported release (`api`'s
    MINIMUM_TRITON_RELEASE, which has the fixes of NVIDIA's August 2025 and May 2026 Triton bulletins); None for a
    later one or an image whose tag names no NGC release (a mirror's own tag, a custom build: the admin's call)."""
    tag = _NGC_TAG.search(image)
    if tag is None:
        return None
    release = (int(tag["yy"]), int(tag["mm"]))
    if release >= tuple(int(p) for p in MINIMUM_TRITON_RELEASE.split(".")):
        return None
    lacks = "CVE-2026-24207 (an unauthenticated authentication bypass, NVIDIA bulletin 5828)"
    if release < (25, 7):  # before NVIDIA's August 2025 bulletin too
        lacks += (", of the shared-memory remote-code-execution chain (CVE-2025-23319/-23320/-23334, whose entry point "
                  "the operator restricts to its key) and of CVE-2025-23310/-23311 (a chunked HTTP body overflows the "
                  "stack)")
    return (f"{where}: Triton {tag['yy']}.{tag['mm']} predates {MINIMUM_TRITON_RELEASE}, the oldest release this "
            f"operator supports: it lacks the fixes of {lacks}; use {MINIMUM_TRITON_RELEASE} or later")


def server_warnings(server: Server) -> list[str]:
    """What admission warns of in a TritonModel's or TritonPool's spec.server (allowed, but worth saying): admin APIs
    it opens, and an NGC tritonserver release older than the minimum supported one. An unset image is the operator's
    default, which it checks itself when it starts."""
    out = []
    if server.unrestricted_apis:
        out.append(f"spec.server.unrestrictedApis: Triton's {', '.join(server.unrestricted_apis)} API answers every "
                   "client of the replicas, without the operator's key")
    old = triton_release_warning(server.image, "spec.server.image") if server.image else None
    if old is not None:
        out.append(old)
    return out


def _pool_fit(model: TritonModel, subject: str, others: Mapping[str, TritonModel],
              pool: Mapping[str, Any] | None, previous: TritonModel | None = None) -> list[FieldError]:
    """The model, with the steps it reaches, against one replica of its pool (none to check: no error); and, for a
    step, each ensemble using it (among `others`: the webhook passes the ensembles that use the model, and what
    they reach) with its steps. A step's error that its previous spec had too (the same ensemble already did not fit)
    is not the change's doing, and does not refuse it."""
    if model.spec.pool is None or pool is None or (pool.get("metadata") or {}).get("name") != model.spec.pool:
        return []
    try:
        parsed = TritonPool.model_validate(pool)
    except ValidationError:
        return []  # a pool the API server stored but this version cannot read: the operator says so on it

    def fit(m: TritonModel) -> tuple[list[FieldError], dict[FieldError, str]]:
        models = [(subject, m), *((IDENT.format(n), o) for n, o in sorted(others.items()))]
        steps = {e: ens for ens, e in step_fit(parsed, models) if e.model == subject}
        return [e for e in check_pool_fit(parsed, models) if e.model == subject], steps

    errors, steps = fit(model)
    if not steps or previous is None or previous.spec.pool != model.spec.pool:
        return errors
    before = set(fit(previous)[1].values())
    return [e for e in errors if steps.get(e) not in before]


def _placements(models: Sequence[Mapping[str, Any]], pool: str) -> dict[str, list[str]]:
    """Each model on `pool`, by name: the replicas (pod names) its status.placement records."""
    out: dict[str, list[str]] = {}
    for body in models:
        if (body.get("spec") or {}).get("pool") != pool:
            continue
        placement = (body.get("status") or {}).get("placement")
        if isinstance(placement, list) and placement:
            out[body["metadata"]["name"]] = [str(p) for p in placement]
    return out


def review_pool(obj: Mapping[str, Any], old: Mapping[str, Any] | None,
                models: Sequence[Mapping[str, Any]] = (), clashing_model: bool = False) -> AdmissionVerdict:
    """The verdict on TritonPool `obj` replacing `old` (None on create). `models`: the namespace's TritonModels as
    the API server has them, status included (an update's placed models, and the steps their ensembles reach).
    `clashing_model`: a TritonModel named `<pool>-pool` exists (rule pool-object-names).

    A change is refused for what it strands that the pool as it was did not (an error on a field the old pool
    already had, from a placement made against a larger pool by a lagging review, does not block an unrelated
    change such as a new image)."""
    name = obj["metadata"]["name"]
    subject = POOL_IDENT.format(name)
    try:
        pool = TritonPool.model_validate(obj)
    except ValidationError as exc:
        return AdmissionVerdict(False, from_pydantic(subject, exc), subject=subject)
    errors = check_pool(pool, subject)
    if clashing_model:
        errors += pool_objects_clash(f"{name}{POOL_OBJECTS_SUFFIX}", name, subject)
    warnings: list[str] = server_warnings(pool.spec.server)
    if old is not None and not errors:
        parsed: list[TritonModel] = []
        for body in models:
            model, errs = _parse(body["metadata"]["name"], body)
            if model is None:
                warnings.append(f"TritonModel {body['metadata']['name']} is not valid itself and was left out: "
                                f"{errs[0].path}: {errs[0].message}")
                continue
            parsed.append(model)
        placements = _placements(models, name)
        after = pool_change_problems(pool, parsed, placements)
        try:
            before = {e.path for e in pool_change_problems(TritonPool.model_validate(old), parsed, placements)}
        except ValidationError:
            before = set()
        errors = [e for e in after if e.path not in before]
    return AdmissionVerdict(not errors, errors, warnings, subject)


#: TritonModels read for one review, at most.
MAX_NEIGHBOURS = 256


def reachable(models: Mapping[str, Mapping[str, Any]], start: list[str]) -> dict[str, Mapping[str, Any]]:
    """The bodies of `models` reachable from the names in `start` through ensemble steps (at most
    MAX_NEIGHBOURS of them)."""
    reached, _ = step_graph.closure(start, step_graph.of_bodies(models))
    return {n: models[n] for n in reached[:MAX_NEIGHBOURS]}


#: What `redacted` says instead of an error another model caused: the rule, not the model.
UNTOLD = "does not hold with the TritonModels involved (rule: {rule}); this answer gives no details of other models"
#: What `redacted` says instead of what a pool change would strand: the field, not the models nor their replicas.
UNTOLD_STRANDED = ("would strand models placed on this pool (the operator never moves a serving model); this answer "
                   "gives no details of them")
#: What `redacted` says instead of an error the change would cause in an ensemble that uses it.
UNTOLD_DEPENDENT = "would break an ensemble that uses {name} (rule: {rule})"


def rule_summary(rule: str) -> str:
    return RULES[rule].summary if rule in RULES else "agrees with the other TritonModels of the namespace"


def redacted(verdict: AdmissionVerdict, obj: Mapping[str, Any]) -> AdmissionVerdict:
    """The verdict as told to a caller that has not shown it may read the namespace: nothing in it that `obj` does
    not name.

    An error `obj` shows on its own (the same path and message with no other TritonModel around, such as a step
    that is not defined) is kept as it is. Every other one comes from another model's fields: it keeps its path
    in `obj` and says which rule (`UNTOLD`), not what the other model has; one that `obj` would cause in an
    ensemble using it names neither the ensemble nor its fields (`UNTOLD_DEPENDENT`). Warnings about other models
    are dropped; those about the object's own spec (`server_warnings`, which start with its field path) are kept.
    The verdict itself (allowed or not) stays. A TritonPool's: what a change would strand keeps
    its field, not the models or replicas (`UNTOLD_STRANDED`); the pool's own errors are kept."""
    own = [w for w in verdict.warnings if w.startswith("spec.")]
    if verdict.allowed:
        return AdmissionVerdict(True, warnings=own, subject=verdict.subject)
    if verdict.subject.startswith(POOL_IDENT.format("")):  # a pool's own errors, or the models it would strand
        told_pool = [e if e.rule != POOL_CHANGE else FieldError(e.model, e.path, UNTOLD_STRANDED, e.rule)
                     for e in verdict.errors]
        return AdmissionVerdict(False, list(dict.fromkeys(told_pool)), own, subject=verdict.subject)
    alone = {(e.path, e.message) for e in review(obj, None, {}).errors}
    errors: list[FieldError] = []
    for e in verdict.errors:
        if e.model != verdict.subject:
            told = FieldError(verdict.subject, "spec", UNTOLD_DEPENDENT.format(
                name=obj["metadata"]["name"], rule=rule_summary(e.rule)), e.rule)
        elif (e.path, e.message) in alone:
            told = e
        else:
            told = FieldError(e.model, e.path, UNTOLD.format(rule=rule_summary(e.rule)), e.rule)
        if told not in errors:
            errors.append(told)
    return AdmissionVerdict(False, errors, own, subject=verdict.subject)
