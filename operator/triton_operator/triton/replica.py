"""Asks one replica's Triton whether it serves exactly the desired config, warm.

A replica passes when the model and every ensemble step are READY and the
loaded config's digest parameter equals the digest the replica was created
for. Otherwise the verdict says why, with Triton's own reason when a load failed.
"""

from __future__ import annotations

from dataclasses import dataclass

import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from ..api.v1alpha1 import DIGEST_PARAMETER


@dataclass(frozen=True)
class ReplicaVerdict:
    ok: bool
    reason: str  # CamelCase
    message: str
    ready_seen: bool = False  # the model answered READY (for READY -> gate latency)


async def check_replica(
    address: str, model: str, steps: tuple[str, ...], digest: str, timeout: float = 2.0
) -> ReplicaVerdict:
    """One round of questions to the Triton at `address` (host:port of gRPC)."""
    client = grpcaio.InferenceServerClient(address)
    try:
        for name in (model, *steps):
            ready = await client.is_model_ready(name, client_timeout=timeout)
            if not ready:
                return await _why_not_ready(client, name, timeout)
        cfg = await client.get_model_config(model, client_timeout=timeout)
        param = cfg.config.parameters.get(DIGEST_PARAMETER)
        loaded = param.string_value if param is not None else ""
        if loaded != digest:
            return ReplicaVerdict(
                False,
                "ConfigDigestMismatch",
                f"Triton loaded config digest {loaded or '(none)'} but this replica wants {digest}",
                ready_seen=True,
            )
        return ReplicaVerdict(True, "ModelWarmed", f"model {model} is READY with config digest {digest}", ready_seen=True)
    except InferenceServerException as exc:
        return ReplicaVerdict(False, "TritonUnreachable", f"Triton did not answer: {exc.message() or exc}")
    except (TimeoutError, OSError) as exc:
        return ReplicaVerdict(False, "TritonUnreachable", f"Triton did not answer: {exc}")
    finally:
        await client.close()


async def _why_not_ready(client: grpcaio.InferenceServerClient, name: str, timeout: float) -> ReplicaVerdict:
    index = await client.get_model_repository_index(client_timeout=timeout, as_json=False)
    states = {m.name: m for m in index.models}
    entry = states.get(name)
    state = entry.state if entry is not None else "UNAVAILABLE"
    reason = entry.reason if entry is not None else "not in the model repository"
    if state in ("LOADING", ""):
        return ReplicaVerdict(False, "ModelWarming", f"model {name} is loading and warming up")
    return ReplicaVerdict(False, "ModelLoadFailed", f"model {name} is {state}: {reason}".strip())
