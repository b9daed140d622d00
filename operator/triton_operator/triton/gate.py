"""Asks one replica's Triton whether it serves exactly the desired config, warm.

A replica passes when the model and every ensemble step are READY and the
loaded config's digest parameter equals the digest the replica was created
for. Otherwise the verdict says why, with Triton's own reason when a load failed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from ..api.v1alpha1 import DIGEST_PARAMETER


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str  # CamelCase
    message: str
    state: str  # Loading | Warming | Ready | Failed
    ready_seen: bool = False  # the model answered READY (for READY -> gate latency)


async def check_replica(
    address: str, model: str, steps: tuple[str, ...], digest: str, timeout: float = 2.0
) -> Verdict:
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
            return Verdict(
                False,
                "ConfigDigestMismatch",
                f"Triton loaded config digest {loaded or '(none)'} but this replica wants {digest}",
                "Failed",
                ready_seen=True,
            )
        return Verdict(True, "ModelWarmed", f"model {model} is READY with config digest {digest}", "Ready", True)
    except InferenceServerException as exc:
        return Verdict(False, "TritonUnreachable", f"Triton did not answer: {exc.message() or exc}", "Loading")
    except (asyncio.TimeoutError, OSError) as exc:
        return Verdict(False, "TritonUnreachable", f"Triton did not answer: {exc}", "Loading")
    finally:
        await client.close()


async def _why_not_ready(client: grpcaio.InferenceServerClient, name: str, timeout: float) -> Verdict:
    index = await client.get_model_repository_index(client_timeout=timeout, as_json=False)
    states = {m.name: m for m in index.models}
    entry = states.get(name)
    state = entry.state if entry is not None else "UNAVAILABLE"
    reason = entry.reason if entry is not None else "not in the model repository"
    if state in ("LOADING", ""):
        return Verdict(False, "ModelWarming", f"model {name} is loading and warming up", "Warming")
    return Verdict(False, "ModelLoadFailed", f"model {name} is {state}: {reason}".strip(), "Failed")
