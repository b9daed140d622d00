"""Pure rendering of a TritonModel into Triton's ModelConfig and model repository.

spec -> `model_config_pb2.ModelConfig` -> `config.pbtxt` (google.protobuf.text_format).
No string templates, no I/O. Output is deterministic byte for byte: text_format
prints fields in declaration order and map entries sorted by key, and every
collection we fill is sorted or kept in the user's order.

The rendered config carries a `parameters` entry with a digest of the whole
model directory (config, version files, warm-up files, the uri and content pins
of fetched files, and for ensembles the steps' digests), so a running replica
can prove which repository it loaded.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.protobuf import json_format, text_format

from ..api import protos
from ..api import steps as step_graph
from ..api.pod import DIGEST_PARAMETER, THRESHOLD_PARAMETER, config_digest
from ..api.v1alpha1 import (
    BATCH_STRATEGY_PARAMETER,
    POOL_FAILED_REQUEST_THRESHOLD,
    QueuePolicy,
    TritonModel,
    TritonModelSpec,
)

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as pb
else:  # tritonclient's generated ModelConfig schema, without tritonclient's client (`api.protos`)
    pb = protos.generated("model_config_pb2")

VERSION_DIR = "1"
#: Where replicas mount the model repository: absolute paths into it (a custom batching strategy's) start here.
REPOSITORY_ROOT = "/models"

_DTYPE = {
    "BOOL": pb.TYPE_BOOL,
    "UINT8": pb.TYPE_UINT8,
    "UINT16": pb.TYPE_UINT16,
    "UINT32": pb.TYPE_UINT32,
    "UINT64": pb.TYPE_UINT64,
    "INT8": pb.TYPE_INT8,
    "INT16": pb.TYPE_INT16,
    "INT32": pb.TYPE_INT32,
    "INT64": pb.TYPE_INT64,
    "FP16": pb.TYPE_FP16,
    "FP32": pb.TYPE_FP32,
    "FP64": pb.TYPE_FP64,
    "BF16": pb.TYPE_BF16,
    "BYTES": pb.TYPE_STRING,
}
WIRE_NAME = {v: k for k, v in _DTYPE.items()}

_KIND = {
    "GPU": pb.ModelInstanceGroup.KIND_GPU,
    "CPU": pb.ModelInstanceGroup.KIND_CPU,
    "AUTO": pb.ModelInstanceGroup.KIND_AUTO,
    "MODEL": pb.ModelInstanceGroup.KIND_MODEL,
}
_CONTROL = {
    "START": pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START,
    "END": pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END,
    "READY": pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY,
    "CORRID": pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID,
}
_TIMEOUT_ACTION = {"REJECT": pb.ModelQueuePolicy.REJECT, "DELAY": pb.ModelQueuePolicy.DELAY}


def data_type(wire: str) -> int:
    code: int = _DTYPE[wire]
    return code


def _queue_policy(dst: pb.ModelQueuePolicy, policy: QueuePolicy) -> None:
    dst.timeout_action = _TIMEOUT_ACTION[policy.timeout_action]
    dst.default_timeout_microseconds = policy.default_timeout_microseconds
    dst.allow_timeout_override = policy.allow_timeout_override
    dst.max_queue_size = policy.max_queue_size


def _tensors(spec: TritonModelSpec, cfg: pb.ModelConfig) -> None:
    for t in spec.inputs or ():
        i = cfg.input.add(name=t.name, data_type=_DTYPE[t.data_type], dims=t.dims)
        if t.optional:
            i.optional = True
        if t.allow_ragged_batch:
            i.allow_ragged_batch = True
        if t.reshape is not None:
            i.reshape.shape.extend(t.reshape)
        if t.format is not None:
            i.format = pb.ModelInput.Format.Value(t.format)
    for t in spec.outputs or ():
        o = cfg.output.add(name=t.name, data_type=_DTYPE[t.data_type], dims=t.dims)
        if t.reshape is not None:
            o.reshape.shape.extend(t.reshape)
        if t.label_filename is not None:
            o.label_filename = t.label_filename


def _dynamic_batching(spec: TritonModelSpec, cfg: pb.ModelConfig) -> None:
    b = spec.batcher
    assert b is not None
    db = cfg.dynamic_batching  # touching it selects the oneof, even with every field at its default
    db.SetInParent()
    db.preferred_batch_size.extend(b.preferred_batch_size or ())
    db.max_queue_delay_microseconds = b.max_queue_delay_microseconds
    db.preserve_ordering = b.preserve_ordering
    db.priority_levels = b.priority_levels
    db.default_priority_level = b.default_priority_level
    if b.default_queue_policy is not None:
        _queue_policy(db.default_queue_policy, b.default_queue_policy)
    for level, policy in sorted((b.priority_queue_policy or {}).items(), key=lambda kv: int(kv[0])):
        _queue_policy(db.priority_queue_policy[int(level)], policy)


def _sequence_batching(spec: TritonModelSpec, cfg: pb.ModelConfig) -> None:
    s = spec.sequence_batcher
    assert s is not None
    sb = cfg.sequence_batching
    sb.SetInParent()
    if s.oldest is not None:
        o = sb.oldest
        o.SetInParent()
        o.max_candidate_sequences = s.oldest.max_candidate_sequences
        o.preferred_batch_size.extend(s.oldest.preferred_batch_size or ())
        o.max_queue_delay_microseconds = s.oldest.max_queue_delay_microseconds
        o.preserve_ordering = s.oldest.preserve_ordering
    elif s.direct is not None:
        d = sb.direct
        d.SetInParent()
        d.max_queue_delay_microseconds = s.direct.max_queue_delay_microseconds
        d.minimum_slot_utilization = s.direct.minimum_slot_utilization
    sb.max_sequence_idle_microseconds = s.max_sequence_idle_microseconds
    for c in s.control_inputs or ():
        ci = sb.control_input.add(name=c.name)
        ctl = ci.control.add(kind=_CONTROL[c.kind])
        if c.kind == "CORRID":
            ctl.data_type = _DTYPE[c.data_type]
            continue
        false_true = list(c.false_true) if c.false_true is not None else [0, 1]
        if c.data_type == "FP32":
            ctl.fp32_false_true.extend(float(v) for v in false_true)
        elif c.data_type == "BOOL":
            ctl.bool_false_true.extend(bool(v) for v in false_true)
        else:
            ctl.int32_false_true.extend(int(v) for v in false_true)
    for st in s.state or ():
        state = sb.state.add(
            input_name=st.input_name, output_name=st.output_name, data_type=_DTYPE[st.data_type], dims=st.dims
        )
        if st.zero_initial_state:
            state.initial_state.add(
                name="zero", data_type=_DTYPE[st.data_type], dims=[max(d, 1) for d in st.dims], zero_data=True
            )


def _ensemble(model: TritonModel, steps: Mapping[str, TritonModel], cfg: pb.ModelConfig) -> None:
    es = cfg.ensemble_scheduling
    for step in model.spec.ensemble.steps if model.spec.ensemble else ():
        target = steps.get(step.model)
        s = es.step.add(model_name=target.triton_name if target else step.model, model_version=step.model_version)
        for k, v in step.input_map.items():
            s.input_map[k] = v
        for k, v in step.output_map.items():
            s.output_map[k] = v


def _version_policy(spec: TritonModelSpec, cfg: pb.ModelConfig) -> None:
    """`version_policy`, only when the spec sets one (Triton's default, latest 1, otherwise)."""
    policy = spec.version_policy
    if policy is None:
        return
    vp = cfg.version_policy
    if policy.latest is not None:
        vp.latest.num_versions = policy.latest
    elif policy.all is not None:
        vp.all.SetInParent()
    else:
        vp.specific.versions.extend(policy.specific or ())


def _warmup(spec: TritonModelSpec, cfg: pb.ModelConfig) -> None:
    for w in spec.model_warmup or ():
        mw = cfg.model_warmup.add(name=w.name, batch_size=w.batch_size, count=w.count)
        for name, inp in w.inputs.items():
            wi = mw.inputs[name]
            wi.data_type = _DTYPE[inp.data_type]
            wi.dims.extend(inp.dims)
            if inp.input_data_file is not None:
                wi.input_data_file = inp.input_data_file
            elif inp.random_data:
                wi.random_data = True
            else:
                wi.zero_data = True


def strategy_library_path(model: TritonModel, repository_root: str = REPOSITORY_ROOT) -> str | None:
    """TRITON_BATCH_STRATEGY_PATH for the model's custom batching strategy, or None without one.

    Triton opens the path as given (relative paths would depend on tritonserver's working directory), so a file of
    the model's source is named by its absolute path in the repository the server loads: `repository_root` is
    where that repository is (REPOSITORY_ROOT in replicas)."""
    b = model.spec.batcher
    lib = b.strategy_library if b is not None else None
    if lib is None:
        return None
    if lib.path is not None:
        return lib.path
    assert lib.file is not None
    return f"{repository_root.rstrip('/')}/{model.triton_name}/{VERSION_DIR}/{lib.file}"


def render_model_config(
    model: TritonModel,
    steps: Mapping[str, TritonModel] | None = None,
    *,
    cpu_only: bool = False,
    repository_root: str = REPOSITORY_ROOT,
) -> pb.ModelConfig:
    """The ModelConfig for `model`, without the digest parameter.

    `steps` maps TritonModel names (metadata.name) to the models an ensemble uses.
    `cpu_only` maps GPU instance groups to CPU ones, for checking GPU configs on a laptop.
    `repository_root` is where the server finds the repository (see `strategy_library_path`).
    """
    spec = model.spec
    cfg = pb.ModelConfig(name=model.triton_name)
    if spec.platform:
        cfg.platform = spec.platform
    if spec.backend:
        cfg.backend = spec.backend
    _version_policy(spec, cfg)
    cfg.max_batch_size = spec.effective_max_batch_size  # printed explicitly below even when 0
    _tensors(spec, cfg)
    if spec.is_ensemble:
        _ensemble(model, steps or {}, cfg)
    elif spec.sequence_batcher is not None:
        _sequence_batching(spec, cfg)
    elif spec.batcher is not None:
        _dynamic_batching(spec, cfg)
    for g in spec.instance_groups or ():
        kind = "CPU" if cpu_only and g.kind == "GPU" else g.kind
        ig = cfg.instance_group.add(count=g.count, kind=_KIND[kind])
        if kind == "GPU" and g.gpus:
            ig.gpus.extend(g.gpus)
    for k, v in sorted((spec.parameters or {}).items()):
        cfg.parameters[k].string_value = v
    threshold = spec.warmup_gate.failed_request_threshold
    if spec.pool is not None and threshold != POOL_FAILED_REQUEST_THRESHOLD:
        cfg.parameters[THRESHOLD_PARAMETER].string_value = str(threshold)  # the pool's probe reads it from here
    strategy = strategy_library_path(model, repository_root)
    if strategy is not None and cfg.HasField("dynamic_batching"):
        cfg.parameters[BATCH_STRATEGY_PARAMETER].string_value = strategy
    _warmup(spec, cfg)
    if spec.decoupled:
        cfg.model_transaction_policy.decoupled = True
    if spec.response_cache:
        cfg.response_cache.enable = True
    return cfg


def config_text(cfg: pb.ModelConfig) -> str:
    """config.pbtxt text. `max_batch_size: 0` is written explicitly: proto3 hides zero scalars."""
    text: str = text_format.MessageToString(cfg, as_utf8=True)
    if cfg.max_batch_size == 0:
        lines = text.splitlines(keepends=True)
        at = next((i for i, ln in enumerate(lines) if not ln.startswith(("name:", "platform:", "backend:"))), len(lines))
        lines.insert(at, "max_batch_size: 0\n")
        text = "".join(lines)
    return text


@dataclass(frozen=True)
class RenderedModel:
    """One model's directory in a Triton model repository."""

    model: TritonModel
    config: pb.ModelConfig  # with the digest parameter
    files: dict[str, bytes]  # path relative to the repository root -> content
    digest: str

    @property
    def name(self) -> str:
        return self.model.triton_name

    @property
    def config_pbtxt(self) -> str:
        return self.files[f"{self.name}/config.pbtxt"].decode()


#: Placeholder that makes an ensemble's (otherwise empty) version directory exist.
ENSEMBLE_VERSION_PLACEHOLDER = ".keep"


def _model_files(model: TritonModel) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    if model.spec.is_ensemble:
        # Triton loads only versions that have a directory: an ensemble with no `1/` fails with
        # "at least one version must be available under the version policy". The repository is
        # a set of files, so an empty directory needs a (ignored) file in it.
        files[f"{model.triton_name}/{VERSION_DIR}/{ENSEMBLE_VERSION_PLACEHOLDER}"] = b""
    mf = model.spec.model_files
    for fname, text in sorted((mf.inline or {}).items() if mf is not None else ()):
        files[f"{model.triton_name}/{fname}"] = text.encode()
    # spec.source is version 1; spec.versions gives each version's directory. Warm-up files are the model's:
    # every version reads <model>/warmup/ (the validator refuses two versions giving one name different data).
    for version, src in model.spec.version_sources.items():
        for fname, text in sorted((src.inline or {}).items()):
            files[f"{model.triton_name}/{version}/{fname}"] = text.encode()
        for fname, b64 in sorted((src.warmup_files or {}).items()):
            files.setdefault(f"{model.triton_name}/warmup/{fname}", base64.b64decode(b64))
    return files


def digest_of(config: pb.ModelConfig, files: Mapping[str, bytes], extra: tuple[str, ...] = ()) -> str:
    h = hashlib.sha256()
    h.update(config_text(config).encode())
    for path in sorted(files):
        h.update(b"\0" + path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    for e in extra:
        h.update(b"\0" + e.encode())
    return h.hexdigest()[:16]


def source_identity(model: TritonModel) -> tuple[str, ...]:
    """What names a fetched model's files, for the digest: its uri and pins (inline files are hashed themselves),
    for spec.source and for each fetched version of spec.versions."""
    spec = model.spec
    sources = [("source", spec.source)] + [(f"versions[{v.version}].source", v.source) for v in spec.versions or ()]
    out = []
    mf = spec.model_files
    if mf is not None and mf.uri is not None:  # (only then: specs without it keep their digests)
        out.append(f"modelFiles.uri={mf.uri}")
        if mf.sha256 is not None:
            out.append(f"modelFiles.sha256={mf.sha256}")
        if mf.object_version is not None:
            out.append(f"modelFiles.objectVersion={mf.object_version}")
    for base, src in sources:
        if src is None or src.uri is None:
            continue
        out.append(f"{base}.uri={src.uri}")
        if src.sha256 is not None:
            out.append(f"{base}.sha256={src.sha256}")
        if src.object_version is not None:
            out.append(f"{base}.objectVersion={src.object_version}")
    return tuple(out)


def render_model(
    model: TritonModel,
    steps: Mapping[str, RenderedModel] | None = None,
    *,
    cpu_only: bool = False,
    repository_root: str = REPOSITORY_ROOT,
) -> RenderedModel:
    """Render one model; an ensemble needs its steps rendered first (their digests roll it)."""
    steps = steps or {}
    cfg = render_model_config(
        model, {k: v.model for k, v in steps.items()}, cpu_only=cpu_only, repository_root=repository_root
    )
    files = _model_files(model)
    step_digests = tuple(f"{k}={steps[k].digest}" for k in sorted(steps))
    digest = digest_of(cfg, files, (*source_identity(model), *step_digests))
    cfg.parameters[DIGEST_PARAMETER].string_value = digest
    files[f"{model.triton_name}/config.pbtxt"] = config_text(cfg).encode()
    return RenderedModel(model=model, config=cfg, files=dict(sorted(files.items())), digest=digest)


def render_repository(
    models: list[TritonModel], *, cpu_only: bool = False, repository_root: str = REPOSITORY_ROOT
) -> dict[str, RenderedModel]:
    """Render a set of models (validated first) into repository entries, by TritonModel name.

    Steps are rendered before the ensembles that use them; an ensemble's entry
    `files` holds only its own directory (see `repository_for` for the closure).
    `repository_root` is where the server will find the repository: replicas mount it at REPOSITORY_ROOT; a
    local tritonserver loading it elsewhere needs that place (it names a custom batching strategy's file).
    """
    by_name = {m.name: m for m in models}
    out: dict[str, RenderedModel] = {}
    for name in step_graph.order(list(by_name), step_graph.of_models(by_name)):
        m = by_name[name]
        used = {s.model: out[s.model] for s in m.spec.ensemble.steps if s.model in out} if m.spec.ensemble else {}
        out[name] = render_model(m, used, cpu_only=cpu_only, repository_root=repository_root)
    return out


def step_closure(name: str, rendered: Mapping[str, RenderedModel]) -> list[str]:
    """`name` and every model it reaches through ensemble steps, each once, sorted."""
    reached, _ = step_graph.closure(name, step_graph.of_models({n: r.model for n, r in rendered.items()}))
    return reached


@dataclass(frozen=True)
class Repository:
    """The repository one replica of a model loads: the model and every model its ensemble steps reach, and their
    files. Computed once per render (`of`) and handed to the renderers of the model's children."""

    own: RenderedModel  # the model the replica serves
    models: tuple[RenderedModel, ...]  # `own` and its steps, recursively, each once, sorted by TritonModel name
    files: Mapping[str, bytes]  # every file of `models`, by repository path, sorted

    @classmethod
    def of(cls, name: str, rendered: Mapping[str, RenderedModel]) -> Repository:
        """The repository that serves the TritonModel `name`, from a render that holds it and its steps."""
        models = tuple(rendered[n] for n in step_closure(name, rendered))
        files: dict[str, bytes] = {}
        for m in models:
            files.update(m.files)
        return cls(own=rendered[name], models=models, files=dict(sorted(files.items())))

    @property
    def steps(self) -> tuple[RenderedModel, ...]:
        """The models the replica loads for `own`'s ensemble steps (none for a model that is no ensemble)."""
        return tuple(m for m in self.models if m.model.name != self.own.model.name)


def repository_for(name: str, rendered: Mapping[str, RenderedModel]) -> dict[str, bytes]:
    """All files of the repository that serves `name`: the model plus its steps, recursively."""
    return dict(Repository.of(name, rendered).files)


def pbtxt_digest(pbtxt: str | None) -> str | None:
    """The digest a rendered config.pbtxt carries (`config_digest`), or None: no text, or text that is not a model
    config."""
    if not pbtxt:
        return None
    try:
        return config_digest(text_format.Parse(pbtxt, pb.ModelConfig()))
    except text_format.ParseError:
        return None


def config_json(pbtxt: str) -> str:
    """A rendered config.pbtxt as the JSON Triton's repository API takes with a load (`config`, the model config
    in protobuf's JSON mapping, field names as in model_config.proto)."""
    cfg = text_format.Parse(pbtxt, pb.ModelConfig())
    return str(json_format.MessageToJson(cfg, preserving_proto_field_name=True, indent=None))
