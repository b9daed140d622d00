"""A pool replica's Triton, as the pool's reconcile asks it: what a model serves there, load it, unload it.

The questions are the warm-up gate's (`triton.replica.check_replica`: READY, at which config digest); the loads carry
the model's config and files in the request (`render.pool.load_request`), so nothing of an inline model is on the
replica's disk. A load's answer is never the verdict alone: an ensemble over steps loaded from requests answers
INTERNAL and is READY all the same (measured on 2.51, `tests/test_pool_load.py`), so the caller asks again.

A load in flight (`heard_of`). Triton 2.51 lists only the models of its repository directories in its repository index
(`ModelRepositoryManager::RepositoryIndex` walks them), so a model loaded from a request is never there, loading or not
(measured: `[]` throughout a 6 s load, with `ready: false` too). What tells a load has reached it is the config
question: a model it has never been asked to load is "not found", one whose load has been received but that has no
version available (loading, failed, or unloaded) "has no available versions" (404 either way, 2.51:
`tests/test_pool_inflight.py`). A second load of a model whose load is in flight waits for the first to finish
(Triton's load/unload conflict wait), then loads again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import repository
from .replica import ReplicaVerdict, check_replica
from .rest import TritonClient, TritonError


@dataclass(frozen=True)
class Served:
    """What a replica serves of one model: READY at `digest` (None: not READY), or why not."""

    ready: bool
    digest: str | None
    reason: str
    message: str

    @property
    def unanswered(self) -> bool:
        """The question got no answer (a timeout, a refused connection): the model's state there is unknown."""
        return self.reason == "TritonUnreachable" and self.message.startswith(NO_ANSWER)


#: How `check_replica` begins the message of a question that got no answer.
NO_ANSWER = "Triton did not answer"


def _served(verdict: ReplicaVerdict) -> Served:
    return Served(verdict.ok, verdict.loaded if verdict.ok else None, verdict.reason, verdict.message)


async def served(address: str, name: str, digest: str, also: str | None, key: str | None,
                 timeout: float = 5.0) -> Served:
    """Whether the replica at `address` serves `name` READY at `digest` (or at `also`, the digest it served before an
    in-place Swap), and at which."""
    return _served(await check_replica(address, name, (), digest, timeout=timeout, also=also, key=key))


async def served_all(address: str, asks: Sequence[tuple[str, str, str | None]], key: str | None,
                     timeout: float = 5.0) -> list[Served]:
    """`served` for each (name, digest, also) of `asks` on the replica at `address`, asked at once over one client:
    its connections are reused, not one opened (and closed) per model (a round asks about every model placed there,
    40 on the bench's GPU pool, before it loads a new one)."""
    async with TritonClient(address, key) as client:
        verdicts = await asyncio.gather(*(check_replica(address, name, (), digest, timeout=timeout, also=also, key=key,
                                                        client=client) for name, digest, also in asks))
    return [_served(v) for v in verdicts]


#: How Triton 2.51 words a config question about a model it has been asked to load and has no version of available
#: (loading, failed, unloaded), and about a model it has never been asked to load.
NO_VERSION, NOT_FOUND = "has no available versions", "is not found"


async def heard_of(address: str, name: str, timeout: float = 5.0) -> bool | None:
    """Whether the replica's Triton has received a load of `name` (True: READY, or loading, failed or unloaded since;
    False: never asked), or None when its answer says neither (no answer, another error)."""
    async with TritonClient(address) as client:
        try:
            await client.model_config(name, timeout=timeout)
            return True
        except TritonError as exc:
            if exc.status == 404 and NO_VERSION in exc.message():
                return True
            if exc.status == 404 and NOT_FOUND in exc.message():
                return False
            return None


async def load(grpc_address: str, name: str, config: str, files: Mapping[str, bytes], key: str | None,
               timeout: float = 600.0) -> str | None:
    """Loads `name` with `config` and `files` into the replica, over gRPC (`triton.repository`: over HTTP a load holds
    one of Triton's HTTP threads, and the requests of every model on it wait); None when Triton accepted it, else
    Triton's reason (which may be wrong about an ensemble: ask `served` after either)."""
    try:
        await repository.load_model(grpc_address, name, config=config, files=files, key=key, timeout=timeout)
        return None
    except TritonError as exc:
        return exc.message() or str(exc)


async def unload(grpc_address: str, name: str, key: str | None, timeout: float = 120.0) -> str | None:
    """Unloads `name` from the replica, over gRPC (Triton lets requests in flight finish); None, or Triton's reason."""
    try:
        await repository.unload_model(grpc_address, name, key=key, timeout=timeout)
        return None
    except TritonError as exc:
        return exc.message() or str(exc)
