"""Pure status computation: (what was observed) -> a typed `TritonModelStatus`, its conditions and their transitions.

Conditions follow Kubernetes conventions: Ready / Progressing / Degraded with
CamelCase reasons and observedGeneration; lastTransitionTime changes only when
a condition's status flips. Reconciling and Stalled restate Progressing and Degraded
in kstatus' abnormal-true form (see `kstatus_conditions`). Ready, Progressing and Degraded each come from a chain
of small named policies (READY, PROGRESSING, DEGRADED), each `(Seen) -> condition | None`, the first that answers
winning, as in cert-manager's readiness policy chains. The status is the pydantic
model the CRD is generated from, so its shape is written down once. No client here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.pod import (
    ANNOTATION_DIGEST,
    ANNOTATION_LOADED,
    ANNOTATION_PREVIOUS,
    FETCH_CONTAINER,
    TRITON_CONTAINER,
    WARMED_CONDITION,
)
from ..api.timestamps import parse_rfc3339, rfc3339
from ..api.v1alpha1 import Condition, ReplicaState, TritonModelStatus
from ..uris import redact
from .upgrade import UPGRADE_UNSCHEDULABLE, UPGRADE_WAITING, unschedulable

#: The gate's reasons for a replica that does not serve what it loaded: it failed to load, loaded another config, or
#: stopped serving (the probe found a model broken, or tritonserver does not answer); the message says how the
#: operator heals it.
FAILED_GATE_REASONS = ("ModelLoadFailed", "ConfigDigestMismatch", "ModelFailing", "TritonNotAnswering")
#: The line `triton-operator fetch` ends a failure with (and writes to its termination message file).
FETCH_FAILED_PREFIX = "error: fetch failed: "


@dataclass(frozen=True)
class Problem:
    """A reason nothing (new) can be deployed."""

    reason: str
    message: str


@dataclass
class Observed:
    generation: int
    desired_replicas: int
    digest: str | None
    selector: str
    problem: Problem | None = None
    # The API server refused the reconcile's own call (e.g. a 403, a 422): Degraded, while the replicas say the rest.
    api_error: Problem | None = None
    # A replica could not load the desired config in place (`plan.rollout`): the rollout stopped.
    rollout_problem: Problem | None = None
    # An upgrade rollout of the Deployment waits for a slot (`plan.upgrade`): why, naming the count and the bound.
    upgrade_waiting: str | None = None
    deployment: Mapping[str, Any] | None = None
    pods: Sequence[Mapping[str, Any]] = field(default_factory=list)
    # The ensembles whose replicas load this model as a step (directly or through nested ensembles), with their
    # spec.replicas: those with replicas serve it, also when it runs none of its own.
    ensembles: Mapping[str, int] = field(default_factory=dict)
    # The HorizontalPodAutoscaler of spec.autoscaling (None without the block): its ScalingActive condition is ours.
    hpa: Mapping[str, Any] | None = None
    # Triton API categories the spec leaves open to every client (spec.server.unrestrictedApis): AdminApisRestricted.
    opened_apis: Sequence[str] = ()

    @property
    def served_by(self) -> list[str]:
        return sorted(name for name, replicas in self.ensembles.items() if replicas > 0)


def pod_condition(pod: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    conditions: Sequence[Mapping[str, Any]] = (pod.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c.get("type") == ctype), None)


def triton_container_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    statuses: Sequence[Mapping[str, Any]] = (pod.get("status") or {}).get("containerStatuses") or ()
    return next((cs for cs in statuses if cs.get("name") == TRITON_CONTAINER), None)


def gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod was created with the warm-up readiness gate (`warmupGate.enabled`, the default)."""
    return any(g.get("conditionType") == WARMED_CONDITION for g in (pod.get("spec") or {}).get("readinessGates") or ())


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return (pod_condition(pod, "Ready") or {}).get("status") == "True"


def warmed(pod: Mapping[str, Any]) -> bool:
    """Whether the replica serves the config it was created for, warm: its gate condition is True.

    A pod without the gate (`warmupGate.enabled: false`) never gets that condition: nothing is known beyond
    what its own readiness says, so it counts once it is Ready.
    """
    if gated(pod):
        return (pod_condition(pod, WARMED_CONDITION) or {}).get("status") == "True"
    return pod_ready(pod)


def fetch_failure(pod: Mapping[str, Any]) -> str | None:
    """Why the replica's `fetch` init container failed, while it is failing: its current or (restarting, in
    back-off) last termination with a non-zero exit code. The message is fetch's own `error: fetch failed: ...` line
    (its termination message; with FallbackToLogsOnError, the log's tail when a crash wrote none)."""
    for cs in (pod.get("status") or {}).get("initContainerStatuses") or ():
        if cs.get("name") != FETCH_CONTAINER:
            continue
        state = cs.get("state") or {}
        if "running" in state or ("terminated" in state and not state["terminated"].get("exitCode")):
            return None  # fetching again, or done
        ended = state.get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
        if not ended.get("exitCode"):
            return None
        # Redacted here too (a uri's query or userinfo), whoever wrote it: an older fetch, a crash's log tail.
        text = redact((ended.get("message") or "").strip())
        said = [ln[len(FETCH_FAILED_PREFIX):] for ln in text.splitlines() if ln.startswith(FETCH_FAILED_PREFIX)]
        return (said[-1] if said else text.splitlines()[-1] if text else f"exit code {ended['exitCode']}")[:1000]
    return None


def replica_state(pod: Mapping[str, Any]) -> dict[str, Any]:
    """One replica's state for status.replicaStates, from its gate condition (or, without a gate, its
    readiness) and container status."""
    name = pod["metadata"]["name"]
    gate = pod_condition(pod, WARMED_CONDITION)
    cs = triton_container_status(pod)
    out: dict[str, Any] = {"pod": name}
    ann = pod["metadata"].get("annotations") or {}
    # The gate writes the loaded digest only when it differs from the one the pod was created for: a True gate
    # means Triton serves that one.
    loaded = ann.get(ANNOTATION_LOADED) or (ann.get(ANNOTATION_DIGEST) if (gate or {}).get("status") == "True" else None)
    if loaded:
        out["configDigest"] = loaded
    waiting = ((cs or {}).get("state") or {}).get("waiting") or {}
    init_waiting: list[Mapping[str, Any]] = [
        (s.get("state") or {})["waiting"] for s in (pod.get("status") or {}).get("initContainerStatuses") or ()
        if (s.get("state") or {}).get("waiting")
    ]
    if gate and gate.get("status") == "True":
        out.update(state="Ready", reason=gate.get("reason") or "ModelWarmed")
        started = parse_rfc3339((((cs or {}).get("state") or {}).get("running") or {}).get("startedAt"))
        turned = parse_rfc3339(gate.get("lastTransitionTime"))
        if started and turned and turned >= started:
            out["warmupSeconds"] = float((turned - started).total_seconds())
    elif gate and gate.get("reason") in FAILED_GATE_REASONS:
        out.update(state="Failed", reason=gate["reason"], message=gate.get("message", ""))
    elif waiting.get("reason") in ("CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "CreateContainerError"):
        out.update(state="Failed", reason=waiting["reason"], message=waiting.get("message", ""))
    elif (fetch_error := fetch_failure(pod)) is not None:
        out.update(state="Failed", reason="SourceFetchFailed", message=f"fetch: {fetch_error}")
    elif init_waiting and init_waiting[0].get("reason") in ("CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff"):
        out.update(state="Failed", reason=f"Init{init_waiting[0]['reason']}", message=init_waiting[0].get("message", ""))
    elif not gated(pod) and pod_ready(pod):
        out.update(state="Ready", reason="PodReady")
    elif cs and (cs.get("state") or {}).get("running"):
        if gate and gate.get("reason") == "ModelWarming":
            out.update(state="Warming", reason="ModelWarming")
        else:
            out.update(state="Loading", reason=(gate or {}).get("reason") or "TritonStarting")
    else:
        out.update(state="Pending", reason="PodPending")
    return out


def replica_failure(deployment: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The Deployment's `ReplicaFailure` condition while it holds: its ReplicaSet cannot create pods (a quota,
    Pod Security or another admission refused them); the message is the API server's."""
    conditions: Sequence[Mapping[str, Any]] = ((deployment or {}).get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c.get("type") == "ReplicaFailure" and c.get("status") == "True"), None)


def condition(ctype: str, status: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    """A status condition of ours (a TritonModel's, a TritonPool's), as of `generation`."""
    return {
        "type": ctype,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


#: kstatus' standard conditions (sigs.k8s.io/cli-utils/pkg/kstatus), abnormal-true: Flux's health checks and other
#: kstatus readers know them for any kind. They restate Progressing and Degraded, so they get no Events of their own.
RECONCILING, STALLED = "Reconciling", "Stalled"
KSTATUS_CONDITIONS = frozenset({RECONCILING, STALLED})


def kstatus_conditions(progressing: Mapping[str, Any], degraded: Mapping[str, Any], generation: int) -> list[dict[str, Any]]:
    """Reconciling and Stalled from Progressing and Degraded. kstatus reads Ready=False as InProgress, so without
    them a model that cannot get better (Degraded=True) would look like one still rolling out.

    Stalled=True while Degraded=True (kstatus: Failed); Reconciling=True while a rollout moves, Progressing=True,
    and nothing stalls it (kstatus: InProgress, even while Ready=True during the rollout's last steps). At most one
    is True: kstatus takes the first True one it meets.
    """
    stalled = degraded["status"] == "True"
    source = degraded if stalled else progressing
    return [
        condition(RECONCILING, progressing["status"] == "True" and not stalled, source["reason"], source["message"], generation),
        condition(STALLED, stalled, degraded["reason"], degraded["message"], generation),
    ]


#: spec.autoscaling's HPA, restated on the TritonModel: whether it can read its metric and so scale the model.
SCALING_ACTIVE = "ScalingActive"


def scaling_active(hpa: Mapping[str, Any], generation: int) -> dict[str, Any]:
    """The HPA's own ScalingActive condition, on the TritonModel. False says why the HPA does not scale (no server
    answers the metric: FailedGetObjectMetric, with the API server's message), which would otherwise be visible only
    on the HPA; Unknown until the HPA controller has synced it."""
    conditions: Sequence[Mapping[str, Any]] = (hpa.get("status") or {}).get("conditions") or ()
    c = next((c for c in conditions if c.get("type") == SCALING_ACTIVE), None)
    name = (hpa.get("metadata") or {}).get("name", "")
    if c is None:
        return {"type": SCALING_ACTIVE, "status": "Unknown", "reason": "AwaitingHPA",
                "message": f"the HorizontalPodAutoscaler {name} has not reported yet", "observedGeneration": generation}
    return {"type": SCALING_ACTIVE, "status": c.get("status") or "Unknown", "reason": c.get("reason") or "Unknown",
            "message": f"HorizontalPodAutoscaler {name}: {c.get('message') or ''}"[:2000],
            "observedGeneration": generation}


#: Present only when spec.server.unrestrictedApis opens some of Triton's admin APIs: False, saying which.
ADMIN_APIS_RESTRICTED = "AdminApisRestricted"


def admin_apis_open(opened: Sequence[str], generation: int) -> dict[str, Any]:
    """AdminApisRestricted=False: which of Triton's admin API categories every client of the replicas may call."""
    return {"type": ADMIN_APIS_RESTRICTED, "status": "False", "reason": "OpenedInSpec",
            "message": f"spec.server.unrestrictedApis leaves Triton's {', '.join(opened)} API open to every client "
                       "of the replicas, without the operator's key", "observedGeneration": generation}


def zero_replicas(obs: Observed, generation: int) -> dict[str, Any]:
    """Ready at `spec.replicas: 0`: the model runs no replica of its own, so what serves it is the ensembles that
    load it as a step. Ready=True either way: 0 is a state the spec asks for (as a Deployment scaled to 0 is
    available), and GitOps health checks must not wait on it (a step is applied before its ensemble: in an earlier
    Argo CD sync wave, or in a Flux Kustomization the ensemble's one dependsOn); the reason and message say whether
    anything serves it."""
    served = obs.served_by
    if served:
        return condition("Ready", True, "ServedByEnsembles",
                     f"spec.replicas is 0: no replica of its own; served inside the replicas of ensemble(s) "
                     f"{', '.join(served)} (their Services answer for it by name too)", generation)
    idle = sorted(obs.ensembles)
    why = (f"and so is that of every ensemble that uses it ({', '.join(idle)})" if idle
           else "and no ensemble uses it")
    return condition("Ready", True, "ScaledToZero", f"spec.replicas is 0 {why}: nothing serves it", generation)


@dataclass(frozen=True)
class Seen:
    """What the conditions are decided from: the observation, and what it says of the replicas, counted once."""

    obs: Observed
    live: list[Mapping[str, Any]]  # the replicas not being deleted
    states: list[dict[str, Any]]  # their status.replicaStates, by pod name
    # At the desired config: created for it, or told to load it in place and done (not still swapping it in).
    current: list[Mapping[str, Any]]
    warm: list[Mapping[str, Any]]  # of those, the ones that serve it warm
    # Serving = in the Service: the pod is Ready (gate and readiness probe), not only warmed.
    serving: list[Mapping[str, Any]]
    # Without the gate (warmupGate.enabled: false) the pods' readiness is all there is to go by.
    ungated: bool
    failed: list[dict[str, Any]]  # the states of the replicas that failed
    refused: Mapping[str, Any] | None  # the Deployment's ReplicaFailure condition, while it holds

    @classmethod
    def of(cls, obs: Observed) -> Seen:
        live = [p for p in obs.pods if not p["metadata"].get("deletionTimestamp")]
        states = sorted((replica_state(p) for p in live), key=lambda s: s["pod"])
        current = [p for p in live if (p["metadata"].get("annotations") or {}).get(ANNOTATION_DIGEST) == obs.digest
                   and ANNOTATION_PREVIOUS not in (p["metadata"].get("annotations") or {})]
        warm = [p for p in current if warmed(p)]
        return cls(obs=obs, live=live, states=states, current=current, warm=warm,
                   serving=[p for p in warm if pod_ready(p)], ungated=bool(current) and not any(gated(p) for p in current),
                   failed=[s for s in states if s["state"] == "Failed"], refused=replica_failure(obs.deployment))

    @property
    def n(self) -> int:
        return self.obs.desired_replicas

    @property
    def g(self) -> int:
        return self.obs.generation

    @property
    def refused_reason(self) -> str:
        return str((self.refused or {}).get("reason") or "FailedCreate")

    @property
    def refused_message(self) -> str:
        return f"the Deployment's ReplicaSet cannot create pods: {(self.refused or {}).get('message', '')}"[:2000]

    @property
    def rolling(self) -> bool:
        """A rollout is under way while some replica is not at the desired config, or the Deployment has not yet
        made what it asks for (a new ReplicaSet's pods, a scale); a replica at the desired config that stopped
        serving is not one (Degraded says so, Ready counts it out)."""
        return (len(self.current) < len(self.live) or len(self.live) != self.n
                or (len(self.serving) < self.n and not any(s["state"] == "Failed" for s in self.states)))


#: A policy decides one condition, or passes (None) to the next in its chain; the first that answers wins. In the
#: shape of cert-manager's readiness policy chains. Each chain ends with one that always answers.
Policy = Callable[[Seen], dict[str, Any] | None]


def _first(chain: Sequence[Policy], seen: Seen) -> dict[str, Any]:
    for policy in chain:
        condition = policy(seen)
        if condition is not None:
            return condition
    raise AssertionError(f"no policy of {[p.__name__ for p in chain]} answered")  # each chain's last always does


# Every condition: a spec that cannot be deployed says so on each.

def ready_spec_problem(s: Seen) -> dict[str, Any] | None:
    p = s.obs.problem
    return condition("Ready", False, p.reason, p.message, s.g) if p is not None else None


def progressing_spec_problem(s: Seen) -> dict[str, Any] | None:
    p = s.obs.problem
    return condition("Progressing", False, p.reason, p.message, s.g) if p is not None else None


def degraded_spec_problem(s: Seen) -> dict[str, Any] | None:
    p = s.obs.problem
    return condition("Degraded", True, p.reason, p.message, s.g) if p is not None else None


# Ready.

def ready_at_zero(s: Seen) -> dict[str, Any] | None:
    return zero_replicas(s.obs, s.g) if s.n == 0 else None


def ready_all_ready_ungated(s: Seen) -> dict[str, Any] | None:
    if len(s.serving) < s.n or not s.ungated:
        return None
    return condition("Ready", True, "AllReplicasReady",
                 f"{len(s.serving)}/{s.n} replicas at the desired config are Ready (warm-up gate disabled)", s.g)


def ready_all_warmed(s: Seen) -> dict[str, Any] | None:
    if len(s.serving) < s.n:
        return None
    return condition("Ready", True, "AllReplicasWarmed", f"{len(s.serving)}/{s.n} replicas serve the desired config, warm", s.g)


def not_ready_rollout_stopped(s: Seen) -> dict[str, Any] | None:
    stopped = s.obs.rollout_problem
    if not stopped:
        return None
    return condition("Ready", False, stopped.reason, f"{len(s.serving)}/{s.n} replicas serve the desired config; "
                 f"{stopped.message}"[:2000], s.g)


def not_ready_replica_failed(s: Seen) -> dict[str, Any] | None:
    if not s.failed:
        return None
    first = s.failed[0]
    why = f"{len(s.warm)}/{s.n} replicas warmed; {first['pod']}: {first.get('message', '')}".strip()
    return condition("Ready", False, first["reason"], why, s.g)


def not_ready_pods_refused(s: Seen) -> dict[str, Any] | None:
    if not s.refused:
        return None
    return condition("Ready", False, s.refused_reason, f"{len(s.serving)}/{s.n} Ready; {s.refused_message}", s.g)


def not_ready_ungated_starting(s: Seen) -> dict[str, Any] | None:
    if not s.ungated:
        return None
    return condition("Ready", False, "ReplicasStarting",
                 f"{len(s.serving)}/{s.n} replicas at the desired config Ready (warm-up gate disabled)", s.g)


def not_ready_warming(s: Seen) -> dict[str, Any]:
    reason = "ReplicasJoining" if len(s.warm) >= s.n else "ReplicasWarming"  # warm, waiting for pod Ready
    return condition("Ready", False, reason, f"{len(s.warm)}/{s.n} replicas warmed, {len(s.serving)}/{s.n} Ready", s.g)


READY: tuple[Policy, ...] = (
    ready_spec_problem, ready_at_zero, ready_all_ready_ungated, ready_all_warmed, not_ready_rollout_stopped,
    not_ready_replica_failed, not_ready_pods_refused, not_ready_ungated_starting, not_ready_warming,
)


# Progressing.

def stalled_rollout_stopped(s: Seen) -> dict[str, Any] | None:
    stopped = s.obs.rollout_problem
    if not (s.rolling and stopped):
        return None
    return condition("Progressing", False, "RolloutStalled", stopped.message[:2000], s.g)


def upgrade_waiting(s: Seen) -> dict[str, Any] | None:
    """An operator upgrade's new pod template waits for a slot (`plan.upgrade`): on its way, not in trouble."""
    waiting = s.obs.upgrade_waiting
    return condition("Progressing", True, UPGRADE_WAITING, waiting[:2000], s.g) if waiting else None


def upgrade_unschedulable(s: Seen) -> dict[str, Any] | None:
    """An upgrade rollout's new pod waits for room no node has (a surge GPU on a full cluster, `plan.upgrade`): still
    on its way, its old replicas serving, but said, with the scheduler's words, rather than a silent RollingOut."""
    why = unschedulable(s.obs.deployment, s.obs.pods)
    return condition("Progressing", True, UPGRADE_UNSCHEDULABLE, why, s.g) if why else None


def rolling_out(s: Seen) -> dict[str, Any] | None:
    if not s.rolling or s.failed or s.refused:
        return None
    return condition("Progressing", True, "RollingOut", f"{len(s.warm)}/{s.n} replicas at config {s.obs.digest} warmed", s.g)


def stalled_replica_failed(s: Seen) -> dict[str, Any] | None:
    if not (s.rolling and s.failed):
        return None
    first = s.failed[0]
    return condition("Progressing", False, "RolloutStalled", f"replica {first['pod']} failed: {first['reason']}", s.g)


def stalled_pods_refused(s: Seen) -> dict[str, Any] | None:
    # Rolling, and the policies before it did not answer: nothing failed and nothing stopped it, the ReplicaSet's
    # pods were refused.
    return condition("Progressing", False, "RolloutStalled", s.refused_message, s.g) if s.rolling else None


def complete_at_zero(s: Seen) -> dict[str, Any] | None:
    if s.n != 0:
        return None
    return condition("Progressing", False, "RolloutComplete",
                 f"no replica of its own to roll out (spec.replicas is 0); config {s.obs.digest}", s.g)


def complete_with_failures(s: Seen) -> dict[str, Any] | None:
    if not s.failed:
        return None
    return condition("Progressing", False, "RolloutComplete",
                 f"no rollout under way: every replica runs config {s.obs.digest}; {len(s.failed)} of them "
                 "do not serve (see Degraded)", s.g)


def complete(s: Seen) -> dict[str, Any]:
    return condition("Progressing", False, "RolloutComplete", f"all replicas serve config {s.obs.digest}", s.g)


PROGRESSING: tuple[Policy, ...] = (
    progressing_spec_problem, upgrade_waiting, stalled_rollout_stopped, upgrade_unschedulable, rolling_out,
    stalled_replica_failed, stalled_pods_refused, complete_at_zero, complete_with_failures, complete,
)


# Degraded.

def degraded_api_error(s: Seen) -> dict[str, Any] | None:
    e = s.obs.api_error
    return condition("Degraded", True, e.reason, e.message[:2000], s.g) if e is not None else None


def degraded_rollout_stopped(s: Seen) -> dict[str, Any] | None:
    stopped = s.obs.rollout_problem
    return condition("Degraded", True, stopped.reason, stopped.message[:2000], s.g) if stopped else None


def degraded_replica_failed(s: Seen) -> dict[str, Any] | None:
    if not s.failed:
        return None
    f = s.failed[0]
    return condition("Degraded", True, f["reason"], f"{f['pod']}: {f.get('message') or f['reason']}", s.g)


def degraded_pods_refused(s: Seen) -> dict[str, Any] | None:
    return condition("Degraded", True, s.refused_reason, s.refused_message, s.g) if s.refused else None


def as_expected(s: Seen) -> dict[str, Any]:
    return condition("Degraded", False, "AsExpected", "no replica has failed", s.g)


DEGRADED: tuple[Policy, ...] = (
    degraded_spec_problem, degraded_api_error, degraded_rollout_stopped, degraded_replica_failed,
    degraded_pods_refused, as_expected,
)


def compute_status(obs: Observed, previous: Mapping[str, Any] | None, now: dt.datetime | None = None) -> TritonModelStatus:
    """The whole status the operator wants, with lastTransitionTime carried over when unchanged (else `now`).
    Ready, Progressing and Degraded each come from their chain of policies (READY, PROGRESSING, DEGRADED)."""
    seen = Seen.of(obs)
    g = obs.generation
    conds = [_first(READY, seen), _first(PROGRESSING, seen), _first(DEGRADED, seen)]
    conds += kstatus_conditions(conds[1], conds[2], g)
    if obs.hpa is not None:
        conds.append(scaling_active(obs.hpa, g))
    if obs.opened_apis:
        conds.append(admin_apis_open(obs.opened_apis, g))

    prev_conds = {c.get("type"): c for c in (previous or {}).get("conditions") or ()}
    stamp = rfc3339(now)
    for c in conds:
        old = prev_conds.get(c["type"])
        held = old is not None and old.get("status") == c["status"] and old.get("lastTransitionTime")
        c["lastTransitionTime"] = old["lastTransitionTime"] if held and old is not None else stamp
    dep_status = (obs.deployment or {}).get("status") or {}
    return TritonModelStatus(
        observed_generation=g,
        conditions=[Condition.model_validate(c) for c in conds],
        replicas=int(dep_status.get("replicas", len(seen.live)) or 0),
        # From the pods, as the conditions are: the Deployment's own count lags them by a controller sync.
        ready_replicas=sum(1 for p in seen.live if pod_ready(p)),
        warmed_replicas=len(seen.warm),
        selector=obs.selector,
        replica_states=[ReplicaState.model_validate(s) for s in seen.states],
        config_digest=obs.digest or None,
        served_by=obs.served_by or None,
    )


def as_dict(status: TritonModelStatus) -> dict[str, Any]:
    """The status as the API server stores it (camelCase, unset fields left out)."""
    return status.model_dump(by_alias=True, exclude_none=True)


def status_changed(old: Mapping[str, Any] | None, new: TritonModelStatus | Mapping[str, Any]) -> bool:
    """Whether writing `new` would change the stored status `old` (lastTransitionTime included: it is carried
    over for a condition whose status holds, so an unchanged status compares equal)."""
    return dict(old or {}) != (as_dict(new) if isinstance(new, TritonModelStatus) else dict(new))


def merge_patch(old: Mapping[str, Any] | None, new: TritonModelStatus) -> dict[str, Any]:
    """A JSON merge patch from `old` to `new`: the new fields, and null for each field no longer reported."""
    patch: dict[str, Any] = as_dict(new)
    for k in old or {}:
        if k not in patch:
            patch[k] = None
    return patch


def transitions(old: Mapping[str, Any] | None, new: TritonModelStatus | Mapping[str, Any]) -> list[dict[str, Any]]:
    """Conditions whose status or reason changed: each becomes an Event (Reconciling and Stalled, which restate
    Progressing and Degraded, are left out).

    A model's first status is news only through its Ready condition, Degraded if it is True, and AdminApisRestricted
    (present only when the spec opens an admin API, a warning worth one Event): that the new
    model progresses and is not degraded is what every creation says, and two more Events per model were two of
    the seven API writes a new model cost (issue 17)."""
    new_dict = as_dict(new) if isinstance(new, TritonModelStatus) else new
    prev = {c.get("type"): c for c in (old or {}).get("conditions") or ()}
    out = []
    for c in new_dict.get("conditions") or ():
        if c["type"] in KSTATUS_CONDITIONS:
            continue
        if not prev and c["type"] not in ("Ready", ADMIN_APIS_RESTRICTED) and not (c["type"] == "Degraded"
                                                                                   and c["status"] == "True"):
            continue
        p = prev.get(c["type"])
        if p is None or p.get("status") != c["status"] or p.get("reason") != c["reason"]:
            out.append(c)
    return out
