"""`triton-operator import`: an existing model repository -> TritonModel YAML -> rendered again gives
back an equivalent ModelConfig, for every example and for hand-written configs typical of real
repositories. The only differences allowed are our digest parameter, instance group names (Triton makes
them up), the defaults Triton itself fills in, and the fields the importer reports as dropped.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import cli, configs_under, diff, normalized, without_digest
from tests.triton_helpers import EXAMPLES
from triton_operator.files import load_paths
from triton_operator.importer import parse_config
from triton_operator.validate import check_documents

EXAMPLE_FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
GENERIC_MODEL = (Path(__file__).parent / "models" / "generic_model.py").read_text()
CONSOLE_SCRIPT = Path(sys.executable).parent / "triton-operator"


# ---------------------------------------------------------------- helpers


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- every example round-trips


@pytest.mark.parametrize("example", EXAMPLE_FILES)
def test_example_import_render_round_trip(example: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """render example -> repo; import repo -> YAML; render YAML -> repo2: same ModelConfigs, same files."""
    first, second, imported = tmp_path / "rendered", tmp_path / "re-rendered", tmp_path / "imported.yaml"
    rc, _, err = cli(["render", str(EXAMPLES / example), "-o", str(first)], capsys)
    assert rc == 0, err
    rc, _, err = cli(["import", str(first), "-o", str(imported)], capsys)
    assert rc == 0, err
    assert "warning" not in err, f"importing a repository we rendered dropped something:\n{err}"

    loaded = check_documents(load_paths([imported]))
    assert not loaded.errors, "the imported YAML fails the operator's checks:\n" + "\n".join(map(str, loaded.errors))
    rc, _, err = cli(["render", str(imported), "-o", str(second)], capsys)
    assert rc == 0, err

    before, after = configs_under(first), configs_under(second)
    assert sorted(before) == sorted(after)
    for name in before:
        a, b = without_digest(before[name]), without_digest(after[name])
        assert a == b, f"{example}: {name} differs after import -> render:\n{diff(a, b, 'rendered', 're-rendered')}"
    # the inline files (and warm-up files, and an ensemble's placeholder) come back byte for byte
    files_before = {k: v for k, v in files_under(first).items() if not k.endswith("config.pbtxt")}
    files_after = {k: v for k, v in files_under(second).items() if not k.endswith("config.pbtxt")}
    assert files_before == files_after
    # with equal configs and files the digest is the same, so the repository is identical byte for byte
    assert files_under(first) == files_under(second)


# ---------------------------------------------------------------- hand-written repositories

#: Six configs in the style of real repositories (plus the two steps of the ensemble). Each `# warns:`
#: line lists the fields `import` must report as dropped.
HAND_WRITTEN = {
    "text_classifier": """
name: "text_classifier"
backend: "python"
max_batch_size: 8
input [
  {
    name: "INPUT_IDS"
    data_type: TYPE_INT64
    dims: [ -1 ]
  },
  {
    name: "ATTENTION_MASK"
    data_type: TYPE_INT64
    dims: [ -1 ]
    optional: true
  }
]
output [
  {
    name: "LOGITS"
    data_type: TYPE_FP32
    dims: [ 2 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
instance_group [
  {
    name: "text_classifier_cpu"
    count: 2
    kind: KIND_CPU
  }
]
parameters: {
  key: "threshold"
  value: { string_value: "0.5" }
}
""",
    "image_resize": """
name: "image_resize"
backend: "python"
max_batch_size: 0
input [
  {
    name: "IMAGE"
    data_type: TYPE_UINT8
    dims: [ -1, -1, 3 ]
  }
]
output [
  {
    name: "RESIZED"
    data_type: TYPE_FP32
    dims: [ 3, 64, 64 ]
    reshape: { shape: [ 3, 4096 ] }
  }
]
instance_group [ { kind: KIND_CPU } ]
model_transaction_policy {
  decoupled: True
}
""",
    "pipeline": """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [
  {
    name: "TEXT"
    data_type: TYPE_STRING
    dims: [ 1 ]
  }
]
output [
  {
    name: "SCORES"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
ensemble_scheduling {
  step [
    {
      model_name: "tokenize"
      model_version: -1
      input_map {
        key: "TEXT"
        value: "TEXT"
      }
      output_map {
        key: "TOKENS"
        value: "tokens"
      }
    },
    {
      model_name: "score_tokens"
      model_version: 1
      input_map {
        key: "TOKENS"
        value: "tokens"
      }
      output_map {
        key: "SCORES"
        value: "SCORES"
      }
    }
  ]
}
""",
    "tokenize": """
name: "tokenize"
backend: "python"
max_batch_size: 16
input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "TOKENS", data_type: TYPE_INT64, dims: [ 32 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
""",
    "score_tokens": """
name: "score_tokens"
backend: "python"
max_batch_size: 8
input [ { name: "TOKENS", data_type: TYPE_INT64, dims: [ 32 ] } ]
output [ { name: "SCORES", data_type: TYPE_FP32, dims: [ 4 ] } ]
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_CPU } ]
""",
    "stateful": """
name: "stateful"
backend: "python"
max_batch_size: 4
input [ { name: "DELTA", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "TOTAL", data_type: TYPE_FP32, dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest {
    max_candidate_sequences: 4
    preferred_batch_size: [ 2, 4 ]
    max_queue_delay_microseconds: 1000
  }
  control_input [
    {
      name: "START"
      control [ { kind: CONTROL_SEQUENCE_START, fp32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "READY"
      control [ { kind: CONTROL_SEQUENCE_READY, int32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "END"
      control [ { kind: CONTROL_SEQUENCE_END, bool_false_true: [ false, true ] } ]
    },
    {
      name: "CORRID"
      control [ { kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_STRING } ]
    }
  ]
}
instance_group [ { count: 1, kind: KIND_CPU } ]
""",
    "ranker": """
name: "ranker"
backend: "python"
max_batch_size: 4
input [ { name: "QUERY", data_type: TYPE_FP16, dims: [ 8 ] } ]
output [ { name: "RANK", data_type: TYPE_INT32, dims: [ 1 ] } ]
dynamic_batching {
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 100000
    allow_timeout_override: true
    max_queue_size: 16
  }
  priority_queue_policy {
    key: 1
    value { timeout_action: REJECT, default_timeout_microseconds: 50000, max_queue_size: 4 }
  }
  priority_queue_policy {
    key: 3
    value { max_queue_size: 64 }
  }
}
response_cache { enable: true }
instance_group [ { kind: KIND_CPU } ]
""",
    "legacy_detector": """
# warns: optimization
name: "legacy_detector"
backend: "python"
max_batch_size: 2
version_policy: { latest { num_versions: 2 } }
input [
  {
    name: "INPUT__0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 8, 8 ]
  }
]
output [
  {
    name: "OUTPUT__0"
    data_type: TYPE_FP32
    dims: [ 10 ]
    label_filename: "labels.txt"
  }
]
optimization { input_pinned_memory { enable: false } }
instance_group [ { count: 1, kind: KIND_CPU } ]
model_warmup [
  {
    name: "from_file"
    batch_size: 2
    count: 1
    inputs {
      key: "INPUT__0"
      value: { data_type: TYPE_FP32, dims: [ 3, 8, 8 ], input_data_file: "input0.bin" }
    }
  },
  {
    name: "random"
    batch_size: 1
    count: 3
    inputs {
      key: "INPUT__0"
      value: { data_type: TYPE_FP32, dims: [ 3, 8, 8 ], random_data: true }
    }
  }
]
""",
}
#: Dropped on import, and said so: (model, what the warning names).
EXPECTED_WARNINGS = {
    ("legacy_detector", "'optimization'"),
}
WARMUP_FILE = bytes(range(256)) * 3  # 3*8*8 FP32 = 768 bytes
#: legacy_detector's version 1: its policy (latest 2) serves it next to version 2, so it is imported and loads too.
OLD_VERSION_MODEL = GENERIC_MODEL + "\n# the old version\n"


def write_hand_written_repository(root: Path) -> Path:
    """The configs above as a model repository, the way people lay them out (code in 1/, an ensemble's
    empty 1/, an old version 1/ next to 2/ that the policy serves too, a labels file, warm-up data)."""
    for name, text in HAND_WRITTEN.items():
        d = root / name
        (d / "1").mkdir(parents=True)
        (d / "config.pbtxt").write_text(text.lstrip())
        if "platform: \"ensemble\"" not in text:
            (d / "1" / "model.py").write_text(GENERIC_MODEL)
    legacy = root / "legacy_detector"
    (legacy / "2").mkdir()
    (legacy / "2" / "model.py").write_text(GENERIC_MODEL)
    (legacy / "1" / "model.py").write_text(OLD_VERSION_MODEL)
    (legacy / "labels.txt").write_text("\n".join(f"class{i}" for i in range(10)) + "\n")
    (legacy / "warmup").mkdir()
    (legacy / "warmup" / "input0.bin").write_bytes(WARMUP_FILE)
    return root


def warned_fields(stderr: str, model: str) -> list[str]:
    return re.findall(rf"warning: {re.escape(model)}: field '([^']+)' is not supported", stderr)


@pytest.fixture
def hand_written(tmp_path: Path) -> Path:
    return write_hand_written_repository(tmp_path / "repository")


def test_hand_written_configs_round_trip(hand_written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    imported = tmp_path / "imported.yaml"
    rc, _, import_err = cli(["import", str(hand_written), "-o", str(imported)], capsys)
    assert rc == 0, import_err

    # every dropped field is reported, naming it, and nothing else is
    warnings = [ln for ln in import_err.splitlines() if ln.startswith("warning:")]
    for model, what in EXPECTED_WARNINGS:
        assert any(ln.startswith(f"warning: {model}:") and what in ln for ln in warnings), (
            f"no warning names {what} of {model}; stderr:\n{import_err}"
        )
    assert len(warnings) == len(EXPECTED_WARNINGS), f"unexpected warnings:\n{import_err}"

    loaded = check_documents(load_paths([imported]))
    assert not loaded.errors, "the imported YAML fails the operator's checks:\n" + "\n".join(map(str, loaded.errors))
    docs = {d["spec"].get("modelName", d["metadata"]["name"]): d for d in yaml.safe_load_all(imported.read_text())}
    assert sorted(docs) == sorted(HAND_WRITTEN)
    # Triton names that are not DNS labels keep their Triton name in spec.modelName
    assert docs["text_classifier"]["metadata"]["name"] == "text-classifier"
    assert docs["pipeline"]["spec"]["ensemble"]["steps"][1]["model"] == "score-tokens"

    rerendered = tmp_path / "re-rendered"
    rc, _, err = cli(["render", str(imported), "-o", str(rerendered)], capsys)
    assert rc == 0, err
    after = configs_under(rerendered)
    for name, text in HAND_WRITTEN.items():
        original = parse_config(text)
        dropped = warned_fields(import_err, name)
        a, b = normalized(original, dropped), normalized(after[name])
        assert a == b, f"{name} differs after import -> render:\n{diff(a, b, 'hand-written', 're-rendered')}"
        if dropped:  # control: the reported fields are really what differs
            assert normalized(original) != b

    # every version directory with its own code, the policy, warm-up data byte for byte, the ensemble gets its 1/
    legacy = docs["legacy_detector"]["spec"]
    assert [v["version"] for v in legacy["versions"]] == [1, 2] and "source" not in legacy
    assert legacy["versionPolicy"] == {"latest": 2}
    assert (rerendered / "legacy_detector" / "1" / "model.py").read_text() == OLD_VERSION_MODEL
    assert (rerendered / "legacy_detector" / "2" / "model.py").read_text() == GENERIC_MODEL
    assert (rerendered / "legacy_detector" / "warmup" / "input0.bin").read_bytes() == WARMUP_FILE
    # the labels beside config.pbtxt come along as a model-level file, byte for byte
    assert legacy["modelFiles"] == {"inline": {"labels.txt": (hand_written / "legacy_detector" / "labels.txt").read_text()}}
    assert (rerendered / "legacy_detector" / "labels.txt").read_bytes() == (
        hand_written / "legacy_detector" / "labels.txt").read_bytes()
    assert base64.b64decode(legacy["versions"][0]["source"]["warmupFiles"]["input0.bin"]) == WARMUP_FILE
    for name in HAND_WRITTEN:
        if name not in ("pipeline", "legacy_detector"):
            assert (rerendered / name / "1" / "model.py").read_text() == GENERIC_MODEL
    assert (rerendered / "pipeline" / "1").is_dir()


# ---------------------------------------------------------------- the CLI, in-process and as installed


def test_import_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli(["import", str(tmp_path / "nope")], capsys)
    assert rc == 1 and "is not a directory" in err
    rc, _, err = cli(["import", str(tmp_path)], capsys)
    assert rc == 1 and "no <model>/config.pbtxt" in err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text('name: "broken"\nmax_batch_size: "eight"\n')
    rc, _, err = cli(["import", str(tmp_path)], capsys)
    assert rc == 1 and "broken/config.pbtxt" in err and "max_batch_size" in err


def test_import_console_script(hand_written: Path, tmp_path: Path) -> None:
    """The installed `triton-operator` entry point, as a user runs it (argument array, no shell)."""
    assert CONSOLE_SCRIPT.exists(), f"console script not installed at {CONSOLE_SCRIPT}"
    out = tmp_path / "imported.yaml"
    proc = subprocess.run(
        [str(CONSOLE_SCRIPT), "import", str(hand_written), "-o", str(out), "-n", "serving"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "version_policy" not in proc.stderr, "version_policy is imported (spec.versionPolicy), not dropped"
    assert f"Wrote {len(HAND_WRITTEN)} TritonModel(s) to {out}" in proc.stderr
    docs = list(yaml.safe_load_all(out.read_text()))
    assert {d["metadata"]["namespace"] for d in docs} == {"serving"}
    loaded = check_documents(load_paths([out]))
    assert not loaded.errors, "\n".join(map(str, loaded.errors))

    # to stdout, then rendered by the console script too
    proc = subprocess.run([str(CONSOLE_SCRIPT), "import", str(hand_written)], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert list(yaml.safe_load_all(proc.stdout)) == [{**d, "metadata": {"name": d["metadata"]["name"]}} for d in docs]
    proc = subprocess.run([str(CONSOLE_SCRIPT), "render", str(out)], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("/config.pbtxt (TritonModel ") == len(HAND_WRITTEN)


# ---------------------------------------------------------------- imported YAML loads in a real tritonserver


@pytest.mark.triton
def test_imported_yaml_loads_ready_in_triton(hand_written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`triton-operator validate` (the console script) on imported YAML: two examples and the hand-written
    repository, every model READY in a real tritonserver after load and warm-up."""

    paths = []
    for example in ("add-sub.yaml", "sentiment-ensemble.yaml"):
        repo, out = tmp_path / Path(example).stem, tmp_path / f"{Path(example).stem}-imported.yaml"
        assert cli(["render", str(EXAMPLES / example), "-o", str(repo)], capsys)[0] == 0
        assert cli(["import", str(repo), "-o", str(out)], capsys)[0] == 0
        paths.append(out)
    out = tmp_path / "hand-written-imported.yaml"
    assert cli(["import", str(hand_written), "-o", str(out)], capsys)[0] == 0
    paths.append(out)

    proc = subprocess.run(
        [str(CONSOLE_SCRIPT), "validate", *map(str, paths), "--show-log", "--load-timeout", "60"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"validate failed:\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    expected = ["add-sub", "tokenizer", "classifier", "sentiment", *HAND_WRITTEN]
    for name in expected:
        assert re.search(rf"^{re.escape(name)}\s+READY\s+loaded and warmed in", proc.stdout, re.M), (
            f"{name} is not READY:\n{proc.stdout}\n{proc.stderr}"
        )
    assert "legacy_detector" in proc.stdout and "(2 warm-up sample(s)" in proc.stdout
    assert f"All {len(expected)} model(s) READY" in proc.stderr


# ---------------------------------------------------------------- ensembles Triton would refuse are refused at import

STEP_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{extra}
"""
JOIN_CONFIG = """
name: "join"
backend: "python"
max_batch_size: 4
input [ { name: "A", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "B", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
ENSEMBLE_CONFIG = """
name: "pipe"
platform: "ensemble"
max_batch_size: 4
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]
ensemble_scheduling { step [ %s ] }
"""


def _repository(root: Path, configs: dict[str, str], versions: dict[str, list[int]]) -> Path:
    for name, text in configs.items():
        d = root / name
        d.mkdir(parents=True)
        (d / "config.pbtxt").write_text(text)
        for v in versions.get(name, [1]):
            (d / str(v)).mkdir()
            if "ensemble" not in text:
                (d / str(v) / "model.py").write_text(GENERIC_MODEL)
    return root


def _version_repository(root: Path, step_version: int, versions: list[int]) -> Path:
    step = '{ model_name: "pre", model_version: %d, input_map { key: "IN", value: "x" }, output_map { key: "OUT", value: "y" } }'
    return _repository(root, {"pre": STEP_CONFIG.format(name="pre", extra=""), "pipe": ENSEMBLE_CONFIG % (step % step_version)},
                       {"pre": versions})


@pytest.mark.parametrize(("step_version", "versions", "why"), [
    (2, [1], "has no version 2"),
    (1, [1, 3], "does not serve version 1 (no versionPolicy: Triton serves the latest version only"),
])
def test_import_refuses_a_step_version_the_imported_model_does_not_serve(
        step_version: int, versions: list[int], why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = _version_repository(tmp_path / "repo", step_version, versions)
    rc, out, err = cli(["import", str(repo)], capsys)
    assert rc == 1, err
    assert out == "", "nothing is written for a repository with a defect"
    assert "TritonModel/pipe: spec.ensemble.steps[0].modelVersion: " in err and why in err, err


def test_import_keeps_the_version_a_step_pins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every version directory is imported under its own number: a step pinning the served one keeps its pin."""
    repo = _version_repository(tmp_path / "repo", 3, [1, 3])
    rc, out, err = cli(["import", str(repo)], capsys)
    assert rc == 0, err
    assert "warning" not in err, err
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(out)}
    assert docs["pipe"]["spec"]["ensemble"]["steps"][0]["modelVersion"] == 3
    assert [v["version"] for v in docs["pre"]["spec"]["versions"]] == [1, 3]


def test_import_refuses_an_ensemble_mixing_decoupled_streams(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = ('{ model_name: "stream", model_version: -1, input_map { key: "IN", value: "x" }, output_map { key: "OUT", value: "mid" } },'
             '{ model_name: "join", model_version: -1, input_map { key: "A", value: "mid" }, input_map { key: "B", value: "x" },'
             ' output_map { key: "OUT", value: "y" } }')
    repo = _repository(tmp_path / "repo", {
        "stream": STEP_CONFIG.format(name="stream", extra="model_transaction_policy { decoupled: true }"),
        "join": JOIN_CONFIG, "pipe": ENSEMBLE_CONFIG % steps}, {})
    rc, out, err = cli(["import", str(repo)], capsys)
    assert rc == 1 and out == "", err
    assert "TritonModel/pipe: spec.ensemble.steps[1].inputMap: inputs come from different streams" in err, err


# ---------------------------------------------------------------- what `import` reads: enums, links, sizes (issue 32)

PLAIN = ('name: "{name}"\nbackend: "python"\nmax_batch_size: 4\ninput {{ name: "a" data_type: TYPE_FP32 dims: 1 }}\n'
         'output {{ name: "b" data_type: TYPE_FP32 dims: 1 }}\ninstance_group {{ kind: KIND_CPU }}\n')


def _plain_repository(root: Path, configs: dict[str, str]) -> Path:
    for name, text in configs.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(text)
        (root / name / "1" / "model.py").write_text("# m\n")
    return root


def _console(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CONSOLE_SCRIPT), *args], capture_output=True, text=True, timeout=120, check=False)


def test_unknown_or_unset_enums_are_field_errors_not_tracebacks(tmp_path: Path) -> None:
    """Nine enum fields: each used to end in `KeyError: 0` (unset) or a ValueError (a number no release defines)."""
    repo = _plain_repository(tmp_path / "repo", {
        "seq": 'name: "seq"\nbackend: "python"\nmax_batch_size: 4\n'
               'input { name: "a" dims: 1 format: 9 }\n'                            # unset data_type, unknown format
               'output { name: "b" dims: 1 data_type: 42 }\n'                       # unknown data_type
               'instance_group { kind: 7 }\n'                                       # unknown kind
               'sequence_batching {\n'
               '  control_input { name: "S" control { kind: 9 } }\n'               # unknown control kind
               '  control_input { name: "C" control { kind: CONTROL_SEQUENCE_CORRID } }\n'  # unset CORRID data_type
               '  state { input_name: "si" output_name: "so" dims: 1 }\n'           # unset state data_type
               '}\n'
               'model_warmup { name: "w" batch_size: 1 inputs { key: "a" value { dims: 1 zero_data: true } } }\n',
        "dyn": PLAIN.format(name="dyn") + 'dynamic_batching { default_queue_policy { timeout_action: 5 } }\n',
    })
    proc = _console("import", str(repo))
    explain = f"exit {proc.returncode}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, explain
    problems = [ln.strip() for ln in proc.stderr.splitlines() if ln.startswith("  TritonModel/")]
    assert [p.split(": ")[1] for p in problems] == [
        "spec.batcher.defaultQueuePolicy.timeoutAction",
        "spec.inputs[0].dataType", "spec.inputs[0].format", "spec.instanceGroups[0].kind",
        "spec.modelWarmup[0].inputs.a.dataType", "spec.outputs[0].dataType",
        "spec.sequenceBatcher.controlInputs[0].kind", "spec.sequenceBatcher.controlInputs[1].dataType",
        "spec.sequenceBatcher.state[0].dataType",
    ], explain
    assert "TritonModel/seq: spec.outputs[0].dataType: 42 is no DataType" in proc.stderr, explain
    assert "TritonModel/seq: spec.inputs[0].dataType: unset (TYPE_INVALID)" in proc.stderr, explain
    assert not proc.stdout, "nothing is written when a problem is found"


@pytest.mark.parametrize("link", ["version file", "model directory", "version directory", "warm-up file", "model file"])
def test_a_link_out_of_the_repository_is_refused_and_nothing_it_names_is_copied(tmp_path: Path, link: str) -> None:
    """It used to follow a link anywhere and copy the file it named into the manifest."""
    outside = tmp_path / "outside"
    (outside / "1").mkdir(parents=True)
    (outside / "secret.txt").write_text("AWS_SECRET_ACCESS_KEY=hunter2\n")
    (outside / "config.pbtxt").write_text(PLAIN.format(name="m"))
    (outside / "1" / "model.py").write_text("# AWS_SECRET_ACCESS_KEY=hunter2\n")
    repo = _plain_repository(tmp_path / "repo", {"m": PLAIN.format(name="m")})
    model = repo / "m"
    if link == "version file":
        (at := model / "1" / "notes.txt").symlink_to(outside / "secret.txt")
    elif link == "model directory":
        (at := repo / "other").symlink_to(outside, target_is_directory=True)
    elif link == "version directory":
        (at := model / "2").symlink_to(outside / "1", target_is_directory=True)
    elif link == "warm-up file":
        (model / "warmup").mkdir()
        (at := model / "warmup" / "a.bin").symlink_to(outside / "secret.txt")
    else:
        (at := model / "labels.txt").symlink_to(outside / "secret.txt")
    proc = _console("import", str(repo))
    explain = f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, explain
    assert "hunter2" not in proc.stdout + proc.stderr, explain
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {at}: a symbolic link out of the model repository (to {(outside / 'secret.txt').resolve()})"
        if link in ("version file", "warm-up file", "model file") else
        f"error: {at}: a symbolic link out of the model repository (to {at.resolve()})"
    ) + f": import copies the files it reads into the manifest, and reads none from outside {repo}", explain


def test_a_link_inside_the_repository_is_followed(tmp_path: Path) -> None:
    repo = _plain_repository(tmp_path / "repo", {"m": PLAIN.format(name="m")})
    (repo / "m" / "labels.txt").write_text("cat\ndog\n")
    (repo / "m" / "1" / "labels.txt").symlink_to(repo / "m" / "labels.txt")
    proc = _console("import", str(repo))
    assert proc.returncode == 0, proc.stderr
    [doc] = yaml.safe_load_all(proc.stdout)
    assert doc["spec"]["source"]["inline"]["labels.txt"] == "cat\ndog\n"


def test_a_large_file_is_not_read_and_is_left_for_a_uri(tmp_path: Path) -> None:
    """1.5 GiB took 3.1 GiB of memory: every file was read whole. A file too large to inline is not read at all."""
    repo = _plain_repository(tmp_path / "repo", {"m": PLAIN.format(name="m")})
    with (repo / "m" / "1" / "weights.bin").open("wb") as f:
        f.truncate(300 << 20)  # sparse: no disk
    proc = _console("import", str(repo))
    assert proc.returncode == 0, proc.stderr
    [doc] = yaml.safe_load_all(proc.stdout)
    assert doc["spec"]["source"] == {"uri": "pvc://CHANGE-ME/m"}
    assert "weights.bin: too large to inline" in proc.stderr


def _import_peak_mib(repo: Path) -> float:
    proc = subprocess.Popen([str(CONSOLE_SCRIPT), "import", str(repo)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"import {repo} failed"
    return usage.ru_maxrss / 1024  # KiB on Linux


def test_a_large_file_costs_no_memory(tmp_path: Path) -> None:
    """The same import with and without a 300 MiB file: the file must not show in the peak. Compared with the
    import of the repository without it, in the same run, so the interpreter's own size (which varies with the
    machine and its load: CI saw 183 MiB) is not mistaken for the file."""
    small = _plain_repository(tmp_path / "small", {"m": PLAIN.format(name="m")})
    repo = _plain_repository(tmp_path / "repo", {"m": PLAIN.format(name="m")})
    with (repo / "m" / "1" / "weights.bin").open("wb") as f:
        f.truncate(300 << 20)
    baseline = _import_peak_mib(small)
    peak = _import_peak_mib(repo)
    assert peak < baseline + 100, (
        f"import of a repository with a 300 MiB file peaked at {peak:.0f} MiB, {peak - baseline:.0f} MiB above "
        f"the same repository without it ({baseline:.0f} MiB): it read the file")


def test_a_config_too_large_for_a_configmap_is_refused_unread(tmp_path: Path) -> None:
    repo = _plain_repository(tmp_path / "repo", {"m": PLAIN.format(name="m")})
    with (repo / "m" / "config.pbtxt").open("ab") as f:
        f.truncate(2 << 20)
    proc = _console("import", str(repo))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (f"error: {repo / 'm' / 'config.pbtxt'}: over 1048576 bytes, more than a model's "
                                   "config can be (the repository ConfigMap holds 1 MiB)")


def test_a_name_that_starts_with_a_digit_becomes_a_valid_tritonmodel_name() -> None:
    from triton_operator.importer import k8s_name

    assert k8s_name("3d_resnet") == "model-3d-resnet"
    assert k8s_name("ResNet.v2") == "resnet-v2"
