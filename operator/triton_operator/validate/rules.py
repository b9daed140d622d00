"""Semantic rules for TritonModels, pure: (models) -> [FieldError].

Every config rule tritonserver has is here (each one in `RULES`): the ones tritonserver enforces when it loads a
config (refused here first, with the field path and why), and the ones it does not (which would fail late, at
warm-up, or silently do nothing). Ensemble rules are checked across the whole set of models.
All errors are collected; none stops the others.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from ..api import steps as step_graph
from ..api.pod import REPOSITORY_KEY_ENV
from ..api.v1alpha1 import (
    BATCH_STRATEGY_PARAMETER,
    GROUP,
    OPERATOR_ANNOTATIONS,
    OPERATOR_ARGS,
    OPERATOR_ENV,
    OPERATOR_LABELS,
    POOLED_SERVER_ACCEPTED,
    POOLED_SERVER_DEFAULTS,
    EnsembleStep,
    QueuePolicy,
    Server,
    Tensor,
    TritonModel,
    TritonModelSpec,
    WarmupInput,
    quantity_bytes,
    quantity_value,
)
from ..uris import has_userinfo, shown
from .errors import FieldError


@dataclass(frozen=True)
class Rule:
    id: str
    triton_enforced: bool
    summary: str


RULES: dict[str, Rule] = {
    r.id: r
    for r in [
        Rule("backend-or-platform", True, "exactly one of backend or platform"),
        Rule("ensemble-platform", True, "ensemble.steps goes with platform: ensemble and vice versa"),
        Rule("ensemble-scheduling-oneof", True, "no batcher or sequenceBatcher on an ensemble (scheduling is a oneof)"),
        Rule("scheduling-oneof", True, "at most one of batcher and sequenceBatcher"),
        Rule("ensemble-no-instances", True, "an ensemble has no instanceGroups or modelWarmup"),
        Rule("source", False, "a non-ensemble model has a source; an ensemble has none"),
        Rule("source-pin", False, "sha256 pins an https:// file; objectVersion pins one s3:// or gs:// object"),
        Rule("source-uri", False, "a fetched uri carries no user:password@ (it would be printed wherever the uri is); "
             "credentials come from credentialsSecret, server.env or the ServiceAccount"),
        Rule("fetch-limits", False, "server.repositorySizeLimit is at least 1Mi, and server.fetch.maxBytes fits in "
             "it (the volume fetch writes into)"),
        Rule("max-batch-size", True, "maxBatchSize >= 1 when batching"),
        Rule("preferred-batch-size", True, "each preferredBatchSize in [1, maxBatchSize]"),
        Rule("default-priority-level", True, "defaultPriorityLevel in [1, priorityLevels]"),
        Rule("priority-queue-policy", True, "priorityQueuePolicy levels in [1, priorityLevels]"),
        Rule("preserve-ordering", True, "preserveOrdering: one priority level, no DELAY with a timeout"),
        Rule("batch-strategy-batching", False,
             "a custom batching strategy needs a batching model (with maxBatchSize 0 it silently does nothing)"),
        Rule("batch-strategy-file", True,
             "a custom batching strategy file named from an inline source is there and is a shared library"),
        Rule("batch-strategy-parameter", False,
             "TRITON_BATCH_STRATEGY_PATH is set by batcher.strategyLibrary, not by parameters"),
        Rule("response-cache-decoupled", True, "no responseCache with decoupled"),
        Rule("response-cache-sequence", True, "no responseCache with sequenceBatcher"),
        Rule("response-cache-size", False, "responseCache needs server.cacheSize > 0 (a pooled model: its pool's) or "
             "it silently does nothing"),
        Rule("sequence-control", True, "control input data types and [false, true] pairs"),
        Rule("sequence-strategy", True, "at most one of direct or oldest; direct minimumSlotUtilization in [0, 1]"),
        Rule("dims", True, "each dim >= 1 or -1"),
        Rule("reshape", True, "reshape keeps the element count"),
        Rule("input-format", True, "an input with format FORMAT_NHWC or FORMAT_NCHW has exactly 3 dims; format is "
             "for inputs only"),
        Rule("label-file", True, "an output's labelFilename is a file of the model directory (inline: in "
             "modelFiles.inline); labelFilename is for outputs only"),
        Rule("model-files", False, "modelFiles.inline names no config.pbtxt, warmup or version directory"),
        Rule("instance-group", True, "gpus only with kind GPU"),
        Rule("server-gpus", True, "server.gpus gives every GPU the instance groups (or an ensemble's steps) use"),
        Rule("python-model-file", True, "an inline python model has model.py"),
        Rule("warmup-batch-size", False, "warm-up batchSize <= maxBatchSize, 1 when not batching"),
        Rule("warmup-data", False, "warm-up input has exactly one of zeroData, randomData, inputDataFile"),
        Rule("warmup-inputs", False, "warm-up inputs are model inputs with the same type and a concrete shape"),
        Rule("warmup-file", False, "warm-up data file exists and holds enough bytes"),
        Rule("warmup-empty", True, "a batching model's warm-up sample gives data for at least one input"),
        Rule("ensemble-step", True, "each step names a model, maps inputs and outputs"),
        Rule("ensemble-step-model", True, "each step's model exists"),
        Rule("ensemble-step-tensors", True, "step maps use the step model's tensor names"),
        Rule("ensemble-tensor-written-once", True, "every ensemble tensor is written once"),
        Rule("ensemble-outputs-written", True, "every ensemble output is written by a step"),
        Rule("ensemble-tensor-available", True, "every step input is an ensemble input or a step output"),
        Rule("ensemble-unused-tensor", True, "no ensemble input or step output is unused"),
        Rule("ensemble-cycle", True, "no cycles between ensembles"),
        Rule("ensemble-types", True, "mapped tensors agree in data type and shape"),
        Rule("ensemble-batch-size", True, "ensemble maxBatchSize <= each batching step's"),
        Rule("ensemble-decoupled-mix", True,
             "a step's inputs (and the ensemble's outputs) all come from one decoupled model's responses, or none"),
        Rule("ensemble-step-version", True,
             "a step asks for version -1 (latest) or a version the step model has and its versionPolicy serves"),
        Rule("model-versions", False,
             "versions: each number once, one content per warm-up file name; not with source"),
        Rule("autoscaling-range", False, "autoscaling.minReplicas <= autoscaling.maxReplicas"),
        Rule("autoscaling-target", False,
             "autoscaling.target sets exactly one of queueTimeMilliseconds, inflightRequests, inferencesPerSecond"),
        Rule("shm-size", False, "server.shmSize is at least 1Mi and at most the tritonserver container's memory limit "
             "(a memory-backed /dev/shm counts against it)"),
        Rule("shm-backend-config", False, "the Python backend's shm settings in server.args are whole bytes and fit "
             "/dev/shm (server.shmSize): its default size times the replica's Python instances, and its growth step"),
        Rule("pod-metadata", False, "server.podLabels and podAnnotations: valid keys, within Kubernetes' sizes, none of "
             "the operator's own (its labels, its selector, its annotations)"),
        Rule("pod-env", False, "server.env names each variable once and none the operator sets (HOME, "
             "TRITON_OPERATOR_REPOSITORY_KEY, the variables a credentialsSecret sets in the fetch step)"),
        Rule("credentials-secret", False,
             "the s3:// sources one replica fetches (a model's, and its ensemble steps') all name one "
             "credentialsSecret or none does, and so do its gs:// sources: the fetch step has one set of AWS_* "
             "variables and one GOOGLE_APPLICATION_CREDENTIALS"),
        Rule("server-args", False, "server.args sets no flag the operator sets to restrict Triton's model repository "
             "API to its own key (--http-restricted-api, --grpc-restricted-protocol, or a prefix Triton would read "
             "as one)"),
        Rule("pooled-model", False, "a pooled model (spec.pool) declares memory (but an ensemble), sets no server field "
             "of its own (its pool's replicas run it), no warmupGate.enabled false, no rollout.strategy NewPods; "
             "memory goes with pool"),
        Rule("pool-steps", False, "a pooled ensemble's steps name the same pool (they are loaded on its replicas, "
             "with their own memory)"),
        Rule("pool-spec", False, "a TritonPool sets exactly one of capacity.memoryPerGpu (with server.gpus >= 1) or "
             "capacity.memoryPerReplica (without gpus)"),
        Rule("pool-source", False, "a pooled model's uri sources are https://, s3:// or gs:// (a pool replica mounts no "
             "model's claim: no pvc://) and name no credentialsSecret (a pool replica's fetch-server sidecar fetches "
             "for every model of the pool, with the pool's own credentials: its spec.server.env, envFrom and "
             "ServiceAccount)"),
        Rule("pool-triton-name", False, "the models of one pool load under distinct Triton names (spec.modelName, "
             "else metadata.name): one tritonserver holds one model of a name"),
        Rule("pool-object-names", False, "no TritonModel is named <pool>-pool after a TritonPool of its namespace: the "
             "pool's Deployment, PodDisruptionBudget and HorizontalPodAutoscaler have that name, and the model's "
             "children would take theirs"),
        Rule("pool-capacity", False, "a pooled model, with every step its ensemble reaches, fits one replica of its "
             "pool (memory against the pool's capacity per replica)"),
        Rule("version-policy", True,
             "versionPolicy is one of latest, all or specific; specific names versions the model has (Triton refuses "
             "a policy serving none, and only logs one missing among others)"),
    ]
}


class Collector:
    """Gathers one object's FieldErrors, each under a rule of RULES."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.errors: list[FieldError] = []

    def __call__(self, rule: str, path: str, message: str) -> None:
        assert rule in RULES, rule
        self.errors.append(FieldError(self.model, path, message, rule))


_FIXED_SIZE = {
    "BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
    "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8,
}  # fmt: skip


def _elements(dims: Sequence[int]) -> int | None:
    return None if any(d < 0 for d in dims) else math.prod(dims)


# ---------------------------------------------------------------- one model


def _chunks(dims: Sequence[int]) -> list[int]:
    """Products of the fixed runs between -1s: [2, 4, -1, 6] -> [8, 6]."""
    out, acc = [], 1
    for d in dims:
        if d == -1:
            out.append(acc)
            acc = 1
        else:
            acc *= d
    out.append(acc)
    return out


def _reshape_error(dims: Sequence[int], reshape: Sequence[int], max_batch: int) -> str | None:
    """Triton's ValidateIOShape reshape rule, or None when the reshape is fine."""
    if not reshape:
        if max_batch == 0:
            return "an empty reshape (a scalar) is not supported for a non-batching model"
        return None if _elements(dims) == 1 else f"an empty reshape needs dims holding exactly 1 element, got {list(dims)}"
    a, b = _elements(dims), _elements(reshape)
    if (a is None) != (b is None):
        return f"reshape {list(reshape)} and dims {list(dims)} must both be fixed or both variable-size"
    if a is not None:
        return None if a == b else f"reshape {list(reshape)} holds {b} elements but dims {list(dims)} hold {a}"
    ca, cb = _chunks(dims), _chunks(reshape)
    if len(ca) != len(cb):
        return f"reshape {list(reshape)} and dims {list(dims)} have different numbers of variable-size dimensions"
    if ca != cb:
        return f"reshape {list(reshape)} and dims {list(dims)} differ in size between their variable-size dimensions"
    return None


def _check_tensors(spec: TritonModelSpec, err: Collector) -> None:
    for kind, tensors in (("inputs", spec.inputs), ("outputs", spec.outputs)):
        seen: set[str] = set()
        for i, t in enumerate(tensors or ()):
            base = f"spec.{kind}[{i}]"
            if t.name in seen:
                err("dims", f"{base}.name", f"duplicate {kind[:-1]} name {t.name!r}")
            seen.add(t.name)
            if not t.dims:
                err("dims", f"{base}.dims", "must list at least one dimension (use [1] for a single value)")
            for j, d in enumerate(t.dims):
                if d == 0 or d < -1:
                    err("dims", f"{base}.dims[{j}]", f"dimension must be >= 1 or -1 (variable), got {d}")
            if t.reshape is not None:
                bad = [j for j, d in enumerate(t.reshape) if d == 0 or d < -1]
                for j in bad:
                    err("dims", f"{base}.reshape[{j}]", f"dimension must be >= 1 or -1 (variable), got {t.reshape[j]}")
                problem = None if bad or not t.dims else _reshape_error(t.dims, t.reshape, spec.effective_max_batch_size)
                if problem:
                    err("reshape", f"{base}.reshape", problem)


def _check_model_level(spec: TritonModelSpec, err: Collector) -> None:
    """Input formats, output label files and the model directory's own files (spec.modelFiles)."""
    for i, t in enumerate(spec.inputs or ()):
        base = f"spec.inputs[{i}]"
        if t.format in ("FORMAT_NHWC", "FORMAT_NCHW") and len(t.dims) != 3:
            err("input-format", f"{base}.format", f"{t.format} needs exactly 3 dims (Triton: \"model input "
                f"NHWC/NCHW require 3 dims\"), got {list(t.dims)}")
        if t.label_filename is not None:
            err("label-file", f"{base}.labelFilename", "labelFilename is for outputs: Triton's model inputs have no "
                "label_filename")
    mf = spec.model_files
    for i, t in enumerate(spec.outputs or ()):
        base = f"spec.outputs[{i}]"
        if t.format is not None:
            err("input-format", f"{base}.format", "format is for inputs: Triton's model outputs have no format")
        if t.label_filename is None:
            continue
        if mf is None:
            err("label-file", f"{base}.labelFilename", f"{t.label_filename!r} is not a file of the model directory: "
                "add it to spec.modelFiles.inline (or spec.modelFiles.uri); Triton fails the load without it")
        elif mf.inline is not None and t.label_filename not in mf.inline:
            err("label-file", f"{base}.labelFilename", f"{t.label_filename!r} is not in spec.modelFiles.inline "
                f"(it has {sorted(mf.inline)}); Triton fails the load without it")
    if mf is None:
        return
    for fname in sorted(mf.inline or ()):
        if fname in ("config.pbtxt", "warmup") or fname.isdigit():
            err("model-files", f"spec.modelFiles.inline[{fname}]", f"{fname!r} is the operator's to render (the "
                "config, the warm-up directory or a version directory); give the file another name")
    _check_pins(mf.uri, mf.sha256, mf.object_version, err, "spec.modelFiles")


def _check_policy_delay(policy: QueuePolicy | None, path: str, err: Collector) -> None:
    if policy is not None and policy.timeout_action == "DELAY" and policy.default_timeout_microseconds != 0:
        err(
            "preserve-ordering",
            path,
            "with preserveOrdering, a queue policy may not DELAY requests with a non-zero timeout "
            "(delayed requests would be reordered)",
        )


def _check_preferred(sizes: Sequence[int] | None, max_batch: int, path: str, err: Collector) -> None:
    for i, s in enumerate(sizes or ()):
        if s <= 0:
            err("preferred-batch-size", f"{path}[{i}]", f"preferred batch size must be > 0, got {s}")
        elif s > max_batch:
            why = "the model does not batch (maxBatchSize 0)" if max_batch == 0 else f"maxBatchSize is {max_batch}"
            err("preferred-batch-size", f"{path}[{i}]", f"preferred batch size {s} exceeds maxBatchSize: {why}")


def _check_batcher(spec: TritonModelSpec, err: Collector) -> None:
    b = spec.batcher
    if b is None:
        return
    mbs = spec.effective_max_batch_size
    _check_preferred(b.preferred_batch_size, mbs, "spec.batcher.preferredBatchSize", err)
    n = b.priority_levels
    if n > 0 and not 1 <= b.default_priority_level <= n:
        err(
            "default-priority-level",
            "spec.batcher.defaultPriorityLevel",
            f"must be in [1, {n}] (priorityLevels is {n}), got {b.default_priority_level}",
        )
    for key in sorted(b.priority_queue_policy or {}, key=lambda k: int(k)):
        if not 1 <= int(key) <= n:
            err(
                "priority-queue-policy",
                f"spec.batcher.priorityQueuePolicy[{key}]",
                f"priority level {key} is outside [1, {n}] (priorityLevels is {n})",
            )
    if b.preserve_ordering:
        if n > 1:
            err("preserve-ordering", "spec.batcher.preserveOrdering", f"allows at most one priority level, got {n}")
        _check_policy_delay(b.default_queue_policy, "spec.batcher.defaultQueuePolicy", err)
        for key, policy in sorted((b.priority_queue_policy or {}).items()):
            _check_policy_delay(policy, f"spec.batcher.priorityQueuePolicy[{key}]", err)
    _check_strategy_library(spec, err)


#: The first bytes of every ELF file, so of every shared library tritonserver (on Linux) can open.
_ELF_MAGIC = "\x7fELF"


def _check_strategy_library(spec: TritonModelSpec, err: Collector) -> None:
    """spec.batcher.strategyLibrary: a batching model, and a file of an inline source that is there (and binary)."""
    lib = spec.batcher.strategy_library if spec.batcher is not None else None
    if lib is None:
        return
    base = "spec.batcher.strategyLibrary"
    if spec.effective_max_batch_size < 1:
        err(
            "batch-strategy-batching",
            base,
            "a custom batching strategy needs a batching model (batching: true, maxBatchSize >= 1): with "
            "maxBatchSize 0 every batch holds one request, and Triton loads the library and never asks it",
        )
    if (lib.file is None) == (lib.path is None):
        err("batch-strategy-file", base, "set exactly one of file (a file of spec.source) or path (in the image)")
    src = spec.source
    if lib.file is not None and src is None and spec.versions:
        err(
            "batch-strategy-file",
            f"{base}.file",
            "names a file of spec.source (version 1's directory), and this model has versions instead, whose "
            "inline files are text and cannot hold a compiled library; set path (in the image)",
        )
        return
    if lib.file is None or src is None or src.inline is None:
        return  # a uri's files are only seen at pod start
    text = src.inline.get(lib.file)
    if text is None:
        err(
            "batch-strategy-file",
            f"{base}.file",
            f"{lib.file!r} is not in spec.source.inline, so Triton fails the load (\"Batching library path not "
            "found\"); inline files are text, so a compiled library comes from spec.source.uri, or from the image "
            "with path",
        )
    elif not text.startswith(_ELF_MAGIC):
        err(
            "batch-strategy-file",
            f"{base}.file",
            f"spec.source.inline[{lib.file}] is text, not a shared library (no ELF header), so Triton cannot open it; "
            "inline files are text, so a compiled library comes from spec.source.uri, or from the image with path",
        )


_CORRID_TYPES = {"UINT64", "INT64", "UINT32", "INT32", "BYTES"}
_CONTROL_TYPES = {"INT32", "FP32", "BOOL"}


def _check_sequence(spec: TritonModelSpec, err: Collector) -> None:
    s = spec.sequence_batcher
    if s is None:
        return
    base = "spec.sequenceBatcher"
    for i, c in enumerate(s.control_inputs or ()):
        p = f"{base}.controlInputs[{i}]"
        if c.kind == "CORRID":
            if c.data_type not in _CORRID_TYPES:
                err("sequence-control", f"{p}.dataType", f"CORRID must be one of {sorted(_CORRID_TYPES)}, got {c.data_type}")
            if c.false_true is not None:
                err("sequence-control", f"{p}.falseTrue", "CORRID takes no falseTrue values")
        else:
            if c.data_type not in _CONTROL_TYPES:
                err("sequence-control", f"{p}.dataType", f"{c.kind} must be INT32, FP32 or BOOL, got {c.data_type}")
            if c.false_true is not None and len(c.false_true) != 2:
                err("sequence-control", f"{p}.falseTrue", f"must have exactly 2 entries [false, true], got {len(c.false_true)}")
            fractions = [v for v in c.false_true or () if v != int(v)]
            if c.data_type == "INT32" and fractions:
                err("sequence-control", f"{p}.falseTrue", f"an INT32 control takes whole numbers (Triton's "
                    f"int32_false_true), got {fractions[0]}")
    kinds = [c.kind for c in s.control_inputs or ()]
    for k in sorted(set(kinds)):
        if kinds.count(k) > 1:
            err("sequence-control", f"{base}.controlInputs", f"control {k} is given more than once")
    names = [c.name for c in s.control_inputs or ()]
    for n in sorted(set(names)):
        if names.count(n) > 1:
            err("sequence-control", f"{base}.controlInputs", f"control tensor {n!r} is used for more than one control kind")
    input_names = {t.name for t in spec.inputs or ()}
    for i, c in enumerate(s.control_inputs or ()):
        if c.name in input_names:
            err(
                "sequence-control",
                f"{base}.controlInputs[{i}].name",
                f"{c.name!r} is also declared in spec.inputs; control tensors come from the batcher, not clients",
            )
    if s.direct is not None and s.oldest is not None:
        err(
            "sequence-strategy",
            base,
            "set at most one of direct or oldest: the strategy is a protobuf oneof (the renderer would keep only oldest)",
        )
    if s.oldest is not None:
        _check_preferred(s.oldest.preferred_batch_size, spec.effective_max_batch_size, f"{base}.oldest.preferredBatchSize", err)
    if s.direct is not None and not 0.0 <= s.direct.minimum_slot_utilization <= 1.0:
        err(
            "sequence-strategy",
            f"{base}.direct.minimumSlotUtilization",
            f"must be in [0, 1], got {s.direct.minimum_slot_utilization}",
        )


def _check_structure(model: TritonModel, err: Collector) -> None:
    spec = model.spec
    if (spec.backend is None) == (spec.platform is None):
        err("backend-or-platform", "spec.backend", "set exactly one of backend (e.g. python) or platform (e.g. ensemble)")
    if spec.is_ensemble != (spec.ensemble is not None):
        if spec.is_ensemble:
            err("ensemble-platform", "spec.ensemble", "platform: ensemble needs ensemble.steps")
        else:
            err("ensemble-platform", "spec.ensemble", "ensemble.steps needs platform: ensemble")
    if spec.is_ensemble:
        why = (
            "Triton's scheduling choice is a protobuf oneof (dynamic_batching | sequence_batching | "
            "ensemble_scheduling): an ensemble is scheduled by ensemble_scheduling, so a {} here would replace its "
            "steps and tritonserver refuses to load it. Batch in the step models instead"
        )
        if spec.batcher is not None:
            err("ensemble-scheduling-oneof", "spec.batcher", f"an ensemble cannot have a batcher: {why}")
        if spec.sequence_batcher is not None:
            err("ensemble-scheduling-oneof", "spec.sequenceBatcher", f"an ensemble cannot have a sequenceBatcher: {why}")
        if spec.instance_groups:
            err("ensemble-no-instances", "spec.instanceGroups", "an ensemble has no instances of its own; its steps do")
        if spec.model_warmup:
            err("ensemble-no-instances", "spec.modelWarmup", "an ensemble has no warm-up of its own; warm up its steps")
        if spec.source is not None:
            err("source", "spec.source", "an ensemble has no source: its repository is built from its steps")
        if spec.versions:
            err("model-versions", "spec.versions", "an ensemble has no versions: its repository is built from its steps")
        if spec.backend is not None:
            err("backend-or-platform", "spec.backend", "an ensemble has platform: ensemble and no backend")
    else:
        if spec.source is None and not spec.versions:
            err("source", "spec.source", "source is required: inline files or a uri (or versions, for several versions)")
        if spec.batcher is not None and spec.sequence_batcher is not None:
            err(
                "scheduling-oneof",
                "spec.sequenceBatcher",
                "set at most one of batcher or sequenceBatcher: Triton's scheduling choice is a protobuf oneof",
            )
    if spec.batching and spec.max_batch_size < 1:
        err("max-batch-size", "spec.maxBatchSize", "must be >= 1 when batching is true (set batching: false for 0)")
    if spec.response_cache and spec.decoupled:
        err("response-cache-decoupled", "spec.responseCache", "the response cache cannot serve a decoupled model")
    if spec.response_cache and spec.sequence_batcher is not None:
        err("response-cache-sequence", "spec.responseCache", "the response cache cannot be used with sequence batching")
    if spec.response_cache and quantity_bytes(spec.server.cache_size) <= 0:
        err(
            "response-cache-size",
            "spec.server.cacheSize",
            "responseCache needs a server cache; with cacheSize 0 Triton accepts the config and caches nothing",
        )
    for i, g in enumerate(spec.instance_groups or ()):
        if g.kind != "GPU" and g.gpus:
            err("instance-group", f"spec.instanceGroups[{i}].gpus", f"gpus may be set only with kind GPU, not {g.kind}")
    _check_gpus(spec, err)
    sources = [("spec.source", spec.source)] if spec.source is not None else []
    sources += [(f"spec.versions[{i}].source", v.source) for i, v in enumerate(spec.versions or ())]
    for base, src in sources:
        if (src.inline is None) == (src.uri is None):
            err("source", base, "set exactly one of inline (files) or uri (where to fetch them)")
        if spec.backend == "python" and src.inline is not None and "model.py" not in src.inline:
            err("python-model-file", f"{base}.inline", "the python backend loads model.py, which is missing")
        _check_pins(src.uri, src.sha256, src.object_version, err, base)
    _check_versions(spec, err)
    if BATCH_STRATEGY_PARAMETER in (spec.parameters or {}):
        err(
            "batch-strategy-parameter",
            f"spec.parameters[{BATCH_STRATEGY_PARAMETER}]",
            "is rendered from spec.batcher.strategyLibrary: set file (a file of spec.source) or path (in the image) "
            "there, which the operator checks (a batching model with the dynamic batcher, the file in the source) "
            "and turns into the path replicas see",
        )


def _check_gpus(spec: TritonModelSpec, err: Collector) -> None:
    """A replica sees `server.gpus` GPUs, numbered from 0: the instance groups must fit (None: derived, fits)."""
    n = spec.server.gpus
    if n is None:
        return
    for i, g in enumerate(spec.instance_groups or ()):
        if g.kind != "GPU":
            continue
        beyond = sorted({x for x in g.gpus or () if x >= n})
        if beyond:
            has = "no GPU" if n == 0 else "GPU 0" if n == 1 else f"GPUs 0..{n - 1}"
            err(
                "server-gpus",
                f"spec.instanceGroups[{i}].gpus",
                f"{'GPU' if len(beyond) == 1 else 'GPUs'} {', '.join(map(str, beyond))} not visible: server.gpus is {n}, "
                f"so a replica has {has} and Triton refuses to load (\"invalid or unsupported gpu id\"); raise "
                f"server.gpus to {max(beyond) + 1} or leave it unset",
            )
        elif n == 0:
            err(
                "server-gpus",
                f"spec.instanceGroups[{i}].kind",
                "kind GPU needs a GPU, but server.gpus is 0: Triton refuses to load (\"has kind KIND_GPU but no GPUs "
                "are available\"); use kind CPU (or AUTO), or leave server.gpus unset",
            )


def _check_versions(spec: TritonModelSpec, err: Collector) -> None:
    """spec.versions (each number once, inline files, warm-up files that agree) and spec.versionPolicy."""
    if spec.source is not None and spec.versions:
        err("model-versions", "spec.versions", "set source (served as version 1) or versions, not both")
    first: dict[int, int] = {}
    warm: dict[str, tuple[int, str]] = {}  # warm-up file name -> (index of the first version giving it, data)
    for i, v in enumerate(spec.versions or ()):
        base = f"spec.versions[{i}]"
        if v.version in first:
            err("model-versions", f"{base}.version", f"version {v.version} is also spec.versions[{first[v.version]}]; "
                "each version is one directory, so give each number once")
        first.setdefault(v.version, i)
        for fname, b64 in sorted((v.source.warmup_files or {}).items()):
            seen = warm.setdefault(fname, (i, b64))
            if seen[1] != b64:
                err("model-versions", f"{base}.source.warmupFiles[{fname}]", f"differs from spec.versions[{seen[0]}]'s "
                    "file of that name: every version reads the model's one warmup/ directory, which holds one file "
                    "per name; give the same data, or another name")
    policy = spec.version_policy
    if policy is None:
        return
    if sum(x is not None for x in (policy.latest, policy.all, policy.specific)) != 1:
        err("version-policy", "spec.versionPolicy", "set exactly one of latest, all or specific: Triton's "
            "version_policy is a protobuf oneof")
    have = spec.available_versions
    none_left = not set(policy.specific or ()) & set(have)
    why = ("none of the versions listed exists, so Triton fails the load (\"at least one version must be available "
           "under the version policy\")" if none_left else
           "Triton only logs an error for it and serves the others, so it silently never loads")
    for i, number in enumerate(policy.specific or ()):
        if have and number not in have:
            err("version-policy", f"spec.versionPolicy.specific[{i}]", f"version {number} does not exist (the model "
                f"has {_versions_text(have)}): {why}; add it to spec.versions or remove it here")


def _check_pins(
    uri: str | None, sha256: str | None, version: str | None, err: Collector, base: str = "spec.source"
) -> None:
    if uri is not None and has_userinfo(uri):
        err("source-uri", f"{base}.uri", f"{shown(uri)} carries credentials (user:password@), which would be printed "
            "wherever the uri is (logs, the status): give them through credentialsSecret or spec.server.env")
    if sha256 is not None and not (uri or "").startswith("https://"):
        err(
            "source-pin",
            f"{base}.sha256",
            "sha256 pins the file or archive an https:// uri names (fetch checks the download); "
            "pin an s3:// or gs:// object with objectVersion",
        )
    if version is None:
        return
    if not (uri or "").startswith(("s3://", "gs://")):
        err("source-pin", f"{base}.objectVersion", "objectVersion is for an s3:// or gs:// uri; pin an https:// file with sha256")
        return
    assert uri is not None
    _bucket, _, key = uri.split("://", 1)[1].partition("/")
    if not key or key.endswith("/"):
        err(
            "source-pin",
            f"{base}.uri",
            f"with objectVersion, uri must name one object (a file or a .tar.gz/.tgz/.zip archive), not a prefix: "
            f"{shown(uri)!r}",
        )
    if uri.startswith("gs://") and not version.isdigit():
        err("source-pin", f"{base}.objectVersion", f"a GCS object's version is its generation, a number; got {version!r}")


def _bytes_elements(data: bytes) -> int | None:
    """How many length-prefixed BYTES elements `data` holds, or None if it ends mid-element."""
    n = off = 0
    while off < len(data):
        if off + 4 > len(data):
            return None
        (length,) = struct.unpack_from("<I", data, off)
        if off + 4 + length > len(data):
            return None
        off += 4 + length
        n += 1
    return n


def _check_warmup_file(p: str, wi: WarmupInput, files: Mapping[str, str], where: str, err: Collector) -> None:
    """A warm-up input's inputDataFile: among the warm-up files, valid base64, and holding the input's elements."""
    assert wi.input_data_file is not None
    data_b64 = files.get(wi.input_data_file)
    if data_b64 is None:
        err(
            "warmup-file",
            f"{p}.inputDataFile",
            f"{wi.input_data_file!r} is not in spec.source.warmupFiles{where}",
        )
        return
    try:
        data = base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError):
        err("warmup-file", f"spec.source.warmupFiles[{wi.input_data_file}]", "is not valid base64")
        return
    count = math.prod(wi.dims)
    if wi.data_type == "BYTES":
        have = _bytes_elements(data)
        if have != count:
            err(
                "warmup-file",
                f"{p}.inputDataFile",
                f"needs {count} BYTES elements (each a 4-byte little-endian length, then the bytes), "
                f"{wi.input_data_file!r} holds {'an incomplete element' if have is None else have}",
            )
    else:
        need = count * _FIXED_SIZE[wi.data_type]
        if len(data) < need:
            err(
                "warmup-file",
                f"{p}.inputDataFile",
                f"needs {need} bytes for {count} {wi.data_type} elements, {wi.input_data_file!r} holds {len(data)}",
            )


def _check_warmup_input(p: str, name: str, wi: WarmupInput, inputs: Mapping[str, Tensor], files: Mapping[str, str],
                        where: str, err: Collector) -> None:
    """One input of a warm-up sample: one kind of data, a model input, its type and concrete dims, its file."""
    chosen = [wi.zero_data is True, wi.random_data is True, wi.input_data_file is not None]
    if sum(chosen) != 1:
        err("warmup-data", p, "set exactly one of zeroData: true, randomData: true or inputDataFile")
    t = inputs.get(name)
    if t is None:
        err(
            "warmup-inputs",
            p,
            f"{name!r} is not a model input (Triton would silently treat it as a control input); "
            f"inputs are {sorted(inputs)}",
        )
        return
    for j, d in enumerate(wi.dims):
        if d < 1:
            err(
                "warmup-inputs",
                f"{p}.dims[{j}]",
                f"warm-up shapes must be concrete (every dim >= 1), got {d}; Triton fails the load at warm-up",
            )
    if wi.data_type != t.data_type:
        err("warmup-inputs", f"{p}.dataType", f"is {wi.data_type} but input {name!r} is {t.data_type}")
    if len(wi.dims) != len(t.dims) or any(m != -1 and m != d for m, d in zip(t.dims, wi.dims, strict=False)):
        err("warmup-inputs", f"{p}.dims", f"{wi.dims} does not fit input {name!r} with dims {t.dims}")
    if wi.input_data_file is not None:
        _check_warmup_file(p, wi, files, where, err)


def _check_warmup(spec: TritonModelSpec, err: Collector) -> None:
    inputs = {t.name: t for t in spec.inputs or ()}
    files: dict[str, str] = {}  # every version's warm-up files land in the model's one warmup/ directory
    for src in spec.version_sources.values():
        for fname, b64 in (src.warmup_files or {}).items():
            files.setdefault(fname, b64)
    fetched = spec.source is not None and spec.source.uri is not None
    where = (
        " (files fetched from spec.source.uri go to the version directory, but Triton reads warm-up data from "
        "<model>/warmup/)" if fetched else ""
    )
    mbs = spec.effective_max_batch_size
    for i, w in enumerate(spec.model_warmup or ()):
        base = f"spec.modelWarmup[{i}]"
        if mbs == 0 and w.batch_size != 1:
            err("warmup-batch-size", f"{base}.batchSize", f"a non-batching model warms up with batchSize 1, got {w.batch_size}")
        elif mbs > 0 and w.batch_size > mbs:
            err("warmup-batch-size", f"{base}.batchSize", f"batchSize {w.batch_size} exceeds maxBatchSize {mbs}")
        for name, wi in w.inputs.items():
            _check_warmup_input(f"{base}.inputs[{name}]", name, wi, inputs, files, where, err)
        if mbs > 0 and not w.inputs:
            err(
                "warmup-empty",
                f"{base}.inputs",
                "a batching model's warm-up sample needs data for at least one input: Triton takes the sample's "
                "batch from its first input and fails the load (\"request has 0 inputs\"), or crashes when every "
                "input is optional",
            )
        missing = sorted(n for n, t in inputs.items() if not t.optional and n not in w.inputs)
        if missing:
            err("warmup-inputs", f"{base}.inputs", f"missing data for required inputs {missing}")


def _check_autoscaling(spec: TritonModelSpec, err: Collector) -> None:
    a = spec.autoscaling
    if a is None:
        return
    if a.min_replicas > a.max_replicas:
        err("autoscaling-range", "spec.autoscaling.minReplicas",
            f"must be <= maxReplicas ({a.max_replicas}), got {a.min_replicas}")
    targets = list(a.target.given())
    if len(targets) != 1:
        err("autoscaling-target", "spec.autoscaling.target", "set exactly one of queueTimeMilliseconds, "
            f"inflightRequests or inferencesPerSecond, got {targets or 'none'}")


def _check_pooled(spec: TritonModelSpec, err: Collector) -> None:
    """The CEL rules of a pooled model (`api.v1alpha1.POOLED_MODEL_RULES`), with field paths."""
    if spec.pool is None:
        if spec.memory is not None:
            err("pooled-model", "spec.memory", "memory goes with pool: it is what a copy takes on a pool replica")
        return
    if spec.memory is None and not spec.is_ensemble:
        err("pooled-model", "spec.memory", "memory is required with pool: what one copy of the model takes on a pool "
            "replica (the operator places copies against the pool's capacity with it)")
    if not spec.warmup_gate.enabled:
        err("pooled-model", "spec.warmupGate.enabled", "a pooled model is always gated: its Service lists a pool "
            "replica only once the model is READY there at the desired config, warm")
    if spec.rollout.strategy != "InPlace":
        err("pooled-model", "spec.rollout.strategy", "a pooled model has no pods of its own to replace: its changes "
            "are loaded in place (rollout.strategy: InPlace; rollout.mode picks Swap or Drain)")
    for path, uri, secret in fetched_sources(spec):
        if uri.startswith("pvc://"):
            err("pool-source", f"{path}.uri", f"a pool replica mounts no model's PersistentVolumeClaim, so it cannot "
                f"read {shown(uri)}: serve the files over https://, s3:// or gs://, give them inline, or run the "
                "model on a Deployment of its own (no spec.pool)")
        if secret is not None:
            err("pool-source", f"{path}.credentialsSecret", "a pool replica's fetch-server sidecar fetches for every "
                "model of the pool, with the pool's credentials only (the TritonPool's spec.server.env and envFrom, "
                "its ServiceAccount's workload identity): a model's own Secret would reach the other models' "
                "fetches; give the pool those credentials, or run the model on a Deployment of its own")
    given = dict(_server_values(spec.server, ".server"))
    for path, default in POOLED_SERVER_DEFAULTS.items():
        accepted = (default, POOLED_SERVER_ACCEPTED[path][0]) if path in POOLED_SERVER_ACCEPTED else (default,)
        if given.get(path) not in accepted:
            err("pooled-model", f"spec{path}", f"a pooled model runs on its pool's tritonservers: set {path[1:]} on "
                f"the TritonPool (spec{path}), not on the model")


def _server_values(model: BaseModel, at: str) -> Iterator[tuple[str, object]]:
    """(`.server.<field>` path, value) for every server setting, nested ones walked (as POOLED_SERVER_DEFAULTS)."""
    for name, f in type(model).model_fields.items():
        path = f"{at}.{f.alias or name}"
        value = getattr(model, name)
        if isinstance(value, BaseModel) and path not in POOLED_SERVER_DEFAULTS:
            yield from _server_values(value, path)
        else:
            yield path, value


# ---------------------------------------------------------------- the pod


#: The Python backend's settings (`--backend-config=python,KEY=VALUE`) that size its regions in /dev/shm.
SHM_DEFAULT_KEY, SHM_GROWTH_KEY = "shm-default-byte-size", "shm-growth-byte-size"
#: What the Python backend refuses below (python_be.cc, 24.10): every instance starts with at least this region.
SHM_DEFAULT_MIN = 1 << 20
#: Kubernetes' limit on all of a pod's annotations together, less room for the operator's own.
ANNOTATIONS_BUDGET = 256 * 1024 - 8 * 1024


def python_shm_settings(args: Sequence[str]) -> list[tuple[int, str, str]]:
    """(index in args, key, value) of each Python backend shm setting: `--backend-config=python,KEY=VALUE`, or
    `--backend-config` followed by `python,KEY=VALUE`, as tritonserver's parser takes them."""
    out = []
    for i, arg in enumerate(args):
        if arg.startswith("--backend-config="):
            text = arg.split("=", 1)[1]
        elif arg == "--backend-config" and i + 1 < len(args):
            text, i = args[i + 1], i + 1
        else:
            continue
        backend, _, setting = text.partition(",")
        key, _, value = setting.partition("=")
        if backend == "python" and key in (SHM_DEFAULT_KEY, SHM_GROWTH_KEY):
            out.append((i, key, value))
    return out


def _check_shm_size(server: Server, err: Collector) -> None:
    if server.shm_size is None:
        return
    size = quantity_value(server.shm_size)
    if size < SHM_DEFAULT_MIN:
        err("shm-size", "spec.server.shmSize",
            f"must be at least 1Mi, got {server.shm_size}: each Python backend model instance starts with a 1 MiB region")
    limit = (server.resources.limits or {}).get("memory") if server.resources is not None else None
    if limit is not None and size > quantity_value(limit):
        err("shm-size", "spec.server.shmSize",
            f"{server.shm_size} is above the tritonserver container's memory limit (spec.server.resources.limits."
            f"memory: {limit}): what /dev/shm holds counts against that limit; lower shmSize or raise the limit")


def _key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if len(name) > 63:
        return f"the name part of {key!r} is {len(name)} characters, over 63"
    if len(prefix) > 253:
        return f"the prefix of {key!r} is {len(prefix)} characters, over 253"
    return None


def _check_pod_metadata(server: Server, err: Collector) -> None:
    for field, given, own, what in (("podLabels", server.pod_labels, OPERATOR_LABELS, "labels"),
                                    ("podAnnotations", server.pod_annotations, OPERATOR_ANNOTATIONS, "annotations")):
        for key in sorted(given or ()):
            path = f"spec.server.{field}[{key}]"
            if key.startswith(f"{GROUP}/") or key in own:
                err("pod-metadata", path, f"is one of the operator's own {what} ({', '.join(own)} and every key under "
                    f"{GROUP}/): the operator sets it on every replica"
                    + (" and selects the replicas by the model label" if what == "labels" else ""))
            elif (problem := _key_problem(key)) is not None:
                err("pod-metadata", path, f"not a valid {what[:-1]} key: {problem}")
    size = sum(len(k) + len(v) for k, v in (server.pod_annotations or {}).items())
    if size > ANNOTATIONS_BUDGET:
        err("pod-metadata", "spec.server.podAnnotations",
            f"{size} bytes in all, over the {ANNOTATIONS_BUDGET} Kubernetes leaves beside the operator's own "
            "(a pod's annotations may hold 256 KiB)")


def _check_env_names(server: Server, err: Collector) -> None:
    seen: dict[str, int] = {}
    for i, var in enumerate(server.env or ()):
        if var.name == REPOSITORY_KEY_ENV:
            err("pod-env", f"spec.server.env[{i}].name", f"{var.name} is set by the operator in the tritonserver "
                "container: the key that restricts Triton's model repository API to the operator")
        elif var.name in OPERATOR_ENV:
            err("pod-env", f"spec.server.env[{i}].name", f"{var.name} is set by the operator in the tritonserver "
                "container (NVIDIA's image has no home for the user replicas run as)")
        if var.name in seen:
            err("pod-env", f"spec.server.env[{i}].name", f"{var.name} is set twice (also env[{seen[var.name]}])")
        seen.setdefault(var.name, i)


#: The smallest repository volume: the rendered files alone (a ConfigMap) may take 1 MiB.
REPOSITORY_SIZE_MIN = 1 << 20


def _check_fetch_limits(server: Server, err: Collector) -> None:
    size = quantity_value(server.repository_size_limit)
    if size < REPOSITORY_SIZE_MIN:
        err("fetch-limits", "spec.server.repositorySizeLimit",
            f"must be at least 1Mi, got {server.repository_size_limit}: the rendered files alone may take 1 MiB")
    if server.fetch.max_bytes is not None and quantity_value(server.fetch.max_bytes) > size:
        err("fetch-limits", "spec.server.fetch.maxBytes",
            f"{server.fetch.max_bytes} may not exceed repositorySizeLimit ({server.repository_size_limit}), the "
            "sizeLimit of the volume fetch writes into: the kubelet would evict the pod instead of fetch failing "
            "with a clear message; lower maxBytes or raise repositorySizeLimit")


def _check_server_args(server: Server, err: Collector) -> None:
    for i, arg in enumerate(server.args or ()):
        flag = next((full for prefix, full in OPERATOR_ARGS.items() if arg.startswith(prefix)), None)
        if flag is not None:
            given = arg.split("=", 1)[0]
            what = flag if given == flag else f"{given} (Triton reads it as {flag})"
            err("server-args", f"spec.server.args[{i}]", f"{what} is set by the operator: it restricts Triton's model "
                "repository API (load, unload, index) to the operator's key, so that no client of the model's Service "
                "can unload it or load code into it")


def check_server(server: Server, ident: str) -> list[FieldError]:
    """The rules of a spec.server alone (a TritonModel's, or a TritonPool's)."""
    err = Collector(ident)
    _check_server_args(server, err)
    _check_shm_size(server, err)
    _check_fetch_limits(server, err)
    _check_pod_metadata(server, err)
    _check_env_names(server, err)
    return err.errors


def check_model(model: TritonModel, ident: str) -> list[FieldError]:
    err = Collector(ident)
    err.errors.extend(check_server(model.spec.server, ident))
    _check_autoscaling(model.spec, err)
    _check_pooled(model.spec, err)
    _check_structure(model, err)
    _check_tensors(model.spec, err)
    _check_model_level(model.spec, err)
    _check_batcher(model.spec, err)
    _check_sequence(model.spec, err)
    _check_warmup(model.spec, err)
    return err.errors


# ---------------------------------------------------------------- ensembles


def _full_shape(t: Tensor, max_batch: int) -> list[int]:
    return ([-1] if max_batch > 0 else []) + list(t.dims)


def _compatible(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x == -1 or y == -1 or x == y for x, y in zip(a, b, strict=True))


def _shape_compatible(a: Tensor, a_mbs: int, b: Tensor, b_mbs: int, *, a_reshape: bool = False) -> bool:
    """Triton's ensemble shape agreement: dims match with -1 as a wildcard, or else the full
    shapes do, where a batching model's shape gets a leading -1. Ensemble tensors use reshape."""
    a_dims = list(a.reshape) if a_reshape and a.reshape is not None else list(a.dims)
    if _compatible(a_dims, b.dims):
        return True
    full_a = ([-1] if a_mbs > 0 else []) + a_dims
    return _compatible(full_a, _full_shape(b, b_mbs))


def _stream_name(stream: tuple[int, str] | None) -> str:
    return "the ensemble's inputs" if stream is None else f"decoupled step {stream[0]} ({stream[1]})"


def _gpus_to_load(spec: TritonModelSpec) -> int:
    """GPUs a replica must see for Triton to load the model at all: one more than the highest index a KIND_GPU
    group names, and 1 for a KIND_GPU group without indices ("has kind KIND_GPU but no GPUs are available").
    KIND_MODEL, CPU and AUTO groups load with none (`_check_gpus` has the same rules for a model's own replicas)."""
    need = 0
    for g in spec.instance_groups or ():
        if g.kind == "GPU":
            need = max(need, max(g.gpus) + 1 if g.gpus else 1)
    return need


def _closure_gpus(model: TritonModel, models: Mapping[str, TritonModel], ensemble: str) -> tuple[int, str]:
    """The most GPUs any model in `model`'s step closure (not walking back into `ensemble`) must see to load, and
    the first model that needs that many: what one replica of `ensemble`, which loads them all, must see."""
    graph = {name: m for name, m in models.items() if name != ensemble} | {model.name: model}
    reached, _ = step_graph.closure(model.name, step_graph.of_models(graph))
    need, who = max(((_gpus_to_load(graph[n].spec), n) for n in reached), key=lambda x: x[0])
    return need, who


def _decoupled(model: TritonModel, models: Mapping[str, TritonModel]) -> bool:
    """Whether a step model answers decoupled: an ensemble does when one of the models its steps reach does
    (Triton marks it so)."""
    graph = {**models, model.name: model}
    reached, _ = step_graph.closure(model.name, step_graph.of_models(graph, ensembles_only=True))
    return any(graph[n].spec.decoupled for n in reached if not graph[n].spec.is_ensemble or graph[n].spec.ensemble is None)


def _check_decoupled_streams(model: TritonModel, models: Mapping[str, TritonModel], err: Collector) -> None:
    """Triton's rule for decoupled steps, which may answer one request with any number of responses.

    Each tensor belongs to a stream: the ensemble's inputs are one, every decoupled step starts a new one
    (two steps of one decoupled model are two streams), and a step that is not decoupled passes on the stream
    of its inputs. A step whose inputs come from different streams, or ensemble outputs that do, cannot be
    paired response by response: Triton refuses the ensemble ("receives inputs originated from different
    decoupled models"). Steps run once all their inputs exist, in any order the data allows.
    """
    assert model.spec.ensemble is not None
    stream: dict[str, tuple[int, str] | None] = {t.name: None for t in model.spec.inputs or ()}
    pending = [
        (i, s, models[s.model]) for i, s in enumerate(model.spec.ensemble.steps)
        if s.model in models and s.model != model.name and s.input_map
    ]
    progress = True
    while pending and progress:
        progress = False
        for item in list(pending):
            i, step, target = item
            if any(v not in stream for v in step.input_map.values()):
                continue
            pending.remove(item)
            progress = True
            came_from = {v: stream[v] for v in step.input_map.values()}
            streams = list(dict.fromkeys(came_from.values()))
            if len(streams) > 1:
                err(
                    "ensemble-decoupled-mix",
                    f"spec.ensemble.steps[{i}].inputMap",
                    "inputs come from different streams of responses: "
                    + ", ".join(f"{v!r} from {_stream_name(s)}" for v, s in came_from.items())
                    + "; a decoupled model answers a request with any number of responses, so Triton cannot pair "
                    "them and refuses the ensemble",
                )
            out = (i, step.model) if _decoupled(target, models) else streams[0]
            for v in step.output_map.values():
                stream.setdefault(v, out)
    outputs = {t.name: stream[t.name] for t in model.spec.outputs or () if t.name in stream}
    if len(set(outputs.values())) > 1:
        err(
            "ensemble-decoupled-mix",
            "spec.outputs",
            "ensemble outputs come from different streams of responses: "
            + ", ".join(f"{n!r} from {_stream_name(s)}" for n, s in outputs.items())
            + "; Triton cannot pair the responses of a decoupled step with others and refuses the ensemble",
        )


def _policy_text(spec: TritonModelSpec) -> str:
    p = spec.version_policy
    if p is None:
        return "no versionPolicy: Triton serves the latest version only"
    if p.latest is not None:
        return f"versionPolicy latest: {p.latest}"
    if p.all is not None:
        return "versionPolicy all"
    return f"versionPolicy specific: [{', '.join(map(str, p.specific or ()))}]"


def _versions_text(versions: Sequence[int]) -> str:
    return f"version {versions[0]}" if len(versions) == 1 else f"versions {', '.join(map(str, versions))}"


def _check_step_version(name: str, version: int, target: TritonModelSpec, path: str, err: Collector) -> None:
    """A step's modelVersion: -1, or a version the step model has and its policy serves (else Triton refuses)."""
    if version == -1:
        return
    have, served = target.available_versions, target.served_versions
    if not have or not served:
        return  # the step model's own errors say why it has no version to serve
    if version not in have:
        err("ensemble-step-version", path, f"TritonModel {name!r} has no version {version} (it has "
            f"{_versions_text(have)}), so Triton refuses the ensemble; use -1 (the latest served) or one of "
            f"{', '.join(map(str, served))}")
    elif version not in served:
        err("ensemble-step-version", path, f"TritonModel {name!r} does not serve version {version} "
            f"({_policy_text(target)}; it serves {_versions_text(served)}), so Triton refuses the ensemble; use -1 "
            f"(the latest served) or one of {', '.join(map(str, served))}, or change its versionPolicy")


#: An ensemble tensor -> who writes it (a description), its Tensor and that writer's max batch size.
_Produced = dict[str, tuple[str, Tensor, int]]


def _check_step_wiring(model: TritonModel, models: Mapping[str, TritonModel], i: int, step: EnsembleStep,
                       produced: _Produced, err: Collector) -> None:
    """One step, as written: maps an input and an output, names a defined model that serves the version (and is not
    the ensemble), whose batch size and tensors fit; the tensors it writes are recorded in `produced`."""
    mbs = model.spec.effective_max_batch_size
    base = f"spec.ensemble.steps[{i}]"
    if not step.input_map:
        err("ensemble-step", f"{base}.inputMap", "must map at least one input")
    if not step.output_map:
        err("ensemble-step", f"{base}.outputMap", "must map at least one output")
    target = models.get(step.model)
    if target is None:
        err("ensemble-step-model", f"{base}.model", f"TritonModel {step.model!r} is not defined")
        return
    _check_step_version(step.model, step.model_version, target.spec, f"{base}.modelVersion", err)
    if target.spec.is_ensemble and step.model == model.name:
        err("ensemble-cycle", f"{base}.model", "an ensemble cannot contain itself")
        return
    t_inputs = {t.name: t for t in target.spec.inputs or ()}
    t_outputs = {t.name: t for t in target.spec.outputs or ()}
    t_mbs = target.spec.effective_max_batch_size
    if mbs > 0 and t_mbs > 0 and mbs > t_mbs:
        err(
            "ensemble-batch-size",
            "spec.maxBatchSize",
            f"ensemble maxBatchSize {mbs} exceeds step model {step.model!r}'s maxBatchSize {t_mbs}",
        )
    for k in step.input_map:
        if k not in t_inputs:
            err("ensemble-step-tensors", f"{base}.inputMap[{k}]", f"{step.model!r} has no input {k!r}; it has {sorted(t_inputs)}")
    for k, t in sorted(t_inputs.items()):
        if not t.optional and k not in step.input_map:
            err("ensemble-step-tensors", f"{base}.inputMap", f"required input {k!r} of {step.model!r} is not mapped")
    for k, v in step.output_map.items():
        if k not in t_outputs:
            err("ensemble-step-tensors", f"{base}.outputMap[{k}]", f"{step.model!r} has no output {k!r}; it has {sorted(t_outputs)}")
            continue
        if v in produced:
            err(
                "ensemble-tensor-written-once",
                f"{base}.outputMap[{k}]",
                f"ensemble tensor {v!r} is already written by the {produced[v][0]}",
            )
            continue
        produced[v] = (f"output {k!r} of step {i} ({step.model})", t_outputs[k], t_mbs)


def _check_step_inputs(model: TritonModel, models: Mapping[str, TritonModel], i: int, step: EnsembleStep,
                       produced: _Produced, consumed: set[str], err: Collector) -> None:
    """One step's inputs, once every step's outputs are known: each is available, of the type and shape the step
    model takes; the tensors it reads are recorded in `consumed`."""
    target = models.get(step.model)
    if target is None or step.model == model.name:
        return
    t_inputs = {t.name: t for t in target.spec.inputs or ()}
    t_mbs = target.spec.effective_max_batch_size
    base = f"spec.ensemble.steps[{i}]"
    for k, v in step.input_map.items():
        consumed.add(v)
        src = produced.get(v)
        if src is None:
            err(
                "ensemble-tensor-available",
                f"{base}.inputMap[{k}]",
                f"ensemble tensor {v!r} is neither an ensemble input nor written by any step",
            )
            continue
        wanted = t_inputs.get(k)
        if wanted is None:
            continue
        if src[1].data_type != wanted.data_type:
            err(
                "ensemble-types",
                f"{base}.inputMap[{k}]",
                f"{v!r} is {src[1].data_type} ({src[0]}) but {step.model!r} input {k!r} is {wanted.data_type}",
            )
        elif not _shape_compatible(src[1], src[2], wanted, t_mbs, a_reshape=src[0] == "ensemble input"):
            err(
                "ensemble-types",
                f"{base}.inputMap[{k}]",
                f"{v!r} has shape {src[1].dims} ({src[0]}) but {step.model!r} input {k!r} has dims {wanted.dims}",
            )


def _check_ensemble_outputs(spec: TritonModelSpec, produced: _Produced, err: Collector) -> None:
    """Every ensemble output is written by a step, of the type and shape the ensemble declares."""
    mbs = spec.effective_max_batch_size
    for j, (name, t) in enumerate({t.name: t for t in spec.outputs or ()}.items()):
        src = produced.get(name)
        if src is None or src[0] == "ensemble input":
            err("ensemble-outputs-written", f"spec.outputs[{j}]", f"ensemble output {name!r} is not written by any step")
            continue
        if src[1].data_type != t.data_type:
            err("ensemble-types", f"spec.outputs[{j}].dataType", f"is {t.data_type} but {src[0]} is {src[1].data_type}")
        elif not _shape_compatible(t, mbs, src[1], src[2], a_reshape=True):
            err("ensemble-types", f"spec.outputs[{j}].dims", f"{t.dims} does not match {src[0]} with dims {src[1].dims}")


def _check_ensemble_gpus(model: TritonModel, models: Mapping[str, TritonModel], err: Collector) -> None:
    """spec.server.gpus, when set, is enough for every step: one replica loads them all into one tritonserver."""
    n = model.spec.server.gpus
    assert model.spec.ensemble is not None
    for i, step in enumerate(model.spec.ensemble.steps):
        target = models.get(step.model)
        if n is None or target is None or step.model == model.name:
            continue
        need, who = _closure_gpus(target, models, model.name)
        if need > n:
            whose = "its" if who == step.model else f"the step model {who}'s"
            err(
                "server-gpus",
                "spec.server.gpus",
                f"the ensemble's replicas load every step into one tritonserver, and step {i} ({step.model}) needs "
                f"{need} GPU(s) for {whose} instance groups (KIND_GPU), which Triton refuses to load with fewer; "
                f"server.gpus is {n}: raise it to {need} or leave it unset",
            )


def _check_ensemble(model: TritonModel, models: Mapping[str, TritonModel], ident: str) -> list[FieldError]:
    err = Collector(ident)
    spec = model.spec
    if not spec.is_ensemble or spec.ensemble is None:
        return err.errors
    ens_outputs = {t.name for t in spec.outputs or ()}
    produced: _Produced = {t.name: ("ensemble input", t, spec.effective_max_batch_size) for t in spec.inputs or ()}
    consumed: set[str] = set()
    for i, step in enumerate(spec.ensemble.steps):
        _check_step_wiring(model, models, i, step, produced, err)
    # second pass: every step input is available, types and shapes agree
    for i, step in enumerate(spec.ensemble.steps):
        _check_step_inputs(model, models, i, step, produced, consumed, err)
    _check_ensemble_outputs(spec, produced, err)
    _check_decoupled_streams(model, models, err)
    _check_ensemble_gpus(model, models, err)
    for name, (desc, _t, _m) in produced.items():
        if name not in consumed and name not in ens_outputs:
            path = "spec.inputs" if desc == "ensemble input" else "spec.ensemble.steps"
            err("ensemble-unused-tensor", path, f"ensemble tensor {name!r} ({desc}) is never used")
    return err.errors


#: The variables a source's credentialsSecret sets in the fetch step (`render.kubernetes`), by uri scheme.
CREDENTIAL_ENV = {
    "s3://": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION"),
    "gs://": ("GOOGLE_APPLICATION_CREDENTIALS",),
}


def _check_replica(model: TritonModel, models: Mapping[str, TritonModel], ident: str) -> list[FieldError]:
    """What one replica runs (the model and every step its ensemble reaches, in one tritonserver, shaped by the
    model's server) against that server's settings: the Python backend's shm settings, the fetch step's env."""
    err = Collector(ident)
    server = model.spec.server
    reached, _ = step_graph.closure(model.name, step_graph.of_models({**models, model.name: model}))
    closure = [models.get(n, model) if n != model.name else model for n in reached]
    # The fewest Python instances the replica starts: each instance group's count (per GPU for KIND_GPU, so at
    # least that), Triton's one instance for a model without groups. Each takes shm-default-byte-size at load.
    instances = sum(max(1, sum(g.count for g in m.spec.instance_groups or ())) for m in closure
                    if m.spec.backend == "python")
    shm = quantity_bytes(server.effective_shm_size)
    for i, key, value in python_shm_settings(server.args or ()):
        path = f"spec.server.args[{i}]"
        if not value.isdigit():
            err("shm-backend-config", path, f"{key} takes a whole number of bytes, got {value!r} (Triton reads only the "
                "leading digits: `64MB` is 64 bytes)")
            continue
        n = int(value)
        if key == SHM_DEFAULT_KEY and n < SHM_DEFAULT_MIN:
            err("shm-backend-config", path, f"{key} must be at least {SHM_DEFAULT_MIN} (1 MiB): the Python backend "
                "refuses less, and every Python model then fails to load")
        elif key == SHM_DEFAULT_KEY and instances and n * instances > shm:
            err("shm-backend-config", path,
                f"{key}={n} for each of the replica's {instances} Python model instance(s) is {n * instances} bytes, "
                f"over /dev/shm's {shm} (spec.server.shmSize {server.effective_shm_size}"
                f"{'' if server.shm_size else ', the default'}): those instances would fail to load; raise shmSize or "
                "lower the setting")
        elif key == SHM_GROWTH_KEY and n == 0:
            err("shm-backend-config", path, f"{key} must be more than 0: the Python backend refuses 0")
        elif key == SHM_GROWTH_KEY and n > shm:
            err("shm-backend-config", path,
                f"{key}={n} is over /dev/shm's {shm} bytes (spec.server.shmSize {server.effective_shm_size}"
                f"{'' if server.shm_size else ', the default'}): every region growth would fail; raise shmSize or "
                "lower the setting")
    _check_credentials(model, closure, err)
    secret_vars = {var for m in closure for src in [*m.spec.version_sources.values(), m.spec.model_files]
                   if src is not None and src.credentials_secret and src.uri
                   for scheme, names in CREDENTIAL_ENV.items() if src.uri.startswith(scheme) for var in names}
    for i, var in enumerate(server.env or ()):
        if var.name in secret_vars:
            err("pod-env", f"spec.server.env[{i}].name",
                f"{var.name} is set in the fetch step from a source's credentialsSecret: set it in that Secret, or "
                "drop credentialsSecret and give the fetch step its credentials here")
    return err.errors


def _check_pool_steps(model: TritonModel, models: Mapping[str, TritonModel], ident: str) -> list[FieldError]:
    """A pooled ensemble is loaded with every step it reaches on the same pool replicas: each step names that pool,
    so that its memory is declared and its settings are the pool's."""
    if model.spec.pool is None or not model.spec.is_ensemble:
        return []
    err = Collector(ident)
    reached, _ = step_graph.closure(model.name, step_graph.of_models({**models, model.name: model}))
    for name in reached:
        step = models.get(name)
        if name == model.name or step is None or step.spec.pool == model.spec.pool:
            continue
        where = f"on pool {step.spec.pool!r}" if step.spec.pool else "not on a pool"
        err("pool-steps", "spec.pool", f"step model {name!r} is {where}: a pooled ensemble's steps are loaded with it "
            f"on the replicas of pool {model.spec.pool!r}; set the step's spec.pool to {model.spec.pool!r} (with "
            "replicas: 0 it runs nowhere else)")
    return err.errors


def fetched_sources(spec: TritonModelSpec) -> list[tuple[str, str, str | None]]:
    """(field path, uri, credentialsSecret) of each of the model's files fetched from a uri at pod start."""
    out = []
    sources = [("spec.source", spec.source)] + [(f"spec.versions[{i}].source", v.source)
                                                for i, v in enumerate(spec.versions or ())]
    for base, src in [*sources, ("spec.modelFiles", spec.model_files)]:
        if src is not None and src.uri is not None:
            out.append((base, src.uri, src.credentials_secret))
    return out


def _check_credentials(model: TritonModel, closure: Sequence[TritonModel], err: Collector) -> None:
    """One replica's fetch step fetches every uri source of its closure with one environment: a credentialsSecret
    of an s3:// source sets AWS_* there (a source without one would use them too, boto3 prefers them to ambient
    credentials), one of a gs:// source mounts key.json at one path and names it in GOOGLE_APPLICATION_CREDENTIALS.
    So the closure's sources of one scheme must agree on their Secret, or one bucket is fetched with another's keys
    (or, for two GCS Secrets, the pod is refused: two volumes at one mount path)."""
    for scheme, what in (("s3://", "the AWS_* variables"), ("gs://", "GOOGLE_APPLICATION_CREDENTIALS and its key file")):
        first: tuple[TritonModel, str, str | None] | None = None
        for m in closure:
            for path, uri, secret in fetched_sources(m.spec):
                if not uri.startswith(scheme):
                    continue
                if first is None:
                    first = (m, path, secret)
                    continue
                other, other_path, other_secret = first
                if secret == other_secret:
                    continue

                def said(who: TritonModel, where: str, name: str | None) -> str:
                    owner = "" if who.name == model.name else f"step model {who.name}'s "
                    named = f"names Secret {name!r}" if name else "names no credentialsSecret (ambient credentials)"
                    return f"{owner}{where} {named}"

                why = (f"{said(m, path, secret)}, and {said(other, other_path, other_secret)}: one replica's fetch step "
                       f"fetches every {scheme} source with one environment, where a credentialsSecret sets {what}, "
                       "so one bucket would be fetched with the other's credentials; name one Secret (that can read "
                       "both) in both, or none")
                if m.name == model.name:
                    err("credentials-secret", f"{path}.credentialsSecret", why)
                else:
                    err("credentials-secret", "spec.ensemble.steps", why)
                break  # one error per scheme and model is enough to say it


def _cycles(models: Mapping[str, TritonModel]) -> Iterator[tuple[str, list[str]]]:
    """Ensembles that reach themselves through steps, with the path."""
    return step_graph.cycles([n for n, m in models.items() if m.spec.is_ensemble], step_graph.of_models(models))


def check_models(models: Sequence[tuple[str, TritonModel]]) -> list[FieldError]:
    """All rules over a set of (identifier, model) pairs, e.g. one multi-document file."""
    errors: list[FieldError] = []
    by_name: dict[str, TritonModel] = {}
    idents: dict[str, str] = {}
    for ident, m in models:
        if m.name in by_name:
            errors.append(FieldError(ident, "metadata.name", f"TritonModel {m.name!r} is defined twice", "schema"))
        by_name[m.name] = m
        idents[m.name] = ident
    triton_names: dict[str, str] = {}
    for ident, m in models:
        other = triton_names.setdefault(m.triton_name, m.name)
        if other != m.name:
            errors.append(
                FieldError(ident, "spec.modelName", f"Triton model name {m.triton_name!r} is also used by {other!r}", "schema")
            )
        errors.extend(check_model(m, ident))
        errors.extend(_check_ensemble(m, by_name, ident))
        errors.extend(_check_replica(m, by_name, ident))
        errors.extend(_check_pool_steps(m, by_name, ident))
    for start, path in _cycles(by_name):
        errors.append(
            FieldError(idents[start], "spec.ensemble.steps", f"ensembles form a cycle: {' -> '.join(path)}", "ensemble-cycle")
        )
    return errors
