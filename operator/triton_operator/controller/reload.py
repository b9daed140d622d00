"""Carries out one replica's in-place reload, as its pod's annotations say (`plan.rollout`).

Swap: Triton loads the new config beside the old one; the gate approves both meanwhile (the pod names the old
digest as `config-digest-previous`), so the replica serves throughout. Drain: the gate approves only the new
digest, so it turns False and the replica leaves the Service; once the kubelet has it NotReady and no request
has reached it for a second (a sequence model: for its idle timeout), Triton unloads the old copy, and once the
copy is gone (requests in flight and open decoupled streams done: Triton holds the copy until then), loads the
new one; the drain timeout bounds both waits together.

A load that fails leaves the replica serving what it served before (Swap: Triton keeps it; Drain: loaded
again, from the config Triton reported before the unload) and records the failure on the pod, where the planner
stops the rollout. Every write is a JSON patch that first tests the pod still asks for this reload, so a
reload overtaken by a newer spec writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..api.pod import (
    ANNOTATION_DIGEST,
    ANNOTATION_DRAIN_SECONDS,
    ANNOTATION_LOADED,
    ANNOTATION_RELOAD,
    ANNOTATION_RELOAD_FAILED,
    ANNOTATION_RELOAD_FROM,
    ANNOTATION_RELOAD_MESSAGE,
)
from ..plan.rollout import INSTRUCTION
from ..plan.status import pod_ready
from ..platform.kube import Kube
from ..render.kubernetes import configmap_key
from ..render.modelconfig import config_json
from ..triton import reload as triton
from . import metrics

log = logging.getLogger("triton_operator.reload")

#: A replica counts as drained once no request has reached it for this long (at least).
QUIET_SECONDS = 1.0


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return pod["metadata"].get("annotations") or {}


async def drain(pod: Callable[[], Mapping[str, Any]], address: str, model: str, timeout: float,
                quiet: float) -> tuple[bool, float]:
    """Waits until the replica is out of the Service (its pod NotReady) and no request has reached it for `quiet`
    seconds, for at most `timeout`; whether it got there, and how long it took."""
    start = time.monotonic()
    deadline = start + timeout
    while pod_ready(pod()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    last = await triton.requests_seen(address, model)
    since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        seen = await triton.requests_seen(address, model)
        if seen != last:
            last, since = seen, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return True, time.monotonic() - start
    return False, time.monotonic() - start


async def reload_replica(kube: Kube, pod: Callable[[], Mapping[str, Any]], address: str, grpc_address: str, model: str,
                         key: str | None = None) -> None:
    """One reload of the replica `pod()` (its latest body) whose Triton answers at `address` (HTTP) and
    `grpc_address` (its loads and unloads, `triton.repository`), for Triton model
    `model`, as its annotations ask; returns once the outcome is written on the pod (or nothing is to be done).
    `key`: the repository key of the replica's TritonModel, which its Triton requires for loads and unloads."""
    body = pod()
    meta, ann = body["metadata"], _annotations(body)
    namespace, name = meta["namespace"], meta["name"]
    digest, mode, source = ann.get(ANNOTATION_DIGEST), ann.get(ANNOTATION_RELOAD), ann.get(ANNOTATION_RELOAD_FROM)
    if not digest or mode not in ("Swap", "Drain") or not source:
        return
    expect = {ANNOTATION_DIGEST: digest, ANNOTATION_RELOAD: mode, ANNOTATION_RELOAD_FROM: source}
    done = dict.fromkeys(INSTRUCTION)
    before = await triton.served(address, model)
    # Done: the instruction goes, and the digest Triton now serves is written in the same patch, so that no reader
    # (the status's replicaStates) sees a finished reload with the previous loaded digest.
    served = {**done, ANNOTATION_LOADED: digest}
    if before is not None and before.digest == digest:  # loaded already (an operator stopped before it wrote so)
        await asyncio.to_thread(kube.patch_pod_annotations, namespace, name, served, expect)
        return
    cm = await asyncio.to_thread(kube.get, "v1", "ConfigMap", namespace, source)
    text = ((cm or {}).get("data") or {}).get(configmap_key(f"{model}/config.pbtxt"))
    if text is None:  # a newer spec's reconcile deleted it: that reconcile re-tells this pod
        log.warning("Cannot reload: no config in ConfigMap pod=%s/%s configmap=%s", namespace, name, source)
        return
    start = time.monotonic()
    log.info("Reloading replica pod=%s/%s model=%s digest=%s mode=%s serving=%s", namespace, name, model, digest,
             mode, before.digest if before else None)
    if mode == "Drain":
        timeout = float(ann.get(ANNOTATION_DRAIN_SECONDS) or 0)
        quiet = max(QUIET_SECONDS, (before.sequence_idle_seconds or 0) if before else 0)
        if timeout > 0 and before is not None:
            drained, took = await drain(pod, address, model, timeout, quiet)
            log.info("Drained replica pod=%s/%s drained=%s seconds=%.1f", namespace, name, drained, took)
        if before is not None:
            await triton.unload(grpc_address, model, key=key)
            gone = await triton.unloaded(address, model, max(0.0, start + timeout - time.monotonic()), key=key)
            log.info("Unloaded replica pod=%s/%s complete=%s seconds=%.1f", namespace, name, gone,
                     time.monotonic() - start)
    loaded = await triton.load(address, grpc_address, model, config_json(text), key=key)
    if loaded.ok:
        metrics.RELOADS.labels(mode=mode, result="ok").inc()
        log.info("Reloaded replica pod=%s/%s digest=%s mode=%s seconds=%.1f", namespace, name, digest, mode,
                 time.monotonic() - start)
        await asyncio.to_thread(kube.patch_pod_annotations, namespace, name, served, expect)
        return
    metrics.RELOADS.labels(mode=mode, result="failed").inc()
    restored = before.digest if before else None
    if mode == "Drain" and before is not None:  # serve the previous config again
        back = await triton.load(address, grpc_address, model, before.config, key=key)
        if not back.ok:
            log.error("Could not load the previous config again pod=%s/%s error=%s", namespace, name, back.message)
    log.warning("Failed to reload replica pod=%s/%s digest=%s mode=%s serving=%s error=%s", namespace, name, digest,
                mode, restored, loaded.message)
    failed = {**done, ANNOTATION_RELOAD_FAILED: digest, ANNOTATION_RELOAD_MESSAGE: loaded.message[:4000]}
    if restored:
        failed[ANNOTATION_DIGEST] = restored
    await asyncio.to_thread(kube.patch_pod_annotations, namespace, name, failed, expect)
