"""The warm-up gate: a pod readiness-gate condition that turns True only when its Triton
serves the desired config (model and every ensemble step READY, loaded digest equal to
the one the pod was created for, asked over its HTTP port, which tritonserver opens after
gRPC) and warm-up is over.

One asyncio task per pod whose tritonserver container is running. While Triton
still refuses connections (it opens its ports only once its models are loaded and
warm) it tries a TCP connect every 20 ms, and asks over HTTP as soon as one is
accepted; with the port open it polls at the pod's interval while the replica
warms, backs off once it is stable, and is woken at once by any event on its pod
(a crash flips the gate within one round trip). Concurrent checks are
bounded, and so is the rate of connects over all pods, so cost stays flat with
hundreds of pods.

Serving, not only READY (issue 33). The pod's `probe` container checks every model the replica serves, all the
time, and fails the container's readiness the moment one is broken (a dead Python stub, a model unloaded, failures
with no success); the kubelet takes the replica out of the Service with no operator in the path. That readiness
change is a pod event: the gate then asks the probe what is broken (`GET /status`), sets the gate False with the
reason (ModelFailing), and heals the replica (`controller.heal`): the broken models are unloaded and loaded
again with the desired config. Heals of one pod back off (HEAL_BACKOFF), so a config that can never load is retried, and
says why, without looping hot.

When a reload is not enough, the pod is deleted (its ReplicaSet makes a new one): a replica that served and whose
heal failed, or that broke again within REPEAT_WINDOW of a heal (each heal leaves the dead copy in memory). Never more
replicas of one model out of the Service at once than its rollout.maxUnavailable allows, counting the one deleted;
and the deletions of one model's replicas back off (DELETE_BACKOFF), so a model that keeps breaking is replaced
more and more slowly rather than churned.

The gate's other parts (the pod's gate and probe container, the verdicts, the calls to Triton) live where `api.pod`
says.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..api.kinds import LABEL_MODEL
from ..api.pod import (
    ANNOTATION_DIGEST,
    ANNOTATION_LOADED,
    ANNOTATION_POLL_MS,
    ANNOTATION_PREVIOUS,
    ANNOTATION_RELOAD,
    ANNOTATION_TRITON_NAME,
    ANNOTATION_VERSIONS,
    GRPC_PORT,
    HTTP_PORT,
    NOT_LOADED,
    PROBE_CONTAINER,
    PROBE_PORT,
    TRITON_CONTAINER,
    WARMED_CONDITION,
    parse_versions_annotation,
    steps_of,
)
from ..api.timestamps import rfc3339, utc_now
from ..plan.readiness import GateWrite, gate_condition, loaded_to_record, message_refresh_due, with_condition
from ..plan.status import pod_condition, pod_ready, triton_container_status
from ..platform.kube import Kube
from ..triton.probe import notify_gate, probe_status
from ..triton.replica import ReplicaVerdict, check_replica, port_open
from . import metrics
from .heal import TRITONSERVER, Healed, reload_models, to_reload
from .reload import reload_replica
from .tasks import detached

log = logging.getLogger("triton_operator.gate")

STABLE_BACKOFF = (1.0, 2.0, 5.0)
#: A replica whose answers are over the read cap (`triton.rest.MAX_ANSWER`: a server that is no Triton, or a hostile
#: image) costs the operator that many bytes each round: its rounds double from the poll interval up to this.
OVERSIZED_MAX_DELAY = 10.0


def oversized_delay(interval: float, rounds: int) -> float:
    """The wait before the next round of a gate whose last `rounds` answers were all over the cap (0: none was)."""
    return interval if rounds <= 0 else min(interval * 2 ** min(rounds, 16), max(OVERSIZED_MAX_DELAY, interval))
#: While Triton refuses connections: a TCP connect this often per pod ...
PORT_PROBE_INTERVAL = 0.02
#: ... and at most this many connects a second over all pods (a thousand replicas loading at once).
PORT_PROBES_PER_SECOND = 500.0
#: Seconds between two heals of one pod: the first at once, then doubling to the last (a config that never loads).
HEAL_BACKOFF = (0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 300.0)
#: A pod that served this long since its last heal starts the backoff again.
HEAL_RESET_SECONDS = 600.0
#: A replica that breaks again within this many seconds of a heal is deleted instead of reloaded again.
REPEAT_WINDOW = 120.0
#: Seconds between two deletions of one model's replicas (by how many came within the last DELETE_MEMORY seconds).
DELETE_BACKOFF = (0.0, 10.0, 30.0, 60.0, 120.0, 300.0)
DELETE_MEMORY = 1800.0
#: The gate's reasons for a replica that stopped serving (the status shows them as Failed).
MODEL_FAILING = "ModelFailing"


@dataclass
class _PodGate:
    namespace: str
    name: str
    body: dict[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    ready_seen_at: float | None = None
    reload: asyncio.Task[None] | None = None  # an in-place reload under way (`controller.reload`)
    reload_for: str | None = None  # the resourceVersion of the pod that reload was started for
    broken: dict[str, str] = field(default_factory=dict)  # what the probe (or Triton) last said cannot serve
    heal: asyncio.Task[None] | None = None  # a heal under way (`controller.heal`)
    heals: int = 0  # heals started since the pod last served for HEAL_RESET_SECONDS
    healed_at: float | None = None  # when the last heal ended (monotonic)
    heal_note: str = ""  # what the last heal did, for the gate's message
    heal_ok: bool = True  # whether the last heal loaded what it reloaded
    served: bool = False  # the gate was True once for this pod
    served_since_heal: bool = False  # ... and since the last heal (the replica broke again, not still)
    deleting: bool = False  # the operator asked for this pod's deletion
    phase: str = ""  # the heal's phase the gate's message last said (`_heal`): a new one is written
    written_at: float = -math.inf  # when this process last wrote the gate (monotonic): a new message's pace
    cause: tuple[str, str, tuple[str, ...]] | None = None  # the gate's reason and message a heal started for, and
    # the models it reloads: said while it runs (the reload itself makes the model LOADING)

    @property
    def address(self) -> str:
        """host:port of the pod's Triton HTTP endpoint, which the operator asks (`triton.rest`)."""
        return f"{(self.body.get('status') or {}).get('podIP')}:{HTTP_PORT}"

    @property
    def grpc_address(self) -> str:
        """host:port of the pod's Triton gRPC endpoint: its loads and unloads (`triton.repository`)."""
        return f"{(self.body.get('status') or {}).get('podIP')}:{GRPC_PORT}"


#: The repository key of a replica's TritonModel (namespace, name), or None when the operator cannot tell it.
KeyOf = Callable[[str, str], "str | None"]
#: rollout.maxUnavailable of a replica's TritonModel (namespace, name).
BudgetOf = Callable[[str, str], int]


def heal_action(served: bool) -> str:
    """The `action` a reload of broken models counts under in triton_operator_heals_total: `reload`, a heal of a
    replica that served and broke; `retry`, the load of a replica that never served tried again (a model that failed
    to load), which the chart's TritonReplicaHealsRepeating leaves out (TritonReplicaGateFailing says it)."""
    return "reload" if served else "retry"


class WarmupGate:
    def __init__(self, kube: Kube, poll_interval: float = 0.2, max_concurrent_checks: int = 32,
                 on_change: Any = None, key_of: KeyOf | None = None, budget_of: BudgetOf | None = None) -> None:
        self.kube = kube
        self.key_of = key_of  # repository calls (the index when a model is not READY, reloads) carry the model's key
        self.poll_interval = poll_interval
        self.sem = asyncio.Semaphore(max_concurrent_checks)
        self.pods: dict[tuple[str, str], _PodGate] = {}
        self.on_change = on_change  # callback(namespace, model) after a gate flip
        self.probing = 0  # pods waiting for their Triton's port to open (`_wait_for_port`)
        self._notices: set[asyncio.Task[None]] = set()  # `_notify_probe` and pod deletion tasks under way
        self.budget_of = budget_of  # how many of a model's replicas may be out of the Service at once (default 1)
        self.deletions: dict[tuple[str, str], list[float]] = {}  # (namespace, model) -> when replicas were deleted

    def observe(self, body: dict[str, Any], deleted: bool = False) -> None:
        """Feed a pod watch event."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        gate = self.pods.get(key)
        if deleted or meta.get("deletionTimestamp"):
            if gate is not None:
                for task in (gate.task, gate.reload, gate.heal):
                    if task:
                        task.cancel()
                self.pods.pop(key, None)
            return
        if not any(g.get("conditionType") == WARMED_CONDITION for g in (body.get("spec") or {}).get("readinessGates") or ()):
            return
        if gate is None:
            gate = _PodGate(meta["namespace"], meta["name"], body)
            self.pods[key] = gate
        gate.body = body
        gate.wake.set()
        if gate.task is None or gate.task.done():
            gate.task = detached(self._run(gate), name=f"gate-{key[0]}/{key[1]}")

    async def stop(self) -> None:
        tasks = [t for g in list(self.pods.values()) for t in (g.task, g.reload, g.heal) if t]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _run(self, gate: _PodGate) -> None:
        stable_rounds = oversized_rounds = 0
        while (gate.namespace, gate.name) in self.pods:
            healing = gate.heal is not None and not gate.heal.done()  # the verdict below is taken during a heal
            verdict = await self._check(gate)
            ann = gate.body["metadata"].get("annotations") or {}
            # A reload starts once Triton is done with what it loads at start: READY (with whichever config), or
            # failed to load it (the reload then brings the config asked for).
            if ANNOTATION_RELOAD in ann and (verdict.ready_seen or verdict.reason == "ModelLoadFailed"):
                self._start_reload(gate)
            if ANNOTATION_RELOAD in ann and not verdict.ok:
                verdict = replace(verdict, reason="Reloading", message=(
                    f"loading config {ann.get(ANNOTATION_DIGEST)} in place ({ann[ANNOTATION_RELOAD]}): {verdict.message}"))
            phase = ""
            if ANNOTATION_RELOAD not in ann and not verdict.ok:
                verdict, phase = self._heal(gate, verdict, healing)
            refresh = message_refresh_due(verdict.ok, time.monotonic() - gate.written_at)
            write = gate_condition(gate.body, verdict.ok, verdict.reason, verdict.message, utc_now(),
                                   changed=phase != gate.phase or refresh)
            if write is None:
                gate.phase = phase
            elif await self._set(gate, verdict, write):
                gate.phase = phase
                stable_rounds = 0
            # After the gate, never before it: the kubelet's pod worker syncs the pod object of the last UPDATE (an
            # annotation write), so one written first made the next sync see the gate still False, and Ready came a
            # PLEG relist (1 s) later (kubelet 1.35 at --v=4, issue 17).
            record = loaded_to_record(ann, verdict.loaded)
            if record:
                await self._record_loaded(gate, record)
            oversized_rounds = oversized_rounds + 1 if verdict.oversized else 0
            if verdict.ok:
                delay = STABLE_BACKOFF[min(stable_rounds, len(STABLE_BACKOFF) - 1)]
                stable_rounds += 1
            else:
                delay = oversized_delay(self._interval(gate), oversized_rounds)
            gate.wake.clear()
            if verdict.reason == "TritonUnreachable" and await self._wait_for_port(gate):
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(gate.wake.wait(), timeout=delay)

    async def _wait_for_port(self, gate: _PodGate) -> bool:
        """While Triton's HTTP port refuses connections: returns once it accepts one or the pod has an event, so
        READY is seen within a connect interval of the port opening instead of within a poll interval.
        False at once when the port is open already (Triton took too long to answer): the caller waits as usual."""
        if await port_open(gate.address):
            return False
        self.probing += 1
        try:
            while True:
                interval = max(PORT_PROBE_INTERVAL, self.probing / PORT_PROBES_PER_SECOND)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(gate.wake.wait(), timeout=interval)
                if gate.wake.is_set() or await port_open(gate.address):
                    return True
        finally:
            self.probing -= 1

    def _heal(self, gate: _PodGate, verdict: ReplicaVerdict, healing: bool = False) -> tuple[ReplicaVerdict, str]:
        """Starts a heal of a replica whose models the probe (or Triton) found broken, when its backoff allows.
        Returns the verdict to write meanwhile (its reason stays the cause: ModelFailing, ModelLoadFailed; its
        message says what the heal does) and the heal's phase, which changes once per heal step: the gate is
        written again when it does, not on every round. `healing`: a heal ran when `verdict` was taken; it may
        have ended since (its load failed right after Triton said LOADING), and the verdict is still the heal's
        (CI at 1438270: the gate said ModelWarming for a moment, and Degraded went AsExpected)."""
        if (pod_condition(gate.body, WARMED_CONDITION) or {}).get("status") == "True":
            gate.served = True  # also for a pod an earlier operator process let in
        if gate.heal is not None and (healing or not gate.heal.done()) and gate.cause is not None:
            if verdict.reason not in (MODEL_FAILING, "ModelLoadFailed", "ModelWarming"):
                return verdict, ""  # tritonserver itself stopped or crashed meanwhile: say that
            # The reload makes the model LOADING ("ModelWarming"): still the cause, until the heal says otherwise.
            return self._healing(gate, verdict)
        names = to_reload(gate.body, gate.broken)
        if not names:
            return verdict, ""
        if verdict.ok is False and verdict.reason not in (MODEL_FAILING, "ModelLoadFailed"):
            return verdict, ""
        now = time.monotonic()
        if gate.healed_at is not None and now - gate.healed_at >= HEAL_RESET_SECONDS:
            gate.heals = 0
        if gate.deleting:
            return replace(verdict, message=f"{verdict.message}; replacing the pod"), "delete"
        # Again: it served after the heal and broke within the window (not: still broken, the probe catching up).
        again = (gate.heal_ok and gate.served_since_heal and gate.healed_at is not None
                 and now - gate.healed_at < REPEAT_WINDOW)
        if gate.served and gate.healed_at is not None and (again or not gate.heal_ok):
            why = (f"it broke again within {REPEAT_WINDOW:.0f}s of heal {gate.heals}" if again
                   else f"heal {gate.heals} failed ({gate.heal_note})")
            left = self._delete_wait(gate)
            if left > 0:
                asyncio.get_running_loop().call_later(min(left, 30.0), gate.wake.set)
                return replace(verdict, message=f"{verdict.message}; {why}: the pod is replaced once "
                               "rollout.maxUnavailable and the back-off allow"), "delete wait"
            self._delete(gate, why)
            return replace(verdict, message=f"{verdict.message}; {why}: replacing the pod"), "delete"
        wait = HEAL_BACKOFF[min(gate.heals, len(HEAL_BACKOFF) - 1)]
        if gate.healed_at is not None and now < gate.healed_at + wait:
            left = gate.healed_at + wait - now
            asyncio.get_running_loop().call_later(left, gate.wake.set)
            note = f"; {gate.heal_note}" if gate.heal_note else ""
            at = rfc3339(utc_now() + dt.timedelta(seconds=round(left)))
            return replace(verdict, message=f"{verdict.message}{note}; next heal at {at}"), f"wait {gate.heals}"
        gate.heals += 1
        gate.served_since_heal = False
        gate.cause = (verdict.reason, verdict.message, names)
        self._start_heal(gate, names, "; ".join(f"{m}: {why}" for m, why in gate.broken.items()))
        return self._healing(gate, verdict)

    @staticmethod
    def _healing(gate: _PodGate, verdict: ReplicaVerdict) -> tuple[ReplicaVerdict, str]:
        """The verdict while a heal runs: the cause it started for (reason and message), and what it does."""
        assert gate.cause is not None
        reason, message, names = gate.cause
        return replace(verdict, reason=reason, message=f"{message}; healing: unloading and loading "
                       f"{', '.join(names)} again (heal {gate.heals})"), f"heal {gate.heals}"

    def _delete_wait(self, gate: _PodGate) -> float:
        """Seconds until this pod may be deleted: 0 when the model's budget and back-off allow it now."""
        model = (gate.body["metadata"].get("labels") or {}).get(LABEL_MODEL, "")
        budget = max(1, self.budget_of(gate.namespace, model)) if self.budget_of is not None else 1
        out = [g for g in self.pods.values() if g is not gate and g.namespace == gate.namespace
               and (g.body["metadata"].get("labels") or {}).get(LABEL_MODEL) == model
               and (g.deleting or not pod_ready(g.body))]
        if len(out) + 1 > budget:
            return 5.0  # another replica of the model is out: look again soon
        now = time.monotonic()
        recent = [t for t in self.deletions.get((gate.namespace, model), ()) if now - t < DELETE_MEMORY]
        self.deletions[(gate.namespace, model)] = recent
        if not recent:
            return 0.0
        return max(0.0, recent[-1] + DELETE_BACKOFF[min(len(recent), len(DELETE_BACKOFF) - 1)] - now)

    def _delete(self, gate: _PodGate, why: str) -> None:
        """Deletes the pod (its ReplicaSet replaces it), records it, and says so in an Event."""
        model = (gate.body["metadata"].get("labels") or {}).get(LABEL_MODEL, "")
        gate.deleting = True
        self.deletions.setdefault((gate.namespace, model), []).append(time.monotonic())
        log.warning("Deleting replica pod=%s/%s why=%r", gate.namespace, gate.name, why)

        async def run() -> None:
            try:
                await asyncio.to_thread(self.kube.delete, "v1", "Pod", gate.namespace, gate.name)
            except Exception as exc:  # noqa: BLE001 - RBAC, the API server: the next round tries again
                gate.deleting = False
                metrics.HEALS.labels(action="delete", result="failed").inc()
                log.warning("Failed to delete replica pod=%s/%s error=%r", gate.namespace, gate.name, exc)
                return
            metrics.HEALS.labels(action="delete", result="ok").inc()
            log.info("Deleted replica pod=%s/%s why=%r", gate.namespace, gate.name, why)
            await self._event(gate, "HealDeleted", f"{why}: deleted the pod; its ReplicaSet replaces it", "Warning")

        # Not the pod's own task: the deletion's watch event makes the gate forget the pod and cancel its tasks,
        # which would drop the Event (seen: the pod deleted, no HealDeleted).
        task = asyncio.create_task(run(), name=f"heal-delete-{gate.namespace}/{gate.name}")
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    def _start_heal(self, gate: _PodGate, names: tuple[str, ...], why: str) -> None:
        address, grpc_address, key, pod = gate.address, gate.grpc_address, self._key(gate), gate.body
        log.info("Healing replica pod=%s/%s models=%s heal=%d why=%r", gate.namespace, gate.name, ",".join(names),
                 gate.heals, why)

        async def run() -> None:
            try:
                healed = await reload_models(self.kube, pod, address, grpc_address, names, key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Triton unreachable, the API server: the next heal retries
                healed = Healed(False, names, f"{type(exc).__name__}: {exc}", 0.0)
            gate.healed_at = time.monotonic()
            gate.heal_ok = healed.ok
            result = "ok" if healed.ok else "failed"
            # A replica that never served did not stop serving: its model never loaded, and this is the load tried
            # again with back-off (as the kubelet restarts a crashing container), not a heal (`heal_action`).
            metrics.HEALS.labels(action=heal_action(gate.served), result=result).inc()
            gate.heal_note = (f"heal {gate.heals} reloaded {', '.join(names)} in {healed.seconds:.1f}s" if healed.ok
                              else f"heal {gate.heals} failed: {healed.message}")
            if healed.ok:
                log.info("Healed replica pod=%s/%s models=%s seconds=%.2f", gate.namespace, gate.name,
                         ",".join(names), healed.seconds)
                message = f"{why}: unloaded and loaded {', '.join(names)} again in {healed.seconds:.1f}s"
            else:
                log.warning("Failed to heal replica pod=%s/%s models=%s error=%s", gate.namespace, gate.name,
                            ",".join(names), healed.message)
                message = f"{why}: reloading {', '.join(names)} failed: {healed.message}"
            await self._event(gate, "Healed" if healed.ok else "HealFailed", message,
                              "Normal" if healed.ok else "Warning")
            gate.broken = {}
            gate.wake.set()

        gate.heal = asyncio.create_task(run(), name=f"heal-{gate.namespace}/{gate.name}")

    async def _event(self, gate: _PodGate, reason: str, message: str, type_: str) -> None:
        """An Event on the replica's pod: news, not state, so a failure is logged and nothing more."""
        involved = {**gate.body, "apiVersion": "v1", "kind": "Pod"}
        try:
            await asyncio.to_thread(self.kube.event, involved, reason, message, type_)
        except Exception as exc:  # noqa: BLE001 - the API server unreachable: the heal itself is done
            log.warning("Failed to record Event reason=%s pod=%s/%s error=%r", reason, gate.namespace, gate.name, exc)

    def _start_reload(self, gate: _PodGate) -> None:
        """Starts the reload the pod's annotations ask for, unless one runs or already ran for this pod version."""
        version = gate.body["metadata"].get("resourceVersion")
        if (gate.reload is not None and not gate.reload.done()) or gate.reload_for == version:
            return
        gate.reload_for = version
        ann = gate.body["metadata"].get("annotations") or {}
        address, grpc_address = gate.address, gate.grpc_address
        key = self._key(gate)

        async def run() -> None:
            try:
                await reload_replica(self.kube, lambda: gate.body, address, grpc_address, ann.get(ANNOTATION_TRITON_NAME, ""),
                                     key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next pod event (or gate round) tries again
                log.warning("Failed to reload pod=%s/%s error=%r", gate.namespace, gate.name, exc)
                gate.reload_for = None
            gate.wake.set()

        gate.reload = asyncio.create_task(run(), name=f"reload-{gate.namespace}/{gate.name}")

    async def _record_loaded(self, gate: _PodGate, digest: str) -> None:
        """Writes on the pod which config its Triton said it has loaded (status.replicaStates shows it)."""
        try:
            patched = await asyncio.to_thread(self.kube.patch_pod_annotations, gate.namespace, gate.name,
                                              {ANNOTATION_LOADED: digest})
        except Exception as exc:  # noqa: BLE001 - the pod may be gone; the next round tries again
            log.warning("Failed to record the loaded digest pod=%s/%s error=%s", gate.namespace, gate.name, exc)
            return
        if patched is not None:
            gate.body.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_LOADED] = digest

    def _notify_probe(self, gate: _PodGate) -> None:
        """Tells the pod's `probe` container that its gate is True, so that it passes the held readiness probe right
        after the kubelet has the gate (instead of a fixed time after tritonserver's HTTP port opened). In the
        background: the gate never waits on it, and a pod that cannot be told falls back to that fixed time."""
        containers = (gate.body.get("spec") or {}).get("containers") or ()
        ip = (gate.body.get("status") or {}).get("podIP")
        if not ip or not any(c.get("name") == PROBE_CONTAINER for c in containers):
            return

        key = self._key(gate)  # the probe takes the notice only with the replica's key

        async def notify() -> None:
            try:
                code = await notify_gate(ip, PROBE_PORT, key)
            except OSError as exc:  # TimeoutError and ConnectionError included
                log.debug("Could not tell the probe about the gate pod=%s/%s error=%r", gate.namespace, gate.name, exc)
                return
            if code != 200:
                log.debug("The probe did not take the gate pod=%s/%s status=%d", gate.namespace, gate.name, code)

        task = asyncio.create_task(notify(), name=f"probe-notice-{gate.namespace}/{gate.name}")
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    def _key(self, gate: _PodGate) -> str | None:
        """The repository key of the pod's TritonModel (the one its label names)."""
        model = (gate.body["metadata"].get("labels") or {}).get(LABEL_MODEL)
        return self.key_of(gate.namespace, model) if self.key_of is not None and model else None

    def _interval(self, gate: _PodGate) -> float:
        ann = gate.body["metadata"].get("annotations") or {}
        ms = ann.get(ANNOTATION_POLL_MS)
        return int(ms) / 1000 if ms and ms.isdigit() else self.poll_interval

    async def _check(self, gate: _PodGate) -> ReplicaVerdict:
        pod = gate.body
        ann = pod["metadata"].get("annotations") or {}
        cs = triton_container_status(pod)
        ip = (pod.get("status") or {}).get("podIP")
        running = bool(((cs or {}).get("state") or {}).get("running"))
        if not ip or not running:
            why = "the tritonserver container is not running" if ip else "the pod has no IP yet"
            return ReplicaVerdict(False, "TritonNotRunning", why)
        steps = steps_of(ann)
        versions = parse_versions_annotation(ann.get(ANNOTATION_VERSIONS))
        async with self.sem:
            verdict = await check_replica(
                gate.address, ann.get(ANNOTATION_TRITON_NAME, ""), steps, ann.get(ANNOTATION_DIGEST, ""),
                versions=versions, also=ann.get(ANNOTATION_PREVIOUS), key=self._key(gate),
            )
        verdict = await self._ask_probe(gate, verdict, cs)
        if verdict.ready_seen and gate.ready_seen_at is None:
            gate.ready_seen_at = time.monotonic()
        if not verdict.ready_seen:
            gate.ready_seen_at = None
        return verdict

    async def _ask_probe(self, gate: _PodGate, verdict: ReplicaVerdict, cs: Any) -> ReplicaVerdict:
        """While tritonserver runs but its container is not ready, what the pod's probe found broken (`GET /status`):
        a replica Triton calls READY may fail every request (a dead Python stub). Sets `gate.broken`."""
        gate.broken = {}
        if verdict.model and verdict.reason == "ModelLoadFailed":
            gate.broken[verdict.model] = verdict.message
        containers = (gate.body.get("spec") or {}).get("containers") or ()
        ip = (gate.body.get("status") or {}).get("podIP")
        if (cs or {}).get("ready") or not ip or not any(c.get("name") == PROBE_CONTAINER for c in containers):
            return verdict
        if not verdict.ok and verdict.reason not in ("ModelLoadFailed", "TritonUnreachable"):
            return verdict
        try:
            broken = await probe_status(ip, PROBE_PORT, self._key(gate))
        except (OSError, ValueError) as exc:  # TimeoutError and ConnectionError included; an old probe: 404
            log.debug("Could not ask the probe pod=%s/%s error=%r", gate.namespace, gate.name, exc)
            return verdict
        if verdict.ok:
            # Triton has just said the model serves the desired config: a "not loaded" from the probe is older than
            # that (it checks every 0.1 s), seen while a reload or a Drain unloaded and loaded it; not a break to heal.
            broken = {m: why for m, why in broken.items() if not why.endswith(NOT_LOADED)}
        gate.broken.update(broken)
        if TRITONSERVER in broken:  # stopped or deadlocked: nothing to reload; it rejoins once it answers again
            return ReplicaVerdict(False, "TritonNotAnswering", broken[TRITONSERVER], ready_seen=verdict.ready_seen,
                                  loaded=verdict.loaded)
        if not broken or not verdict.ok:
            return verdict
        return ReplicaVerdict(False, MODEL_FAILING, "; ".join(broken.values()), ready_seen=True, loaded=verdict.loaded)

    async def _set(self, gate: _PodGate, verdict: ReplicaVerdict, write: GateWrite) -> bool:
        """Writes the gate; False when the write failed (the next round tries again)."""
        cond = write.condition
        status, message = cond["status"], cond["message"]
        before = pod_condition(gate.body, WARMED_CONDITION) or {}
        try:
            await asyncio.to_thread(self.kube.patch_pod_condition, gate.namespace, gate.name, cond)
        except Exception as exc:  # noqa: BLE001 - the pod may be gone; the next event retries
            log.warning("Failed to patch gate pod=%s/%s error=%s", gate.namespace, gate.name, exc)
            return False
        gate.written_at = time.monotonic()
        if write.warmup_seconds is not None:
            metrics.WARMUP_SECONDS.observe(write.warmup_seconds)
        if verdict.ok and gate.ready_seen_at is not None:
            metrics.READY_TO_GATE_SECONDS.observe(time.monotonic() - gate.ready_seen_at)
        if (before.get("status"), before.get("reason")) != (status, verdict.reason):  # not a heal's new message
            metrics.GATE_TRANSITIONS.labels(status=status, reason=verdict.reason).inc()
        if status == "True":
            gate.served = gate.served_since_heal = True
            self._notify_probe(gate)
        # keep our copy current so the next round compares against what we wrote
        gate.body.setdefault("status", {})["conditions"] = with_condition(gate.body, cond)
        log.info(
            "Set readiness gate pod=%s/%s status=%s reason=%s message=%r",
            gate.namespace, gate.name, status, verdict.reason, message,
        )
        if self.on_change:
            model = (gate.body["metadata"].get("labels") or {}).get(LABEL_MODEL)
            if model:
                self.on_change(gate.namespace, model)
        return True


__all__ = ["TRITON_CONTAINER", "WarmupGate"]
