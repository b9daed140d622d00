"""Field errors: what is wrong, where (a field path such as `spec.batcher.preferredBatchSize[0]`), and why."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import ValidationError

from ..api.v1alpha1 import MODEL_NAME_RULE


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


#: Pydantic's errors for a value of the wrong JSON type (in strict mode, a string or a boolean for a number).
_STRICT_TYPES = frozenset({"int_type", "float_type", "bool_type", "string_type"})


def from_pydantic(model: str, exc: ValidationError, prefix: str = "") -> list[FieldError]:
    errors = []
    for e in exc.errors(include_url=False):
        loc = [
            p
            for p in e["loc"]
            if not (isinstance(p, str) and (p.startswith(("function-", "constrained-")) or p == "[key]"))
        ]
        msg = e["msg"]
        if e["type"] in _STRICT_TYPES:  # strict: "8" is no integer; say what was given
            msg = f"{msg}, got {type(e['input']).__name__} {e['input']!r}"[:300]
        elif loc == ["metadata", "name"] and e["type"] in ("string_pattern_mismatch", "string_too_long"):
            msg = f"{MODEL_NAME_RULE}, got {e['input']!r}"
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        errors.append(FieldError(model, field_path(loc, prefix), msg, "schema"))
    return errors
