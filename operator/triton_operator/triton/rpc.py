"""The operator's gRPC client for Triton: the few GRPCInferenceService calls it makes, over `grpc.aio`.

The stubs and messages are tritonclient's generated ones (`api.protos`), so requests and answers are exactly what
`tritonclient.grpc.aio.InferenceServerClient` sends and returns; that client itself is not imported, because its
package brings numpy (issue 17: the operator's memory). The operator asks only about models and the repository:
it never sends an inference request. Errors come as `TritonError`, with gRPC's status and Triton's message.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import grpc  # type: ignore[import-untyped]  # no stubs installed (types-grpcio is not a dependency)

from ..api import protos

#: tritonclient's own limits: a model config or statistics answer is never cut short.
_MAX_MESSAGE = 2**31 - 1
_OPTIONS = [("grpc.max_send_message_length", _MAX_MESSAGE), ("grpc.max_receive_message_length", _MAX_MESSAGE)]


class TritonError(Exception):
    """Triton (or gRPC on its way) refused or failed a call: `code` is gRPC's status, e.g. `StatusCode.UNAVAILABLE`
    while nothing listens, `StatusCode.DEADLINE_EXCEEDED` past the call's timeout."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code

    def message(self) -> str:  # the accessor tritonclient's InferenceServerException has
        return str(self.args[0]) if self.args else ""


def _error(exc: grpc.RpcError) -> TritonError:
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
    details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else None
    return TritonError(details or (str(code) if code is not None else str(exc)), code)


class TritonClient:
    """One channel to the Triton at `address` (host:port of its gRPC endpoint). Use as `async with`, or `close()`."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._pb = protos.generated("service_pb2")
        self._channel = grpc.aio.insecure_channel(address, options=_OPTIONS)
        self._stub = protos.generated("service_pb2_grpc").GRPCInferenceServiceStub(self._channel)

    async def __aenter__(self) -> TritonClient:
        return self

    async def __aexit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        try:
            return await getattr(self._stub, method)(request=request, timeout=timeout)
        except grpc.RpcError as exc:
            raise _error(exc) from None

    async def is_model_ready(self, name: str, version: str = "", timeout: float | None = None) -> bool:
        answer = await self._call("ModelReady", self._pb.ModelReadyRequest(name=name, version=version), timeout)
        return bool(answer.ready)

    async def model_config(self, name: str, version: str = "", timeout: float | None = None) -> Any:
        """The config Triton has loaded for the model (a `ModelConfig` message)."""
        answer = await self._call("ModelConfig", self._pb.ModelConfigRequest(name=name, version=version), timeout)
        return answer.config

    async def repository_index(self, timeout: float | None = None) -> Any:
        """Every model in the repository, one entry per version, with its state and reason (`.models`)."""
        return await self._call("RepositoryIndex", self._pb.RepositoryIndexRequest(), timeout)

    async def load_model(self, name: str, config: str | None = None, timeout: float | None = None) -> None:
        """Loads `name` (explicit model control); `config` (JSON) overrides the repository's config.pbtxt."""
        request = self._pb.RepositoryModelLoadRequest(model_name=name)
        if config is not None:
            request.parameters["config"].string_param = config
        await self._call("RepositoryModelLoad", request, timeout)

    async def unload_model(self, name: str, timeout: float | None = None) -> None:
        await self._call("RepositoryModelUnload", self._pb.RepositoryModelUnloadRequest(model_name=name), timeout)

    async def statistics(self, name: str, version: str = "", timeout: float | None = None) -> Any:
        """The model's cumulative statistics, one entry per version (`.model_stats`)."""
        return await self._call("ModelStatistics", self._pb.ModelStatisticsRequest(name=name, version=version),
                                timeout)
