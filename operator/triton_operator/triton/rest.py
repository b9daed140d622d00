"""The operator's client for Triton: the few calls it makes, over Triton's HTTP/REST API (KServe v2 and Triton's
repository, config and statistics extensions), with aiohttp.

The operator asks only about models and the repository, never for an inference, and aiohttp is loaded anyway
(kopf's own client): so neither tritonclient's client (numpy) nor grpc is loaded in the operator's process
(issue 17: its memory). The answers are parsed into tritonclient's generated messages (`api.protos`), the very
types a gRPC answer has, so callers read `ModelConfig`, `RepositoryIndexResponse` and `ModelStatisticsResponse`
fields as ever. Errors come as `TritonError`: Triton's own message, and the HTTP status when Triton answered.

HTTP is also the port tritonserver opens last (gRPC first, then HTTP, then metrics): a replica that answers here
answers over both.

The repository index carries the model's repository key (`render.repository_key`), which replicas require for it;
no other call carries it, so a replica's other endpoints never see it. Loads and unloads go over gRPC
(`triton.repository`): over HTTP, Triton 2.51 holds one of its HTTP threads for the whole load, and the requests of
every model whose connections land on that thread wait for it.

Bounds (issue 39, M1). Whoever may create a TritonModel chooses the image its replicas run, so what answers here may be
any server: one that streams an endless body, or trickles it a byte at a time. Every answer is read in chunks up to
`MAX_ANSWER` bytes (a Content-Length over it is refused before its body is read), and the whole call, connect to last
byte, has a deadline (the caller's `timeout`, else `DEFAULT_TIMEOUT`). An answer over the cap, or one that is not the
JSON its call expects, is a `TritonError` with no status, as a replica that did not answer: the gate, heals, reloads
and pool loads already take that for a failed question, and ask again next round. So one replica costs the operator
at most `MAX_ANSWER` bytes per question in flight, whatever it sends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
from google.protobuf import json_format

from ..api import protos
from ..api.pod import KEY_HEADER

#: The largest answer read from a replica. The largest the operator asks for are a model's config (an ensemble's or a
#: large model's: tens of KiB) and the statistics of a model with many batch sizes (a few hundred bytes per size): 4 MiB
#: is a hundred times that, and small beside the operator's memory limit.
MAX_ANSWER = 4 << 20
#: A call's deadline when its caller names none: connect, request, and the answer's last byte.
DEFAULT_TIMEOUT = 30.0


_T = TypeVar("_T")


class TritonError(Exception):
    """Triton refused or failed a call (`status`: the HTTP status), or did not answer (`status` None: nothing
    listens, the connection broke, or the call's timeout passed)."""

    def __init__(self, message: str, status: int | None = None, oversized: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.oversized = oversized  # its answer was over the cap: not a server of ours (`read_capped`)

    def message(self) -> str:  # the accessor tritonclient's InferenceServerException has
        return str(self.args[0]) if self.args else ""


def _model_path(name: str, version: str = "") -> str:
    path = f"/v2/models/{quote(name, safe='')}"
    return f"{path}/versions/{quote(version, safe='')}" if version else path


def _error_text(body: bytes) -> str:
    """Triton's `{"error": "..."}`, else the body's start."""
    try:
        return str(json.loads(body).get("error") or "")
    except (ValueError, AttributeError):
        return body[:300].decode(errors="replace")


class AnswerTooLarge(Exception):
    """An HTTP answer over its cap (`read_capped`)."""


async def read_capped(resp: aiohttp.ClientResponse, limit: int = MAX_ANSWER) -> bytes:
    """The body of `resp`, read chunk by chunk and never more than `limit` bytes: `AnswerTooLarge` as soon as the
    Content-Length, or the bytes that came, go over it (the connection is then closed, not drained)."""
    if resp.content_length is not None and resp.content_length > limit:
        resp.close()
        raise AnswerTooLarge(f"an answer of {resp.content_length} bytes; at most {limit} are read")
    chunks: list[bytes] = []
    size = 0
    while chunk := await resp.content.read(64 * 1024):
        size += len(chunk)
        if size > limit:
            resp.close()
            raise AnswerTooLarge(f"an answer of more than {limit} bytes; at most {limit} are read")
        chunks.append(chunk)
    return b"".join(chunks)


def _parsed(parse: Callable[[], _T], what: str, address: str) -> _T:
    """`parse()`, with a body that is not the JSON expected (malformed, nested past the parser's depth, of another
    shape) as a `TritonError`."""
    try:
        return parse()
    except (ValueError, TypeError, AttributeError, RecursionError, json_format.Error) as exc:
        raise TritonError(f"{what} from {address} is not what Triton answers: {str(exc)[:200]}") from None


class TritonClient:
    """Calls to the Triton whose HTTP endpoint is `address` (host:port), with `key` on its repository calls (None:
    none; a replica then refuses them with 403). Use as `async with`, or `close()`."""

    def __init__(self, address: str, key: str | None = None) -> None:
        self.address = address
        self._repository_headers = {KEY_HEADER: key} if key else {}
        self._base = f"http://{address}"
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> TritonClient:
        return self

    async def __aexit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, timeout: float | None, body: Any = None,
                       ok: tuple[int, ...] = (200,)) -> tuple[int, bytes]:
        """(status, body) of one call, the body at most `MAX_ANSWER` bytes and the whole call within `timeout` (None:
        `DEFAULT_TIMEOUT`); a status outside `ok` raises `TritonError` with Triton's message."""
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=False)
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        if path.startswith("/v2/repository/"):
            headers.update(self._repository_headers)
        try:
            async with asyncio.timeout(timeout), \
                    self._session.request(method, self._base + path, data=data, headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                answer = await read_capped(resp)
                status = resp.status
        except AnswerTooLarge as exc:
            raise TritonError(f"{method} {path} at {self.address}: {exc}", oversized=True) from None
        except TimeoutError:
            raise TritonError(f"no answer from {self.address} within {timeout}s ({method} {path})") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise TritonError(f"{method} {path} at {self.address} failed: {exc}") from None
        if status not in ok:
            raise TritonError(_error_text(answer) or f"HTTP {status}", status)
        return status, answer

    async def is_model_ready(self, name: str, version: str = "", timeout: float | None = None) -> bool:
        """READY (200), or not (400: loading, failed, unloaded or unknown)."""
        status, _ = await self._request("GET", _model_path(name, version) + "/ready", timeout, ok=(200, 400))
        return status == 200

    async def model_config(self, name: str, version: str = "", timeout: float | None = None) -> Any:
        """The config Triton has loaded for the model, as a `ModelConfig` message."""
        _, answer = await self._request("GET", _model_path(name, version) + "/config", timeout)
        return _parsed(lambda: json_format.Parse(answer, protos.generated("model_config_pb2").ModelConfig(),
                                                 ignore_unknown_fields=True), "the model config", self.address)

    async def repository_index(self, timeout: float | None = None) -> Any:
        """Every model in the repository, one entry per version, with its state and reason (`.models`)."""
        _, answer = await self._request("POST", "/v2/repository/index", timeout, body={})
        return _parsed(lambda: json_format.ParseDict({"models": json.loads(answer)},
                                                     protos.generated("service_pb2").RepositoryIndexResponse(),
                                                     ignore_unknown_fields=True), "the repository index", self.address)

    async def statistics(self, name: str, version: str = "", timeout: float | None = None) -> Any:
        """The model's cumulative statistics, one entry per version (`.model_stats`)."""
        _, answer = await self._request("GET", _model_path(name, version) + "/stats", timeout)
        return _parsed(lambda: json_format.Parse(answer, protos.generated("service_pb2").ModelStatisticsResponse(),
                                                 ignore_unknown_fields=True), "the statistics", self.address)
