"""Triton's two repository calls that wait for the work they ask for, load and unload, over gRPC.

Why not HTTP, as every other call (`triton.rest`): Triton 2.51's HTTP server answers a load on one of its worker
threads (`--http-thread-count`, 8) and holds that thread until the load is done, the model's `initialize` and warm-up
included. Each new HTTP connection is handed to a worker thread in turn, so while a load runs, every request of every
model of the server whose connection lands on that thread waits for it (measured here, `tests/test_repository_grpc.py`:
a load of 3 to 6 s, requests to models nobody loaded taking as long; the CI run of the pool's 20-model test saw one
time out after 10 s). Triton's gRPC server runs a load off its inference threads: requests over HTTP and gRPC go on
being answered in milliseconds, and two loads run side by side.

grpcio is imported at the first call (8 MiB of the operator's resident memory, measured with grpcio 1.85): the
operator process starts without it (`tests/test_protos.py`). The messages are tritonclient's generated ones
(`api.protos`); the call is grpcio's own unary call, so no client code of tritonclient (numpy) is loaded. No proxy
(`grpc.enable_http_proxy` off): a replica is reached directly, as over HTTP (`trust_env=False`).

The key (`render.repository_key`) travels in the header `--grpc-restricted-protocol` names; without it the replica
refuses the call (UNAVAILABLE, "This protocol is restricted").

Bounds (issue 39, M1): what we send may be large (a pool's model files travel in the load request, up to Triton's own
INT32_MAX), but what we receive is an empty `RepositoryModelLoadResponse`: the channel receives at most
`MAX_ANSWER` bytes per message (grpcio's default is 4 MiB; tritonclient raises it to 2 GiB), so a server that answers
with a huge message gets RESOURCE_EXHAUSTED, a `TritonError` as any failed load. Every call has a deadline (the
caller's, else `DEFAULT_TIMEOUT`), over the whole call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api import protos
from ..render.repository_key import GRPC_KEY_HEADER
from .rest import TritonError

_SERVICE = "/inference.GRPCInferenceService/"
#: Triton's own limit on what it receives (INT32_MAX); a pool's files come in the load request.
_MAX_MESSAGE = 2**31 - 1
#: The largest message received: load and unload answer an empty message (Triton's error text travels in the
#: trailers, which grpc bounds apart: `grpc.max_metadata_size`, 8 KiB by default).
MAX_ANSWER = 1 << 20
#: A call's deadline when its caller names none (a load includes the model's initialize and warm-up).
DEFAULT_TIMEOUT = 600.0


async def _call(address: str, method: str, request: Any, response: Any, key: str | None, timeout: float | None) -> None:
    import grpc
    import grpc.aio

    options = [("grpc.enable_http_proxy", 0), ("grpc.max_send_message_length", _MAX_MESSAGE),
               ("grpc.max_receive_message_length", MAX_ANSWER)]
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    metadata = ((GRPC_KEY_HEADER, key),) if key else None
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        rpc = channel.unary_unary(_SERVICE + method, request_serializer=type(request).SerializeToString,
                                  response_deserializer=response.FromString)
        try:
            await rpc(request, timeout=timeout, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TritonError(f"no answer from {address} within {timeout}s ({method})") from None
            if code == grpc.StatusCode.UNAVAILABLE and "restricted" not in (exc.details() or ""):
                raise TritonError(f"{method} at {address} failed: {exc.details()}") from None
            raise TritonError(exc.details() or code.name, _HTTP_STATUS.get(code.name)) from None


#: The HTTP status Triton's HTTP endpoint answers for the same refusal, so callers read one `TritonError.status`.
_HTTP_STATUS = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "INTERNAL": 500, "UNAVAILABLE": 403,
                "ALREADY_EXISTS": 409}


async def load_model(address: str, name: str, config: str | None = None, files: Mapping[str, bytes] | None = None,
                     key: str | None = None, timeout: float | None = None) -> None:
    """Loads `name` into the Triton whose gRPC endpoint is `address` (explicit model control); `config` (JSON)
    overrides the repository's config.pbtxt, and `files` (`file:<path>` -> content, with `config`) are the model's
    directory, written by Triton itself (a pool replica, `render.pool.load_request`). Returns once the model is
    loaded (and warmed up), or raises `TritonError` with Triton's reason."""
    pb = protos.generated("service_pb2")
    request = pb.RepositoryModelLoadRequest(model_name=name)
    if config is not None:
        request.parameters["config"].string_param = config
    for path, content in (files or {}).items():
        request.parameters[path].bytes_param = content
    await _call(address, "RepositoryModelLoad", request, pb.RepositoryModelLoadResponse, key, timeout)


async def unload_model(address: str, name: str, key: str | None = None, timeout: float | None = None) -> None:
    """Asks the Triton at `address` (gRPC) to unload `name`; Triton lets requests in flight finish first."""
    pb = protos.generated("service_pb2")
    request = pb.RepositoryModelUnloadRequest(model_name=name)
    await _call(address, "RepositoryModelUnload", request, pb.RepositoryModelUnloadResponse, key, timeout)
