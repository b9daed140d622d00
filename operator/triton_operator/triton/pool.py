"""A pool replica's Triton, as the pool's reconcile asks it: what a model serves there, load it, unload it.

The questions are the warm-up gate's (`triton.replica.check_replica`: READY, at which config digest); the loads carry
the model's config and files in the request (`render.pool.load_request`), so nothing of an inline model is on the
replica's disk. A load's answer is never the verdict alone: an ensemble over steps loaded from requests answers
INTERNAL and is READY all the same (measured on 2.51, `tests/test_pool_load.py`), so the caller asks again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


async def load(address: str, name: str, config: str, files: Mapping[str, bytes], key: str | None,
               timeout: float = 600.0) -> str | None:
    """Loads `name` with `config` and `files` into the replica; None when Triton accepted it, else Triton's reason
    (which may be wrong about an ensemble: ask `served` after either)."""
    async with TritonClient(address, key) as client:
        try:
            await client.load_model(name, config=config, files=files, timeout=timeout)
            return None
        except TritonError as exc:
            return exc.message() or str(exc)


async def unload(address: str, name: str, key: str | None, timeout: float = 120.0) -> str | None:
    """Unloads `name` from the replica (Triton lets requests in flight finish); None, or Triton's reason."""
    async with TritonClient(address, key) as client:
        try:
            await client.unload_model(name, timeout=timeout)
            return None
        except TritonError as exc:
            return exc.message() or str(exc)
