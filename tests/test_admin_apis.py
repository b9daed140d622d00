"""Triton's admin APIs on a REAL tritonserver (2.51 from the nvidia-pytriton wheel), started with the flags replicas
run with (`render.repository_key.restriction_args`, issue 39 H1).

Without a restriction any client of a model's Service could change the server's log level, register shared-memory
regions (the entry point of the remote-code-execution chain in Triton before 25.07) and change trace settings. Each
replica restricts the repository, shared-memory, logging and trace APIs to its key: every one of those calls is
refused over HTTP (403) and gRPC (UNAVAILABLE "This protocol is restricted") with no key or a wrong one, and answered
with the key; what clients need (inference, readiness, a model's config and statistics) stays open, and so do the
operator's own calls (the probe's statistics, the gate's question, a load). `spec.server.unrestrictedApis` opens the
categories it names, and never the repository API.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.triton_helpers import Served, ServerPool, models_from_yaml, tensor
from triton_operator.agent.probe import fetch_counts
from triton_operator.api.pod import KEY_HEADER
from triton_operator.render.repository_key import GRPC_KEY_HEADER
from triton_operator.triton.replica import check_replica
from triton_operator.triton.repository import load_model, unload_model

pytestmark = pytest.mark.triton

KEY = "k" * 64
WRONG = "0" * 64
MODEL = "admin-guarded"
SPEC = f"""
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata: {{name: {MODEL}}}
spec:
  backend: python
  batching: false
  inputs: [{{name: INPUT, dataType: FP32, dims: [1]}}]
  outputs: [{{name: OUTPUT, dataType: FP32, dims: [1]}}]
  instanceGroups: [{{kind: CPU, count: 1}}]
  source:
    inline:
      model.py: |
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", pb_utils.get_input_tensor_by_name(
                    r, "INPUT").as_numpy() + 1)]) for r in requests]
"""

#: category -> (what, path, body or None for a GET): Triton's admin calls a client of a Service could make.
HTTP_CALLS: dict[str, list[tuple[str, str, dict[str, Any] | None]]] = {
    "logging": [("set the log level", "/v2/logging", {"log_verbose_level": 1}),
                ("read the log settings", "/v2/logging", None)],
    "shared-memory": [("register a system region", "/v2/systemsharedmemory/region/x/register",
                       {"key": "/no-such-region", "offset": 0, "byte_size": 8}),
                      ("system shared-memory status", "/v2/systemsharedmemory/status", None),
                      ("CUDA shared-memory status", "/v2/cudasharedmemory/status", None)],
    "trace": [("set trace settings", "/v2/trace/setting", {"trace_rate": "1"}),
              ("read trace settings", "/v2/trace/setting", None)],
    "model-repository": [("list the repository", "/v2/repository/index", {}),
                         ("unload the model", f"/v2/repository/models/{MODEL}/unload", {})],
}


def grpc_calls(client: grpcclient.InferenceServerClient) -> dict[str, list[tuple[str, Callable[[Any], Any]]]]:
    return {
        "logging": [("set the log level", lambda h: client.update_log_settings({"log_verbose_level": 1}, headers=h)),
                    ("read the log settings", lambda h: client.get_log_settings(headers=h))],
        "shared-memory": [("register a system region", lambda h: client.register_system_shared_memory(
                              "x", "/no-such-region", 8, headers=h)),
                          ("system shared-memory status", lambda h: client.get_system_shared_memory_status(headers=h)),
                          ("CUDA shared-memory status", lambda h: client.get_cuda_shared_memory_status(headers=h))],
        "trace": [("set trace settings", lambda h: client.update_trace_settings(settings={"trace_rate": "1"}, headers=h)),
                  ("read trace settings", lambda h: client.get_trace_settings(headers=h))],
        "model-repository": [("list the repository", lambda h: client.get_model_repository_index(headers=h)),
                             ("unload the model", lambda h: client.unload_model(MODEL, headers=h))],
    }


def call(address: str, path: str, body: dict[str, Any] | None, key: str | None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{address}{path}", data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **({KEY_HEADER: key} if key else {})},
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - 127.0.0.1
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def restricted_over_http(status: int, text: str) -> bool:
    return status == 403 and "This API is restricted" in text


def grpc_answer(fn: Callable[[Any], Any], headers: dict[str, str] | None) -> str:
    """"ok", or the gRPC status and message of the refusal."""
    try:
        fn(headers)
        return "ok"
    except InferenceServerException as exc:
        return f"{exc.status()} {exc.message()}"


@pytest.fixture(scope="module")
def servers() -> Iterator[ServerPool]:
    pool = ServerPool()
    try:
        yield pool
    finally:
        pool.close()


def serve(servers: ServerPool, tmp: Path, opened: tuple[str, ...] = ()) -> Served:
    served = servers.serve(models_from_yaml(SPEC), tmp / "repo", key=KEY, opened=opened)
    # HTTP opens after gRPC, which start() waits for.
    served.wait_for("the HTTP port", lambda: call(served.server.http_url, "/v2/health/ready", None, None)[0] == 200)
    return served


def refusals(served: Served, opened: tuple[str, ...]) -> dict[str, str]:
    """Every admin call with no key, a wrong key and the key: what did not come out as the restriction says (a
    restricted category refused without the right key and not refused with it; an opened one never refused)."""
    wrong: dict[str, str] = {}
    address = served.server.http_url
    for category, calls in HTTP_CALLS.items():
        for what, path, body in calls:
            for key in (None, WRONG, KEY):
                status, text = call(address, path, body, key)
                refused = restricted_over_http(status, text)
                if refused != (category not in opened and key != KEY):
                    wrong[f"HTTP {what} (key {key and key[:1]})"] = f"{status} {text[:120]}"
    client = grpcclient.InferenceServerClient(served.server.grpc_url)
    try:
        for category, gcalls in grpc_calls(client).items():
            for what, fn in gcalls:
                if what == "unload the model":
                    continue  # with the key it would unload the model: the HTTP call above has (and it is loaded again)
                for key in (None, WRONG, KEY):
                    answer = grpc_answer(fn, {GRPC_KEY_HEADER: key} if key else None)
                    refused = answer.startswith("StatusCode.UNAVAILABLE") and "This protocol is restricted" in answer
                    if refused != (category not in opened and key != KEY):
                        wrong[f"gRPC {what} (key {key and key[:1]})"] = answer[:160]
    finally:
        client.close()
    return wrong


def infer(served: Served) -> float:
    out = served.client.infer(MODEL, [tensor("INPUT", __import__("numpy").array([1.0], "float32"))])
    return float(out.as_numpy("OUTPUT")[0])


def test_without_the_key_no_client_reaches_the_shared_memory_logging_trace_or_repository_api(
        servers: ServerPool, tmp_path: Path) -> None:
    served = serve(servers, tmp_path)
    assert not (wrong := refusals(served, ())), served.why(f"not as restricted: {json.dumps(wrong, indent=1)}")
    # The key's HTTP unload above took the model away: load it again, with the key, as the operator does.
    asyncio.run(load_model(served.server.grpc_url, MODEL, key=KEY))
    # What clients need stays open: inference, readiness, the model's config and statistics.
    assert infer(served) == 2.0
    for path in (f"/v2/models/{MODEL}/ready", f"/v2/models/{MODEL}/config", f"/v2/models/{MODEL}/stats", "/v2"):
        assert call(served.server.http_url, path, None, None)[0] == 200, path
    # The operator's own calls: the probe's statistics (no key), the gate's question of why a model is not READY and
    # a load and an unload (with the key).
    host, port = served.server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        counts = fetch_counts(conn)
    finally:
        conn.close()
    assert counts[MODEL][0] >= 1, counts
    verdict = asyncio.run(check_replica(served.server.http_url, "no-such-model", (), "d", key=KEY))
    assert verdict.reason == "ModelLoadFailed", verdict
    asyncio.run(unload_model(served.server.grpc_url, MODEL, key=KEY))
    asyncio.run(load_model(served.server.grpc_url, MODEL, key=KEY))
    assert infer(served) == 2.0


def test_unrestricted_apis_opens_the_categories_it_names_and_never_the_repository(
        servers: ServerPool, tmp_path: Path) -> None:
    opened = ("shared-memory", "trace")
    served = serve(servers, tmp_path, opened)
    assert not (wrong := refusals(served, opened)), served.why(f"not as restricted: {json.dumps(wrong, indent=1)}")
    asyncio.run(load_model(served.server.grpc_url, MODEL, key=KEY))
    assert infer(served) == 2.0
