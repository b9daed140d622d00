"""The probe's own request to a model (issue 39): is a model that failed its clients' requests broken, or were the
requests bad?

A Python model raises on inputs it refuses (a `ValueError` on a negative number), and Triton counts each such request
as failed, exactly as it counts a request a dead stub failed. So failed requests alone cannot tell a broken model
from a client sending bad inputs, and any client could take a model out of its Service by sending them. Before the
probe calls a model broken on its failed requests it sends one request of its own that must succeed: the model's
warm-up sample, which the model served while it loaded (Triton turns a model READY only once every sample
succeeded). `confirm` fetches the model's config from Triton (`GET /v2/models/<m>/config`), builds the request from
the first sample whose inputs are all `zero_data` or `random_data`, and sends it (`POST /v2/models/<m>/infer`,
binary tensors, outputs as binary so nothing is encoded as JSON):

- answered 200: it serves (`SERVED`); the failures were the clients';
- answered with another error (a 500 of the model's code, a dead stub's "not healthy"): `FAILED`, it is broken;
- 503 (a full queue: Triton refuses before the model runs), 404 (unloaded meanwhile: the probe's "not loaded" rule
  says so), no answer within the deadline, or a connection error: `UNKNOWN`, no verdict; the probe keeps its last
  verdict and asks again later (slow is not broken);
- nothing to send (`NO_SAMPLE`): the probe keeps the old rule for that model, its failed requests alone decide. That
  is a model with no warm-up sample, one whose samples read `input_data_file` (the file is in tritonserver's
  repository, which the probe container does not mount, and a pool's request-loaded models have it in a directory
  Triton made), a decoupled model (Triton's HTTP endpoint refuses them, 501, and the probe speaks no gRPC), and a
  model whose config Triton refuses to the probe (401/403: the model-config API restricted to a key it does not send).

An ensemble has no sample of its own (Triton refuses one): it is confirmed through its steps, each with its own
sample (nested ensembles too). It serves when every step does; it is broken when a step fails its sample; a step
with no sample leaves the ensemble to the old rule.

Data as Triton's warm-up makes it: `zero_data` zeros (an empty string for BYTES), `random_data` random bytes (zeros
for BYTES), shape `[1, *dims]` for a batching model (Triton's warm-up sends requests of batch 1), `dims` otherwise.
A sequence model's request starts and ends a sequence of its own (a random correlation ID, a string one when its
CORRID control is TYPE_STRING).

Standard library only (and the pod contract, `api.pod`, which is too): it runs in the probe container.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import time
from dataclasses import dataclass, replace
from typing import Any, Final, Literal
from urllib.parse import quote

from ..api.pod import THRESHOLD_PARAMETER

#: The verdicts (see the module's docstring).
Kind = Literal["served", "failed", "unknown", "no-sample"]
SERVED: Final = "served"
FAILED: Final = "failed"
UNKNOWN: Final = "unknown"
NO_SAMPLE: Final = "no-sample"

#: The largest config read from Triton, and the most of an error answer kept for the verdict's message.
MAX_CONFIG_BYTES = 4 << 20
MAX_ERROR_BYTES = 2048
#: The largest request the probe builds from a sample: a larger one is no sample (the old rule), since the probe
#: container has 64 MiB and two confirmations may run at once, each holding its request about twice.
MAX_REQUEST_BYTES = 4 << 20
#: Nested ensembles followed at most this deep.
MAX_DEPTH = 8

_SIZES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2, "UINT32": 4, "INT32": 4,
          "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8, "BYTES": 4}  # BYTES: an empty string, its 4-byte length


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    why: str = ""
    # Whether the model's config was read, and the threshold it carries (None: it carries none).
    config: bool = False
    threshold: int | None = None


def threshold_of(config: dict[str, Any]) -> int | None:
    """The failed-request threshold a model's config carries (THRESHOLD_PARAMETER), or None."""
    value = ((config.get("parameters") or {}).get(THRESHOLD_PARAMETER) or {}).get("string_value", "")
    return int(value) if str(value).isdigit() else None


def wire_type(config_type: str) -> str:
    """A config data type (`TYPE_FP32`) as the HTTP protocol names it (`FP32`; `TYPE_STRING` is `BYTES`)."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def sample_request(config: dict[str, Any]) -> tuple[bytes, bytes] | str:
    """The inference request (JSON header, binary tensors) of the first usable warm-up sample of a model's config
    (as `GET /v2/models/<m>/config` answers it), or why there is none."""
    if (config.get("model_transaction_policy") or {}).get("decoupled"):
        return "a decoupled model (Triton's HTTP endpoint refuses them)"
    samples = config.get("model_warmup") or []
    if not samples:
        return "no warm-up sample"
    names = {i.get("name") for i in config.get("input") or ()}
    batching = int(config.get("max_batch_size") or 0) > 0
    for sample in samples:
        inputs = {n: i for n, i in (sample.get("inputs") or {}).items() if n in names}  # others: control inputs
        if not inputs or any("input_data_file" in i for i in inputs.values()):
            continue
        built = _tensors(inputs, batching)
        if isinstance(built, str):
            return built
        header, data = built
        params: dict[str, Any] = {"binary_data_output": True, **_sequence(config)}
        return json.dumps({"inputs": header, "parameters": params}).encode(), data
    return "its warm-up samples read input_data_file, which the probe cannot see"


def _tensors(inputs: dict[str, Any], batching: bool) -> tuple[list[dict[str, Any]], bytes] | str:
    header: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    total = 0
    for name, spec in sorted(inputs.items()):
        dtype = wire_type(str(spec.get("data_type", "")))
        shape = [1, *map(int, spec.get("dims") or ())] if batching else [int(d) for d in spec.get("dims") or ()]
        if dtype not in _SIZES or any(d < 0 for d in shape):
            return f"warm-up input {name} has data type {dtype} or dims {shape} the probe cannot build"
        count = 1
        for d in shape:
            count *= d
        size = count * _SIZES[dtype]
        total += size
        if total > MAX_REQUEST_BYTES:
            return f"its warm-up sample is over {MAX_REQUEST_BYTES >> 20} MiB"
        random_data = bool(spec.get("random_data")) and dtype != "BYTES"
        chunks.append(os.urandom(size) if random_data else bytes(size))
        header.append({"name": name, "shape": shape, "datatype": dtype, "parameters": {"binary_data_size": size}})
    return header, b"".join(chunks)


def _sequence(config: dict[str, Any]) -> dict[str, Any]:
    """A sequence model's request parameters: a sequence of one request, with a correlation ID of its own."""
    batching = config.get("sequence_batching")
    if batching is None:
        return {}
    string_id = any(c.get("kind") == "CONTROL_SEQUENCE_CORRID" and c.get("data_type") == "TYPE_STRING"
                    for ci in batching.get("control_input") or () for c in ci.get("control") or ())
    number = random.getrandbits(62) + 1
    return {"sequence_id": f"triton-operator-probe-{number}" if string_id else number,
            "sequence_start": True, "sequence_end": True}


def confirm(target: tuple[str, int], model: str, timeout: float) -> Verdict:
    """The probe's own request to `model` on tritonserver's HTTP port `target`, within `timeout` seconds in all (the
    config, then the sample; an ensemble's steps one after another)."""
    return _confirm(target, model, time.monotonic() + timeout, 0)


def _confirm(target: tuple[str, int], model: str, deadline: float, depth: int) -> Verdict:
    status, body = _call(target, "GET", f"/v2/models/{quote(model, safe='')}/config", deadline, MAX_CONFIG_BYTES)
    if status in (401, 403):  # the model-config API restricted to a key the probe lacks: the old rule, not never
        return Verdict(NO_SAMPLE, f"its config is refused to the probe: {_error(status, body)}")
    if status != 200:
        return Verdict(UNKNOWN, f"its config: {_error(status, body)}")
    try:
        config = json.loads(body)
    except ValueError:
        return Verdict(UNKNOWN, "its config is not JSON")
    verdict = _sample(target, model, config, deadline, depth)
    return replace(verdict, config=True, threshold=threshold_of(config))


def _sample(target: tuple[str, int], model: str, config: dict[str, Any], deadline: float, depth: int) -> Verdict:
    if config.get("platform") == "ensemble":
        return _ensemble(target, model, config, deadline, depth)
    request = sample_request(config)
    if isinstance(request, str):
        return Verdict(NO_SAMPLE, request)
    header, data = request
    status, body = _call(target, "POST", f"/v2/models/{quote(model, safe='')}/infer", deadline, MAX_ERROR_BYTES,
                         header + data, {"Inference-Header-Content-Length": str(len(header)),
                                         "Content-Type": "application/octet-stream"})
    if status == 200:
        return Verdict(SERVED)
    if status in (None, 404, 503):
        return Verdict(UNKNOWN, _error(status, body))
    return Verdict(FAILED, _error(status, body))


def _ensemble(target: tuple[str, int], model: str, config: dict[str, Any], deadline: float, depth: int) -> Verdict:
    steps = list(dict.fromkeys(s.get("model_name", "") for s in (config.get("ensemble_scheduling") or {}).get("step")
                               or ()))
    if depth >= MAX_DEPTH or not steps:
        return Verdict(NO_SAMPLE, f"ensemble {model} nests too deep" if steps else f"ensemble {model} has no steps")
    verdicts = {s: _confirm(target, s, deadline, depth + 1) for s in steps}
    for kind in (FAILED, NO_SAMPLE, UNKNOWN):
        found = [(s, v) for s, v in verdicts.items() if v.kind == kind]
        if found:
            step, v = found[0]
            return Verdict(v.kind, f"its step {step}: {v.why}")
    return Verdict(SERVED)


def _call(target: tuple[str, int], method: str, path: str, deadline: float, limit: int, body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int | None, bytes]:
    """One request on a connection of its own: (status, at most `limit` bytes of the body); (None, why) when it
    could not be sent or answered before `deadline`."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None, b"no time left"
    conn = http.client.HTTPConnection(*target, timeout=remaining)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read(limit)
    except (OSError, http.client.HTTPException) as exc:
        return None, f"no answer within the deadline ({exc.__class__.__name__}: {exc})".encode()
    finally:
        conn.close()


def _error(status: int | None, body: bytes) -> str:
    """What an answer says: Triton's `{"error": ...}` message, else the body's start."""
    text = body.decode(errors="replace")
    try:
        text = str(json.loads(text).get("error", text))
    except (ValueError, AttributeError):
        pass
    text = " ".join(text.split())[:300]
    return text if status is None else f"HTTP {status}: {text}"
