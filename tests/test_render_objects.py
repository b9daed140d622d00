"""`triton-operator render --objects`: the Kubernetes objects the operator would apply for a spec, as a
multi-document YAML stream (as `helm template` prints a chart), so a reviewer of a GitOps pull request sees
the pods a change makes. Checked against what the planner itself decides to apply for the same TritonModel."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli_helpers import cli
from triton_operator.plan.planner import World, plan
from triton_operator.plan.upgrade import RECORD

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CONSOLE_SCRIPT = Path(sys.executable).parent / "triton-operator"
UID = "00000000-0000-0000-0000-0000000000b1"


def _stream(text: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert text.startswith("# ") and "\n---\n" in text, "a commented, multi-document stream"
    return docs


def _planned(body: dict[str, Any], models: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """What the operator applies on the first reconcile of `body` in namespace `team-a`."""
    everything = {m["metadata"]["name"]: m for m in (models or [])} | {body["metadata"]["name"]: body}
    world = World(body=body, models=everything, children={}, pods=[], now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    return [_without_record(a.obj) for a in plan(world).apply]


def _without_record(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without the operator's record in a Deployment's labels (what it was rendered from, `plan.upgrade`),
    which `render --objects` says it leaves out: it is the operator's, of the spec as the API server stores it."""
    labels = {k: v for k, v in (obj["metadata"].get("labels") or {}).items() if k not in RECORD}
    return obj | {"metadata": obj["metadata"] | {"labels": labels}}


def _with_uid(path: Path, tmp_path: Path, **spec: Any) -> tuple[Path, dict[str, Any]]:
    [body] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    body["metadata"].update(namespace="team-a", uid=UID)
    body["spec"].update(spec)
    out = tmp_path / path.name
    out.write_text(yaml.safe_dump(body))
    return out, body


def test_the_objects_are_the_ones_the_operator_applies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The autoscaling example, with several replicas and pod settings: ConfigMap, Deployment, Service, PDB and HPA,
    equal to the planner's own first apply for that TritonModel (uid and namespace from its metadata)."""
    pod = {"serviceAccountName": "model-reader", "podLabels": {"team": "vision"}, "shmSize": "2Gi",
           "env": [{"name": "AWS_REGION", "value": "eu-west-1"}]}
    path, body = _with_uid(EXAMPLES / "autoscaling.yaml", tmp_path, replicas=3)
    body["spec"].setdefault("server", {}).update(pod)
    path.write_text(yaml.safe_dump(body))
    rc, out, err = cli(["render", str(path), "--objects"], capsys)
    assert rc == 0, err
    docs = _stream(out)
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                                         "HorizontalPodAutoscaler"]
    assert docs == _planned(body)
    template = docs[1]["spec"]["template"]
    assert template["spec"]["serviceAccountName"] == "model-reader"
    assert template["metadata"]["labels"]["team"] == "vision"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in template["spec"]["volumes"]
    assert all(d["metadata"]["ownerReferences"][0]["uid"] == UID for d in docs)
    assert "config.pbtxt (TritonModel" not in out, "stdout carries only the objects"


def test_an_ensemble_and_its_steps_each_get_their_objects(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a uid (a manifest from Git) the owner reference, which needs one, is left out; the namespace is -n."""
    rc, out, err = cli(["render", str(EXAMPLES / "sentiment-ensemble.yaml"), "--objects", "-n", "team-b"], capsys)
    assert rc == 0, err
    docs = _stream(out)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for model in ("tokenizer", "classifier", "sentiment"):
        assert {("Deployment", model), ("Service", model)} <= names
    assert all(d["metadata"]["namespace"] == "team-b" and "ownerReferences" not in d["metadata"] for d in docs)
    [ensemble] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sentiment"]
    ann = ensemble["spec"]["template"]["metadata"]["annotations"]
    assert set(ann["serving.triton-operator.dev/triton-steps"].split(",")) == {"tokenizer", "classifier"}


def test_the_repositorys_files_read_as_text_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(["render", str(EXAMPLES / "add-sub.yaml"), "--objects", "--operator-image", "registry/op:1"], capsys)
    assert rc == 0
    assert ": |\n    import numpy as np\n    import triton_python_backend_utils as pb_utils\n" in out
    assert "&id" not in out and "*id" not in out, "no YAML anchors: every object in full"
    docs = _stream(out)
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][1]["image"] == "registry/op:1"


def test_objects_refuse_what_the_operator_would_refuse_and_options_that_do_not_apply(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    [body] = [d for d in yaml.safe_load_all((EXAMPLES / "add-sub.yaml").read_text()) if d]
    body["spec"]["server"] = {"shmSize": "4Gi", "resources": {"limits": {"memory": "2Gi"}}}
    bad.write_text(yaml.safe_dump(body))
    rc, out, err = cli(["render", str(bad), "--objects"], capsys)
    assert rc == 1 and out == ""
    assert "spec.server.shmSize" in err
    rc, out, err = cli(["render", str(EXAMPLES / "add-sub.yaml"), "--objects", "--cpu"], capsys)
    assert rc == 1 and out == "" and "drop --cpu" in err


def test_the_console_script_prints_the_stream(tmp_path: Path) -> None:
    proc = subprocess.run([str(CONSOLE_SCRIPT), "render", str(EXAMPLES / "add-sub.yaml"), "--objects"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [d["kind"] for d in _stream(proc.stdout)] == ["ConfigMap", "Deployment", "Service"]
