"""Which namespaces are the operator's: its `--namespace` patterns (kopf's syntax: names, globs, `!` excludes) as a
predicate, as the webhook's namespaceSelector, and against the namespaces a LIST found.

Pure. Keeping kopf's set of served namespaces level with the API is `controller.namespaces`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable


def watches(namespaces: list[str], clusterwide: bool) -> Callable[[str], bool]:
    """kopf's namespace patterns (globs, `!` excludes) as a predicate."""
    if clusterwide or not namespaces:
        return lambda ns: True
    include = [p for p in namespaces if not p.startswith("!")]
    exclude = [p[1:] for p in namespaces if p.startswith("!")]
    return lambda ns: any(fnmatch.fnmatchcase(ns, p) for p in include) and not any(
        fnmatch.fnmatchcase(ns, p) for p in exclude)


def has_patterns(namespaces: list[str]) -> bool:
    """Whether any namespace is a glob or an exclusion (kopf then discovers namespaces; else it takes the names)."""
    return any(ch in n for n in namespaces for ch in "*?[!")


def exact_namespaces(namespaces: list[str], clusterwide: bool) -> list[str] | None:
    """The namespaceSelector's list when every pattern is a plain name; else None (every namespace)."""
    if clusterwide or not namespaces or has_patterns(namespaces):
        return None
    return list(namespaces)


def missed(listed: dict[str, bool], served: set[str], watched: Callable[[str], bool]) -> set[str]:
    """Namespaces that exist, are not being deleted, match the patterns, and are not served."""
    return {name for name, terminating in listed.items() if not terminating and watched(name)} - served
