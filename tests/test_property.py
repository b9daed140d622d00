"""Property: ANY TritonModel the validator accepts loads READY in a real tritonserver.

A hypothesis strategy writes TritonModel documents over the config surface (batching, batcher with
preferred sizes / priority levels / queue policies / preserveOrdering, sequence batcher with direct or
oldest and control inputs, tensors of every data type with -1 dims, reshape and optional inputs,
decoupled, response cache, warm-up from zeros / random data / data files, CPU instance groups,
parameters). On purpose it also strays over the rules' boundaries (a preferred size one past
maxBatchSize, a priority level of 0, a warm-up batch too large, a reshape with one element too
many, ...), so what decides whether a spec gets loaded is the validator, not the generator.

Every spec `check_documents` accepts is rendered (model.py = tests/models/generic_model.py, which
serves any config) and loaded into ONE shared explicit-mode tritonserver with a response cache; it
must turn READY (load plus warm-up), or the test fails with Triton's own reason, the log and the
rendered config.pbtxt. Such a failure is a bug in the validator: a rule is missing or too lax.
"""

from __future__ import annotations

import base64
import copy
import math
import os
import random
import struct
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import yaml
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from tests.conftest import SharedTriton
from tests.timing import scaled
from triton_operator.files import write_repository
from triton_operator.render.modelconfig import render_repository
from triton_operator.validate import check_documents, load_documents

GENERIC_MODEL = (Path(__file__).parent / "models" / "generic_model.py").read_text()
#: What the strategy puts in source.inline["model.py"]; `_named` swaps in the generic model's code.
GENERIC_MARKER = "# the generic model: tests/models/generic_model.py"
API_VERSION = "serving.triton-operator.dev/v1alpha1"

#: Examples per run: 55 with a fixed seed, so CI runs the same ones (~39 loads, ~1 min on 2 cores).
#: For a longer hunt: PROPERTY_EXAMPLES=400 (~7 min), and/or another PROPERTY_SEED.
MAX_EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "55"))
#: A fixed seed rather than `derandomize=True`, whose seed is a hash of the test's source: any edit to
#: the test would swap the example set (hypothesis repeats its early picks, so the share of accepted
#: specs swings from one set to the next).
SEED = int(os.environ.get("PROPERTY_SEED", "11"))
#: At least this many accepted specs must really have been loaded, so the test cannot pass vacuously.
MIN_LOADED = int(os.environ.get("PROPERTY_MIN_LOADED", "25"))
#: Shrinking re-loads every candidate in Triton (minutes); set HYPOTHESIS_SHRINK=1 to get a minimal example.
PHASES = [Phase.explicit, Phase.generate] + ([Phase.shrink] if os.environ.get("HYPOTHESIS_SHRINK") else [])
#: A load (and warm-up) of one generic model takes ~1.5 s; past this (30 s, scaled) Triton is stuck LOADING.
LOAD_TIMEOUT = scaled(30.0)

DTYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
          "FP16", "FP32", "FP64", "BF16", "BYTES"]  # fmt: skip
ELEMENT_SIZE = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
                "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}  # fmt: skip
CONTROL_TYPES = ["INT32", "FP32", "BOOL"]
CORRID_TYPES = ["UINT64", "INT64", "UINT32", "INT32", "BYTES"]

#: Rule boundaries the generator may stray over; each spec crosses none (most of the time) or a few.
DEFECTS = [
    "mbs-zero", "preferred-over", "preferred-zero", "preferred-not-batching", "default-priority",
    "queue-policy-level", "preserve-priorities", "preserve-delay", "cache-decoupled", "cache-sequence",
    "cache-size", "corrid-type", "control-type", "false-true", "control-twice", "control-is-input",
    "slot-utilization", "oldest-preferred", "both-strategies", "both-schedulers", "dim-zero", "dim-negative",
    "dims-empty", "reshape", "duplicate-tensor", "gpus-on-cpu", "no-model-py", "no-source", "inline-and-uri",
    "warmup-batch", "warmup-type", "warmup-dims", "warmup-variable", "warmup-missing", "warmup-unknown",
    "warmup-data", "warmup-file", "warmup-empty", "backend-and-platform",
]  # fmt: skip


# ---------------------------------------------------------------- the strategy


class _Draw:
    """The draw function plus the set of rule boundaries this spec crosses."""

    def __init__(self, draw: Any, defects: frozenset[str]) -> None:
        self.draw = draw
        self.defects = defects

    def __call__(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.draw(strategy)

    def stray(self, defect: str) -> bool:
        assert defect in DEFECTS, defect
        return defect in self.defects

    def maybe(self, p_true: int = 1, of: int = 2) -> bool:
        """True with probability about p_true/of; the simplest draw (what hypothesis tries first and
        shrinks towards) gives the likelier outcome, so rare branches stay rare."""
        x = self.draw(st.integers(0, of - 1))
        return x < p_true if 2 * p_true >= of else x >= of - p_true


def _dims(d: _Draw) -> list[int]:
    dims = d(st.lists(st.sampled_from([-1, 1, 2, 3, 4]), min_size=1, max_size=3))
    if d.stray("dims-empty"):
        return []
    if d.stray("dim-zero"):
        dims[d(st.integers(0, len(dims) - 1))] = 0
    if d.stray("dim-negative"):
        dims[d(st.integers(0, len(dims) - 1))] = d(st.sampled_from([-2, -7]))
    return dims


def _reshape(d: _Draw, dims: list[int], batching: bool) -> list[int] | None:
    """A reshape that keeps Triton's element-count rule, or (straying) one that breaks it."""
    if not dims or any(x < -1 or x == 0 for x in dims) or not d.maybe(1, 4):
        return None
    variable = -1 in dims
    if d.stray("reshape"):
        if variable:
            return [x if x == -1 else x + 1 for x in dims] + [2]  # fixed runs no longer match
        return d(st.sampled_from([[math.prod(dims) + 1], [], [math.prod(dims), 2]])) if math.prod(dims) != 1 else [2]
    at = d(st.integers(0, len(dims)))
    options = [dims[:at] + [1] + dims[at:]]  # an extra 1 keeps every fixed run's element count
    if not variable:
        options += [[math.prod(dims)], list(reversed(dims))]
        if math.prod(dims) == 1 and batching:
            options.append([])  # a scalar: allowed only when the batch dimension remains
    return d(st.sampled_from(options))


TENSOR_NAMES = st.sampled_from(["X", "in:0", "input/ids", "t.1", "_y", "INPUT__0", "a-b"])


def _tensors(d: _Draw, prefix: str, batching: bool, *, is_input: bool, low: int) -> list[dict[str, Any]]:
    out = []
    for i in range(d(st.integers(low, 3))):
        name = f"{prefix}{i}" if d.maybe(3, 4) else f"{prefix}{i}_{d(TENSOR_NAMES)}"
        t: dict[str, Any] = {"name": name, "dataType": d(st.sampled_from(DTYPES)), "dims": _dims(d)}
        if is_input and d.maybe(1, 4):
            t["optional"] = True
        if is_input and d.maybe(1, 8):
            t["allowRaggedBatch"] = True
        reshape = _reshape(d, t["dims"], batching)
        if reshape is not None:
            t["reshape"] = reshape
        out.append(t)
    if out and d.stray("duplicate-tensor"):
        out.append(dict(out[0], dataType=d(st.sampled_from(DTYPES))))
    return out


def _preferred(d: _Draw, mbs: int) -> list[int] | None:
    sizes = d(st.lists(st.integers(1, mbs), min_size=1, max_size=3, unique=True)) if mbs >= 1 and d.maybe() else None
    if d.stray("preferred-over") and mbs >= 1:
        sizes = (sizes or []) + [mbs + 1]
    if d.stray("preferred-zero"):
        sizes = (sizes or []) + [d(st.sampled_from([0, -1]))]
    if d.stray("preferred-not-batching") and mbs == 0:
        sizes = [1]
    return sizes


def _queue_policy(d: _Draw, *, no_delay_timeout: bool) -> dict[str, Any]:
    policy: dict[str, Any] = {}
    if d.maybe():
        policy["timeoutAction"] = d(st.sampled_from(["REJECT", "DELAY"]))
    if d.maybe():
        policy["defaultTimeoutMicroseconds"] = d(st.sampled_from([0, 1000, 5_000_000]))
    if no_delay_timeout and policy.get("timeoutAction") == "DELAY":
        policy["defaultTimeoutMicroseconds"] = 0
    if d.maybe():
        policy["allowTimeoutOverride"] = d(st.booleans())
    if d.maybe():
        policy["maxQueueSize"] = d(st.sampled_from([0, 1, 16]))
    return policy


def _batcher(d: _Draw, mbs: int) -> dict[str, Any]:
    b: dict[str, Any] = {}
    if d.maybe():
        b["maxQueueDelayMicroseconds"] = d(st.sampled_from([0, 100, 20_000]))
    preferred = _preferred(d, mbs)
    if preferred is not None:
        b["preferredBatchSize"] = preferred
    levels = d(st.sampled_from([1, 2, 3] if d.stray("default-priority") else [0, 0, 1, 2, 3]))
    preserve = d.stray("preserve-priorities") or d.stray("preserve-delay") or d.maybe(1, 3)
    if preserve and levels > 1 and not d.stray("preserve-priorities"):
        levels = 1
    if preserve and levels <= 1 and d.stray("preserve-priorities"):
        levels = 2
    if levels:
        b["priorityLevels"] = levels
        b["defaultPriorityLevel"] = d(st.integers(1, levels))
        if d.stray("default-priority"):
            b["defaultPriorityLevel"] = d(st.sampled_from([0, levels + 1]))
    elif d.maybe(1, 4):
        b["defaultPriorityLevel"] = d(st.integers(0, 3))  # ignored by Triton without priority levels
    no_delay_timeout = preserve and not d.stray("preserve-delay")
    if d.maybe():
        b["defaultQueuePolicy"] = _queue_policy(d, no_delay_timeout=no_delay_timeout)
    keys = set(d(st.lists(st.integers(1, levels), max_size=levels, unique=True))) if levels else set()
    if d.stray("queue-policy-level"):
        keys.add(d(st.sampled_from([0, levels + 1])))
    if keys:
        b["priorityQueuePolicy"] = {str(k): _queue_policy(d, no_delay_timeout=no_delay_timeout) for k in sorted(keys)}
    if preserve and d.stray("preserve-delay"):
        b["defaultQueuePolicy"] = {"timeoutAction": "DELAY", "defaultTimeoutMicroseconds": 1000}
    if preserve:
        b["preserveOrdering"] = True
    return b


def _false_true(d: _Draw, dtype: str) -> list[float] | None:
    if d.stray("false-true"):
        return d(st.sampled_from([[1], [0, 1, 2]]))
    if not d.maybe():
        return None
    values = st.sampled_from([0.5, 1.5, -1.0]) if dtype == "FP32" else st.integers(-2, 3)
    return [d(values), d(values)]


def _sequence_batcher(d: _Draw, mbs: int, input_names: list[str]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    strategy = d(st.sampled_from(["none", "direct", "oldest"]))
    strategy = "direct" if d.stray("slot-utilization") else "oldest" if d.stray("oldest-preferred") else strategy
    if strategy == "direct" or d.stray("both-strategies"):
        direct: dict[str, Any] = {}
        if d.maybe():
            direct["maxQueueDelayMicroseconds"] = d(st.sampled_from([0, 100]))
        if d.maybe():
            direct["minimumSlotUtilization"] = d(st.sampled_from([0.0, 0.5, 1.0]))
        if d.stray("slot-utilization"):
            direct["minimumSlotUtilization"] = d(st.sampled_from([-0.1, 1.5]))
        s["direct"] = direct
    if strategy == "oldest" or d.stray("both-strategies"):
        oldest: dict[str, Any] = {"maxCandidateSequences": d(st.integers(1, 4))}
        preferred = _preferred(d, mbs)
        if d.stray("oldest-preferred"):
            preferred = (preferred or []) + [mbs + 1]
        if preferred is not None:
            oldest["preferredBatchSize"] = preferred
        if d.maybe():
            oldest["maxQueueDelayMicroseconds"] = d(st.sampled_from([0, 100]))
        if d.maybe():
            oldest["preserveOrdering"] = d(st.booleans())
        s["oldest"] = oldest
    if d.maybe():
        s["maxSequenceIdleMicroseconds"] = d(st.sampled_from([1, 1_000_000, 5_000_000]))
    kinds = d(st.lists(st.sampled_from(["START", "END", "READY", "CORRID"]), max_size=4, unique=True))
    if d.stray("corrid-type") and "CORRID" not in kinds:
        kinds.append("CORRID")
    if (d.stray("control-type") or d.stray("false-true")) and kinds in ([], ["CORRID"]):
        kinds.insert(0, d(st.sampled_from(["START", "END", "READY"])))
    if not kinds and (d.stray("control-twice") or d.stray("control-is-input")):
        kinds.append("START")
    controls = []
    for kind in kinds:
        c: dict[str, Any] = {"name": f"CTL_{kind}", "kind": kind}
        if kind == "CORRID":
            c["dataType"] = d(st.sampled_from(CORRID_TYPES))
            if d.stray("corrid-type"):
                c["dataType"] = d(st.sampled_from(["FP32", "BOOL", "INT8", "FP64"]))
        else:
            if d.maybe(3, 4):
                c["dataType"] = d(st.sampled_from(CONTROL_TYPES))
            if d.stray("control-type"):
                c["dataType"] = d(st.sampled_from(["INT64", "UINT8", "BYTES", "FP16"]))
            false_true = _false_true(d, c.get("dataType", "INT32"))
            if false_true is not None:
                c["falseTrue"] = false_true
        controls.append(c)
    if controls and d.stray("control-twice"):
        twin = dict(controls[0])
        if d.maybe():
            twin["name"] = "CTL_OTHER"  # the same kind twice
        else:
            twin["kind"] = "READY" if twin["kind"] != "READY" else "END"  # one tensor, two kinds
            twin.pop("falseTrue", None)
            twin["dataType"] = "INT32"
        controls.append(twin)
    if controls and input_names and d.stray("control-is-input"):
        controls[0]["name"] = input_names[0]
    if controls:
        s["controlInputs"] = controls
    if d.maybe(1, 4):  # an implicit state tensor
        state: dict[str, Any] = {"inputName": "STATE_IN", "outputName": "STATE_OUT",
                                 "dataType": d(st.sampled_from(DTYPES)), "dims": _dims(d)}  # fmt: skip
        if d.maybe():
            state["zeroInitialState"] = True
        s["state"] = [state]
    return s


def _data_file(d: _Draw, dtype: str, dims: list[int]) -> bytes:
    count = math.prod(dims)
    if dtype == "BYTES":
        elements = [d(st.binary(max_size=6)) for _ in range(count)]
        data = b"".join(struct.pack("<I", len(e)) + e for e in elements)
        if d.stray("warmup-file"):
            data = data[:-1] if data else b"\x01"
        return data
    need = count * ELEMENT_SIZE[dtype]
    if dtype == "BOOL":
        data = bytes(d(st.lists(st.integers(0, 1), min_size=need, max_size=need)))
    else:
        data = d(st.binary(min_size=need, max_size=need))
    if d.maybe(1, 4):
        data += b"\0" * d(st.integers(1, 8))  # more bytes than needed: Triton reads what it needs
    if d.stray("warmup-file"):
        data = data[: need - 1]
    return data


def _warmup(d: _Draw, inputs: list[dict[str, Any]], mbs: int, files: dict[str, str]) -> list[dict[str, Any]]:
    samples = []
    for n in range(d(st.integers(1, 2))):
        batch = d(st.integers(1, min(mbs, 4))) if mbs else 1
        if d.stray("warmup-batch"):
            batch = mbs + 1
        sample: dict[str, Any] = {"name": f"sample{n}", "batchSize": batch}
        if d.maybe(1, 3):
            sample["count"] = d(st.integers(1, 3))
        data: dict[str, Any] = {}
        for t in inputs:
            if t.get("optional") and not d.defects & NEEDS_INPUTS and d.maybe():
                continue
            dims = [x if x != -1 else d(st.integers(1, 3)) for x in t["dims"]]
            if d.stray("warmup-variable") and -1 in t["dims"]:
                dims = list(t["dims"])
            if d.stray("warmup-dims"):
                dims = dims + [1] if d.maybe() else [x + 1 for x in dims] or [2]
            dtype = t["dataType"]
            if d.stray("warmup-type"):
                dtype = d(st.sampled_from([x for x in DTYPES if x != dtype]))
            entry: dict[str, Any] = {"dataType": dtype, "dims": dims}
            source = "inputDataFile" if d.stray("warmup-file") else d(st.sampled_from(["zeroData", "randomData", "inputDataFile"]))
            if source == "inputDataFile" and all(x >= 1 for x in dims) and dtype in ELEMENT_SIZE | {"BYTES": 0}:
                fname = f"s{n}-{len(files)}.bin"
                files[fname] = base64.b64encode(_data_file(d, dtype, dims)).decode()
                entry["inputDataFile"] = fname
            else:
                entry["randomData" if source == "randomData" else "zeroData"] = True
            if d.stray("warmup-data"):
                entry.pop("inputDataFile", None)
                if d.maybe():
                    entry["zeroData"], entry["randomData"] = True, True
                else:
                    entry.pop("randomData", None)
                    entry["zeroData"] = False
            data[t["name"]] = entry
        required = [t["name"] for t in inputs if not t.get("optional") and t["name"] in data]
        if required and d.stray("warmup-missing"):
            data.pop(required[0])
        if d.stray("warmup-unknown"):
            data["NOT_AN_INPUT"] = {"dataType": "FP32", "dims": [1], "zeroData": True}
        if d.stray("warmup-empty"):
            data = {}
        sample["inputs"] = data
        samples.append(sample)
    return samples


def _instance_groups(d: _Draw) -> list[dict[str, Any]] | None:
    if d.maybe(1, 4) and not d.stray("gpus-on-cpu"):
        return None  # Triton's default
    groups = []
    for _ in range(d(st.integers(1, 2))):
        kind = d(st.sampled_from(["CPU", "CPU", "CPU", "GPU", "AUTO", "MODEL"]))
        g: dict[str, Any] = {"kind": kind, "count": d(st.integers(1, 2)) if not groups else 1}
        if kind == "GPU" and d.maybe():
            g["gpus"] = [0]
        groups.append(g)
    if d.stray("gpus-on-cpu"):
        groups[0] = {"kind": "CPU", "count": 1, "gpus": [0]}
    return groups


PARAM_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=16)


#: Defects that need a context: a sequence batcher, a dynamic batcher, batching on or off, a warm-up.
NEEDS_SEQUENCE = {"corrid-type", "control-type", "false-true", "control-twice", "control-is-input",
                  "slot-utilization", "oldest-preferred", "both-strategies"}  # fmt: skip
NEEDS_BATCHER = {"preferred-over", "preferred-zero", "preferred-not-batching", "default-priority",
                 "queue-policy-level", "preserve-priorities", "preserve-delay"}  # fmt: skip
NEEDS_BATCHING = {"mbs-zero", "preferred-over", "oldest-preferred", "warmup-batch", "warmup-empty"}
NEEDS_WARMUP = {"warmup-batch", "warmup-type", "warmup-dims", "warmup-variable", "warmup-missing",
                "warmup-unknown", "warmup-data", "warmup-file", "warmup-empty"}  # fmt: skip
NEEDS_INPUTS = NEEDS_WARMUP - {"warmup-batch", "warmup-unknown", "warmup-empty"} | {
    "control-is-input", "dim-zero", "dim-negative", "dims-empty", "reshape", "duplicate-tensor"}


@st.composite
def tritonmodels(draw: Any, defects: frozenset[str] | None = None) -> dict[str, Any]:
    """A TritonModel document (no metadata.name yet): valid, or straying over a few rule boundaries
    (`defects`, drawn when not given)."""
    if defects is None:
        # none (5 in 8), one (2 in 8) or two; picked with a drawn seed, which spreads the picks evenly
        # (hypothesis' own sampled_from and lists favour the first few and repeat what they drew)
        pick = random.Random(draw(st.integers(0, 2**64)))
        defects = frozenset(pick.sample(DEFECTS, pick.choice([0, 0, 0, 0, 0, 1, 1, 2])))
    d = _Draw(draw, defects)
    spec: dict[str, Any] = {"backend": "python"}
    batching = True if defects & NEEDS_BATCHING else False if d.stray("preferred-not-batching") else d.maybe(3, 4)
    if batching:
        spec["maxBatchSize"] = 0 if d.stray("mbs-zero") else d(st.sampled_from([1, 2, 3, 4, 8, 16]))
    else:
        spec["batching"] = False
        if d.maybe(1, 4):
            spec["maxBatchSize"] = d(st.sampled_from([0, 4]))  # ignored without batching
    mbs = spec["maxBatchSize"] if batching else 0
    inputs = _tensors(d, "INPUT", batching, is_input=True, low=1 if defects & NEEDS_INPUTS or d.maybe(7, 8) else 0)
    if d.stray("warmup-variable") and not any(-1 in t["dims"] for t in inputs):
        inputs[0]["dims"] = [-1]
        inputs[0].pop("reshape", None)
    if d.stray("warmup-missing"):
        inputs[0].pop("optional", None)
    if d.stray("reshape") and "reshape" not in inputs[0]:
        inputs[0]["reshape"] = [math.prod(inputs[0]["dims"]) + 1] if -1 not in inputs[0]["dims"] else [2, -1, 2, -1]
    outputs = _tensors(d, "OUTPUT", batching, is_input=False, low=0 if d.maybe(1, 8) else 1)
    if inputs:
        spec["inputs"] = inputs
    if outputs:
        spec["outputs"] = outputs
    if defects & NEEDS_SEQUENCE:
        scheduling = "sequence"
    elif defects & NEEDS_BATCHER:
        scheduling = "batcher"
    else:
        scheduling = d(st.sampled_from(["none", "batcher", "batcher", "sequence"]))
    if scheduling == "batcher" or d.stray("both-schedulers"):
        spec["batcher"] = _batcher(d, mbs)
    if scheduling == "sequence" or d.stray("both-schedulers") or d.stray("cache-sequence"):
        spec["sequenceBatcher"] = _sequence_batcher(d, mbs, [t["name"] for t in inputs])
    if d.maybe(1, 4):
        spec["decoupled"] = True
    if (d.maybe(1, 4) and "sequenceBatcher" not in spec and not spec.get("decoupled")) or any(
        d.stray(x) for x in ("cache-decoupled", "cache-sequence", "cache-size")
    ):
        spec["responseCache"] = True
        if d.stray("cache-decoupled"):
            spec["decoupled"] = True
        if d.stray("cache-size"):
            spec["server"] = {"cacheSize": "0"}
    files: dict[str, str] = {}
    if defects & NEEDS_WARMUP or d.maybe(2, 3):
        spec["modelWarmup"] = _warmup(d, inputs, mbs, files)
    groups = _instance_groups(d)
    if groups is not None:
        spec["instanceGroups"] = groups
    if d.maybe(1, 3):
        spec["parameters"] = d(st.dictionaries(PARAM_TEXT.filter(bool), PARAM_TEXT, max_size=3))
    source: dict[str, Any] = {"inline": {"model.py": GENERIC_MARKER}}
    if files:
        source["warmupFiles"] = files
    if d.stray("no-model-py"):
        source["inline"] = {"util.py": "VALUE = 1\n"}
    if d.stray("inline-and-uri"):
        source["uri"] = "s3://bucket/model"
    if not d.stray("no-source"):
        spec["source"] = source
    if d.stray("backend-and-platform"):
        spec["platform"] = "onnxruntime_onnx"
    if d.maybe(1, 4):
        spec["modelName"] = "MODELNAME"  # replaced by a unique Triton name with '_' and '.'
    return {"apiVersion": API_VERSION, "kind": "TritonModel", "metadata": {"name": "NAME"}, "spec": spec}


def _named(doc: dict[str, Any], n: int) -> dict[str, Any]:
    """The document with a unique name (and Triton name, when modelName is set) and the generic model's code."""
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": f"prop-{n:04d}"}
    if "modelName" in doc["spec"]:
        doc["spec"]["modelName"] = f"Prop_{n:04d}.v1"
    inline = (doc["spec"].get("source") or {}).get("inline") or {}
    if inline.get("model.py") == GENERIC_MARKER:
        inline["model.py"] = GENERIC_MODEL
    return doc


def _show(doc: dict[str, Any]) -> str:
    """The spec as YAML, with the generic model's code abbreviated."""
    shown = yaml.safe_load(yaml.safe_dump(doc))
    inline = (shown["spec"].get("source") or {}).get("inline") or {}
    if inline.get("model.py") == GENERIC_MODEL:
        inline["model.py"] = GENERIC_MARKER
    return yaml.safe_dump(shown, sort_keys=False, allow_unicode=True)


# ---------------------------------------------------------------- regressions found by this test

#: A batching model's warm-up sample without any input: tritonserver refuses it ("request has 0
#: inputs"), or crashes with SIGSEGV when the model's inputs are all optional. Accepted by the
#: validator until rule `warmup-empty`.
EMPTY_WARMUP_ALL_OPTIONAL = {
    "apiVersion": API_VERSION,
    "kind": "TritonModel",
    "metadata": {"name": "NAME"},
    "spec": {
        "backend": "python",
        "maxBatchSize": 4,
        "inputs": [{"name": "INPUT0", "dataType": "FP32", "dims": [4], "optional": True}],
        "outputs": [{"name": "OUTPUT0", "dataType": "FP32", "dims": [4]}],
        "modelWarmup": [{"name": "sample0", "batchSize": 1, "inputs": {}}],
        "instanceGroups": [{"kind": "CPU", "count": 1}],
        "source": {"inline": {"model.py": GENERIC_MARKER}},
    },
}
EMPTY_WARMUP_NO_INPUTS = {
    **EMPTY_WARMUP_ALL_OPTIONAL,
    "spec": {k: v for k, v in EMPTY_WARMUP_ALL_OPTIONAL["spec"].items() if k != "inputs"},
}


# ---------------------------------------------------------------- the generator strays on purpose (no Triton)


#: The rule that must refuse each stray (the validator's own rule ids, or "schema").
EXPECTED_RULE = {
    "mbs-zero": {"max-batch-size"}, "preferred-over": {"preferred-batch-size"},
    "preferred-zero": {"preferred-batch-size"}, "preferred-not-batching": {"preferred-batch-size"},
    "default-priority": {"default-priority-level"}, "queue-policy-level": {"priority-queue-policy"},
    "preserve-priorities": {"preserve-ordering"}, "preserve-delay": {"preserve-ordering"},
    "cache-decoupled": {"response-cache-decoupled"}, "cache-sequence": {"response-cache-sequence"},
    "cache-size": {"response-cache-size"}, "corrid-type": {"sequence-control"}, "control-type": {"sequence-control"},
    "false-true": {"sequence-control"}, "control-twice": {"sequence-control"}, "control-is-input": {"sequence-control"},
    "slot-utilization": {"sequence-strategy"}, "oldest-preferred": {"preferred-batch-size", "sequence-strategy"},
    "both-strategies": {"sequence-strategy"}, "both-schedulers": {"scheduling-oneof"}, "dim-zero": {"dims"},
    "dim-negative": {"schema"}, "dims-empty": {"dims"}, "reshape": {"reshape"}, "duplicate-tensor": {"dims"},
    "gpus-on-cpu": {"instance-group"}, "no-model-py": {"python-model-file"}, "no-source": {"source"},
    "inline-and-uri": {"source"}, "warmup-batch": {"warmup-batch-size"}, "warmup-type": {"warmup-inputs"},
    "warmup-dims": {"warmup-inputs"}, "warmup-variable": {"warmup-inputs"}, "warmup-missing": {"warmup-inputs"},
    "warmup-unknown": {"warmup-inputs"}, "warmup-data": {"warmup-data"}, "warmup-file": {"warmup-file"},
    "warmup-empty": {"warmup-empty"}, "backend-and-platform": {"backend-or-platform"},
}  # fmt: skip


def _check(doc: dict[str, Any]) -> list[Any]:
    return check_documents(load_documents(yaml.safe_dump(_named(doc, 0)), "<generated>")).errors


def test_every_defect_has_its_rule() -> None:
    assert set(EXPECTED_RULE) == set(DEFECTS)


@pytest.mark.parametrize("defect", DEFECTS)
def test_each_stray_is_refused_by_its_rule(defect: str) -> None:
    """Without a server: every spec that crosses boundary `defect` is refused, by the rule for it."""

    @settings(max_examples=15, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(doc=tritonmodels(frozenset({defect})))
    def run(doc: dict[str, Any]) -> None:
        errors = _check(doc)
        listing = "\n".join(f"  [{e.rule}] {e}" for e in errors) or "  (none: accepted)"
        assert {e.rule for e in errors} & EXPECTED_RULE[defect], (
            f"{defect}: not refused by {sorted(EXPECTED_RULE[defect])}; errors:\n{listing}\n--- spec ---\n{_show(doc)}"
        )

    run()


def test_generator_writes_valid_and_invalid_specs() -> None:
    """Without a server: the free-running strategy yields a mix of accepted and refused specs."""
    accepted, refused = 0, 0

    @seed(SEED)
    @settings(max_examples=200, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(doc=tritonmodels())
    def run(doc: dict[str, Any]) -> None:
        nonlocal accepted, refused
        if _check(doc):
            refused += 1
        else:
            accepted += 1

    run()
    assert accepted >= 80 and refused >= 40, f"accepted {accepted}, refused {refused} of 200: the mix is off"


# ---------------------------------------------------------------- the property, against a real tritonserver


#: What a gRPC call says when the server went away under it (as opposed to Triton refusing a load).
TRANSPORT_ERRORS = ("Socket closed", "Stream removed", "failed to connect", "Connection reset", "Broken pipe")


def _died(server: Any, reason: str) -> bool:
    """Whether tritonserver exited; after a transport error give the dying process a few seconds."""
    if any(m in reason for m in TRANSPORT_ERRORS):
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return False
    return server.process.poll() is not None


def _log_since(server: Any, offset: int, limit: int = 4000) -> str:
    with open(server.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")[-limit:]


def _load_and_check(triton: SharedTriton, doc: dict[str, Any], stats: Counter[str], load_times: list[float]) -> None:
    loaded = check_documents(load_documents(yaml.safe_dump(doc), "<generated>"))
    if loaded.errors:
        stats["refused"] += 1
        return
    stats["accepted"] += 1
    models = [m for _, m in loaded.models]
    rendered = render_repository(models, cpu_only=True)  # as `triton-operator validate --cpu`: no GPUs here
    server, client = triton.get()
    repo = Path(server.model_repository)
    write_repository(rendered, repo)
    (r,) = rendered.values()
    name = r.name
    log_start = server.log_path.stat().st_size
    started = time.monotonic()
    reason = ""
    try:
        client.load_model(name, client_timeout=LOAD_TIMEOUT)
        ready = client.is_model_ready(name)
    except InferenceServerException as exc:
        ready, reason = False, exc.message() or str(exc)
    seconds = time.monotonic() - started
    crashed = _died(server, reason)
    stuck = not crashed and "Deadline" in reason
    log = _log_since(server, log_start)
    if crashed or stuck:
        triton.discard()  # the next example gets a fresh server
    elif ready:
        client.unload_model(name)
    assert ready, (
        f"the validator accepted this spec but tritonserver did not load it "
        f"({'tritonserver CRASHED' if crashed else 'stuck LOADING' if stuck else 'refused'} after {seconds:.1f}s).\n"
        f"Triton's reason: {reason or 'not READY after load'}\n"
        f"--- spec ---\n{_show(doc)}--- rendered config.pbtxt ---\n{r.config_pbtxt}"
        f"--- tritonserver log since the load ---\n{log}"
    )
    stats["loaded"] += 1
    load_times.append(seconds)


@pytest.mark.triton
@pytest.mark.parametrize("doc", [EMPTY_WARMUP_ALL_OPTIONAL, EMPTY_WARMUP_NO_INPUTS], ids=["all-optional", "no-inputs"])
def test_an_empty_warmup_sample_really_breaks_triton(doc: dict[str, Any], tmp_path: Path) -> None:
    """The defect behind rule `warmup-empty`, rendered anyway (schema only) into a throwaway server:
    Triton refuses the load, or dies."""
    from triton_operator.api.v1alpha1 import TritonModel
    from triton_operator.triton.local import LocalTritonServer

    doc = _named(doc, 0)
    assert {e.rule for e in _check(doc)} == {"warmup-empty"}
    rendered = render_repository([TritonModel.model_validate(doc)])
    repo = write_repository(rendered, tmp_path / "repo")
    server = LocalTritonServer(model_repository=repo, log_path=tmp_path / "tritonserver.log",
                               extra_args=["--exit-timeout-secs=2"]).start()  # fmt: skip
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            client.load_model("prop-0000", client_timeout=LOAD_TIMEOUT)
            ready, reason = client.is_model_ready("prop-0000"), ""
        except InferenceServerException as exc:
            ready, reason = False, exc.message() or str(exc)
        crashed = _died(server, reason)
    finally:
        server.stop(grace=3)
    assert not ready, "tritonserver loaded a batching model whose warm-up sample has no inputs: rule warmup-empty is moot"
    assert crashed or "request has 0 inputs" in reason, f"refused for another reason: {reason}\n{server.log_tail(30)}"


@pytest.mark.triton
@pytest.mark.timeout(scaled(600))
def test_any_spec_the_validator_accepts_loads_in_triton(triton: SharedTriton, record_property: Any) -> None:
    stats: Counter[str] = Counter()
    load_times: list[float] = []
    serial = iter(range(1, 1_000_000))
    started = time.monotonic()

    @seed(SEED)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, phases=PHASES,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])  # fmt: skip
    @example(doc=EMPTY_WARMUP_ALL_OPTIONAL)
    @example(doc=EMPTY_WARMUP_NO_INPUTS)
    @given(doc=tritonmodels())
    def prop(doc: dict[str, Any]) -> None:
        stats["generated"] += 1
        _load_and_check(triton, _named(doc, next(serial)), stats, load_times)

    prop()
    elapsed = time.monotonic() - started
    summary = (
        f"{stats['generated']} specs generated, {stats['accepted']} accepted by the validator, "
        f"{stats['loaded']} loaded READY in tritonserver, {stats['refused']} refused; "
        f"{elapsed:.1f}s, {triton.starts} server start(s), mean load {sum(load_times) / max(1, len(load_times)):.2f}s"
    )
    print(f"\nproperty: {summary}")
    record_property("property", summary)
    assert stats["loaded"] >= MIN_LOADED, f"too few accepted specs were loaded to mean anything: {summary}"
    assert stats["refused"] >= MAX_EXAMPLES // 6, f"too few specs strayed over a rule: {summary}"
