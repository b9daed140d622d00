"""Asks one replica's Triton whether it serves exactly the desired config, warm.

A replica passes when the model and every ensemble step are READY (every version
its version policy serves, when the caller names them) and the loaded config's
digest parameter, in each served version of the model, equals the digest the
replica was created for. Otherwise the verdict says why, with Triton's own reason when a load failed.

The warm-up gate's call to Triton (`controller.gate` asks, `plan.readiness` decides; the map: `api.pod`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

from ..api.pod import config_digest
from .rest import TritonClient, TritonError


@dataclass(frozen=True)
class ReplicaVerdict:
    ok: bool
    reason: str  # CamelCase
    message: str
    ready_seen: bool = False  # the model answered READY (for READY -> gate latency)
    loaded: str | None = None  # the digest of the config Triton said it has loaded (None: it did not say)
    model: str | None = None  # the Triton model the verdict is about, when one is not READY
    oversized: bool = False  # an answer was over the read cap: a server that is no Triton (the gate backs off)


async def check_replica(
    address: str,
    model: str,
    steps: tuple[str, ...],
    digest: str,
    timeout: float = 2.0,
    versions: Mapping[str, tuple[int, ...]] | None = None,
    also: str | None = None,
    key: str | None = None,
    client: TritonClient | None = None,
) -> ReplicaVerdict:
    """One round of questions to the Triton at `address` (host:port of its HTTP endpoint).

    `versions` names, by Triton model name, the versions that must each be READY (the policy's served ones); a
    model it does not name is asked about its latest version. `also` is a second digest the replica may serve
    (in-place Swap: the config it served before, while the new one loads beside it). The questions go over HTTP,
    the port tritonserver opens last (gRPC, then HTTP): a replica that answered READY over gRPC alone could still
    refuse HTTP clients for a moment (tens of milliseconds in the pods here, longer on a loaded machine). `key` is
    the model's repository key: a model that is not READY is looked up in the repository index, which replicas answer
    only with it. `client`: one to ask through (its connections, its key), left open; else one of its own."""
    versions = versions or {}
    own = client is None
    client = TritonClient(address, key) if client is None else client
    try:
        for name in (model, *steps):
            for v in versions.get(name) or (None,):
                version = "" if v is None else str(v)
                ready = await client.is_model_ready(name, version, timeout=timeout)
                if not ready:
                    return await _why_not_ready(client, name, timeout, v)
        accepted = {digest} | ({also} if also else set())
        first: str | None = None
        for v in versions.get(model) or (None,):
            cfg = await client.model_config(model, "" if v is None else str(v), timeout=timeout)
            loaded = config_digest(cfg) or ""
            first = loaded if first is None else first
            if loaded not in accepted:
                which = "" if v is None else f" for version {v}"
                return ReplicaVerdict(
                    False,
                    "ConfigDigestMismatch",
                    f"Triton loaded config digest {loaded or '(none)'}{which} but this replica wants {digest}",
                    ready_seen=True,
                    loaded=loaded or None,
                )
        served = f" (versions {', '.join(map(str, versions[model]))})" if versions.get(model) else ""
        return ReplicaVerdict(
            True, "ModelWarmed", f"model {model}{served} is READY with config digest {first}", ready_seen=True,
            loaded=first or None,
        )
    except TritonError as exc:
        if exc.status is not None:  # it answered, with an error: not a question of reaching it
            return ReplicaVerdict(False, "TritonUnreachable", f"Triton answered {exc.status}: {exc.message()}")
        return ReplicaVerdict(False, "TritonUnreachable", f"Triton did not answer: {exc.message()}",
                              oversized=exc.oversized)
    finally:
        if own:
            await client.close()


async def port_open(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts a TCP connection at `address` (host:port): tritonserver opens its ports only
    once the models it loads at start are loaded and warm, so while it refuses, a round of questions is not worth
    asking. A refused connect costs a few syscalls."""
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _why_not_ready(
    client: TritonClient, name: str, timeout: float, version: int | None = None
) -> ReplicaVerdict:
    try:
        index = await client.repository_index(timeout=timeout)
    except TritonError as exc:
        if exc.status != 403:
            raise
        # Not this operator's key: a replica made before the master key changed (its replacement is on its way).
        what = f"model {name}" if version is None else f"model {name} version {version}"
        return ReplicaVerdict(False, "RepositoryKeyRefused", f"{what} is not READY, and Triton refused the operator's "
                              f"repository key when asked why: {exc.message()}")
    entries = [m for m in index.models if m.name == name]
    # the index has one entry per version (with its own state); without a version, the newest one speaks
    entry = next((m for m in entries if m.version == str(version)), None) if version is not None else None
    if entry is None and entries and version is None:
        entry = max(entries, key=lambda m: int(m.version) if m.version.isdigit() else -1)
    what = f"model {name}" if version is None else f"model {name} version {version}"
    state = entry.state if entry is not None else "UNAVAILABLE"
    reason = entry.reason if entry is not None else "not in the model repository"
    if state in ("LOADING", ""):
        return ReplicaVerdict(False, "ModelWarming", f"{what} is loading and warming up", model=name)
    return ReplicaVerdict(False, "ModelLoadFailed", f"{what} is {state}: {reason}".strip(), model=name)
