"""The bound on upgrade rollouts, pure: an operator upgrade must not roll every model's Deployment at once.

A new operator version may render another pod template for a TritonModel nobody changed (a probe's argument, a
volume, a new default image). Applied at once everywhere, every Deployment rolls in the same minute: a fleet-wide
cold start, and a surge GPU per model. So such a change is an *upgrade rollout*, and at most `Upgrades.limit` of
them are under way at once, cluster-wide (`run --max-upgrade-rollouts`, the chart's `upgrade.maxModelsRolling`).

When a Deployment change is an upgrade rollout (`bound_deployment`): the desired pod template differs from the live
Deployment's, the live Deployment has replicas (at 0 a new template makes no pod), and what the template is
rendered from did not change since that template was applied. What it is rendered from, of the user's: the
TritonModel's spec and the specs of the ensemble steps it loads, each without `replicas` (`source_digest`). The
Deployment's metadata.labels record it (LABEL_SOURCE, and the model's generation in LABEL_GENERATION for people to
read); the pod template does not, so recording it rolls nothing. Labels, not annotations: the API server bumps a
Deployment's metadata.generation on any change of its annotations (it copies them onto the ReplicaSets), so a record
there moved the generation with every spec change, an in-place reload too; a label change moves nothing (the
Deployment's own labels are neither its selector nor its pod template's). Hence values a label takes: a 16-hex
digest, the generation's digits, the start in Unix seconds. Not the model's generation alone: a scale subresource write (an
HPA, `kubectl scale`) bumps it too, and every autoscaled model would escape the bound at its next scale; and an
ensemble's template changes with its steps' specs while its own generation stays. A change of that source is the
user's: it rolls as it always did, unbounded.

A Deployment written by an operator from before this record has no LABEL_SOURCE. It counts as unchanged when
the TritonModel's status.observedGeneration equals its metadata.generation: the older operator reconciled the
current spec, so its live template was rendered from it. That is the conservative side: the other reading (no
record: the user's change, unbounded) would roll the whole fleet on the very upgrade that brings the bound. What
it can get wrong is a spec change the older operator recorded in the status but failed to apply, or a step's spec
changed while no operator ran: such a change waits its turn like an upgrade rollout, delayed, not lost.

A Deployment is in an upgrade rollout from the apply that started one (LABEL_STARTED: when) until its rollout
is finished (`rollout_finished`: the Deployment controller saw the template, and every replica is updated and
available, as `kubectl rollout status` judges), and then while a pod of its model still terminates (`draining`: the
GPU a replaced pod holds is not free before it is gone). The count is read back from the Deployments the operator sees
(`upgrade_rollouts`), so a restarted operator counts what is still rolling. A rollout that never finishes (a new
template whose pods cannot start) holds its slot: a broken operator version stops at `limit` models. A later change
of the user's drops LABEL_STARTED (the plan leaves it out, and server-side apply removes what its field manager
no longer sets), and so frees the slot.

A model that waits keeps its live template and the live record, says so on its status (Progressing=True, reason
UPGRADE_WAITING) and is reconciled again when a slot frees (`controller.reconcile`). Its other children are applied
as usual; its Deployment only when something else of it changed (its replicas: a scale): with the live template,
which the webhook on the operator's own writes (`validate.operator_writes`) refuses when the upgrade changed what a
replica may use (the default tritonserver image, the repository key's Secret, the token's automount). The model then
says Degraded, reason ApiError, and takes the new replica count when its turn comes. Its record is not rewritten
while it waits: it still says what the live template was rendered from.

How an upgrade rollout replaces replicas (`upgrade_strategy`). A model's Deployment rolls with maxSurge 1,
maxUnavailable 0 as rendered: a new replica is created and warmed before an old one goes, which needs one GPU more
than the model holds. On a cluster whose GPUs are all in use that surge pod stays Pending (Unschedulable) and the
rollout, with the slot it holds, waits until a GPU frees. So an upgrade rollout of a Deployment with 2 replicas or
more replaces them one at a time without a surge (maxSurge 0, maxUnavailable 1), as Strimzi rolls its brokers and
CloudNativePG its instances, one member at a time in the room the members already hold: an old replica leaves the
Service (its preStop drain), and its replacement takes the GPU it frees and joins the Service once its warm-up gate
passes, only then the next. The cost: the model serves on one replica fewer (n-1 of n) for the whole rollout, about
n times a replica's drain, start, load and warm-up; never more than n pods, so no GPU beyond its own. The
replacement is created as the old pod starts terminating, and the scheduler counts that pod's GPU until it is gone:
the replacement is Pending for that time, waiting for its own model's GPU, not for a spare one. The strategy stays
while the record's LABEL_STARTED does (until the user's next change, which renders the surge strategy again):
changing a Deployment's strategy rolls no pod (it is not in its pod template), and a strategy that flipped back at
the rollout's end would be a write per model and a start of the next upgrade's rollout with a surge. A user's own
change always rolls with the surge: it is the user's to pay for, and it keeps every replica serving.

A Deployment of 1 replica keeps the surge during an upgrade rollout: without it the model would serve nothing
from the old pod's drain until the new one is warm. If its surge pod cannot be scheduled (`unschedulable`: Pending
as Unschedulable, with no pod of the model terminating whose GPU it waits for), the model says so on its status
(Progressing=True, reason UPGRADE_UNSCHEDULABLE, the scheduler's message naming what is missing) and keeps its slot:
freed, the next model's pods would compete for the same GPU when one frees, and the one Pending first would still
hold it. Its old replica keeps serving throughout. For the same reason, while an upgrade rollout cannot schedule
its new pod (`Upgrades.stuck`), no other starts, below the bound too: its pod would wait for the same room, or take
the GPU a no-surge replacement waits for (the scheduler gives a freed GPU to the pod Pending first).
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api import steps as step_graph
from ..api.kinds import DEPLOYMENT
from ..api.v1alpha1 import GROUP
from .compare import contains

#: A label of the Deployment (its metadata, never its selector or pod template): a digest of the specs its template
#: was rendered from (16 hex digits).
LABEL_SOURCE = f"{GROUP}/rendered-from-spec"
#: A label of the Deployment: the TritonModel's metadata.generation it was last applied for (for people; not compared).
LABEL_GENERATION = f"{GROUP}/rendered-from-generation"
#: A label of the Deployment: when the operator started an upgrade rollout of it (Unix seconds).
LABEL_STARTED = f"{GROUP}/upgrade-rollout-started"

#: The whole record, as a waiting Deployment keeps it.
RECORD = (LABEL_SOURCE, LABEL_GENERATION, LABEL_STARTED)

#: The Progressing reason of a model whose upgrade rollout waits for a slot; the Event's reason when one starts.
UPGRADE_WAITING = "UpgradeRolloutWaiting"
UPGRADE_STARTED = "UpgradeRolloutStarted"
#: The Progressing reason of a model whose upgrade rollout's new pod cannot be scheduled (no GPU free for the surge).
UPGRADE_UNSCHEDULABLE = "UpgradeRolloutUnschedulable"
#: The Event's reason when a TritonPool's upgrade rollout goes on without the surge pod it could not schedule.
ROLLING_WITHOUT_SURGE = "UpgradeRolloutWithoutSurge"

#: The strategy of an upgrade rollout of a Deployment of 2 replicas or more: one replica at a time, no surge pod.
NO_SURGE = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}

DeploymentKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Upgrades:
    """The bound, and the Deployments that count against it."""

    limit: int = 0  # at most this many upgrade rollouts at once, cluster-wide; 0: no bound
    rolling: frozenset[DeploymentKey] = frozenset()  # the Deployments in an unfinished upgrade rollout
    # Those of `rolling` whose new pod cannot be scheduled (`unschedulable`): while any is, no other starts.
    stuck: frozenset[DeploymentKey] = frozenset()


@dataclass(frozen=True)
class Upgrade:
    """What the bound decided for one model's Deployment: an upgrade rollout starts now, or waits for a slot."""

    started: bool
    message: str


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def rollout_finished(deployment: Mapping[str, Any]) -> bool:
    """Whether the Deployment's rollout is over, as `kubectl rollout status` judges it: the controller has seen the
    latest spec, and every wanted replica is updated and available, with no replica of an older template left."""
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    wanted = _int(spec.get("replicas", 1))
    updated = _int(status.get("updatedReplicas"))
    return (_int(status.get("observedGeneration")) >= _int((deployment.get("metadata") or {}).get("generation"))
            and updated >= wanted and _int(status.get("replicas")) == updated
            and _int(status.get("availableReplicas")) >= updated)


def in_upgrade_rollout(deployment: Mapping[str, Any]) -> bool:
    """Whether the Deployment counts against the bound: an upgrade rollout of it started and has not finished."""
    return LABEL_STARTED in _labels(deployment) and not rollout_finished(deployment)


def draining(deployment: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a Deployment whose upgrade rollout started (LABEL_STARTED) still holds its slot after its rollout
    finished: a pod of the model is still terminating (its preStop drain, tritonserver's exit), and keeps what it was
    given, its GPU included, until it is gone. Freed at the rollout's end, the slot let the next model's surge pod be
    created while that GPU was still taken: on a node with one GPU for the bound's one surge, two surge pods went
    Pending as Unschedulable in e2e/test_upgrade.py (the signal a cluster autoscaler adds nodes on)."""
    return LABEL_STARTED in _labels(deployment) and any((p.get("metadata") or {}).get("deletionTimestamp")
                                                        for p in pods)


def unschedulable(deployment: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]],
                  owner: str = "model") -> str | None:
    """Why an upgrade rollout of `deployment` (LABEL_STARTED, unfinished) does not move, if it waits for room: a pod
    of the model Pending as Unschedulable (the scheduler's message: which resource no node has free), while no pod
    of the model terminates (a replacement waits for the GPU its own replaced pod is giving back: on its way).
    `owner`: what the message says holds the slot ("model", or "pool" for a TritonPool's Deployment)."""
    if deployment is None or not in_upgrade_rollout(deployment):
        return None
    pods = list(pods)
    if any((p.get("metadata") or {}).get("deletionTimestamp") for p in pods):
        return None
    for p in pods:
        status = p.get("status") or {}
        scheduled: Mapping[str, Any] = next(
            (c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"), {})
        if status.get("phase") == "Pending" and scheduled.get("status") == "False" \
                and scheduled.get("reason") == "Unschedulable":
            replicas = _int((deployment.get("spec") or {}).get("replicas", 1))
            return (f"the upgrade rollout's new pod {p['metadata'].get('name', '')} cannot be scheduled: "
                    f"{scheduled.get('message') or 'Unschedulable'}. "
                    f"{'Its other replicas keep' if replicas > 1 else 'Its old replica keeps'} serving; the {owner} "
                    "holds its upgrade slot until there is room for it (a GPU freed, or a node added)")[:2000]
    return None


def upgrade_strategy(out: dict[str, Any], live: Mapping[str, Any], no_surge: bool = True) -> dict[str, Any]:
    """`out` with the strategy an upgrade rollout takes: while its record holds LABEL_STARTED and it has 2 replicas
    or more (those it is applied with, else the live ones), NO_SURGE; otherwise the rendered strategy (a surge).
    Not with `no_surge` False: a TritonPool's replicas hand their copies over to the surge pod before they go
    (`plan.pool.rollout`); without one, a replica would go before its copies serve elsewhere."""
    replicas = (out.get("spec") or {}).get("replicas", (live.get("spec") or {}).get("replicas", 1))
    if no_surge and LABEL_STARTED in _labels(out) and _int(replicas) >= 2:
        out["spec"] = {**out["spec"], "strategy": copy.deepcopy(NO_SURGE)}
    return out


def upgrade_rollouts(deployments: Iterable[Mapping[str, Any]]) -> frozenset[DeploymentKey]:
    """The Deployments among `deployments` in an unfinished upgrade rollout: the count, rebuilt from the world."""
    return frozenset((d["metadata"]["namespace"], d["metadata"]["name"]) for d in deployments
                     if d.get("kind", DEPLOYMENT.kind) == DEPLOYMENT.kind and in_upgrade_rollout(d))


def _spec_without_replicas(body: Mapping[str, Any]) -> dict[str, Any]:
    spec = body.get("spec")
    return {k: v for k, v in spec.items() if k != "replicas"} if isinstance(spec, Mapping) else {}


def source_digest(body: Mapping[str, Any], models: Mapping[str, Mapping[str, Any]]) -> str:
    """A digest of what of the user's a model's pod template is rendered from: its spec and the specs of every
    ensemble step it reaches, each without `replicas` (a scale is no change of the template)."""
    name = body["metadata"]["name"]
    specs = {name: _spec_without_replicas(body)}
    steps = step_graph.steps_of(body)
    if steps:
        def graph(n: str) -> Iterable[str] | None:
            return steps if n == name else step_graph.of_bodies(models)(n)

        reached, _ = step_graph.closure(name, graph)
        specs.update({n: _spec_without_replicas(models[n]) for n in reached if n != name})
    return hashlib.sha256(json.dumps(specs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _same_source(live: Mapping[str, Any], body: Mapping[str, Any], source: str) -> bool:
    """Whether the live template was rendered from what the model is now (see the module's docstring for a
    Deployment without the record)."""
    recorded = _labels(live).get(LABEL_SOURCE)
    if recorded is not None:
        return recorded == source
    generation = (body.get("metadata") or {}).get("generation")
    return generation is not None and (body.get("status") or {}).get("observedGeneration") == generation


def _template_differs(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    return not contains((live.get("spec") or {}).get("template"), desired["spec"]["template"])


def bound_deployment(desired: Mapping[str, Any], live: Mapping[str, Any] | None, body: Mapping[str, Any],
                     source: str, upgrades: Upgrades, now: dt.datetime,
                     no_surge: bool = True) -> tuple[dict[str, Any], Upgrade | None]:
    """The Deployment to apply, with its record (labels LABEL_SOURCE, LABEL_GENERATION), and what the bound decided:
    None when this is no upgrade rollout (nothing to roll, a new Deployment, or the user's own change). Only the
    Deployment's own labels take the record: its annotations, selector and pod template stay as rendered. `body`:
    the TritonModel, or the TritonPool whose Deployment it is (`no_surge` False: see `upgrade_strategy`)."""
    out = copy.deepcopy(dict(desired))
    meta = out["metadata"] = dict(out["metadata"])
    labels = meta["labels"] = dict(meta.get("labels") or {})
    labels[LABEL_SOURCE] = source
    generation = (body.get("metadata") or {}).get("generation")
    labels[LABEL_GENERATION] = str(generation) if isinstance(generation, int) else ""
    if live is None:
        return out, None
    started = _labels(live).get(LABEL_STARTED)
    if not _template_differs(live, out):
        if started is not None:  # still counted until it finishes: keep it (an apply leaving it out removes it)
            labels[LABEL_STARTED] = started
        return upgrade_strategy(out, live, no_surge), None
    if not _same_source(live, body, source) or _int((live.get("spec") or {}).get("replicas", 1)) == 0:
        return out, None
    key = (live["metadata"].get("namespace", ""), live["metadata"]["name"])
    what = "pool" if body.get("kind") == "TritonPool" else "model"
    others = upgrades.rolling - {key}
    bound = f"{len(others)} of at most {upgrades.limit} Deployments are in an upgrade rollout"
    blocked = sorted(upgrades.stuck - {key}) if upgrades.limit else []
    if blocked:
        bound = (f"the upgrade rollout of {', '.join(f'{ns}/{n}' for ns, n in blocked[:3])} cannot schedule its new "
                 "pod (no room on the nodes: its status says what is missing), and none starts until it can (a pod "
                 "started now would compete for the same room); " + bound)
    if upgrades.limit and key not in upgrades.rolling and (len(others) >= upgrades.limit or blocked):
        # The live template, and the live record (whatever of it there is): written only if something else changed.
        out["spec"] = {**out["spec"], "template": copy.deepcopy(live["spec"]["template"])}
        for k in RECORD:
            labels.pop(k, None)
            if k in _labels(live):
                labels[k] = _labels(live)[k]
        return upgrade_strategy(out, live, no_surge), Upgrade(
            False, f"the operator renders another pod template for this unchanged {what}; {bound} "
                   "(--max-upgrade-rollouts): it waits for one to finish, its replicas keep serving")
    # One under way that takes a newer template keeps its slot and its start.
    labels[LABEL_STARTED] = started if started is not None and in_upgrade_rollout(live) else str(int(now.timestamp()))
    limit = f"{bound} besides it" if upgrades.limit else "no bound on upgrade rollouts (--max-upgrade-rollouts 0)"
    out = upgrade_strategy(out, live, no_surge)
    how = ("one replica at a time, without a surge pod" if out["spec"].get("strategy") == NO_SURGE
           else "with a surge pod (its one replica serves until the new one is warm)" if no_surge
           else "one replica at a time with a surge pod, each old one going once its copies serve elsewhere")
    return out, Upgrade(True, f"the operator renders another pod template for this unchanged {what}: its Deployment "
                              f"rolls to it now, {how}; {limit}")
