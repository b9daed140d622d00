"""Whether a live object already holds what the operator wants of it: the one comparison every controller makes
before it applies (server defaults may add fields; only the fields the operator sets count)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def differs(existing: Any, desired: Mapping[str, Any]) -> bool:
    """Whether a child must be applied: it does not exist, or lacks or changed a field we set."""
    return existing is None or not contains(existing, desired)


def contains(existing: Any, desired: Any) -> bool:
    """Whether `existing` already holds every field of `desired` (server defaults may add more). An empty list or
    map the operator sets is held by a field the API server left out or wrote as null: Kubernetes does not tell them
    apart (an EndpointSlice with no endpoint reads back `"endpoints": null`; without this, every round applied it
    again: seen on the real node, issue 41)."""
    if isinstance(desired, dict):
        if not isinstance(existing, dict):
            return False
        return all((_empty(v) and existing.get(k) is None) or (k in existing and contains(existing[k], v))
                   for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(existing, list) or len(existing) != len(desired):
            return False
        return all(contains(e, d) for e, d in zip(existing, desired, strict=True))
    number, text = (int, float), str
    if (isinstance(desired, number) and isinstance(existing, text)) or (isinstance(desired, text) and isinstance(existing, number)):
        return str(existing) == str(desired)
    return bool(existing == desired)


def _empty(value: Any) -> bool:
    return isinstance(value, (list, dict)) and not value
