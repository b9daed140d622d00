"""Field errors: what is wrong, where (a field path such as `spec.batcher.preferredBatchSize[0]`), and why."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import ValidationError


@dataclass(frozen=True, order=True)
class FieldError:
    """One defect in one TritonModel.

    `rule` names the rule (see `validate.rules.RULES`); `triton_enforced` says
    whether a real tritonserver would refuse the rendered config too (True) or
    would load it and misbehave late or silently (False).
    """

    model: str  # "<namespace>/<name>" or "<file>#<doc>" when the name is unknown
    path: str
    message: str
    rule: str = "schema"

    def __str__(self) -> str:
        return f"{self.model}: {self.path}: {self.message}"


def field_path(loc: Iterable[object], prefix: str = "") -> str:
    """`('spec', 'inputs', 0, 'dims', 1)` -> `spec.inputs[0].dims[1]`."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out and str(part).isidentifier():
            out += f".{part}"
        elif out:
            out += f"[{part}]"
        else:
            out = str(part)
    return out


def from_pydantic(model: str, exc: ValidationError, prefix: str = "") -> list[FieldError]:
    errors = []
    for e in exc.errors(include_url=False):
        loc = [
            p
            for p in e["loc"]
            if not (isinstance(p, str) and (p.startswith(("function-", "constrained-")) or p == "[key]"))
        ]
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        errors.append(FieldError(model, field_path(loc, prefix), msg, "schema"))
    return errors
