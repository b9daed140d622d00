"""Talking to a running Triton over gRPC: load models, read readiness, loaded config and statistics.

For the CLI and tests (the operator itself asks replicas with `rpc.TritonClient`): synchronous tritonclient
calls; callers in asyncio code run them in a thread.

Bounds (issue 39, M1): the channel receives at most `MAX_ANSWER` bytes per message (tritonclient's own default is
2 GiB), and every call has a deadline (`client_timeout`). An answer over the cap is RESOURCE_EXHAUSTED, an
`InferenceServerException` as any failed call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from ..api.pod import config_digest


@dataclass(frozen=True)
class ModelState:
    """What Triton says about one model: READY / LOADING / UNAVAILABLE / … with its reason."""

    name: str
    state: str
    reason: str = ""
    loaded_digest: str | None = None

    @property
    def ready(self) -> bool:
        return self.state == "READY"


@dataclass(frozen=True)
class LoadResult:
    name: str
    ready: bool
    seconds: float
    reason: str = ""
    warmup_executions: int = 0


#: The largest message received: the answers asked for here (a model's config, the repository index, statistics) are
#: kilobytes; 4 MiB is grpcio's own default.
MAX_ANSWER = 4 << 20
#: What a request may carry (tritonclient's default: Triton's own limit, INT32_MAX).
_MAX_SEND = 2**31 - 1


def connect(url: str, timeout: float = 5.0) -> grpcclient.InferenceServerClient:
    """A client of the Triton at `url` (host:port of its gRPC endpoint) whose channel receives at most `MAX_ANSWER`
    bytes per message, with tritonclient's other channel settings (its keep-alive defaults)."""
    keepalive = grpcclient.KeepAliveOptions()
    return grpcclient.InferenceServerClient(url, verbose=False, channel_args=[
        ("grpc.max_send_message_length", _MAX_SEND),
        ("grpc.max_receive_message_length", MAX_ANSWER),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
    ])


def loaded_digest(client: grpcclient.InferenceServerClient, name: str, timeout: float | None = 2.0) -> str | None:
    """The digest parameter of the config Triton actually loaded for `name`."""
    return config_digest(client.get_model_config(name, client_timeout=timeout).config)


def repository_states(client: grpcclient.InferenceServerClient, timeout: float | None = 2.0,
                      headers: dict[str, str] | None = None) -> dict[str, ModelState]:
    """Every model in the repository index with its state and reason (newest version per model)."""
    index = client.get_model_repository_index(headers=headers, client_timeout=timeout)
    out: dict[str, ModelState] = {}
    for m in index.models:
        prev = out.get(m.name)
        if prev is None or prev.state != "READY":
            out[m.name] = ModelState(m.name, m.state or "UNAVAILABLE", m.reason)
    return out


def execution_count(client: grpcclient.InferenceServerClient, name: str, timeout: float | None = 10.0) -> int:
    stats = client.get_inference_statistics(name, client_timeout=timeout)
    return sum(s.execution_count for s in stats.model_stats)


def load_model(client: grpcclient.InferenceServerClient, name: str, timeout: float = 300.0,
               headers: dict[str, str] | None = None) -> LoadResult:
    """Load (and so warm up) one model in explicit mode; READY or Triton's own reason for failing.

    Some defects leave Triton LOADING forever (a Python model whose stub cannot start), so the
    load has a deadline; past it the model is reported as failed with its repository state.
    `headers`: gRPC metadata for a server whose repository API is restricted (`render.repository_key`).
    """
    start = time.monotonic()
    try:
        client.load_model(name, headers=headers, client_timeout=timeout)
    except InferenceServerException as exc:
        reason = exc.message() or str(exc)
        if "Deadline" in reason:
            reason = f"still not READY after {timeout:.0f}s (Triton keeps it LOADING; see the tritonserver log)"
        states = _safe_states(client, headers)
        if name in states and states[name].reason:
            reason = states[name].reason
        return LoadResult(name, False, time.monotonic() - start, reason)
    seconds = time.monotonic() - start
    ready = client.is_model_ready(name, client_timeout=10.0)
    executions = 0
    if ready:
        try:
            executions = execution_count(client, name)
        except InferenceServerException:
            executions = 0
    return LoadResult(name, ready, seconds, "" if ready else "not READY after load", executions)


def _safe_states(client: grpcclient.InferenceServerClient,
                 headers: dict[str, str] | None = None) -> dict[str, ModelState]:
    try:
        return repository_states(client, headers=headers)
    except InferenceServerException:
        return {}
