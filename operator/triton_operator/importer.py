"""Pure conversion of an existing Triton `ModelConfig` into a TritonModel manifest.

The inverse of `render.modelconfig`: import -> render gives back an equivalent
ModelConfig (same protobuf, less our digest parameter and instance group names).
Fields TritonModel does not cover are reported, never silently dropped.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from google.protobuf import text_format

from .api import protos
from .api.pod import DIGEST_PARAMETER
from .api.v1alpha1 import API_VERSION, BATCH_STRATEGY_PARAMETER, KIND
from .render.modelconfig import WIRE_NAME
from .validate.errors import field_path

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as pb
else:  # tritonclient's generated ModelConfig schema, without tritonclient's client (`api.protos`)
    pb = protos.generated("model_config_pb2")

_KIND_NAME = {v: k.removeprefix("KIND_") for k, v in pb.ModelInstanceGroup.Kind.items()}
_FORMAT_NAME = {v: k for k, v in pb.ModelInput.Format.items()}
_TIMEOUT_ACTION_NAME = {v: k for k, v in pb.ModelQueuePolicy.TimeoutAction.items()}
_CONTROL_NAME = {
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "START",
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "END",
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "READY",
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}
_SUPPORTED = {
    "name", "platform", "backend", "max_batch_size", "input", "output", "dynamic_batching", "sequence_batching",
    "ensemble_scheduling", "instance_group", "parameters", "model_warmup", "model_transaction_policy",
    "response_cache", "version_policy",
}  # fmt: skip
#: Fields TritonModel covers, by message; any other field set in one of these is reported as dropped.
_COVERED = {
    "inference.ModelConfig": _SUPPORTED,
    "inference.ModelInput": {"name", "data_type", "format", "dims", "reshape", "optional", "allow_ragged_batch"},
    "inference.ModelOutput": {"name", "data_type", "dims", "reshape", "label_filename"},
    "inference.ModelSequenceBatching": {"direct", "oldest", "max_sequence_idle_microseconds", "control_input", "state"},
    "inference.ModelSequenceBatching.State": {"input_name", "output_name", "data_type", "dims", "initial_state"},
    "inference.ModelInstanceGroup": {"name", "kind", "count", "gpus"},  # names are Triton's to make up
    "inference.ModelEnsembling.Step": {"model_name", "model_version", "input_map", "output_map"},
}


def _repeated(fd: Any) -> bool:
    # protobuf >= 5.29 has `is_repeated` and deprecates `label`
    return bool(fd.is_repeated) if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED


def _dropped(msg: Any, path: str = "") -> list[str]:
    """Paths (`output[0].label_filename`) of the fields set in `msg` that a manifest cannot carry."""
    out = []
    covered = _COVERED.get(msg.DESCRIPTOR.full_name)
    for fd, value in msg.ListFields():
        here = f"{path}.{fd.name}" if path else fd.name
        if covered is not None and fd.name not in covered:
            out.append(here)
        elif fd.message_type is not None and not fd.message_type.GetOptions().map_entry:
            items = enumerate(value) if _repeated(fd) else [(None, value)]
            for i, item in items:
                out.extend(_dropped(item, here if i is None else f"{here}[{i}]"))
    return out


@dataclass(frozen=True)
class ImportProblem:
    """A defect the manifest cannot carry: the field it would be in, and why."""

    path: str
    message: str


@dataclass
class Imported:
    manifest: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    problems: list[ImportProblem] = field(default_factory=list)


def k8s_name(triton_name: str) -> str:
    """A TritonModel name (`api.v1alpha1.MODEL_NAME_PATTERN`) for a Triton model name: lowercase, '_' and '.' ->
    '-', and `model-` before one that starts with a digit (a Service's name starts with a letter)."""
    name = re.sub(r"[^a-z0-9-]", "-", triton_name.lower()).strip("-")
    if name[:1].isdigit():
        name = f"model-{name}"
    return (name or "model")[:63].rstrip("-")


def parse_config(text: str) -> pb.ModelConfig:
    return text_format.Parse(text, pb.ModelConfig())


def _enum(value: int, names: Mapping[int, str], enum: Any, where: str, out: dict[str, Any], key: str,
          problems: list[ImportProblem]) -> None:
    """`out[key]` = the manifest's name for the proto enum `value`, or a problem at `where` when it has none: a
    config may hold an enum number proto3 keeps but no release of Triton defines, or leave a data type unset."""
    name = names.get(value)
    if name is not None:
        out[key] = name
        return
    known = {v: k for k, v in enum.items()}
    choices = ", ".join(dict.fromkeys(names.values()))
    if value not in known:
        said = f"{value} is no {enum.DESCRIPTOR.name} that Triton's model_config.proto defines"
    elif value == 0:
        said = f"unset ({known[value]}), which Triton refuses too"
    else:
        said = f"{known[value]} is not one a TritonModel can have"
    problems.append(ImportProblem(where, f"{said}: give one of {choices}"))


def _tensor(t: Any, is_input: bool, where: str, problems: list[ImportProblem]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": t.name}
    _enum(t.data_type, WIRE_NAME, pb.DataType, f"{where}.dataType", out, "dataType", problems)
    out["dims"] = list(t.dims)
    if is_input and t.optional:
        out["optional"] = True
    if is_input and t.allow_ragged_batch:
        out["allowRaggedBatch"] = True
    if t.HasField("reshape"):
        out["reshape"] = list(t.reshape.shape)
    if is_input and t.format != pb.ModelInput.FORMAT_NONE:
        _enum(t.format, _FORMAT_NAME, pb.ModelInput.Format, f"{where}.format", out, "format", problems)
    if not is_input and t.label_filename:
        out["labelFilename"] = t.label_filename
    return out


def _policy(p: pb.ModelQueuePolicy, where: str, problems: list[ImportProblem]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _enum(p.timeout_action, _TIMEOUT_ACTION_NAME, pb.ModelQueuePolicy.TimeoutAction, f"{where}.timeoutAction", out,
          "timeoutAction", problems)
    return {**out, "defaultTimeoutMicroseconds": p.default_timeout_microseconds,
            "allowTimeoutOverride": p.allow_timeout_override, "maxQueueSize": p.max_queue_size}


def _batcher(db: pb.ModelDynamicBatching, problems: list[ImportProblem]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "maxQueueDelayMicroseconds": db.max_queue_delay_microseconds,
        "preserveOrdering": db.preserve_ordering,
        "priorityLevels": db.priority_levels,
        "defaultPriorityLevel": db.default_priority_level,
    }
    if db.preferred_batch_size:
        out["preferredBatchSize"] = list(db.preferred_batch_size)
    if db.HasField("default_queue_policy"):
        out["defaultQueuePolicy"] = _policy(db.default_queue_policy, "spec.batcher.defaultQueuePolicy", problems)
    if db.priority_queue_policy:
        out["priorityQueuePolicy"] = {str(k): _policy(v, f"spec.batcher.priorityQueuePolicy[{k}]", problems)
                                      for k, v in sorted(db.priority_queue_policy.items())}
    return out


def _sequence(sb: pb.ModelSequenceBatching, warnings: list[str], problems: list[ImportProblem]) -> dict[str, Any]:
    out: dict[str, Any] = {"maxSequenceIdleMicroseconds": sb.max_sequence_idle_microseconds or 1_000_000}
    if sb.HasField("oldest"):
        o = sb.oldest
        out["oldest"] = {
            "maxCandidateSequences": o.max_candidate_sequences,
            "maxQueueDelayMicroseconds": o.max_queue_delay_microseconds,
            "preserveOrdering": o.preserve_ordering,
        }
        if o.preferred_batch_size:
            out["oldest"]["preferredBatchSize"] = list(o.preferred_batch_size)
    elif sb.HasField("direct"):
        out["direct"] = {
            "maxQueueDelayMicroseconds": sb.direct.max_queue_delay_microseconds,
            "minimumSlotUtilization": sb.direct.minimum_slot_utilization,
        }
    controls: list[dict[str, Any]] = []
    for ci in sb.control_input:
        for c in ci.control:
            where = f"spec.sequenceBatcher.controlInputs[{len(controls)}]"
            entry: dict[str, Any] = {"name": ci.name}
            _enum(c.kind, _CONTROL_NAME, pb.ModelSequenceBatching.Control.Kind, f"{where}.kind", entry, "kind", problems)
            if c.kind == pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
                _enum(c.data_type, WIRE_NAME, pb.DataType, f"{where}.dataType", entry, "dataType", problems)
            elif c.fp32_false_true:
                entry["dataType"], entry["falseTrue"] = "FP32", list(c.fp32_false_true)
            elif c.bool_false_true:
                entry["dataType"], entry["falseTrue"] = "BOOL", [int(v) for v in c.bool_false_true]
            else:
                entry["dataType"], entry["falseTrue"] = "INT32", list(c.int32_false_true)
            controls.append(entry)
    if controls:
        out["controlInputs"] = controls
    states: list[dict[str, Any]] = []
    for st in sb.state:
        s: dict[str, Any] = {"inputName": st.input_name, "outputName": st.output_name}
        _enum(st.data_type, WIRE_NAME, pb.DataType, f"spec.sequenceBatcher.state[{len(states)}].dataType", s, "dataType",
              problems)
        s["dims"] = list(st.dims)
        if any(i.zero_data for i in st.initial_state):
            s["zeroInitialState"] = True
        if any(i.HasField("data_file") for i in st.initial_state):
            warnings.append(f"sequence state {st.input_name!r}: initial_state data_file is not supported and was dropped")
        states.append(s)
    if states:
        out["state"] = states
    return out


def _warmup(w: pb.ModelWarmup, where: str, problems: list[ImportProblem]) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    for name, wi in sorted(w.inputs.items()):
        entry: dict[str, Any] = {}
        _enum(wi.data_type, WIRE_NAME, pb.DataType, field_path(("inputs", name, "dataType"), where), entry, "dataType",
              problems)
        entry["dims"] = list(wi.dims)
        which = wi.WhichOneof("input_data_type")
        if which == "random_data":
            entry["randomData"] = True
        elif which == "input_data_file":
            entry["inputDataFile"] = wi.input_data_file
        else:
            entry["zeroData"] = True
        inputs[name] = entry
    return {"name": w.name, "batchSize": w.batch_size, "count": w.count or 1, "inputs": inputs}


def _version_policy(vp: pb.ModelVersionPolicy) -> dict[str, Any] | None:
    """spec.versionPolicy for a `version_policy`, or None for Triton's default (none set, or an empty one)."""
    which = vp.WhichOneof("policy_choice")
    if which == "latest":
        return {"latest": max(1, vp.latest.num_versions)}  # Triton reads 0 as its default, 1
    if which == "all":
        return {"all": {}}
    if which == "specific":
        return {"specific": list(vp.specific.versions)}
    return None


#: A file's content as the CLI read it: None for one too large to inline, which it did not read (`cli.main`).
FileContent = bytes | None


def _text(files: Mapping[str, FileContent]) -> tuple[dict[str, str], list[str]]:
    """The files that are UTF-8 text (and were read), and the names of the others: binary or too large."""
    inline: dict[str, str] = {}
    other = []
    for fname, data in sorted(files.items()):
        try:
            text = None if data is None else data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None:
            other.append(fname if data is not None else f"{fname}: too large to inline")
        else:
            inline[fname] = text
    return inline, other


def _source(
    cfg: pb.ModelConfig, files: Mapping[str, FileContent], uri: str | None, warnings: list[str],
    where: str = "spec.source", placeholder: str = "",
) -> dict[str, Any]:
    """A Source for one version directory's files: inline when they are flat text, else a uri to fill in."""
    source: dict[str, Any] = {}
    inline, binary = _text(files)
    if uri or binary or "/" in "".join(inline):
        source["uri"] = uri or placeholder or f"pvc://CHANGE-ME/{cfg.name}"
        warnings.append(
            f"{cfg.name}: version files are binary or nested ({', '.join(binary or sorted(inline))}); "
            f"set {where}.uri to where they live (now {source['uri']})"
        )
    else:
        source["inline"] = inline
    return source


def _model_files(cfg: pb.ModelConfig, files: Mapping[str, FileContent], warnings: list[str]) -> dict[str, Any]:
    """spec.modelFiles for the model directory's own files: inline when they are flat text, else a uri to fill in."""
    hidden = sorted(f for f in files if any(part.startswith(".") for part in f.split("/")))
    if hidden:
        warnings.append(f"{cfg.name}: hidden files in the model directory were not imported: {', '.join(hidden)}")
    inline, binary = _text({f: data for f, data in files.items() if f not in hidden})
    if not binary and "/" not in "".join(inline):
        return {"inline": inline} if inline else {}
    uri = f"pvc://CHANGE-ME/{cfg.name}/model-files"
    warnings.append(
        f"{cfg.name}: model directory files are binary or nested ({', '.join(binary or sorted(inline))}); "
        f"set spec.modelFiles.uri to where they live (now {uri})"
    )
    return {"uri": uri}


def _strategy_library(
    cfg: pb.ModelConfig, path: str, source_files: Mapping[str, FileContent] | None, problems: list[ImportProblem]
) -> dict[str, str] | None:
    """spec.batcher.strategyLibrary for a TRITON_BATCH_STRATEGY_PATH: `file` when the path ends in
    `<model>/1/<file>` and that file is one of `source_files`, version 1's files that become spec.source (whatever
    the repository's root was where it ran), else `path` (a library elsewhere in the server's image)."""
    if not path.startswith("/"):
        problems.append(ImportProblem(
            f"spec.parameters[{BATCH_STRATEGY_PARAMETER}]",
            f"{path!r} is relative: Triton opens it from tritonserver's working directory, which a replica does not "
            "share; make it absolute, or name a file of the version directory",
        ))
        return None
    parts = path.split("/")
    for i in range(len(parts) - 2):
        rest = "/".join(parts[i + 2:])
        if parts[i] == cfg.name and parts[i + 1] == "1" and source_files is not None and rest in source_files:
            return {"file": rest}
    return {"path": path}


def _head(cfg: pb.ModelConfig, name: str) -> dict[str, Any]:
    """spec's first fields: the Triton name when the TritonModel's differs, platform, backend and batch size."""
    spec: dict[str, Any] = {}
    if name != cfg.name:
        spec["modelName"] = cfg.name
    if cfg.platform:
        spec["platform"] = cfg.platform
    if cfg.backend and cfg.platform != "ensemble":
        spec["backend"] = cfg.backend
    if cfg.max_batch_size == 0:
        spec["batching"] = False
    else:
        spec["maxBatchSize"] = cfg.max_batch_size
    return spec


def _scheduling(cfg: pb.ModelConfig, k8s_names: Mapping[str, str], warnings: list[str],
                problems: list[ImportProblem]) -> dict[str, Any]:
    """spec.batcher, spec.sequenceBatcher or spec.ensemble, from the config's scheduling choice."""
    which = cfg.WhichOneof("scheduling_choice")
    if which == "dynamic_batching":
        return {"batcher": _batcher(cfg.dynamic_batching, problems)}
    if which == "sequence_batching":
        return {"sequenceBatcher": _sequence(cfg.sequence_batching, warnings, problems)}
    if which == "ensemble_scheduling":
        return {"ensemble": {
            "steps": [
                {
                    "model": k8s_names.get(s.model_name, k8s_name(s.model_name)),
                    # whether the step model has and serves it is validate's rule (ensemble-step-version)
                    "modelVersion": s.model_version,
                    "inputMap": dict(sorted(s.input_map.items())),
                    "outputMap": dict(sorted(s.output_map.items())),
                }
                for s in cfg.ensemble_scheduling.step
            ]
        }}
    return {}


def _instance_groups(cfg: pb.ModelConfig, problems: list[ImportProblem]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for g in cfg.instance_group:
        entry: dict[str, Any] = {}
        _enum(g.kind, _KIND_NAME, pb.ModelInstanceGroup.Kind, f"spec.instanceGroups[{len(groups)}].kind", entry, "kind",
              problems)
        entry["count"] = g.count or 1
        if g.gpus:
            entry["gpus"] = list(g.gpus)
        groups.append(entry)
    return groups


def _parameters(cfg: pb.ModelConfig, spec: dict[str, Any], files: Mapping[str, FileContent] | None,
                version_files: Mapping[int, Mapping[str, FileContent]] | None, warnings: list[str],
                problems: list[ImportProblem]) -> dict[str, str]:
    """spec.parameters, but the digest's and the custom batching strategy's: that one becomes
    spec.batcher.strategyLibrary (set on `spec` here), or is dropped with a warning where Triton never reads it."""
    which = cfg.WhichOneof("scheduling_choice")
    params = {k: v.string_value for k, v in sorted(cfg.parameters.items()) if k != DIGEST_PARAMETER}
    if BATCH_STRATEGY_PARAMETER in params and which != "sequence_batching":  # (Triton refuses it with that)
        strategy_path = params.pop(BATCH_STRATEGY_PARAMETER)
        if which == "dynamic_batching":
            dirs = dict(version_files) if version_files else {1: files or {}}
            source_files = dirs[1] if list(dirs) == [1] else None  # what becomes spec.source, if anything does
            lib = _strategy_library(cfg, strategy_path, source_files, problems)
            if lib is not None:
                spec["batcher"]["strategyLibrary"] = lib
        else:
            warnings.append(
                f"{cfg.name}: parameter {BATCH_STRATEGY_PARAMETER} ({strategy_path}) was dropped: without "
                "dynamic_batching Triton never asks a custom batching strategy"
            )
    return params


def _behaviour(cfg: pb.ModelConfig, problems: list[ImportProblem]) -> dict[str, Any]:
    """spec.modelWarmup, decoupled, responseCache and versionPolicy, where the config sets them."""
    spec: dict[str, Any] = {}
    if cfg.model_warmup:
        spec["modelWarmup"] = [_warmup(w, f"spec.modelWarmup[{i}]", problems) for i, w in enumerate(cfg.model_warmup)]
    if cfg.model_transaction_policy.decoupled:
        spec["decoupled"] = True
    if cfg.response_cache.enable:
        spec["responseCache"] = True
    policy = _version_policy(cfg.version_policy)
    if policy is not None:
        spec["versionPolicy"] = policy
    return spec


def _sources(cfg: pb.ModelConfig, by_version: Mapping[int, Mapping[str, FileContent]],
             warmup_files: Mapping[str, FileContent] | None, uri: str | None, warnings: list[str],
             problems: list[ImportProblem]) -> dict[str, Any]:
    """spec.source for a lone version 1, else spec.versions; the warm-up files go with the first."""
    warm = {k: base64.b64encode(v).decode() for k, v in sorted((warmup_files or {}).items()) if v is not None}
    for k, v in sorted((warmup_files or {}).items()):
        if v is None:  # warm-up data travels in the repository ConfigMap, which holds 1 MiB
            where = "spec.source" if list(by_version) == [1] else "spec.versions[0].source"
            problems.append(ImportProblem(field_path(("warmupFiles", k), where), f"warmup/{k} is too large to "
                                          "carry inline (the repository ConfigMap holds 1 MiB in all); use a "
                                          "smaller sample, or randomData or zeroData in modelWarmup"))
    if list(by_version) == [1]:
        source = _source(cfg, by_version[1], uri, warnings)
        if warm:
            source["warmupFiles"] = warm
        return {"source": source}
    entries = []
    for i, (number, vfiles) in enumerate(by_version.items()):
        vsource = _source(cfg, vfiles, uri, warnings, f"spec.versions[{i}].source",
                          f"pvc://CHANGE-ME/{cfg.name}/{number}")
        if warm and i == 0:  # every version reads the one warmup/ directory: give it once
            vsource["warmupFiles"] = warm
        entries.append({"version": number, "source": vsource})
    return {"versions": entries}


def import_config(
    cfg: pb.ModelConfig,
    files: Mapping[str, FileContent] | None = None,
    warmup_files: Mapping[str, FileContent] | None = None,
    k8s_names: Mapping[str, str] | None = None,
    uri: str | None = None,
    versions: Mapping[str, Sequence[int]] | None = None,
    version_files: Mapping[int, Mapping[str, FileContent]] | None = None,
    model_files: Mapping[str, FileContent] | None = None,
) -> Imported:
    """A TritonModel manifest for `cfg`. `files` are the version directory's files (inlined when text).

    `k8s_names` maps Triton model names to TritonModel names, for ensemble steps. `versions` gives the
    version directories of each model in the repository. `version_files` gives each version directory's
    files instead of `files`: a lone version 1 becomes spec.source, anything else spec.versions. `model_files`
    are the model directory's own files beside config.pbtxt (e.g. labels), by path relative to it.
    """
    warnings: list[str] = []
    problems: list[ImportProblem] = []
    k8s_names = k8s_names or {}
    for path in _dropped(cfg):
        warnings.append(f"{cfg.name}: field {path!r} is not supported by TritonModel and was dropped")
    name = k8s_names.get(cfg.name, k8s_name(cfg.name))
    spec = _head(cfg, name)
    if cfg.input:
        spec["inputs"] = [_tensor(t, True, f"spec.inputs[{i}]", problems) for i, t in enumerate(cfg.input)]
    if cfg.output:
        spec["outputs"] = [_tensor(t, False, f"spec.outputs[{i}]", problems) for i, t in enumerate(cfg.output)]
    spec.update(_scheduling(cfg, k8s_names, warnings, problems))
    if cfg.instance_group:
        spec["instanceGroups"] = _instance_groups(cfg, problems)
    params = _parameters(cfg, spec, files, version_files, warnings, problems)
    if params:
        spec["parameters"] = params
    spec.update(_behaviour(cfg, problems))
    if model_files:  # (an ensemble's too: its outputs may name labels as well)
        own = _model_files(cfg, model_files, warnings)
        if own:
            spec["modelFiles"] = own
    if cfg.platform != "ensemble":
        by_version = dict(sorted(version_files.items())) if version_files else {1: files or {}}
        spec.update(_sources(cfg, by_version, warmup_files, uri, warnings, problems))
    manifest = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}
    return Imported(manifest, warnings, problems)
