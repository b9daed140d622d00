"""Talking to a running Triton over gRPC: load models, read readiness, loaded config and statistics.

For the CLI and tests (the operator itself asks replicas with `rpc.TritonClient`): synchronous tritonclient
calls; callers in asyncio code run them in a thread.
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


def connect(url: str, timeout: float = 5.0) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url, verbose=False)


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


def execution_count(client: grpcclient.InferenceServerClient, name: str) -> int:
    stats = client.get_inference_statistics(name)
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
    ready = client.is_model_ready(name)
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
