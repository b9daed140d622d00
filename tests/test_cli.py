"""The `triton-operator` command line: `render` writes a model repository and prints each config.pbtxt,
refuses invalid input with field paths and writes nothing; `validate` loads every model in a real
tritonserver and reports READY with the warm-up time, or FAILED with Triton's own reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import cli
from tests.triton_helpers import EXAMPLES
from triton_operator.files import load_paths
from triton_operator.validate import check_documents

CORPUS = Path(__file__).parent / "corpus" / "invalid"
CONSOLE_SCRIPT = Path(sys.executable).parent / "triton-operator"


def example_models() -> list:
    loaded = check_documents(load_paths([EXAMPLES]))
    assert not loaded.errors
    return [m for _, m in loaded.models]


# ---------------------------------------------------------------- render


def test_render_directory_writes_the_layout_and_prints_each_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "models"
    rc, stdout, stderr = cli(["render", str(EXAMPLES), "-o", str(out)], capsys)
    assert rc == 0, stderr
    models = example_models()
    assert f"Wrote model repository with {len(models)} model(s) to {out}" in stderr

    # the printed configs: a header per model, then exactly the file's text
    printed = dict(re.findall(r"^# (\S+)/config\.pbtxt \(TritonModel [^)]*\)\n(.*?)(?=^# |\Z)", stdout, re.M | re.S))
    assert sorted(printed) == sorted(m.triton_name for m in models)
    for m in models:
        d = out / m.triton_name
        assert (d / "config.pbtxt").read_text() == printed[m.triton_name]
        assert f'name: "{m.triton_name}"' in printed[m.triton_name]
        if m.spec.is_ensemble:
            assert sorted(p.name for p in (d / "1").iterdir()) == [".keep"], "an ensemble needs its (empty) 1/"
        else:
            for version, src in m.spec.version_sources.items():  # spec.source is version 1
                for fname, text in (src.inline or {}).items():
                    assert (d / str(version) / fname).read_text() == text
    assert sorted(p.name for p in out.iterdir()) == sorted(m.triton_name for m in models)


def test_render_without_output_only_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    rc, stdout, stderr = cli(["render", str(EXAMPLES / "non-batching.yaml")], capsys)
    assert rc == 0, stderr
    assert stdout.startswith("# non-batching/config.pbtxt (TritonModel non-batching, digest ")
    assert "max_batch_size: 0\n" in stdout
    assert list(tmp_path.iterdir()) == []


def test_render_console_script(tmp_path: Path) -> None:
    out = tmp_path / "models"
    proc = subprocess.run([str(CONSOLE_SCRIPT), "render", str(EXAMPLES / "add-sub.yaml"), "-o", str(out)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "add-sub/1/model.py",
        "add-sub/config.pbtxt",
    ]
    assert proc.stdout.split("\n", 1)[1] == (out / "add-sub" / "config.pbtxt").read_text()


def _invalid_set(tmp_path: Path) -> Path:
    """A directory with one valid TritonModel and two invalid ones (from the corpus, renamed)."""
    d = tmp_path / "specs"
    d.mkdir()
    (d / "a-valid.yaml").write_text((EXAMPLES / "add-sub.yaml").read_text())
    for name, case in (("bad-preferred", "01-preferred-batch-size-too-large"), ("bad-warmup", "36-warmup-variable-dims")):
        body = yaml.safe_load((CORPUS / f"{case}.yaml").read_text())
        body["metadata"]["name"] = name
        (d / f"{name}.yaml").write_text(yaml.safe_dump(body))
    return d


def test_render_invalid_exits_1_names_fields_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    specs, out = _invalid_set(tmp_path), tmp_path / "models"
    rc, stdout, stderr = cli(["render", str(specs), "-o", str(out)], capsys)
    assert rc == 1
    assert stdout == "", "nothing is printed for an invalid set"
    assert not out.exists(), "an invalid set must not leave a (half-)written repository, not even the valid model"
    assert "error: 2 problem(s) found:" in stderr
    assert "TritonModel/bad-preferred: spec.batcher.preferredBatchSize[0]: preferred batch size 16 exceeds maxBatchSize" in stderr
    assert "TritonModel/bad-warmup: spec.modelWarmup[0].inputs[INPUT].dims[0]: warm-up shapes must be concrete" in stderr


def test_render_refuses_schema_errors_and_bad_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((EXAMPLES / "add-sub.yaml").read_text().replace("maxBatchSize: 8", "maxBatchSize: 8\n  maxBatch: 8"))
    rc, _, stderr = cli(["render", str(bad), "-o", str(tmp_path / "out")], capsys)
    assert rc == 1 and "TritonModel/add-sub: spec.maxBatch: unknown field" in stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: TritonModel\nspec: [unclosed\n")
    rc, _, stderr = cli(["render", str(broken)], capsys)
    assert rc == 1 and "(yaml): not valid YAML" in stderr
    rc, _, stderr = cli(["render", str(tmp_path / "missing.yaml")], capsys)
    assert rc == 1 and "no such file or directory" in stderr
    assert not (tmp_path / "out").exists()


def test_render_invalid_console_script(tmp_path: Path) -> None:
    specs, out = _invalid_set(tmp_path), tmp_path / "models"
    proc = subprocess.run([str(CONSOLE_SCRIPT), "render", str(specs), "-o", str(out)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 1
    assert "spec.batcher.preferredBatchSize[0]" in proc.stderr and "spec.modelWarmup[0].inputs[INPUT].dims[0]" in proc.stderr
    assert not out.exists()


# ---------------------------------------------------------------- validate, against a real tritonserver

RAISES_IN_INITIALIZE = """\
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata:
  name: broken-init
spec:
  backend: python
  maxBatchSize: 4
  inputs:
    - {name: INPUT, dataType: FP32, dims: [4]}
  outputs:
    - {name: OUTPUT, dataType: FP32, dims: [4]}
  instanceGroups:
    - {kind: CPU, count: 1}
  source:
    inline:
      model.py: |
        class TritonPythonModel:
            def initialize(self, args):
                raise RuntimeError("weights file /models/broken-init/weights.bin is missing")

            def execute(self, requests):
                return []
"""

GPU_MODEL = """\
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata:
  name: on-gpu
spec:
  backend: python
  maxBatchSize: 4
  inputs:
    - {name: INPUT, dataType: FP32, dims: [4]}
  outputs:
    - {name: OUTPUT, dataType: FP32, dims: [4]}
  instanceGroups:
    - {kind: GPU, count: 1}
  modelWarmup:
    - name: zeros
      inputs:
        INPUT: {dataType: FP32, dims: [4], zeroData: true}
  source:
    inline:
      model.py: |
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def execute(self, requests):
                return [
                    pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()),
                    ])
                    for r in requests
                ]
"""


def _validate(args: list[str], timeout: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it."""
    return subprocess.run([str(CONSOLE_SCRIPT), "validate", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=env)  # fmt: skip


def _explain(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


@pytest.mark.triton
def test_validate_example_is_ready_with_warmup_time() -> None:
    proc = _validate([str(EXAMPLES / "add-sub.yaml")])
    assert proc.returncode == 0, _explain(proc)
    # add-sub has one warm-up sample with count 2: Triton runs it twice before READY
    m = re.search(r"^add-sub\s+READY\s+loaded and warmed in (\d+\.\d+)s \(1 warm-up sample\(s\), (\d+) execution\(s\)\)$",
                  proc.stdout, re.M)  # fmt: skip
    assert m, _explain(proc)
    assert float(m.group(1)) > 0 and int(m.group(2)) == 2, _explain(proc)
    assert "Validated 1 TritonModel(s): schema and" in proc.stderr
    assert "All 1 model(s) READY in a real tritonserver 2.51.0" in proc.stderr


@pytest.mark.triton
def test_validate_reports_the_exception_from_initialize(tmp_path: Path) -> None:
    spec = tmp_path / "broken-init.yaml"
    spec.write_text(RAISES_IN_INITIALIZE)
    proc = _validate([str(spec), "--load-timeout", "60"])
    assert proc.returncode == 1, _explain(proc)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("broken-init")), "")
    assert re.match(r"broken-init\s+FAILED\s+after \d+\.\d+s: ", line), _explain(proc)
    assert "RuntimeError: weights file /models/broken-init/weights.bin is missing" in line, _explain(proc)
    assert "error: 1 of 1 model(s) failed to load in tritonserver" in proc.stderr


@pytest.mark.triton
def test_validate_gpu_instances_need_cpu_flag_here(tmp_path: Path) -> None:
    """With no GPU visible, KIND_GPU fails with Triton's own reason, and --cpu maps it to KIND_CPU.

    CUDA_VISIBLE_DEVICES="" hides every GPU from tritonserver (the CUDA runtime honours it), so this
    holds on a GPU host as on a laptop.
    """
    spec = tmp_path / "on-gpu.yaml"
    spec.write_text(GPU_MODEL)
    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}

    proc = _validate([str(spec), "--load-timeout", "60"], env=no_gpu)
    assert proc.returncode == 1, _explain(proc)
    assert "on-gpu ask for KIND_GPU instances; pass --cpu" in proc.stderr
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("on-gpu")), "")
    assert "FAILED" in line and "has kind KIND_GPU but no GPUs are available" in line, _explain(proc)

    proc = _validate([str(spec), "--cpu", "--load-timeout", "60"], env=no_gpu)
    assert proc.returncode == 0, _explain(proc)
    assert re.search(r"^on-gpu\s+READY\s+loaded and warmed in \d+\.\d+s \(1 warm-up sample\(s\), 1 execution\(s\)\)$",
                     proc.stdout, re.M), _explain(proc)  # fmt: skip


@pytest.mark.triton
def test_validate_says_which_models_get_their_files_at_pod_start_and_loads_the_rest(tmp_path: Path) -> None:
    """A model whose files come from a uri (fetched by the pod's init container) cannot load in a local server, nor
    can an ensemble that runs it: each is one SKIPPED line naming the uri, and the others still load."""
    docs = [*yaml.safe_load_all((EXAMPLES / "add-sub.yaml").read_text()),
            *yaml.safe_load_all((EXAMPLES / "sources" / "s3.yaml").read_text())]
    pipeline = yaml.safe_load((EXAMPLES / "add-sub.yaml").read_text())
    step_out = {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}
    pipeline = {"apiVersion": pipeline["apiVersion"], "kind": "TritonModel", "metadata": {"name": "via-s3"},
                "spec": {"inputs": pipeline["spec"]["inputs"], "outputs": [
                    {**o, "name": step_out[o["name"]]} for o in pipeline["spec"]["outputs"]],
                    "platform": "ensemble", "maxBatchSize": 8, "ensemble": {"steps": [{
                        "model": "add-sub-s3", "inputMap": {"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
                        "outputMap": step_out}]}}}
    spec = tmp_path / "mixed.yaml"
    spec.write_text(yaml.safe_dump_all([d for d in docs if d] + [pipeline], sort_keys=False))

    proc = _validate([str(spec)])
    assert proc.returncode == 0, _explain(proc)
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines() if ln.strip()}
    assert re.match(r"add-sub-s3\s+SKIPPED its files come from s3://models/add-sub at pod start", lines["add-sub-s3"]), \
        _explain(proc)
    assert "SKIPPED its step add-sub-s3 gets its files from s3://models/add-sub" in lines["via-s3"], _explain(proc)
    assert re.match(r"add-sub\s+READY\s+loaded and warmed in", lines["add-sub"]), _explain(proc)
    assert "All 1 loaded model(s) READY in a real tritonserver 2.51.0; 2 skipped" in proc.stderr, _explain(proc)
    assert "at least one version must be available" not in proc.stdout + proc.stderr


@pytest.mark.triton
def test_validate_invalid_spec_never_starts_a_server(tmp_path: Path) -> None:
    proc = _validate([str(_invalid_set(tmp_path))], timeout=60)
    assert proc.returncode == 1, _explain(proc)
    assert "Starting tritonserver" not in proc.stderr
    assert "spec.batcher.preferredBatchSize[0]" in proc.stderr


def test_validate_without_the_server_extras_client_says_so_in_one_line() -> None:
    """Where tritonclient's gRPC client cannot load (the operator image has no numpy), `validate` still checks the
    specs, then stops with one line naming the extra: no traceback."""
    code = ("import sys; sys.modules['grpc'] = None\n"  # `import grpc` fails, as in the image
            "from triton_operator.cli.main import main\n"
            f"sys.exit(main(['validate', {str(EXAMPLES / 'add-sub.yaml')!r}, '--cpu']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Validated 1 TritonModel(s)" in proc.stderr
    assert "error: loading models needs the 'server' extra (pip install 'triton-operator[server]')" in proc.stderr
    assert "Traceback" not in proc.stderr and "Starting tritonserver" not in proc.stderr
