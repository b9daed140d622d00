"""The Argo CD health check the chart ships (charts/triton-operator/argocd-health.lua), run by a real Lua
interpreter on TritonModel objects whose status is what the operator writes (`plan.status.compute_status`); the
e2e tests (e2e/test_operator.py) run it on live TritonModels too: Healthy, Progressing while warming, Degraded.

Argo CD runs the script with the object as the global `obj` and reads `status` and `message` from the table
it returns; the harness here does the same with `lua5.4`.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.health_checks import ARGOCD_HEALTH_SCRIPT as SCRIPT
from e2e.health_checks import LUA, lua_literal
from e2e.health_checks import argocd_health as health
from tests.documents import _model, _pod
from triton_operator.plan.status import Observed, Problem

CHART = Path(__file__).resolve().parent.parent / "charts" / "triton-operator"
KEY = "resource.customizations.health.serving.triton-operator.dev_TritonModel"


pytestmark = pytest.mark.skipif(LUA is None, reason="lua5.4 is not installed (Debian package lua5.4)")


def test_the_literal_round_trips_through_lua() -> None:
    value = {"a": [1, 2.5, "x\"y\\z\n\t"], "b": {"c": True, "d": False, "e": None}, "f": []}
    code = f'local v = {lua_literal(value)}\nio.write(#v.a, " ", v.a[2], " ", v.a[3], " ", tostring(v.b.c), " ", ' \
           f'tostring(v.b.d), " ", tostring(v.b.e), " ", #v.f)'
    proc = subprocess.run([LUA, "-"], input=code, capture_output=True, text=True, timeout=30, check=True)
    assert proc.stdout == '3 2.5 x"y\\z\n\t true false nil 0'


# ---------------------------------------------------------------- TritonModels with the statuses the operator writes


def _conds(body: dict[str, Any]) -> dict[str, dict]:
    return {c["type"]: c for c in body["status"]["conditions"]}


def test_all_replicas_warm_at_the_current_generation_is_healthy() -> None:
    body = _model(3, Observed(3, 2, "d2", "sel", pods=[_pod("a", "d2", "True"), _pod("b", "d2", "True")]))
    assert _conds(body)["Ready"]["status"] == "True"
    status, message = health(body)
    assert status == "Healthy" and message.startswith("AllReplicasWarmed: 2/2 replicas"), message


def test_scaled_to_zero_is_healthy() -> None:
    status, _ = health(_model(2, Observed(2, 0, "d1", "sel")))
    assert status == "Healthy"


def test_a_step_at_zero_replicas_is_healthy_before_its_ensemble_exists_and_after() -> None:
    """A step is applied before its ensemble (a sync wave): a wave waits for Healthy, so the step must be."""
    status, message = health(_model(2, Observed(2, 0, "d1", "sel")))
    assert status == "Healthy" and message.startswith("ScaledToZero: ") and "nothing serves it" in message, message
    status, message = health(_model(2, Observed(2, 0, "d1", "sel", ensembles={"sentiment": 1})))
    assert status == "Healthy" and message.startswith("ServedByEnsembles: ") and "sentiment" in message, message


@pytest.mark.parametrize(("pods", "reason"), [
    ([_pod("a", "d1", "True"), _pod("b", "d1", "True"), _pod("c", "d2", "False", reason="ModelWarming")], "RollingOut"),
    ([_pod("a", "d2", "True"), _pod("b", "d2", "True", ready="False")], "RollingOut"),  # warm, readiness probe pending
    ([], "RollingOut"),  # no pod yet
])
def test_a_rollout_is_progressing(pods: list[dict], reason: str) -> None:
    body = _model(4, Observed(4, 2, "d2", "sel", pods=pods))
    assert _conds(body)["Progressing"]["status"] == "True"
    status, message = health(body)
    assert status == "Progressing" and message.startswith(f"{reason}: "), message


def test_a_replica_that_fails_to_load_is_degraded_with_tritons_reason() -> None:
    why = "model add-sub is UNAVAILABLE: ZeroDivisionError: division by zero"
    pods = [_pod("a", "d1", "True"), _pod("b", "d1", "True"), _pod("c", "d2", "False", reason="ModelLoadFailed", message=why)]
    status, message = health(_model(5, Observed(5, 2, "d2", "sel", pods=pods)))
    assert status == "Degraded" and message.startswith("ModelLoadFailed: ") and "ZeroDivisionError" in message, message


@pytest.mark.parametrize("problem", [
    Problem("InvalidSpec", "spec.batcher.preferredBatchSize[0]: preferred batch size 16 exceeds maxBatchSize"),
    Problem("StepModelMissing", "ensemble step model(s) tokenizer not found in namespace default; nothing is deployed"),
])
def test_a_spec_that_cannot_be_deployed_is_degraded(problem: Problem) -> None:
    status, message = health(_model(2, Observed(2, 1, None, "sel", problem=problem)))
    assert (status, message) == ("Degraded", f"{problem.reason}: {problem.message}")


def test_a_status_of_an_older_generation_is_progressing_not_healthy() -> None:
    """The spec changed (generation 4) and the operator has not reconciled it yet: its Ready=True is about 3."""
    body = _model(4, Observed(3, 2, "d1", "sel", pods=[_pod("a", "d1", "True"), _pod("b", "d1", "True")]))
    assert body["status"]["observedGeneration"] == 3 and _conds(body)["Ready"]["status"] == "True"
    assert health(body) == ("Progressing", "Waiting for the operator to observe generation 4")


def test_a_stale_degraded_status_is_progressing_too() -> None:
    body = _model(7, Observed(6, 1, None, "sel", problem=Problem("InvalidSpec", "fixed in generation 7")))
    assert health(body) == ("Progressing", "Waiting for the operator to observe generation 7")


def test_conditions_of_an_older_generation_are_not_read() -> None:
    body = _model(3, Observed(3, 2, "d2", "sel", pods=[_pod("a", "d2", "True"), _pod("b", "d2", "True")]))
    stale = copy.deepcopy(body)
    for c in stale["status"]["conditions"]:
        c["observedGeneration"] = 2
    status, _ = health(stale)
    assert status == "Progressing"


def test_no_status_yet_is_progressing() -> None:
    assert health(_model(1, None))[0] == "Progressing"
    body = _model(1, None)
    body["status"] = {}
    assert health(body)[0] == "Progressing"


# ---------------------------------------------------------------- the chart README carries the same script


def test_the_chart_readme_holds_the_script_under_its_argocd_key() -> None:
    readme = (CHART / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    configs = [yaml.safe_load(b) for b in blocks if KEY in b]
    assert len(configs) == 1, f"the chart README needs one argocd-cm example with {KEY}"
    cm = configs[0]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "argocd-cm"
    assert cm["data"][KEY] == SCRIPT.read_text(), "the README's script differs from argocd-health.lua"
