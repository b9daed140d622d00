"""GPUs per replica: `server.gpus` defaults to what the instance groups need (an ensemble's replicas run
every step, so to the most any step needs), and a value they cannot run with is refused, naming the field.

Triton's semantics (core model_config_utils: instance group normalisation): KIND_GPU without `gpus`
places instances on every visible GPU and refuses to load with none ("has kind KIND_GPU but no GPUs are
available"); `gpus: [i, ...]` needs GPU i visible ("invalid or unsupported gpu id"); KIND_AUTO (and no
instance group at all) runs on the GPUs when there are any, else on the CPU; KIND_MODEL leaves placement
to the model, which for the backends that use it (TensorRT-LLM, vLLM) means a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.cli.main import main
from triton_operator.files import load_paths
from triton_operator.render.kubernetes import render_children
from triton_operator.render.modelconfig import render_repository
from triton_operator.validate import Document, check_documents
from triton_operator.validate.admission import review

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
UID = "00000000-0000-0000-0000-000000000001"


def _body(name: str = "m", groups: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "serving.triton-operator.dev/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {
            "backend": "python",
            "maxBatchSize": 4,
            "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
            "source": {"inline": {"model.py": "pass\n"}},
            **spec,
        },
    }
    if groups is not None:
        body["spec"]["instanceGroups"] = groups
    return body


def _ensemble(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.triton-operator.dev/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": "ens"},
        "spec": {
            "platform": "ensemble",
            "maxBatchSize": 4,
            "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "y", "dataType": "FP32", "dims": [4]}],
            "ensemble": {"steps": [{"model": "step", "inputMap": {"IN": "x"}, "outputMap": {"OUT": "y"}}]},
            **spec,
        },
    }


def _gpu_limits(bodies: list[dict[str, Any]]) -> dict[str, str | None]:
    """`nvidia.com/gpu` of each model's tritonserver container (None: not requested)."""
    models = [TritonModel.model_validate(b) for b in bodies]
    rendered = render_repository(models)
    out = {}
    for m in models:
        [dep] = [c for c in render_children(m, rendered, UID, "ns") if c["kind"] == "Deployment"]
        triton = dep["spec"]["template"]["spec"]["containers"][0]
        assert triton["name"] == "tritonserver"
        out[m.name] = ((triton.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
    return out


def _errors(bodies: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    loaded = check_documents([Document(f"doc#{i}", b) for i, b in enumerate(bodies)])
    return [(e.model, e.path, e.message) for e in loaded.errors]


# ---------------------------------------------------------------- the default


@pytest.mark.parametrize(("groups", "gpus"), [
    ([{"kind": "CPU", "count": 2}], None),
    (None, None),  # Triton's default group is KIND_AUTO: the CPU when no GPU is visible
    ([{"kind": "AUTO"}], None),
    ([{"kind": "GPU"}], "1"),
    ([{"kind": "GPU", "gpus": [0, 2]}], "3"),
    ([{"kind": "CPU"}, {"kind": "GPU", "gpus": [1]}], "2"),
    ([{"kind": "MODEL"}], "1"),
])
def test_server_gpus_defaults_to_what_the_instance_groups_need(groups: list[dict[str, Any]] | None, gpus: str | None) -> None:
    assert _gpu_limits([_body(groups=groups)]) == {"m": gpus}


def test_no_gpu_toleration_without_gpus() -> None:
    models = [TritonModel.model_validate(_body(groups=[{"kind": "CPU"}]))]
    [dep] = [c for c in render_children(models[0], render_repository(models), UID, "ns") if c["kind"] == "Deployment"]
    assert "tolerations" not in dep["spec"]["template"]["spec"]


def test_an_explicit_server_gpus_is_kept() -> None:
    assert _gpu_limits([_body(groups=[{"kind": "CPU"}], server={"gpus": 2})]) == {"m": "2"}
    assert _gpu_limits([_body(groups=[{"kind": "GPU"}], server={"gpus": 4})]) == {"m": "4"}


def test_the_sentiment_example_asks_for_no_gpu_to_run_a_tokenizer() -> None:
    loaded = check_documents(load_paths([EXAMPLES / "sentiment-ensemble.yaml"]))
    assert not loaded.errors
    bodies = [m.model_dump(by_alias=True, exclude_none=True) for _, m in loaded.models]
    assert _gpu_limits(bodies) == {"tokenizer": None, "classifier": None, "sentiment": None}


def test_an_ensemble_defaults_to_the_most_any_step_needs() -> None:
    step = _body("step", groups=[{"kind": "GPU", "gpus": [0, 1]}])
    assert _gpu_limits([step, _ensemble()]) == {"step": "2", "ens": "2"}
    cpu_step = _body("step", groups=[{"kind": "CPU"}])
    assert _gpu_limits([cpu_step, _ensemble()]) == {"step": None, "ens": None}


# ---------------------------------------------------------------- contradictions


def test_gpu_indices_beyond_server_gpus_are_refused_naming_them() -> None:
    errors = _errors([_body(groups=[{"kind": "GPU", "gpus": [0, 1, 2, 3]}], server={"gpus": 1})])
    assert [(p, "GPUs 1, 2, 3 not visible" in msg and "server.gpus is 1" in msg) for _, p, msg in errors] == [
        ("spec.instanceGroups[0].gpus", True)], errors


def test_kind_gpu_with_zero_server_gpus_is_refused_naming_it() -> None:
    errors = _errors([_body(groups=[{"kind": "CPU"}, {"kind": "GPU"}], server={"gpus": 0})])
    assert [(p, "server.gpus is 0" in msg) for _, p, msg in errors] == [("spec.instanceGroups[1].kind", True)], errors


@pytest.mark.parametrize(("groups", "server_gpus", "needs"), [
    ([{"kind": "GPU", "gpus": [0, 1, 2, 3]}], 1, "4"),
    ([{"kind": "GPU"}], 0, "1"),
])
def test_an_ensemble_whose_step_needs_more_gpus_than_it_gets_is_refused(
        groups: list[dict[str, Any]], server_gpus: int, needs: str) -> None:
    errors = _errors([_body("step", groups=groups), _ensemble(server={"gpus": server_gpus})])
    assert [(m, p) for m, p, _ in errors] == [("TritonModel/ens", "spec.server.gpus")], errors
    assert f"step 0 (step) needs {needs}" in errors[0][2], errors


@pytest.mark.parametrize("body", [
    _body(groups=[{"kind": "CPU"}], server={"gpus": 0}),
    _body(groups=[{"kind": "GPU", "gpus": [1]}], server={"gpus": 2}),
    _body(groups=[{"kind": "AUTO"}], server={"gpus": 0}),
    _body(groups=[{"kind": "MODEL"}], server={"gpus": 0}),  # the model decides: it may well run on the CPU
    _body(groups=[{"kind": "CPU"}], server={"gpus": 3}),  # more than Triton uses is allowed (e.g. for model code)
])
def test_consistent_gpu_settings_are_accepted(body: dict[str, Any]) -> None:
    assert _errors([body]) == []


# ---------------------------------------------------------------- an ensemble's replicas load every step (issue 12 #6)


def _nested(server_gpus: int, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """outer -> inner (an ensemble) -> step: outer's replicas load all three."""
    inner = _ensemble()
    inner["metadata"]["name"] = "inner"
    outer = _ensemble(server={"gpus": server_gpus})
    outer["spec"]["ensemble"]["steps"][0] = {"model": "inner", "inputMap": {"x": "x"}, "outputMap": {"y": "y"}}
    return [_body("step", groups=groups), inner, outer]


def test_an_ensemble_without_gpus_may_load_a_kind_model_step() -> None:
    """KIND_MODEL leaves placement to the model, which may run on the CPU: Triton loads it with no GPU, so an
    ensemble with `server.gpus: 0` is no more refused for it than the step's own replicas are."""
    assert _errors([_body("step", groups=[{"kind": "MODEL"}]), _ensemble(server={"gpus": 0})]) == []
    assert _errors([_body("step", groups=[{"kind": "MODEL"}], server={"gpus": 0})]) == []


def test_an_ensemble_refused_for_a_nested_step_names_that_step_model() -> None:
    errors = _errors(_nested(1, [{"kind": "GPU", "gpus": [0, 1]}]))
    assert [(m, p) for m, p, _ in errors] == [("TritonModel/ens", "spec.server.gpus")], errors
    message = errors[0][2]
    assert "step 0 (inner) needs 2 GPU(s) for the step model step's instance groups" in message, message
    assert "server.gpus is 1: raise it to 2 or leave it unset" in message, message
    assert _errors(_nested(2, [{"kind": "GPU", "gpus": [0, 1]}])) == []
    assert _errors(_nested(0, [{"kind": "MODEL"}, {"kind": "AUTO"}])) == []


def test_a_step_change_that_needs_more_gpus_than_its_ensemble_gets_is_refused_by_the_webhook() -> None:
    """The same rule at admission: the change to the step is refused, naming the ensemble's field."""
    step, ens = _body("step", groups=[{"kind": "CPU"}]), _ensemble(server={"gpus": 1})
    assert review(step, None, {"ens": ens}, ["ens"]).allowed
    changed = _body("step", groups=[{"kind": "GPU", "gpus": [1]}])
    verdict = review(changed, step, {"ens": ens}, ["ens"])
    assert not verdict.allowed
    assert "would break ensemble ens: spec.server.gpus: " in verdict.message, verdict.message


def test_render_refuses_an_ensemble_whose_step_needs_more_gpus_naming_the_field(tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump_all([_body("step", groups=[{"kind": "GPU"}]), _ensemble(server={"gpus": 0})]))
    capsys.readouterr()
    assert main(["render", str(path), "-o", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert "spec.server.gpus: the ensemble's replicas load every step into one tritonserver" in err, err
    assert not (tmp_path / "out").exists()
