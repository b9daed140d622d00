"""Single requests to one replica's tritonserver, as tests and benches ask them: an add-sub inference
(`infer_add_sub`), Triton's own readiness answer over HTTP (`model_ready_over_http`), the config digest a replica
has loaded (`loaded_digest`), how many requests the replicas answered by their own statistics
(`added_answers`), and Triton's admin calls a client of a Service could try (`ADMIN_HTTP`, `admin_grpc_calls`,
`admin_not_refused`). Continuous load through a Service is `e2e.load.ServiceLoad`'s.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from e2e.kube import Kube
from e2e.operator_fixtures import live_pods
from triton_operator.api.pod import DIGEST_PARAMETER, KEY_HEADER
from triton_operator.render.repository_key import GRPC_KEY_HEADER


def infer_add_sub(address: str, model: str = "add-sub") -> np.ndarray:
    """One request at `address`:8001; returns OUTPUT0 (a+b)."""
    client = grpcclient.InferenceServerClient(f"{address}:8001")
    try:
        a = np.array([[1, 2, 3, 4]], dtype=np.float32)
        b = np.array([[10, 20, 30, 40]], dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32"), grpcclient.InferInput("INPUT1", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        return client.infer(model, inputs, client_timeout=30).as_numpy("OUTPUT0")
    finally:
        client.close()


def model_ready_over_http(ip: str, model: str, version: str | None = None) -> bool | None:
    """Triton's own answer (for one `version`, when given), on a fresh connection each time (a gRPC channel would
    back off after refusals).

    True on 200; False when Triton says no (400) or nothing listens yet (Triton opens its ports only once
    load and warm-up are done); None when the question went unanswered (a timeout on a loaded machine),
    which proves nothing either way.
    """
    try:
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/ready"
        with urllib.request.urlopen(f"http://{ip}:8000{path}", timeout=5) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False
    except urllib.error.URLError as e:
        return False if isinstance(e.reason, ConnectionRefusedError) else None
    except ConnectionRefusedError:
        return False
    except OSError:
        return None


def added_answers(kube: Kube, namespace: str, first: str, model: str) -> dict[str, int]:
    """Requests each replica of `model` other than `first` has answered, by Triton's own statistics (the load goes through
    the ClusterIP: only the replicas know who answered); only those that answered some."""
    out = {}
    for pod in live_pods(kube, namespace, model):
        if pod["metadata"]["name"] == first or not pod["status"].get("podIP"):
            continue
        client = grpcclient.InferenceServerClient(f"{pod['status']['podIP']}:8001")
        try:
            stats = client.get_inference_statistics(model, client_timeout=2)
            done = sum(s.inference_stats.success.count for s in stats.model_stats)
        except InferenceServerException:
            done = 0
        finally:
            client.close()
        if done:
            out[pod["metadata"]["name"]] = done
    return out


def loaded_digest(ip: str, model: str = "add-sub") -> str | None:
    """The digest parameter of the config the replica's Triton has loaded (None: it has no READY copy)."""
    client = grpcclient.InferenceServerClient(f"{ip}:8001")
    try:
        if not client.is_model_ready(model, client_timeout=2):
            return None
        try:
            config = client.get_model_config(model, client_timeout=2).config
        except InferenceServerException as e:
            # Unloaded between the two questions (a run of e2e/test_pool_autoscaling met "has no available
            # versions" while waiting for exactly that): no READY copy. Any other error is the test's to see.
            if e.status() == "StatusCode.NOT_FOUND":
                return None
            raise
        param = config.parameters.get(DIGEST_PARAMETER)
        return param.string_value if param is not None else None
    finally:
        client.close()


#: Triton's admin APIs besides the repository's (issue 39): what a client could change or read through a Service with
#: them open. Path and body (None: a GET).
ADMIN_HTTP: dict[str, tuple[str, dict[str, Any] | None]] = {
    "set the log level": ("/v2/logging", {"log_verbose_level": 1}),
    "read the log settings": ("/v2/logging", None),
    "register a system shared-memory region": ("/v2/systemsharedmemory/region/x/register",
                                               {"key": "/triton_python_backend_shm_region_1", "offset": 0,
                                                "byte_size": 8}),
    "system shared-memory status": ("/v2/systemsharedmemory/status", None),
    "CUDA shared-memory status": ("/v2/cudasharedmemory/status", None),
    "set trace settings": ("/v2/trace/setting", {"trace_rate": "1"}),
    "read trace settings": ("/v2/trace/setting", None),
}


def admin_grpc_calls(client: grpcclient.InferenceServerClient) -> dict[str, Callable[[dict[str, str] | None], Any]]:
    """The same admin APIs over gRPC, each a call taking the request's metadata."""
    return {"set the log level": lambda h: client.update_log_settings({"log_verbose_level": 1}, headers=h),
            "read the log settings": lambda h: client.get_log_settings(headers=h),
            "register a system shared-memory region": lambda h: client.register_system_shared_memory(
                "x", "/triton_python_backend_shm_region_1", 8, headers=h),
            "system shared-memory status": lambda h: client.get_system_shared_memory_status(headers=h),
            "CUDA shared-memory status": lambda h: client.get_cuda_shared_memory_status(headers=h),
            "set trace settings": lambda h: client.update_trace_settings(settings={"trace_rate": "1"}, headers=h),
            "read trace settings": lambda h: client.get_trace_settings(headers=h)}


def http_call(address: str, path: str, body: dict[str, Any] | None,
              headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One HTTP call to Triton at `address` (host:port), as any client that reaches it can make: a POST of `body`, or
    a GET when it is None."""
    req = urllib.request.Request(f"http://{address}{path}", data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})},
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - a test address (198.18.0.0/15)
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def admin_not_refused(ip: str) -> dict[str, str]:
    """Each admin call at `ip` (a Service's or a replica's; HTTP 8000, gRPC 8001) with no key and with a wrong one,
    that Triton did not refuse as restricted: empty when every one was."""
    wrong: dict[str, str] = {}
    for what, (path, body) in ADMIN_HTTP.items():
        for headers in (None, {KEY_HEADER: "0" * 64}):
            status, text = http_call(f"{ip}:8000", path, body, headers)
            if not (status == 403 and "This API is restricted" in text):
                wrong[f"HTTP {what} {headers}"] = f"{status} {text[:120]}"
    client = grpcclient.InferenceServerClient(f"{ip}:8001")
    try:
        wrong.update({f"gRPC {k}": v for k, v in grpc_not_refused(admin_grpc_calls(client)).items()})
    finally:
        client.close()
    return wrong


def grpc_not_refused(calls: Mapping[str, Callable[[dict[str, str] | None], Any]]) -> dict[str, str]:
    """Each gRPC call, with no key and with a wrong one, that Triton did not refuse as restricted (UNAVAILABLE, "This
    protocol is restricted"): empty when every one was."""
    wrong: dict[str, str] = {}
    for what, call in calls.items():
        for headers in (None, {GRPC_KEY_HEADER: "0" * 64}):
            try:
                call(headers)
                wrong[f"{what} {headers}"] = "accepted"
            except InferenceServerException as exc:
                if exc.status() != "StatusCode.UNAVAILABLE" or "This protocol is restricted" not in (exc.message() or ""):
                    wrong[f"{what} {headers}"] = f"{exc.status()} {exc.message()}"
    return wrong
