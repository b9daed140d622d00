"""The admission verdict on one TritonModel change, given the TritonModels around it. Pure.

The CRD schema and its CEL rules refuse what one object shows on its own. What needs
other objects is decided here, for the validating webhook (`servers/webhook.py`):

- the new object passes every rule in `rules.py`, checked together with the models its
  ensemble steps reach (step references, tensor names, types and shapes, batch sizes,
  cycles);
- a change to a model used as an ensemble step does not break an ensemble that uses it
  (an error the ensemble did not have before the change is the change's fault).

Metadata-only updates and objects being deleted are always allowed: garbage collection
and namespace deletion must never be blocked by a model whose step went missing later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..api import steps as step_graph
from ..api.v1alpha1 import TritonModel
from .errors import FieldError, from_pydantic
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
) -> AdmissionVerdict:
    """The verdict on `obj` replacing `old` (None on create).

    `neighbours`: the current bodies of the other TritonModels of the namespace that matter, by
    name: every model reachable through ensemble steps from `obj` and from each of `dependents`.
    `dependents`: names of ensembles whose steps use `obj`.
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
    errors = own + broken
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
    ensemble using it names neither the ensemble nor its fields (`UNTOLD_DEPENDENT`). Warnings, all about other
    models, are dropped. The verdict itself (allowed or not) stays."""
    if verdict.allowed:
        return AdmissionVerdict(True, subject=verdict.subject)
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
    return AdmissionVerdict(False, errors, subject=verdict.subject)
