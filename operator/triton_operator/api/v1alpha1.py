"""The TritonModel API, version v1alpha1: the single source of the CRD.

Field names are PyTriton's ModelConfig names in camelCase; the `description`
of each field is what `kubectl explain` shows. Rules that involve one object
and that CEL can express live here as `x-kubernetes-validations`, so the API
server refuses them at `kubectl apply`; `triton_operator.validate` checks the
same rules (and the ones CEL cannot express) locally with field paths.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from .. import DEFAULT_TRITON_IMAGE, LEGACY_TRITON_IMAGE, MINIMUM_TRITON_RELEASE
from . import GROUP as GROUP  # noqa: PLC0414 (re-exported: named by the package, `api.GROUP`, read from here too)
from .pod import REPOSITORY_KEY_ENV

VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TritonModel"
PLURAL = "tritonmodels"
SINGULAR = "tritonmodel"
SHORT_NAMES = ["tm", "tmodel"]

MAX_LIST = 64
MAX_TENSORS = 128
MAX_NAME = 253

# A Triton model, tensor or file name: no path separators, no "." or "..".
ModelNameStr = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
]
TensorNameStr = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")]
FileNameStr = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")]
K8sNameStr = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_NAME, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
]
#: What a TritonModel's name must be: it names the model's Service, a DNS-1035 label (a lowercase letter first,
#: lowercase letters, digits and `-`, at most 63), and it is the value of the labels its pods are selected by (at
#: most 63). The CRD checks metadata.name against it at `kubectl apply` (`api.crd`).
MODEL_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_MODEL_NAME = 63
MODEL_NAME_RULE = (
    "must be a DNS-1035 label: a lowercase letter first, then lowercase letters, digits and '-', ending in a letter "
    "or digit, at most 63 characters (it names the model's Service and labels its pods)"
)
ModelObjectNameStr = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_MODEL_NAME, pattern=MODEL_NAME_PATTERN)
]
QuantityStr = Annotated[str, StringConstraints(max_length=64, pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")]
#: A container resource quantity as Kubernetes writes one: `500m` CPU, `2`, `8Gi`, `1.5G`.
ResourceQuantityStr = Annotated[str, StringConstraints(
    max_length=64, pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")]
#: A file's text in a ConfigMap-carried repository (the whole repository must fit in 1 MiB).
FileTextStr = Annotated[str, StringConstraints(max_length=1 << 20)]
#: Where files are fetched from at pod start (spec.source.uri, spec.modelFiles.uri).
FetchUriStr = Annotated[str, StringConstraints(max_length=2048, pattern=r"^(https://|pvc://|s3://|gs://)\S+$")]
Sha256Str = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
ObjectVersionStr = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^\S+$")]
#: The CEL rule of a files block that is inline or fetched (spec.source, spec.modelFiles).
INLINE_OR_URI = ConfigDict(
    json_schema_extra={
        "x-kubernetes-validations": [
            {"rule": "has(self.inline) != has(self.uri)", "message": "exactly one of inline or uri must be set"},
            {
                "rule": "!has(self.uri) || !self.uri.matches('^[A-Za-z0-9+.-]+://[^/?#]*@')",
                "message": "uri carries credentials (user:password@), which would be printed wherever the uri is: "
                           "give them through credentialsSecret or spec.server.env",
                "fieldPath": ".uri",
            },
        ]
    }
)
#: The bounds of the protobuf integer types in Triton's model_config.proto, for the fields rendered into them
#: (tests/test_bounds.py checks every integer field against the proto field it becomes). A 64-bit field is bounded
#: by JSON_INT_MAX, the largest integer a float64 holds exactly: the API server keeps a schema's minimum and maximum
#: as float64, so int64's own top (2**63 - 1) became 2**63 there, which its check of defaults against the maximum
#: turned into int64's minimum and refused the CRD. 2**53 microseconds is 285 years.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
UINT32_MAX = 2**32 - 1
JSON_INT_MIN, JSON_INT_MAX = -(2**53 - 1), 2**53 - 1
Dim = Annotated[int, Field(ge=-1, le=INT32_MAX)]
#: Said of each fetched uri: what it may not hold, and how it is printed.
_URI_CREDENTIALS = (
    " No `user:password@` (refused: credentials come from credentialsSecret, spec.server.env or the "
    "ServiceAccount). A query, such as a presigned URL's signature, is fine: logs, the status and the CLI print "
    "it as `?<redacted>`."
)

_UNITS: dict[str, Decimal | int] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
          "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def quantity_value(q: str) -> Decimal:
    """The exact value of a Kubernetes quantity as this API's patterns take them: `64Mi`, `1.5G`, `500m`, `1048576`."""
    for suffix, mult in _UNITS.items():
        if q.endswith(suffix):
            return Decimal(q[: -len(suffix)]) * mult
    return Decimal(q)


def quantity_bytes(q: str) -> int:
    """Bytes in a Kubernetes quantity such as `64Mi`, `1G` or `1048576` (a fraction of a byte rounds down)."""
    return int(quantity_value(q))


#: A model parameter's key and value, as Triton's ModelParameter takes them.
ParameterKey = Annotated[str, StringConstraints(min_length=1, max_length=256)]
ParameterValue = Annotated[str, StringConstraints(max_length=4096)]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        frozen=True,
    )


class DataType(str, Enum):
    """Tensor data types by their wire names (what tritonclient calls them)."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BF16 = "BF16"
    BYTES = "BYTES"


# ---------------------------------------------------------------- source


class Source(_Model):
    """Where the model's files come from: exactly one of `inline` or `uri`."""

    model_config = INLINE_OR_URI

    inline: dict[FileNameStr, FileTextStr] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description=(
            "Files placed in the model's version directory, by file name, e.g. `model.py` for the Python "
            "backend. Text only; the whole repository must fit in a ConfigMap (1 MiB)."
        ),
    )
    uri: FetchUriStr | None = (
        Field(
            default=None,
            description=(
                "Where the version directory's files are fetched from at pod start: `https://…` (a file, "
                "or a .tar.gz/.zip archive), `pvc://<claim>/<path>`, `s3://<bucket>/<prefix>` or "
                "`gs://<bucket>/<prefix>` (or one object there, with objectVersion). A change to uri, sha256 or "
                "objectVersion rolls the replicas; new files behind an unchanged uri are not noticed until a "
                "replica restarts, so pin them with sha256 or objectVersion." + _URI_CREDENTIALS
            ),
        )
    )
    sha256: Sha256Str | None = Field(
        default=None,
        description=(
            "For an `https://` uri: the SHA-256 of the file or archive it names, as 64 lowercase hex digits. "
            "Each replica's fetch step checks the download against it before unpacking and fails on a mismatch, "
            "so different content behind the same URL never loads; changing it rolls the replicas."
        ),
    )
    object_version: ObjectVersionStr | None = Field(
        default=None,
        description=(
            "For an `s3://` or `gs://` uri naming one object (a file, or a .tar.gz/.tgz/.zip archive; not a prefix "
            "ending in `/`): the version to fetch, an S3 VersionId or a GCS generation number. Needs versioning "
            "on the bucket. Every replica fetches exactly that version; changing it rolls the replicas."
        ),
    )
    credentials_secret: K8sNameStr | None = Field(
        default=None,
        description=(
            "Name of a Secret in the same namespace holding credentials for `s3://` (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, optional AWS_ENDPOINT_URL) or `gs://` (`key.json`). Referenced, never copied."
        ),
    )
    warmup_files: dict[FileNameStr, FileTextStr] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description=(
            "Binary warm-up data by file name, base64-encoded; placed in `<model>/warmup/`, where Triton reads "
            "`modelWarmup[].inputs[].inputDataFile`. Also for a `uri` model: its fetched files go to the version "
            "directory, never to `warmup/`, so every inputDataFile must be here."
        ),
    )


# ---------------------------------------------------------------- model-level files


class ModelFiles(_Model):
    """Files of the model directory itself, beside `config.pbtxt` and the version directories (e.g. the labels
    an output's labelFilename names): exactly one of `inline` or `uri`."""

    model_config = INLINE_OR_URI

    inline: dict[FileNameStr, FileTextStr] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description=(
            "Text files placed in `<model>/` beside config.pbtxt, by file name (e.g. `labels.txt`). Not "
            "`config.pbtxt` (rendered), `warmup`, or a number (a version directory's name)."
        ),
    )
    uri: FetchUriStr | None = (
        Field(
            default=None,
            description=(
                "Where the model directory's own files are fetched from at pod start, like source.uri (a file, an "
                "archive or a prefix), but placed in `<model>/`. The fetch step refuses a tree holding "
                "config.pbtxt, `warmup` or a version directory (a number): those are the operator's." + _URI_CREDENTIALS
            ),
        )
    )
    sha256: Sha256Str | None = Field(
        default=None, description="For an `https://` uri: the SHA-256 of what it names, as for source.sha256."
    )
    object_version: ObjectVersionStr | None = Field(
        default=None,
        description="For an `s3://` or `gs://` uri naming one object: its version, as for source.objectVersion.",
    )
    credentials_secret: K8sNameStr | None = Field(
        default=None, description="Secret with credentials for `s3://` or `gs://`, as for source.credentialsSecret."
    )


# ---------------------------------------------------------------- versions


class ModelVersion(_Model):
    """One version of the model: a version directory `<model>/<version>/` with its own files."""

    version: int = Field(
        ge=1,
        le=INT32_MAX,
        description="The version number: the name of its directory in the model repository, and what clients and "
        "ensemble steps ask for.",
    )
    source: Source = Field(
        description=(
            "The version's files, placed in `<model>/<version>/`: inline, or fetched from its own `uri` at pod start "
            "(pinned with sha256 or objectVersion like spec.source). Its `warmupFiles` go to the model's one "
            "`warmup/` directory, which every version reads, so a file name used by two versions must hold the same "
            "data in both."
        )
    )


class VersionPolicyAll(_Model):
    """Serve every version (Triton's `version_policy { all {} }`); takes no fields."""


class VersionPolicy(_Model):
    """Which versions Triton serves (Triton's `version_policy`): exactly one of latest, all or specific."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.latest), has(self.all), has(self.specific)].filter(x, x).size() == 1",
                    "message": "set exactly one of latest, all or specific",
                }
            ]
        }
    )

    latest: int | None = Field(
        default=None,
        ge=1,
        le=INT32_MAX,
        description="Serve the N highest versions (Triton's default is latest 1, the highest version only).",
    )
    all: VersionPolicyAll | None = Field(default=None, description="Serve every version: `all: {}`.")
    specific: list[Annotated[int, Field(ge=1, le=INT32_MAX)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_LIST,
        description="Serve exactly these versions; each must be one of the model's versions.",
    )


# ---------------------------------------------------------------- tensors


class Tensor(_Model):
    """One model input or output."""

    name: TensorNameStr = Field(description="Tensor name, as the model and clients use it.")
    data_type: DataType = Field(description="Element type, by wire name (FP32, INT64, BYTES, …).")
    dims: list[Dim] = Field(
        max_length=16,
        description=(
            "Shape without the batch dimension when the model batches; -1 marks a variable-size dimension."
        ),
    )
    optional: bool = Field(default=False, description="Inputs only: requests may omit this input.")
    allow_ragged_batch: bool = Field(
        default=False, description="Inputs only: requests in one batch may have different shapes."
    )
    reshape: list[Dim] | None = Field(
        default=None,
        max_length=16,
        description="Shape the backend sees instead of `dims`; must hold the same number of elements.",
    )
    format: Literal["FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"] | None = Field(
        default=None,
        description=(
            "Inputs only: the image layout, FORMAT_NHWC or FORMAT_NCHW (FORMAT_NONE: none given). Triton requires "
            "exactly 3 dims with NHWC or NCHW."
        ),
    )
    label_filename: FileNameStr | None = Field(
        default=None,
        description=(
            "Outputs only: a file of the model directory (spec.modelFiles), one label per line, that Triton's "
            "classification extension reports with each class (`value:index:label`)."
        ),
    )


# ---------------------------------------------------------------- batching


class QueuePolicy(_Model):
    """How long requests may wait in the batcher's queue, and what happens when they time out."""

    timeout_action: Literal["REJECT", "DELAY"] = Field(
        default="REJECT", description="On timeout, REJECT the request or DELAY it behind others."
    )
    default_timeout_microseconds: int = Field(
        default=0, ge=0, le=JSON_INT_MAX, description="Queue timeout per request; 0 means no timeout."
    )
    allow_timeout_override: bool = Field(default=False, description="Requests may set a shorter timeout.")
    max_queue_size: int = Field(default=0, ge=0, le=UINT32_MAX, description="Queue capacity; 0 means unbounded.")


#: The `parameters` key through which Triton finds a model's custom batching strategy library.
BATCH_STRATEGY_PARAMETER = "TRITON_BATCH_STRATEGY_PATH"


class StrategyLibrary(_Model):
    """A custom batching strategy: a shared library with Triton's five `TRITONBACKEND_ModelBatch*` functions.

    Exactly one of `file` (a file of the model's source) or `path` (an absolute path in the server image)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "has(self.file) != has(self.path)", "message": "set exactly one of file or path"}
            ]
        }
    )

    file: Annotated[
        str, StringConstraints(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")
    ] | None = Field(
        default=None,
        description=(
            "The library as a file of `source` (version 1's directory), relative to it (e.g. `strategy.so`, or "
            "`lib/strategy.so` inside a fetched archive). Inline files are text, so a compiled library comes from "
            "`source.uri`; an inline source must hold the named file (a text file is refused: it cannot be a "
            "shared library), and a model with `versions` (inline only) uses path instead. Rendered as the "
            "parameter TRITON_BATCH_STRATEGY_PATH: `/models/<model>/1/<file>`, where replicas mount the model "
            "repository."
        ),
    )
    path: Annotated[str, StringConstraints(min_length=2, max_length=1024, pattern=r"^/\S+$")] | None = Field(
        default=None,
        description=(
            "The library as an absolute path in the tritonserver image (server.image), e.g. one baked into a "
            "custom image. Rendered as the parameter TRITON_BATCH_STRATEGY_PATH as given; Triton fails the load "
            "(\"Batching library path not found\") when the replica has no file there."
        ),
    )


class DynamicBatcher(_Model):
    """Triton's dynamic batcher: combines requests into server-side batches."""

    max_queue_delay_microseconds: int = Field(
        default=0, ge=0, le=JSON_INT_MAX, description="How long to wait for a preferred batch size before executing."
    )
    preferred_batch_size: list[Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="Batch sizes to aim for; each must be > 0 and <= maxBatchSize.",
    )
    preserve_ordering: bool = Field(default=False, description="Return responses in request order.")
    priority_levels: int = Field(default=0, ge=0, le=INT32_MAX, description="Number of priority levels; 0 disables priorities.")
    default_priority_level: int = Field(
        default=0, ge=0, le=INT32_MAX, description="Priority of requests that set none; in [1, priorityLevels]."
    )
    default_queue_policy: QueuePolicy | None = Field(default=None, description="Queue policy of every level by default.")
    priority_queue_policy: dict[Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")], QueuePolicy] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="Queue policy per priority level (keys are levels in [1, priorityLevels]).",
    )
    strategy_library: StrategyLibrary | None = Field(
        default=None,
        description=(
            "A custom batching strategy (Triton's custom batching): a shared library whose five "
            "`TRITONBACKEND_ModelBatch*` functions decide whether each request joins the batch being formed, on "
            "top of maxBatchSize and preferredBatchSize (e.g. cap a batch by its requests or bytes). Needs a "
            "batching model (maxBatchSize >= 1); the library must be built against Triton's tritonbackend.h "
            "for the server image's Triton."
        ),
    )


class ControlKind(str, Enum):
    START = "START"
    END = "END"
    READY = "READY"
    CORRID = "CORRID"


class SequenceControlInput(_Model):
    """A control tensor the sequence batcher feeds the model."""

    name: TensorNameStr = Field(description="Input tensor name the model reads the control from.")
    kind: ControlKind = Field(description="START, END, READY, or CORRID (the correlation ID).")
    data_type: DataType = Field(
        default=DataType.INT32,
        description=(
            "Type of the control tensor: INT32, FP32 or BOOL for START/END/READY; UINT64, INT64, UINT32, "
            "INT32 or BYTES for CORRID."
        ),
    )
    false_true: list[Annotated[float, Field(ge=INT32_MIN, le=INT32_MAX, allow_inf_nan=False)]] | None = Field(
        default=None,
        max_length=8,
        description=(
            "START/END/READY: the [false, true] values; exactly two entries, whole numbers for INT32 (Triton's "
            "int32_false_true). Defaults to [0, 1]."
        ),
    )


class SequenceState(_Model):
    """An implicit state tensor carried between requests of one sequence."""

    input_name: TensorNameStr = Field(description="Input name the model reads the state from.")
    output_name: TensorNameStr = Field(description="Output name the model writes the next state to.")
    data_type: DataType = Field(description="Element type of the state.")
    dims: list[Dim] = Field(max_length=16, description="Shape of the state.")
    zero_initial_state: bool = Field(default=False, description="Start each sequence with a zero-filled state.")


class SequenceDirect(_Model):
    """Direct strategy: each sequence gets a batch slot for its whole life."""

    max_queue_delay_microseconds: int = Field(default=0, ge=0, le=JSON_INT_MAX, description="Wait for more slots to fill.")
    minimum_slot_utilization: float = Field(
        default=0.0, description="Fraction of slots that must be ready before a batch runs; in [0, 1]."
    )


class SequenceOldest(_Model):
    """Oldest strategy: the oldest sequences' requests are batched dynamically."""

    max_candidate_sequences: int = Field(
        default=1, ge=1, le=INT32_MAX, description="Sequences considered for each batch.")
    preferred_batch_size: list[Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]] | None = Field(
        default=None, max_length=MAX_LIST, description="Batch sizes to aim for; each > 0 and <= maxBatchSize."
    )
    max_queue_delay_microseconds: int = Field(
        default=0, ge=0, le=JSON_INT_MAX, description="Wait for a preferred batch size.")
    preserve_ordering: bool = Field(default=False, description="Return responses in request order.")


class SequenceBatcher(_Model):
    """Triton's sequence batcher, for stateful models: every request of one correlation ID goes to one instance."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "!(has(self.direct) && has(self.oldest))", "message": "set at most one of direct or oldest"}
            ]
        }
    )

    direct: SequenceDirect | None = Field(default=None, description="The direct strategy (the default).")
    oldest: SequenceOldest | None = Field(default=None, description="The oldest-first strategy.")
    max_sequence_idle_microseconds: int = Field(
        default=1_000_000, ge=1, le=JSON_INT_MAX, description="A sequence idle this long is ended and its slot freed."
    )
    control_inputs: list[SequenceControlInput] | None = Field(
        default=None, max_length=8, description="Control tensors: START, END, READY, CORRID."
    )
    state: list[SequenceState] | None = Field(default=None, max_length=16, description="Implicit state tensors.")


# ---------------------------------------------------------------- behaviour


class WarmupInput(_Model):
    """Data for one input of a warm-up sample: exactly one of zeroData, randomData, inputDataFile."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.zeroData) && self.zeroData, has(self.randomData) && self.randomData, "
                    "has(self.inputDataFile)].filter(x, x).size() == 1",
                    "message": "set exactly one of zeroData: true, randomData: true or inputDataFile",
                }
            ]
        }
    )

    data_type: DataType = Field(description="Must match the model input's dataType.")
    dims: list[Dim] = Field(
        max_length=16, description="Concrete shape of the sample (no -1), without the batch dimension."
    )
    zero_data: bool | None = Field(default=None, description="Fill with zeros (empty strings for BYTES).")
    random_data: bool | None = Field(default=None, description="Fill with random data.")
    input_data_file: FileNameStr | None = Field(
        default=None,
        description=(
            "Read from `<model>/warmup/<file>`: the file must be in `source.warmupFiles`, also when the model's "
            "files come from `source.uri` (a file elsewhere is refused)."
        ),
    )


class Warmup(_Model):
    """One warm-up sample Triton runs on every instance before the model turns READY."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)] = Field(description="Sample name.")
    batch_size: int = Field(
        default=1, ge=1, le=UINT32_MAX, description="Batch size of the sample; <= maxBatchSize, 1 when not batching.")
    count: int = Field(default=1, ge=1, le=1000, description="How many times the sample runs.")
    inputs: dict[TensorNameStr, WarmupInput] = Field(
        max_length=MAX_TENSORS, description="Data for each model input, by input name."
    )


class InstanceGroup(_Model):
    """Model instances: where they run and how many."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.kind == 'GPU' || !has(self.gpus) || size(self.gpus) == 0",
                    "message": "gpus may be set only with kind GPU",
                    "fieldPath": ".gpus",
                }
            ]
        }
    )

    kind: Literal["GPU", "CPU", "AUTO", "MODEL"] = Field(default="GPU", description="GPU, CPU, AUTO or MODEL.")
    count: int = Field(default=1, ge=1, le=1024, description="Instances per device (GPU) or in total (CPU).")
    gpus: list[Annotated[int, Field(ge=0, le=1024)]] | None = Field(
        default=None, max_length=64, description="GPU indices to place instances on (kind GPU only)."
    )


class EnsembleStep(_Model):
    """One step of an ensemble: a TritonModel in the same namespace and how tensors flow through it."""

    model: ModelObjectNameStr = Field(description="Name of a TritonModel in the same namespace.")
    model_version: int = Field(
        default=-1,
        ge=-1,
        le=JSON_INT_MAX,
        description=(
            "Version of the step model to use: -1 (the latest it serves) or one of the versions it serves under its "
            "versionPolicy (a model with only source has version 1 alone). A version that does not exist, or that "
            "the policy does not serve, is refused: Triton would refuse the ensemble."
        ),
    )
    input_map: dict[TensorNameStr, TensorNameStr] = Field(
        max_length=MAX_TENSORS, description="Step model input name -> ensemble tensor name."
    )
    output_map: dict[TensorNameStr, TensorNameStr] = Field(
        max_length=MAX_TENSORS, description="Step model output name -> ensemble tensor name."
    )


class Ensemble(_Model):
    """An ensemble's pipeline (with `platform: ensemble`)."""

    steps: list[EnsembleStep] = Field(min_length=1, max_length=MAX_LIST, description="Steps, in any order.")


# ---------------------------------------------------------------- deployment


class Toleration(_Model):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=JSON_INT_MIN, le=JSON_INT_MAX)


#: A label or annotation key: an optional DNS-subdomain prefix and `/`, then a name (at most 63 characters).
QualifiedNameStr = Annotated[str, StringConstraints(
    min_length=1, max_length=317,
    pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")]
LabelValueStr = Annotated[str, StringConstraints(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")]
#: An environment variable's name, as Kubernetes has long taken them (a C identifier, with `-` and `.` too).
EnvNameStr = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]
#: A ConfigMap or Secret key.
DataKeyStr = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]

#: The pod labels the operator sets on every replica (`render.kubernetes.labels`): podLabels may not set them, nor
#: any key under the API group's prefix (the selector, `serving.triton-operator.dev/model`, is one).
OPERATOR_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by")
#: Pod annotations the operator writes besides those under its API group's prefix.
OPERATOR_ANNOTATIONS = ("kubectl.kubernetes.io/default-container",)
#: Environment variables the operator sets in the tritonserver container (the key's: `api.pod.REPOSITORY_KEY_ENV`).
OPERATOR_ENV = ("HOME", REPOSITORY_KEY_ENV)
#: tritonserver flags the operator sets and server.args may not: they restrict Triton's model repository API to the
#: operator's key (`render.repository_key`). Triton's parser (getopt_long) takes any unambiguous prefix of a long
#: option, so every argument starting with one of these prefixes is refused: `--http-r` names no other flag, nor
#: does `--grpc-re` (`--grpc-root-cert` is `--grpc-ro`).
OPERATOR_ARGS = {"--http-r": "--http-restricted-api", "--grpc-re": "--grpc-restricted-protocol"}
#: Triton's API categories every replica restricts to the operator's key (`render.repository_key`): the repository API
#: (load, unload, index) always; the rest unless `spec.server.unrestrictedApis` opens them by name. None is an API
#: a client needs to infer. `model-config`, `statistics`, `metadata`, `health` and `inference` stay open: clients
#: (perf_analyzer, tritonclient's helpers) read a model's config and statistics, and neither changes the server.
ALWAYS_RESTRICTED_API = "model-repository"
OpenableApi = Literal["shared-memory", "logging", "trace"]
OPENABLE_APIS: tuple[str, ...] = get_args(OpenableApi)
#: What a replica's /dev/shm holds at most when spec.server.shmSize is unset (see Server.shm_size).
SHM_SIZE_DEFAULT = "1Gi"
#: The sizeLimit of a replica's repository volume (the `fetch` step's emptyDir) and of its /tmp.
REPOSITORY_SIZE_DEFAULT = "10Gi"
TMP_SIZE_DEFAULT = "4Gi"


def _reserved_keys_rule(field: str, keys: tuple[str, ...], what: str) -> JsonDict:
    """The CEL rule (on Server) that refuses the operator's own label or annotation keys in `field`."""
    listed = ", ".join(f"'{k}'" for k in keys)
    return {
        "rule": f"!has(self.{field}) || self.{field}.all(k, !k.startsWith('{GROUP}/') && !(k in [{listed}]))",
        "message": f"{field} may not set the operator's own {what}: {', '.join(keys)} or any key under {GROUP}/",
        "fieldPath": f".{field}",
    }


class LocalObjectReference(_Model):
    """A reference to an object in the model's namespace by name."""

    name: K8sNameStr = Field(description="The object's name.")


class KeySelector(_Model):
    """One key of a Secret or ConfigMap in the model's namespace."""

    name: K8sNameStr = Field(description="The Secret's or ConfigMap's name.")
    key: DataKeyStr = Field(description="The key whose value the variable takes.")
    optional: bool | None = Field(default=None, description="Start the container even when the key is missing.")


class ObjectFieldSelector(_Model):
    """A field of the pod, e.g. `metadata.name`, `metadata.namespace`, `status.podIP`, `spec.nodeName`."""

    field_path: Annotated[str, StringConstraints(min_length=1, max_length=256)] = Field(
        description="The field's path in the pod.")
    api_version: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        default=None, description="The schema the path is written in (default v1).")


class ResourceFieldSelector(_Model):
    """A container's resource request or limit, e.g. `limits.memory`."""

    resource: Annotated[str, StringConstraints(min_length=1, max_length=128)] = Field(
        description="limits.cpu, limits.memory, requests.cpu, requests.memory, …")
    container_name: Annotated[str, StringConstraints(max_length=63)] | None = Field(
        default=None, description="Whose resource (default: the container the variable is in).")
    divisor: ResourceQuantityStr | None = Field(default=None, description="The unit the value is given in.")


class EnvVarSource(_Model):
    """Where a variable's value comes from: exactly one of the four."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), has(self.resourceFieldRef)]"
                ".filter(x, x).size() == 1",
        "message": "set exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef"}]})

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(default=None, description="A resource of a container.")


class EnvVar(_Model):
    """An environment variable: a value, or where to read it from (Kubernetes' EnvVar)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!(has(self.value) && has(self.valueFrom))", "message": "set value or valueFrom, not both"}]})

    name: EnvNameStr = Field(description="The variable's name.")
    value: Annotated[str, StringConstraints(max_length=32768)] | None = Field(
        default=None, description="Its value; `$(OTHER)` expands a variable defined before it.")
    value_from: EnvVarSource | None = Field(default=None, description="Where its value comes from.")


class EnvFromReference(_Model):
    """A Secret or ConfigMap whose every key becomes a variable."""

    name: K8sNameStr = Field(description="The Secret's or ConfigMap's name.")
    optional: bool | None = Field(default=None, description="Start the container even when it is missing.")


class EnvFromSource(_Model):
    """Every key of one Secret or ConfigMap as variables (Kubernetes' EnvFromSource)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "has(self.secretRef) != has(self.configMapRef)", "message": "set exactly one of secretRef or configMapRef"}]})

    prefix: EnvNameStr | None = Field(default=None, description="Put before each key to make the variable's name.")
    secret_ref: EnvFromReference | None = Field(default=None, description="A Secret.")
    config_map_ref: EnvFromReference | None = Field(default=None, description="A ConfigMap.")


class TopologySpreadConstraint(_Model):
    """How replicas spread over a topology (Kubernetes' TopologySpreadConstraint)."""

    max_skew: int = Field(ge=1, le=10_000, description="The largest allowed difference in replicas between two domains.")
    topology_key: QualifiedNameStr = Field(
        description="The node label whose values are the domains, e.g. `topology.kubernetes.io/zone`, "
        "`kubernetes.io/hostname`.")
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        description="DoNotSchedule: a replica that would break maxSkew stays Pending; ScheduleAnyway: prefer, not require.")
    label_selector: dict[str, Any] | None = Field(
        default=None,
        description="The pods counted (a Kubernetes LabelSelector). Unset: the model's own replicas "
        "(`matchLabels: {serving.triton-operator.dev/model: <name>}`), which is what spreading replicas means.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    match_label_keys: list[QualifiedNameStr] | None = Field(
        default=None, max_length=16,
        description="Pod label keys whose values, taken from the replica, narrow labelSelector, e.g. "
        "`pod-template-hash` to count only the replicas of one rollout.")
    min_domains: int | None = Field(default=None, ge=1, le=10_000, description="With DoNotSchedule: the fewest domains.")
    node_affinity_policy: Literal["Honor", "Ignore"] | None = Field(
        default=None, description="Whether nodeSelector and affinity limit the domains counted (Kubernetes: Honor).")
    node_taints_policy: Literal["Honor", "Ignore"] | None = Field(
        default=None, description="Whether taints the replica does not tolerate limit the domains (Kubernetes: Ignore).")


class Resources(_Model):
    """Container resources; `nvidia.com/gpu` comes from `server.gpus` (or what the instance groups need)."""

    requests: dict[str, ResourceQuantityStr] | None = Field(
        default=None, description="Requested cpu, memory, … (Kubernetes quantities: `500m`, `2`, `8Gi`).")
    limits: dict[str, ResourceQuantityStr] | None = Field(
        default=None, description="Limits on cpu, memory, … (Kubernetes quantities).")


#: Said of each pod field: it is part of the pod template, which Triton cannot load into a running server.
_NEW_PODS = " A change rolls new pods, under rollout.strategy InPlace too."

#: The schema key (`json_schema_extra`) of a field whose default the operator applies and the CRD does not
#: (`api.crd` drops the field's `default` there and says it in the description): every field with a default added
#: after 0.1.0. The API server fills a CRD's defaults into every object it returns, so a default of a field the previous
#: release lacks is in every model it reads after a `helm rollback` to it; 0.1.0's operator refuses a field it does not
#: know, and every model went `InvalidSpec` (seen in e2e/test_upgrade.py). Unset, the field reads as before.
OPERATOR_DEFAULT = "x-triton-operator-default"
_OPERATOR_DEFAULT: JsonDict = {OPERATOR_DEFAULT: True}


class FetchLimits(_Model):
    """What the `fetch` init step may cost a node: it stops, and the replica reports Degraded with reason
    SourceFetchFailed naming the field, at the first of these it reaches."""

    max_bytes: QuantityStr | None = Field(
        default=None,
        description=(
            "The most fetch writes into the repository volume in one run: each download as it streams to disk "
            "(an archive while it is there), everything an archive unpacks to, the rendered files, counting a 4 KiB "
            "block per file and directory, as the volume's usage is measured. A source past it (an archive that "
            "unpacks to more than it says, a bucket prefix that grew) fails in one line, before the kubelet would "
            "evict the pod for its volume. Unset: repositorySizeLimit; at most repositorySizeLimit." + _NEW_PODS
        ),
    )
    max_files: int = Field(
        default=100_000,
        json_schema_extra=_OPERATOR_DEFAULT,
        ge=1,
        le=10_000_000,
        description=(
            "The most files and directories fetch creates in one run (archive members, objects under a prefix, "
            "files of a claim): many small files fill a node's inodes long before its bytes." + _NEW_PODS
        ),
    )
    timeout_seconds: int = Field(
        default=3600,
        json_schema_extra=_OPERATOR_DEFAULT,
        ge=10,
        le=86400,
        description=(
            "The deadline of a whole fetch run, besides the 60 s each read may wait: a source that keeps sending a "
            "byte now and then cannot hold the replica in its init step. The kubelet retries a failed run with "
            "back-off." + _NEW_PODS
        ),
    )


class Server(_Model):
    """The tritonserver container of each replica, and the pod around it."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {
            "rule": "!has(self.shmSize) || !isQuantity(self.shmSize) || "
                    "quantity(self.shmSize).compareTo(quantity('1Mi')) >= 0",
            "message": "shmSize must be at least 1Mi (each Python backend model instance starts with a 1 MiB region)",
            "fieldPath": ".shmSize",
        },
        {
            "rule": "!has(self.shmSize) || !has(self.resources) || !has(self.resources.limits) || "
                    "!('memory' in self.resources.limits) || !isQuantity(self.shmSize) || "
                    "!isQuantity(self.resources.limits['memory']) || "
                    "quantity(self.shmSize).compareTo(quantity(self.resources.limits['memory'])) <= 0",
            "message": "shmSize may not exceed resources.limits.memory: what /dev/shm holds counts against the "
                       "container's memory",
            "fieldPath": ".shmSize",
        },
        _reserved_keys_rule("podLabels", OPERATOR_LABELS, "labels"),
        _reserved_keys_rule("podAnnotations", OPERATOR_ANNOTATIONS, "annotations"),
        {
            "rule": "!has(self.repositorySizeLimit) || !isQuantity(self.repositorySizeLimit) || "
                    "quantity(self.repositorySizeLimit).compareTo(quantity('1Mi')) >= 0",
            "message": "repositorySizeLimit must be at least 1Mi (the rendered files alone may take 1 MiB)",
            "fieldPath": ".repositorySizeLimit",
        },
        {
            "rule": "!has(self.fetch) || !has(self.fetch.maxBytes) || !isQuantity(self.fetch.maxBytes) || "
                    "!has(self.repositorySizeLimit) || !isQuantity(self.repositorySizeLimit) || "
                    "quantity(self.fetch.maxBytes).compareTo(quantity(self.repositorySizeLimit)) <= 0",
            "message": "fetch.maxBytes may not exceed repositorySizeLimit: the volume fetch writes into holds no more",
            "fieldPath": ".fetch.maxBytes",
        },
        {
            "rule": "!has(self.env) || self.env.all(e, !(e.name in [" + ", ".join(f"'{n}'" for n in OPERATOR_ENV) + "]))",
            "message": f"env may not set {', '.join(OPERATOR_ENV)}: the operator sets it in the tritonserver container",
            "fieldPath": ".env",
        },
        {
            "rule": "!has(self.args) || self.args.all(a, " + " && ".join(
                f"!a.startsWith('{prefix}')" for prefix in OPERATOR_ARGS) + ")",
            "message": f"args may not set {' or '.join(OPERATOR_ARGS.values())}: the operator sets them, to restrict "
                       "Triton's model repository API to its own key",
            "fieldPath": ".args",
        },
    ]})

    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = Field(
        default=None,
        description=(
            "tritonserver image. Unset: the operator's default, which its admin sets once for the cluster (the "
            f"chart's `tritonImage`, `run --default-triton-image`; out of the box {DEFAULT_TRITON_IMAGE}). The "
            f"minimum supported release is NGC {MINIMUM_TRITON_RELEASE}: admission warns of an NGC tritonserver:YY.MM "
            "image before it. Objects that earlier versions defaulted carry "
            f"{LEGACY_TRITON_IMAGE} here, and keep it until it is changed."
        ),
    )
    cache_size: QuantityStr = Field(
        default="64Mi",
        description=(
            "Size of the server's local response cache (used when responseCache is true). The one setting of a "
            "step that reaches an ensemble's replicas: they have one cache for every model they load, sized by the "
            "largest cacheSize among those that set responseCache (the ensemble's own counts only when it sets "
            "responseCache itself)."
        ),
    )
    gpus: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description=(
            "`nvidia.com/gpu` per replica. Default: what the instance groups need: one more than the highest "
            "index in an instance group's `gpus`, at least 1 for a GPU or MODEL group, and 0 when every group is "
            "CPU or AUTO or there is none (Triton then runs the model on the CPU). An ensemble's replicas run "
            "every step, so its default is the most any step's instance groups need; a step's own server.gpus "
            "counts for the step's own replicas only, so set the ensemble's when a step's code uses GPUs its "
            "instance groups do not show (KIND_CPU or KIND_MODEL with several GPUs). A value the instance groups "
            "cannot run with (a GPU index >= gpus, KIND_GPU with 0) is refused, and so is an ensemble's value "
            "that one of its steps' instance groups cannot run with."
        ),
    )
    resources: Resources | None = Field(default=None, description="cpu/memory requests and limits.")
    node_selector: dict[str, str] | None = Field(default=None, description="Node labels replicas must match.")
    tolerations: list[Toleration] | None = Field(default=None, max_length=32, description="Taints replicas tolerate.")
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="A Kubernetes affinity, passed to the pod as is.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    args: list[Annotated[str, StringConstraints(max_length=1024)]] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Extra tritonserver arguments, appended as given. Not --http-restricted-api or "
            "--grpc-restricted-protocol: the operator sets them, so that only it may use Triton's model repository "
            "API (load, unload, index). The Python backend's shared memory settings "
            "(`--backend-config=python,shm-default-byte-size=N`, `…,shm-growth-byte-size=N`, in bytes) must fit "
            "shmSize: a default size times the Python model instances the replica loads, or a growth step, larger "
            "than /dev/shm is refused (Triton would fail every load or every growth)."
        ),
    )
    unrestricted_apis: list[OpenableApi] | None = Field(
        default=None,
        max_length=3,
        description=(
            "Triton API categories to leave open to every client of the replicas. By default each replica "
            "answers Triton's shared-memory (system and CUDA), logging and trace APIs, over HTTP and gRPC, only "
            "with the operator's key, as it does the model repository API (which cannot be opened): none is needed "
            "to infer, and the shared-memory API is the entry point of the remote-code-execution chain in Triton "
            "before 25.07 (CVE-2025-23319, -23320, -23334). Open `shared-memory` only for clients that pass tensors "
            "through system shared memory from the same pod or node; the model's status then says "
            "AdminApisRestricted=False and admission warns." + _NEW_PODS
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    startup_timeout_seconds: int = Field(
        default=600, ge=10, le=86400, description="How long load plus warm-up may take before the replica restarts."
    )
    shm_size: QuantityStr | None = Field(
        default=None,
        description=(
            "Size of each replica's /dev/shm, a memory-backed emptyDir (tmpfs). The Python backend moves every "
            "request's and response's tensors through it: each model instance has a region there that grows to "
            "hold the largest tensors it has handled (1 MiB to start, by default) and never shrinks while the "
            "instance lives; a tensor that does not fit fails its request (\"Failed to increase the shared memory "
            "pool size\"). The container runtime's default, 64 MiB, fails a Python model returning 76 MiB. "
            f"Unset: {SHM_SIZE_DEFAULT}, or the container's memory limit (resources.limits.memory) when that is "
            "lower: room for a Python step that takes a batch of eight 1080p RGB images and returns them in FP32 "
            "(200 MB). It is a cap, not a reservation: tmpfs pages take memory only once written, and Kubernetes "
            "counts them against the container's memory (its limit, and the node's eviction), so a value above "
            "resources.limits.memory is refused. At least 1Mi." + _NEW_PODS
        ),
    )
    repository_size_limit: QuantityStr = Field(
        default=REPOSITORY_SIZE_DEFAULT,
        json_schema_extra=_OPERATOR_DEFAULT,
        description=(
            "The sizeLimit of the replica's repository volume: the emptyDir the `fetch` init step fills when a "
            "source is a uri (and tritonserver reads). The kubelet evicts a pod whose volume grows past it; fetch "
            "itself stops at fetch.maxBytes, at most this, with a clear message. Raise it for models larger than "
            f"the default, {REPOSITORY_SIZE_DEFAULT}. It is a cap, not a reservation: the node's disk is taken only "
            "as files are written. At least 1Mi." + _NEW_PODS
        ),
    )
    tmp_size_limit: QuantityStr = Field(
        default=TMP_SIZE_DEFAULT,
        json_schema_extra=_OPERATOR_DEFAULT,
        description=(
            "The sizeLimit of tritonserver's /tmp, an emptyDir (the root filesystem is read-only): the Python "
            "backend unpacks execution environments there, and libraries cache there (HOME is /tmp). The kubelet "
            "evicts a pod whose /tmp grows past it." + _NEW_PODS
        ),
    )
    fetch: FetchLimits = Field(
        default_factory=FetchLimits,
        description=(
            "Bounds of the `fetch` init step, which runs when a source is a uri: what it may write, how many "
            "files, and for how long. Its container has requests and limits of its own (cpu 100m to 1, memory "
            "128Mi to 256Mi): it streams every download, so its memory does not grow with the model."
        ),
    )
    service_account_name: K8sNameStr | None = Field(
        default=None,
        description=(
            "The ServiceAccount the replicas run as, in the model's namespace (Kubernetes' default: `default`). The "
            "identity cloud credentials hang on: IRSA (EKS), EKS Pod Identity, GKE and Azure Workload Identity "
            "give the `fetch` init step credentials for s3:// and gs:// sources without a credentialsSecret." + _NEW_PODS
        ),
    )
    automount_service_account_token: bool = Field(
        default=False,
        json_schema_extra=_OPERATOR_DEFAULT,
        description=(
            "Mount a Kubernetes API token in the replicas. Off by default: tritonserver and the user's Python code "
            "never call the API server. The tokens IRSA and Azure Workload Identity inject are projected volumes of "
            "their own, which this does not touch; GKE Workload Identity needs no token." + _NEW_PODS
        ),
    )
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None,
        max_length=16,
        description=(
            "Secrets (type kubernetes.io/dockerconfigjson, in the model's namespace) for pulling server.image and "
            "the operator's image (the fetch and probe containers) from private registries, e.g. a copy of "
            "NVIDIA's image: `[{name: my-registry}]`." + _NEW_PODS
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    pod_labels: dict[QualifiedNameStr, LabelValueStr] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Labels added to every replica (cost allocation, mesh or policy selection). Not the operator's own: "
            f"{', '.join(OPERATOR_LABELS)} and every key under {GROUP}/ (the model's selector) are refused. They "
            "are part of the pod digest." + _NEW_PODS
        ),
    )
    pod_annotations: dict[QualifiedNameStr, Annotated[str, StringConstraints(max_length=65536)]] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Annotations added to every replica (scrape settings, mesh injection, …). Not the operator's own: "
            f"{', '.join(OPERATOR_ANNOTATIONS)} and every key under {GROUP}/ are refused." + _NEW_PODS
        ),
    )
    priority_class_name: K8sNameStr | None = Field(
        default=None,
        description="The PriorityClass of the replicas: which pods the scheduler preempts for which." + _NEW_PODS,
    )
    topology_spread_constraints: list[TopologySpreadConstraint] | None = Field(
        default=None,
        max_length=8,
        description=(
            "How replicas spread over zones or nodes. A constraint without labelSelector counts the model's own "
            "replicas." + _NEW_PODS
        ),
    )
    env: list[EnvVar] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Environment variables of the tritonserver container and of the `fetch` init step (so credentials "
            "for s3:// and gs:// sources can come from here: AWS_*, GOOGLE_APPLICATION_CREDENTIALS, an endpoint, "
            "a proxy). Not those the operator sets: HOME, TRITON_OPERATOR_REPOSITORY_KEY, nor, when a source the replica fetches names a "
            "credentialsSecret, the variables it sets (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, "
            "AWS_ENDPOINT_URL, AWS_REGION; GOOGLE_APPLICATION_CREDENTIALS)." + _NEW_PODS
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    env_from: list[EnvFromSource] | None = Field(
        default=None,
        max_length=16,
        description=(
            "Secrets and ConfigMaps whose keys become environment variables of the tritonserver container and the "
            "`fetch` init step; a variable set by env or by the operator wins over one of the same name here."
            + _NEW_PODS
        ),
    )

    @property
    def effective_shm_size(self) -> str:
        """The size of a replica's shared memory: shmSize, or SHM_SIZE_DEFAULT capped at the memory limit."""
        if self.shm_size is not None:
            return self.shm_size
        limit = (self.resources.limits or {}).get("memory") if self.resources is not None else None
        if limit is not None and quantity_value(limit) < quantity_value(SHM_SIZE_DEFAULT):
            return limit
        return SHM_SIZE_DEFAULT

    @property
    def fetch_max_bytes(self) -> int:
        """What the fetch step may write: fetch.maxBytes, or the repository volume's sizeLimit."""
        return quantity_bytes(self.fetch.max_bytes if self.fetch.max_bytes is not None else self.repository_size_limit)


class WarmupGate(_Model):
    """The readiness gate that keeps a replica out of the Service until it serves the desired config, warm."""

    enabled: bool = Field(
        default=True,
        description=(
            "Add the readiness gate to replicas. When false, a replica joins the Service as soon as its readiness "
            "probe (Triton's /v2/health/ready) passes, and the status's Ready follows the pods' readiness "
            "(reason AllReplicasReady) instead of the gate."
        ),
    )
    poll_interval_milliseconds: int = Field(
        default=200, ge=50, le=10_000, description="How often a warming replica is checked."
    )
    failed_request_threshold: int = Field(
        default=3,
        json_schema_extra=_OPERATOR_DEFAULT,
        ge=0,
        le=1000,
        description=(
            "Once a replica serves, it counts as broken (out of the Service at once, then healed) when a model it "
            "serves is no longer loaded, when one of its Python stubs has died, when tritonserver stops answering, "
            "or when this many requests to one model fail in a row with none served between them (Triton's "
            "statistics) AND a request of the replica's own probe fails too: the model's first warm-up sample "
            "(modelWarmup) with zeroData or randomData inputs, sent at most once a second while the failures go "
            "on. So a client whose requests make the model's code raise (Triton counts those as failed requests) "
            "cannot take replicas out of the Service: the probe's sample still succeeds. An ensemble is confirmed "
            "through its steps' samples. A model with no such sample (none, only inputDataFile samples, which the "
            "probe cannot read, or a decoupled model, which Triton's HTTP endpoint refuses) is broken on its "
            "failed requests alone: give it a zeroData or randomData sample, or set 0 if its clients can make it "
            "raise. 0 turns this rule off. On a pool (spec.pool) each model has its own: the pool's probe reads a "
            "value other than 3 from the model's loaded config."
        ),
    )


class Rollout(_Model):
    """How a change of the spec reaches running replicas."""

    strategy: Literal["InPlace", "NewPods"] = Field(
        default="InPlace",
        description=(
            "InPlace: a change that Triton can apply by reloading the model is loaded into the running replicas "
            "through Triton's repository API, replica by replica through the warm-up gate; the Deployment's pod "
            "template does not change, so no pod is created and no spare GPU is needed. Those are changes of the "
            "model's own config alone: maxBatchSize, batching, batcher, sequenceBatcher, inputs, outputs, "
            "decoupled, responseCache (on a server that already has a cache), modelWarmup, instanceGroups (on the "
            "same GPUs) and parameters. Every other change needs new pods and rolls the Deployment (maxSurge 1, "
            "maxUnavailable 0): server (image, resources, gpus, args, cacheSize, placement, and every pod setting: "
            "shmSize, repositorySizeLimit, tmpSizeLimit, fetch, serviceAccountName, automountServiceAccountToken, "
            "imagePullSecrets, podLabels, podAnnotations, priorityClassName, topologySpreadConstraints, env, envFrom), "
            "source, modelFiles, "
            "versions, versionPolicy, warmupGate, and an ensemble's steps. NewPods: every change rolls the "
            "Deployment."
        ),
    )
    mode: Literal["Swap", "Drain"] = Field(
        default="Swap",
        description=(
            "How one replica reloads in place. Swap (the default): Triton loads the new config beside the old one "
            "and switches when it is ready, the replica serving throughout (measured on the Triton shipped: 0 of "
            "1413 requests failed in a 4.4 s reload; a load that fails leaves the old config serving). It needs "
            "memory for two copies of the model during the load. Drain: the replica's gate turns False so it "
            "leaves the Service, requests in flight finish (up to drainTimeoutSeconds), then Triton unloads the "
            "old copy and loads the new one once that copy is gone: one copy in memory, one replica's capacity "
            "less. A model with a sequence batcher always drains (Triton does not promise that live sequences "
            "survive a swap), and so does a decoupled model: Triton keeps the old copy until every open stream "
            "(its gRPC stream) is closed by its client, and the new config loads only then."
        ),
    )
    max_unavailable: int = Field(
        default=1,
        ge=1,
        le=1000,
        description=(
            "How many replicas may be unavailable at once during an in-place rollout: reloading, or out of the "
            "Service for any reason (as a Deployment's maxUnavailable counts them). A replica already out of the "
            "Service is told to reload at once; a serving one waits until fewer than this are unavailable."
        ),
    )
    drain_timeout_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description=(
            "Drain: the longest wait, once a replica was told to reload, for its requests to stop (it left the "
            "Service and no request arrived for a second; for a sequence model, none for the sequence idle "
            "timeout) and, once Triton unloads it, for its requests in flight and open decoupled streams to end. "
            "Past it the replica reloads anyway."
        ),
    )


class AutoscalingTarget(_Model):
    """The one metric the HorizontalPodAutoscaler keeps at its target, read from Triton's own statistics."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.queueTimeMilliseconds), has(self.inflightRequests), "
                    "has(self.inferencesPerSecond)].filter(x, x).size() == 1",
                    "message": "set exactly one of queueTimeMilliseconds, inflightRequests or inferencesPerSecond",
                }
            ]
        }
    )

    queue_time_milliseconds: float | None = Field(
        default=None,
        gt=0,
        le=3_600_000,
        description=(
            "Mean time a request waits in Triton's queue before it runs, in milliseconds, over the warmed replicas "
            "(metric triton_queue_time_ms). Above it the HPA adds replicas in proportion (desired = ready replicas "
            "x measured / target), below it removes them."
        ),
    )
    inflight_requests: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description=(
            "Requests in flight or pending per warmed replica, averaged over the window (metric "
            "triton_inflight_requests: the time requests spent in Triton, queue and compute, per second of the "
            "window, so 2 means two requests at any moment on average)."
        ),
    )
    inferences_per_second: float | None = Field(
        default=None,
        gt=0,
        le=10_000_000,
        description=(
            "Inference requests completed per second per replica (metric triton_inferences_per_second, the model's "
            "total over its warmed replicas; the HPA divides it by this target)."
        ),
    )


    def given(self) -> dict[str, float]:
        """The targets set, by their field names (exactly one in a valid spec)."""
        return {name: value for name, value in (("queueTimeMilliseconds", self.queue_time_milliseconds),
                                                ("inflightRequests", self.inflight_requests),
                                                ("inferencesPerSecond", self.inferences_per_second))
                if value is not None}


class Autoscaling(_Model):
    """A HorizontalPodAutoscaler of the model's replicas on Triton's own metrics (custom.metrics.k8s.io)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "minReplicas must be <= maxReplicas",
                    "fieldPath": ".minReplicas",
                }
            ]
        }
    )

    min_replicas: int = Field(default=1, ge=1, le=1000, description="The fewest replicas the HPA scales to.")
    max_replicas: int = Field(ge=1, le=1000, description="The most replicas the HPA scales to.")
    target: AutoscalingTarget = Field(description="The metric and its target value.")
    behavior: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The HPA's behavior (autoscaling/v2 HorizontalPodAutoscalerBehavior: scaleUp and scaleDown "
            "stabilizationWindowSeconds, selectPolicy and policies), passed to it as is. Unset: Kubernetes' "
            "defaults (scale down after a 300 s stabilisation window)."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


# ---------------------------------------------------------------- a model on a pool


def _cel_literal(value: Any) -> str:
    return json.dumps(value)


def _server_defaults(model: type[BaseModel], at: str) -> Iterator[tuple[str, Any]]:
    """(`.server.<field>` path, its default or None) for every field of a server setting, nested ones walked."""
    for name, f in model.model_fields.items():
        path = f"{at}.{f.alias or to_camel(name)}"
        default = f.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            yield from _server_defaults(type(default), path)
        else:
            yield path, default


#: The server fields of a TritonModel, at their defaults: a pooled model may set none of them (its pool's replicas
#: run it), and `validate.rules` names the one that differs. `.server.image` -> its default (None: no default).
POOLED_SERVER_DEFAULTS: dict[str, Any] = dict(_server_defaults(Server, ".server"))
#: Values a pooled model may carry besides its default, and why: what the API server stored as the default before.
POOLED_SERVER_ACCEPTED: dict[str, tuple[Any, str]] = {
    ".server.image": (LEGACY_TRITON_IMAGE, "the default that 0.1.x stored"),
}
#: What a pooled model may not set, as the reference says it.
POOLED_MODEL_REFUSED = ("server", "warmupGate.enabled: false", "rollout.strategy: NewPods")
_POOLED = "!has(self.pool) || "
#: The failed-request threshold of a model on a pool replica that sets none: the pool probe's `--fail-threshold`
#: (`--every-model`). A pooled model that sets another carries it in its config (`api.pod.THRESHOLD_PARAMETER`).
POOL_FAILED_REQUEST_THRESHOLD = 3


def _pooled_server_rule(path: str, default: Any) -> JsonDict:
    """The CEL rule that a pooled model leaves one server field (`path`, under `self`) alone: unset, or its default
    (the API server fills defaults in before it evaluates the rules)."""
    parents = path.split(".")[1:-1]  # ".server.fetch.maxFiles" -> server, fetch
    guard = "".join(f"!has(self.{'.'.join(parents[:i + 1])}) || " for i in range(len(parents)))
    rule = f"{guard}!has(self{path})"
    if default is not None:
        rule += f" || self{path} == {_cel_literal(default)}"
    accepted, why = POOLED_SERVER_ACCEPTED.get(path, (None, ""))
    if accepted is not None:
        rule += f" || self{path} == {_cel_literal(accepted)}"
    here = (f" (here it must stay {default})" if default is not None
            else f" (here it must stay unset; {accepted}, {why}, is let be)" if accepted is not None else "")
    return {
        "rule": f"{_POOLED}{rule}",
        "message": f"a pooled model runs on its pool's tritonservers: set {path[1:]} on the TritonPool "
                   f"(spec{path}), not on the model{here}",
        "fieldPath": path,
    }


POOLED_MODEL_RULES: list[JsonDict] = [
    {
        "rule": f"{_POOLED}has(self.memory) || (has(self.platform) && self.platform == 'ensemble')",
        "message": "memory is required with pool: what one copy of the model takes on a pool replica (the operator "
                   "places copies against the pool's capacity with it)",
        "fieldPath": ".memory",
    },
    {
        "rule": "!has(self.memory) || has(self.pool)",
        "message": "memory goes with pool: it is what a copy takes on a pool replica",
        "fieldPath": ".memory",
    },
    {
        "rule": f"{_POOLED}!has(self.warmupGate) || self.warmupGate.enabled",
        "message": "a pooled model is always gated: its Service lists a pool replica only once the model is READY "
                   "there at the desired config, warm (warmupGate.enabled: false has no meaning on a pool)",
        "fieldPath": ".warmupGate.enabled",
    },
    {
        "rule": f"{_POOLED}!has(self.rollout) || self.rollout.strategy == 'InPlace'",
        "message": "a pooled model has no pods of its own to replace: its changes are loaded in place "
                   "(rollout.strategy: InPlace; rollout.mode picks Swap or Drain)",
        "fieldPath": ".rollout.strategy",
    },
    *(_pooled_server_rule(path, default) for path, default in POOLED_SERVER_DEFAULTS.items()),
]


# ---------------------------------------------------------------- the spec


class TritonModelSpec(_Model):
    """Desired state of a Triton model and the replicas that serve it."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.backend) != has(self.platform)",
                    "message": "set exactly one of backend or platform",
                    "fieldPath": ".backend",
                },
                {
                    "rule": "has(self.platform) && self.platform == 'ensemble' ? has(self.ensemble) : !has(self.ensemble)",
                    "message": "ensemble.steps goes with platform: ensemble, and platform: ensemble needs ensemble.steps",
                    "fieldPath": ".ensemble",
                },
                {
                    "rule": "!(has(self.platform) && self.platform == 'ensemble' && has(self.batcher))",
                    "message": "an ensemble cannot have a batcher: Triton's scheduling is a oneof, and ensemble_scheduling "
                    "takes the place of dynamic_batching (the steps batch on their own)",
                    "fieldPath": ".batcher",
                },
                {
                    "rule": "!(has(self.platform) && self.platform == 'ensemble' && has(self.sequenceBatcher))",
                    "message": "an ensemble cannot have a sequenceBatcher: ensemble_scheduling takes its place",
                    "fieldPath": ".sequenceBatcher",
                },
                {
                    "rule": "!(has(self.batcher) && has(self.sequenceBatcher))",
                    "message": "set at most one of batcher or sequenceBatcher (Triton's scheduling is a oneof)",
                    "fieldPath": ".sequenceBatcher",
                },
                {
                    "rule": "!(has(self.platform) && self.platform == 'ensemble') || "
                    "!has(self.instanceGroups) || size(self.instanceGroups) == 0",
                    "message": "an ensemble has no instanceGroups of its own (its steps run on theirs)",
                    "fieldPath": ".instanceGroups",
                },
                {
                    "rule": "!(has(self.platform) && self.platform == 'ensemble') || "
                    "!has(self.modelWarmup) || size(self.modelWarmup) == 0",
                    "message": "an ensemble has no modelWarmup of its own (its steps warm up on their own)",
                    "fieldPath": ".modelWarmup",
                },
                {
                    "rule": "!(has(self.platform) && self.platform == 'ensemble' && has(self.source))",
                    "message": "an ensemble has no source: its repository is built from its steps",
                    "fieldPath": ".source",
                },
                {
                    "rule": "(has(self.platform) && self.platform == 'ensemble') || has(self.source) || has(self.versions)",
                    "message": "source is required (inline files or a uri), or versions",
                    "fieldPath": ".source",
                },
                {
                    "rule": "!(has(self.source) && has(self.versions))",
                    "message": "set source (served as version 1) or versions, not both",
                    "fieldPath": ".versions",
                },
                {
                    "rule": "!(has(self.platform) && self.platform == 'ensemble' && has(self.versions))",
                    "message": "an ensemble has no versions: its repository is built from its steps",
                    "fieldPath": ".versions",
                },
                {
                    "rule": "!self.batching || self.maxBatchSize >= 1",
                    "message": "maxBatchSize must be >= 1 when batching is true",
                    "fieldPath": ".maxBatchSize",
                },
                {
                    "rule": "!has(self.batcher) || !has(self.batcher.preferredBatchSize) || "
                    "self.batcher.preferredBatchSize.all(s, s > 0 && self.batching && s <= self.maxBatchSize)",
                    "message": "each preferredBatchSize must be > 0 and <= maxBatchSize (and batching must be true)",
                    "fieldPath": ".batcher.preferredBatchSize",
                },
                {
                    "rule": "!has(self.batcher) || self.batcher.priorityLevels == 0 || "
                    "(self.batcher.defaultPriorityLevel >= 1 && self.batcher.defaultPriorityLevel <= self.batcher.priorityLevels)",
                    "message": "defaultPriorityLevel must be in [1, priorityLevels]",
                    "fieldPath": ".batcher.defaultPriorityLevel",
                },
                {
                    "rule": "!has(self.batcher) || !has(self.batcher.priorityQueuePolicy) || "
                    "self.batcher.priorityQueuePolicy.all(k, int(k) >= 1 && int(k) <= self.batcher.priorityLevels)",
                    "message": "every priorityQueuePolicy level must be in [1, priorityLevels]",
                    "fieldPath": ".batcher.priorityQueuePolicy",
                },
                {
                    "rule": "!has(self.batcher) || !self.batcher.preserveOrdering || self.batcher.priorityLevels <= 1",
                    "message": "preserveOrdering allows at most one priority level",
                    "fieldPath": ".batcher.preserveOrdering",
                },
                {
                    "rule": "!has(self.batcher) || !has(self.batcher.strategyLibrary) || "
                    "(self.batching && self.maxBatchSize >= 1)",
                    "message": "a custom batching strategy needs a batching model (batching: true, maxBatchSize >= 1)",
                    "fieldPath": ".batcher.strategyLibrary",
                },
                {
                    "rule": "!(self.responseCache && self.decoupled)",
                    "message": "responseCache cannot be used with a decoupled model",
                    "fieldPath": ".responseCache",
                },
                {
                    "rule": "!(self.responseCache && has(self.sequenceBatcher))",
                    "message": "responseCache cannot be used with sequenceBatcher",
                    "fieldPath": ".responseCache",
                },
                {
                    "rule": "!has(self.modelWarmup) || self.modelWarmup.all(w, self.batching"
                            " ? w.batchSize <= self.maxBatchSize : w.batchSize == 1)",
                    "message": "modelWarmup batchSize must be <= maxBatchSize (exactly 1 when batching is false)",
                    "fieldPath": ".modelWarmup",
                },
                {
                    "rule": "!has(self.modelWarmup) || !self.batching || self.modelWarmup.all(w, size(w.inputs) > 0)",
                    "message": "a batching model's modelWarmup sample needs data for at least one input "
                    "(Triton takes the batch from the first input)",
                    "fieldPath": ".modelWarmup",
                },
                *POOLED_MODEL_RULES,
            ]
        }
    )

    model_name: ModelNameStr | None = Field(
        default=None, description="The model's name in Triton; defaults to metadata.name."
    )
    backend: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z0-9_]+$")] | None = Field(
        default=None, description="Triton backend, e.g. python, onnxruntime, pytorch, tensorrt."
    )
    platform: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z0-9_]+$")] | None = Field(
        default=None, description="Triton platform instead of a backend, e.g. ensemble, onnxruntime_onnx."
    )
    source: Source | None = Field(
        default=None,
        description="The model's files (not for ensembles): its version 1. For several versions use versions instead.",
    )
    model_files: ModelFiles | None = Field(
        default=None,
        description=(
            "Files of the model directory itself (`<model>/`, beside config.pbtxt), shared by every version, such "
            "as the labels an output's labelFilename names: inline text, or fetched from a uri."
        ),
    )
    versions: list[ModelVersion] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_LIST,
        description=(
            "Several versions of the model, each a version directory with its own files, instead of source (which "
            "is version 1 alone). Which of them Triton serves is versionPolicy's choice (by default the highest). "
            "Clients address one with `/v2/models/<model>/versions/<version>`, ensemble steps with modelVersion."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["version"]},
    )
    version_policy: VersionPolicy | None = Field(
        default=None,
        description=(
            "Which versions Triton serves: `latest: N`, `all: {}` or `specific: [..]` (rendered as "
            "`version_policy`). Unset: Triton's default, the highest version only. Every served version must load "
            "and warm up before a replica's gate opens."
        ),
    )

    batching: bool = Field(default=True, description="Whether the model accepts batches; false renders max_batch_size: 0.")
    max_batch_size: int = Field(default=4, ge=0, le=INT32_MAX, description="Largest batch the model accepts.")
    batcher: DynamicBatcher | None = Field(default=None, description="Enables Triton's dynamic batcher.")
    sequence_batcher: SequenceBatcher | None = Field(default=None, description="Enables the sequence batcher.")

    inputs: list[Tensor] | None = Field(
        default=None,
        max_length=MAX_TENSORS,
        description="Input tensors.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    outputs: list[Tensor] | None = Field(
        default=None,
        max_length=MAX_TENSORS,
        description="Output tensors.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    decoupled: bool = Field(default=False, description="The model may send zero or many responses per request.")
    response_cache: bool = Field(
        default=False, description="Cache responses in the server's local cache (sized by server.cacheSize)."
    )
    model_warmup: list[Warmup] | None = Field(
        default=None, max_length=MAX_LIST, description="Warm-up samples run before the model turns READY."
    )
    instance_groups: list[InstanceGroup] | None = Field(
        default=None, max_length=16, description="Model instances; Triton's default when empty."
    )
    parameters: dict[ParameterKey, ParameterValue] | None = Field(
        default=None, max_length=MAX_LIST, description="Backend parameters, string to string."
    )
    ensemble: Ensemble | None = Field(
        default=None,
        description=(
            "Ensemble steps (with platform: ensemble). The ensemble's replicas load the ensemble and every step "
            "model it reaches into one tritonserver, shaped by the ensemble's own replicas, server and warmupGate "
            "(see server); a step model with replicas: 0 runs nowhere else."
        ),
    )

    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description=(
            "Number of replicas of the model's own Deployment: tritonservers serving it behind its Service. 0 runs "
            "none: the ConfigMap, the Deployment (at 0) and the Service (without endpoints) stay, so scaling up "
            "again changes only this number. A step model clients reach only through ensembles needs no replicas "
            "of its own: the ensembles' replicas load it (and answer for it by name too). Its status then says so: "
            "Ready=True, reason ServedByEnsembles, and status.servedBy names the ensembles; with no ensemble "
            "running it, the reason is ScaledToZero. With pool: how many of the pool's replicas load the model "
            "(its copies, each on a replica of its own)."
        ),
    )
    pool: ModelObjectNameStr | None = Field(
        default=None,
        description=(
            "The TritonPool (in the model's namespace) whose shared tritonservers serve the model, instead of a "
            "Deployment of its own. replicas is then how many of the pool's replicas load it (each copy on a "
            "replica of its own, spread across nodes where the pool allows), and memory what one copy takes there. "
            "The pool's replicas carry the server settings: a pooled model sets no server field of its own "
            f"({', '.join(POOLED_MODEL_REFUSED)} are refused). Its Service has no selector: the operator lists in "
            "it only the pool replicas where the model is READY at the desired config and warm. An ensemble on a "
            "pool is loaded with every step it reaches on the same replicas; its steps name the same pool."
        ),
    )
    memory: QuantityStr | None = Field(
        default=None,
        description=(
            "What one copy of the model takes on a pool replica (required with pool, but for an ensemble, whose "
            "steps declare theirs): its weights, instances and buffers, in total over the GPUs it uses, in bytes "
            "(`512Mi`, `2Gi`). The operator places copies against the pool's capacity per replica with it, and "
            "refuses a model larger than a replica holds. It is a declaration, not a limit: nothing measures it."
        ),
    )
    server: Server = Field(
        default_factory=Server,
        description=(
            "The tritonserver container of the model's own replicas. An ensemble's replicas run every step model "
            "in one tritonserver shaped by the ensemble's server alone: its image, gpus, resources, nodeSelector, "
            "tolerations, affinity, args, startupTimeoutSeconds and pod settings (shmSize, serviceAccountName, env, "
            "…) apply to every step there, and a step's own values of these are ignored there. Only a step's "
            "cacheSize counts (see cacheSize)."
        ),
        json_schema_extra={"default": {}},
    )
    warmup_gate: WarmupGate = Field(
        default_factory=WarmupGate, description="Traffic gating on warm-up.", json_schema_extra={"default": {}}
    )
    rollout: Rollout = Field(
        default_factory=Rollout,
        description="How changes reach running replicas: in place through Triton's repository API, or new pods.",
        json_schema_extra={"default": {}},
    )
    autoscaling: Autoscaling | None = Field(
        default=None,
        description=(
            "Scale the replicas on Triton's own statistics: the operator renders a HorizontalPodAutoscaler (named "
            "after the model, owned by it) that sets spec.replicas through the scale subresource, on a metric the "
            "operator serves through the custom metrics API (custom.metrics.k8s.io: the chart's "
            "customMetrics.enabled, off by default; or an adapter serving the same metric names). Only warmed "
            "replicas count. Without a server for the metric the HPA does not scale, and says why in its ScalingActive "
            "condition, which the model's status restates. "
            "Leave spec.replicas out of manifests that set this: the HPA owns it. Unset: no "
            "HPA is rendered (one of your own still works through the scale subresource). With pool, it scales the "
            "model's copies on the pool: its metric is read from the pool replicas where a copy serves (the "
            "model's EndpointSlices' ready endpoints), each a copy in the figures, and the HPA compares the "
            "model's total to the target times its copies (an AverageValue, the pool's replicas being shared)."
        ),
    )

    @property
    def is_ensemble(self) -> bool:
        return self.platform == "ensemble"

    @property
    def version_sources(self) -> dict[int, Source]:
        """Each version's files by version number, in order: spec.versions, or spec.source as version 1."""
        if self.versions:
            return {v.version: v.source for v in sorted(self.versions, key=lambda v: v.version)}
        return {1: self.source} if self.source is not None else {}

    @property
    def available_versions(self) -> list[int]:
        """The versions that have a directory in the rendered repository (an ensemble's is 1), ascending."""
        return [1] if self.is_ensemble else sorted(self.version_sources)

    @property
    def served_versions(self) -> list[int]:
        """The versions Triton loads under the version policy (Triton's default: the latest one), ascending."""
        have, policy = self.available_versions, self.version_policy
        if policy is None or policy.latest is not None:
            n = 1 if policy is None or policy.latest is None else policy.latest
            return have[-n:]
        if policy.all is not None:
            return have
        return sorted(set(policy.specific or ()) & set(have))

    @property
    def effective_max_batch_size(self) -> int:
        return self.max_batch_size if self.batching else 0

    @property
    def gpus_needed(self) -> int:
        """GPUs this model's own instance groups need visible: Triton places a KIND_GPU group without `gpus` on
        every visible GPU and fails with none, `gpus: [i]` needs GPU i, KIND_MODEL leaves placement to the model
        (a GPU, for the backends that use it), KIND_AUTO and no group fall back to the CPU."""
        need = 0
        for g in self.instance_groups or ():
            if g.gpus:
                need = max(need, max(g.gpus) + 1)
            elif g.kind in ("GPU", "MODEL"):
                need = max(need, 1)
        return need


# ---------------------------------------------------------------- status


class Condition(_Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    observed_generation: int | None = Field(default=None, ge=0, le=JSON_INT_MAX)
    last_transition_time: str | None = None
    reason: str | None = None
    message: str | None = None


class ReplicaState(_Model):
    pod: str = Field(description="Pod name.")
    state: Literal["Pending", "Loading", "Warming", "Ready", "Failed"] = Field(description="Replica state.")
    reason: str | None = Field(default=None, description="Why, in CamelCase.")
    message: str | None = Field(default=None, description="Triton's own reason on failure.")
    warmup_seconds: float | None = Field(default=None, description="Observed time from container start to gate True.")
    config_digest: str | None = Field(
        default=None, description="Digest of the config the replica's Triton has loaded, as it last said."
    )


class TritonModelStatus(_Model):
    """Observed state, written by the operator."""

    model_config = ConfigDict(frozen=False)

    observed_generation: int | None = Field(default=None, ge=0, le=JSON_INT_MAX)
    conditions: list[Condition] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int | None = Field(default=None, ge=0, le=INT32_MAX, description="Replicas that exist.")
    ready_replicas: int | None = Field(
        default=None, ge=0, le=INT32_MAX, description="Replicas that are Ready (gate included).")
    warmed_replicas: int | None = Field(
        default=None,
        ge=0,
        le=INT32_MAX,
        description="Replicas at the desired config whose gate is True (without the gate: that are Ready).",
    )
    config_digest: str | None = Field(default=None, description="Digest of the desired model repository.")
    selector: str | None = Field(default=None, description="Pod label selector, for the scale subresource.")
    replica_states: list[ReplicaState] | None = Field(default=None, description="Per-replica state.")
    served_by: list[str] | None = Field(
        default=None,
        description=(
            "Ensembles (TritonModel names) whose replicas load this model as a step, directly or through a nested "
            "ensemble, and that run replicas (spec.replicas > 0). With spec.replicas 0 the model is served there "
            "alone: Ready=True, reason ServedByEnsembles."
        ),
    )
    placement: list[str] | None = Field(
        default=None,
        max_length=1000,
        description=(
            "A pooled model: the pool replicas (pod names) its copies are loaded on, first placed first. The "
            "operator places a copy again only when its replica is gone: a model that is serving never moves."
        ),
    )


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: ModelObjectNameStr
    namespace: str | None = None


class TritonModel(BaseModel):
    """A TritonModel as read from YAML or the API server."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    api_version: Literal["serving.triton-operator.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["TritonModel"]
    metadata: ObjectMeta
    spec: TritonModelSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def triton_name(self) -> str:
        return self.spec.model_name or self.metadata.name

    @property
    def uri_sources(self) -> list[tuple[str, Source | ModelFiles]]:
        """Every source of this model fetched by uri, with where it lands under the repository (the fetch step's
        key): MODEL for spec.source (into 1/), MODEL/VERSION for each of spec.versions, MODEL/. for
        spec.modelFiles (into the model directory itself). The renderer's fetch arguments and volumes and the
        review of the operator's writes (which Secrets and claims a replica may use) both read them here."""
        name = self.triton_name
        found: list[tuple[str, Source | ModelFiles]] = [
            (name if not self.spec.versions else f"{name}/{version}", src)
            for version, src in self.spec.version_sources.items()]
        if self.spec.model_files is not None:
            found.append((f"{name}/.", self.spec.model_files))
        return [(key, src) for key, src in found if src.uri is not None]
