"""Keeping kopf's set of served namespaces level with the API (which namespaces are the operator's: `platform.namespaces`).

With a glob (`--namespace 'team-*'`), kopf finds the matching namespaces itself: one LIST, then a
watch that starts with a LIST of its own whose items it ignores. A namespace created between those
two LISTs is never served until the operator restarts, and a watch that restarts after a "410 Gone"
loses the namespaces created while it was down the same way. `NamespaceSet.revise` runs every drift
round and adds what kopf missed; kopf then starts that namespace's watches as for any new one.
"""

from __future__ import annotations

import asyncio
import logging

# kopf takes the insights it serves from as a keyword of kopf.operator(); the class is not re-exported.
from kopf._cogs.structs.references import Insights, NamespaceName

from ..platform.kube import Kube
from ..platform.namespaces import missed, watches

log = logging.getLogger("triton_operator.namespaces")


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
