"""Which namespaces are the operator's, and keeping kopf's set of served namespaces level with the API.

With a glob (`--namespace 'team-*'`), kopf finds the matching namespaces itself: one LIST, then a
watch that starts with a LIST of its own whose items it ignores. A namespace created between those
two LISTs is never served until the operator restarts, and a watch that restarts after a "410 Gone"
loses the namespaces created while it was down the same way. `NamespaceSet.revise` runs every drift
round and adds what kopf missed; kopf then starts that namespace's watches as for any new one.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Callable

# kopf takes the insights it serves from as a keyword of kopf.operator(); the class is not re-exported.
from kopf._cogs.structs.references import Insights, NamespaceName

from .kube import Kube

log = logging.getLogger("triton_operator.namespaces")


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


class NamespaceSet:
    """The namespaces kopf serves (its `Insights`, handed to kopf.operator), checked against a LIST."""

    def __init__(self, kube: Kube, namespaces: list[str]) -> None:
        self.kube = kube
        self.watched = watches(namespaces, clusterwide=False)
        self.insights = Insights()

    async def revise(self) -> set[str]:
        """Adds the matching namespaces kopf does not serve; returns them. Removing is left to kopf: a namespace
        that is going away stays served until its objects are gone."""
        listed = await asyncio.to_thread(self.kube.list_namespaces)
        async with self.insights.revised:
            found = missed(listed, {ns for ns in self.insights.namespaces if ns is not None}, self.watched)
            if found:
                self.insights.namespaces.update(NamespaceName(ns) for ns in found)
                self.insights.revised.notify_all()
        for name in sorted(found):
            log.warning("Serving a namespace the namespace watch never reported namespace=%s", name)
        return found
