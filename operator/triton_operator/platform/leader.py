"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it.

Every operator replica serves the admission webhook; exactly one, the holder of the Lease, reconciles and
drives the warm-up gates. A candidate takes the Lease when it is free or when its holder has not renewed it
for `lease_seconds`, measured on the candidate's own clock from the moment it last saw the record change
(never by comparing timestamps written by another machine's clock). The holder renews every `retry_seconds`;
if it cannot renew for `renew_seconds` it must stop leading, because after `lease_seconds` another replica
may take over. A holder that shuts down cleanly gives the Lease up, so a follower takes over at once.

Writes are conditional (an update carries the resourceVersion it read), so two candidates never both win.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..api.kinds import LEASE
from ..api.timestamps import rfc3339
from .errors import ApiError
from .kube import Kube

log = logging.getLogger("triton_operator.leader")


@dataclass(frozen=True)
class ElectionSettings:
    """Leader election on the Lease `namespace/name` (the chart: the release's namespace and full name); the
    identity is this process's. Timings as client-go's defaults for controllers: 15 s, 10 s, 2 s."""

    namespace: str
    name: str
    identity: str
    lease_seconds: float = 15.0
    renew_seconds: float = 10.0
    retry_seconds: float = 2.0


@dataclass
class LeaderElection:
    kube: Kube
    settings: ElectionSettings
    # What this candidate last saw: (holder, renewTime, leaseDurationSeconds), and when (time.monotonic()).
    _seen: tuple[Any, ...] | None = field(default=None, init=False)
    _seen_at: float = field(default=0.0, init=False)
    _leading: bool = field(default=False, init=False)

    @property
    def leading(self) -> bool:
        return self._leading

    def _observe(self, lease: dict[str, Any] | None) -> None:
        spec = (lease or {}).get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._seen:
            self._seen, self._seen_at = record, time.monotonic()

    def _lease(self, spec: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"apiVersion": LEASE.api_version, "kind": LEASE.kind,
                "metadata": meta or {"name": self.settings.name, "namespace": self.settings.namespace}, "spec": spec}

    def try_acquire_or_renew(self) -> bool:
        """One round: take or renew the Lease if this candidate may; whether it holds the Lease now."""
        now = rfc3339(micro=True)
        current = self.kube.get(LEASE.api_version, LEASE.kind, self.settings.namespace, self.settings.name)
        if current is None:
            first: dict[str, Any] = {"holderIdentity": self.settings.identity, "leaseDurationSeconds": int(self.settings.lease_seconds),
                                     "acquireTime": now, "renewTime": now, "leaseTransitions": 0}
            try:
                created = self.kube.create(self._lease(first))
            except ApiError as exc:
                if exc.status == 409:  # another candidate created it first
                    return False
                raise
            self._observe(created)
            return True
        self._observe(current)
        spec: dict[str, Any] = dict(current.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_seconds)
        if holder and holder != self.settings.identity and time.monotonic() < self._seen_at + duration:
            return False  # held, and renewed within its duration as far as this candidate has seen
        if holder != self.settings.identity:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec["acquireTime"] = now
        spec.update(holderIdentity=self.settings.identity, leaseDurationSeconds=int(self.settings.lease_seconds), renewTime=now)
        try:
            updated = self.kube.replace(self._lease(spec, current["metadata"]))
        except ApiError as exc:
            if exc.status == 409:  # changed since read: someone else renewed or took it
                return False
            raise
        self._observe(updated)
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Waits until this candidate holds the Lease (True), or `stop` is set first (False)."""
        log.info("Waiting to lead lease=%s/%s identity=%s", self.settings.namespace, self.settings.name, self.settings.identity)
        while not stop.is_set():
            try:
                if await asyncio.to_thread(self.try_acquire_or_renew):
                    self._leading = True
                    log.info("Became the leader lease=%s/%s identity=%s", self.settings.namespace, self.settings.name,
                             self.settings.identity)
                    return True
            except Exception as exc:  # noqa: BLE001 - the API server may be away: keep trying
                log.warning("Could not read or take the lease error=%r", exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.retry_seconds)
        return False

    async def hold(self, lost: asyncio.Event) -> None:
        """Renews the Lease every `retry_seconds` while leading; sets `lost` (and returns) once a renewal has
        not succeeded for `renew_seconds`, or someone else holds the Lease."""
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.retry_seconds)
            try:
                if await asyncio.to_thread(self.try_acquire_or_renew):
                    last_ok = time.monotonic()
                    continue
                log.error("Lost the lease to another replica lease=%s/%s holder=%s", self.settings.namespace, self.settings.name,
                          (self._seen or (None,))[0])
            except Exception as exc:  # noqa: BLE001 - retried until the renew deadline
                if time.monotonic() - last_ok < self.settings.renew_seconds:
                    log.warning("Could not renew the lease error=%r", exc)
                    continue
                log.error("Could not renew the lease for %.0fs: stepping down error=%r", self.settings.renew_seconds, exc)
            self._leading = False
            lost.set()
            return

    def release(self) -> None:
        """Gives the Lease up (a clean shutdown): a follower takes it on its next round, not after the duration."""
        if not self._leading:
            return
        self._leading = False
        current = self.kube.get(LEASE.api_version, LEASE.kind, self.settings.namespace, self.settings.name)
        if current is None or (current.get("spec") or {}).get("holderIdentity") != self.settings.identity:
            return
        spec = dict(current["spec"])
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=rfc3339(micro=True))
        try:
            self.kube.replace(self._lease(spec, current["metadata"]))
            log.info("Released the lease lease=%s/%s identity=%s", self.settings.namespace, self.settings.name, self.settings.identity)
        except ApiError as exc:
            log.warning("Could not release the lease error=%s", exc)
