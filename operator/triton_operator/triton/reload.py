"""Loading a new config into a running Triton, in place (EXPLICIT model control): the calls an in-place rollout
makes on one replica, through Triton's repository API and its statistics.

Measured on the Triton we ship (2.51, `tests/test_reload_live.py` pins it): a load with a new `config` while the
model serves swaps in the background (the old copy answers until the new one is READY; a load that fails leaves
the old one serving); an unload takes the model away until the next load is done. An unload returns at once,
but Triton keeps the copy (state UNLOADING) until every request that holds it is released: an open decoupled
stream (its gRPC stream) holds it until the client closes it, and every response it sends arrives.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from google.protobuf import json_format

from ..api.pod import config_digest
from . import repository
from .rest import TritonClient, TritonError


@dataclass(frozen=True)
class Served:
    """The config a replica's Triton has loaded for a model, as the JSON a load takes, and its digest."""

    config: str
    digest: str | None
    sequence_idle_seconds: float | None  # a sequence model: how long Triton keeps an idle sequence's slot


@dataclass(frozen=True)
class Loaded:
    ok: bool
    message: str  # Triton's own, when the load failed


async def served(address: str, name: str, timeout: float = 5.0) -> Served | None:
    """What the replica serves for `name`, or None when it has no READY copy of it."""
    async with TritonClient(address) as client:
        if not await client.is_model_ready(name, timeout=timeout):
            return None
        cfg = await client.model_config(name, timeout=timeout)
    idle = None
    if cfg.HasField("sequence_batching"):
        # Triton's default idle timeout is 1 s when the config names none
        idle = (cfg.sequence_batching.max_sequence_idle_microseconds or 1_000_000) / 1e6
    text = json_format.MessageToJson(cfg, preserving_proto_field_name=True, indent=None)
    return Served(text, config_digest(cfg), idle)


async def requests_seen(address: str, name: str, timeout: float = 5.0) -> int:
    """Requests the replica has received for `name` so far (succeeded and failed, every version): a count that
    stops moving once no request arrives."""
    async with TritonClient(address) as client:
        stats = await client.statistics(name, timeout=timeout)
    return sum(s.inference_stats.success.count + s.inference_stats.fail.count for s in stats.model_stats)


async def unloaded(address: str, name: str, timeout: float, interval: float = 0.25, key: str | None = None) -> bool:
    """Waits, for at most `timeout` seconds, until no copy of `name` is UNLOADING (requests in flight and open
    streams done, the copy gone from memory); whether it got there. `key`: the model's repository key."""
    deadline = time.monotonic() + timeout
    async with TritonClient(address, key) as client:
        while True:
            index = await client.repository_index(timeout=10.0)
            if not any(m.name == name and m.state == "UNLOADING" for m in index.models):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(interval)


async def unload(grpc_address: str, name: str, timeout: float = 120.0, key: str | None = None) -> None:
    """Unloads `name` (Triton lets requests in flight finish first), over gRPC (`triton.repository`: a load or an
    unload over HTTP holds one of Triton's HTTP threads). `key`: the model's repository key."""
    await repository.unload_model(grpc_address, name, key=key, timeout=timeout)


async def load(address: str, grpc_address: str, name: str, config: str, timeout: float = 600.0,
               key: str | None = None) -> Loaded:
    """Loads `name` with `config` (JSON) over the files the replica's repository holds, over gRPC at `grpc_address`
    (`triton.repository`); returns once Triton has the new copy READY (warm-up included, asked over HTTP at
    `address`) or has given up on it, with Triton's reason. `key`: the model's repository key (without it a replica
    refuses the load)."""
    json.loads(config)  # a malformed config is our defect, not Triton's answer
    async with TritonClient(address) as client:
        try:
            await repository.load_model(grpc_address, name, config=config, key=key, timeout=timeout)
            if not await client.is_model_ready(name, timeout=10.0):
                return Loaded(False, "the load returned but the model is not READY")
            return Loaded(True, "")
        except TritonError as exc:
            return Loaded(False, exc.message() or str(exc))
