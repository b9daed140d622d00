"""What kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute, the library behind Flux's health checks)
computes for TritonModel objects whose status is what the operator writes (`plan.status.compute_status`).

kstatus knows no TritonModel. For a kind it has no rule for it reads, in order: metadata.deletionTimestamp
(Terminating), status.observedGeneration against metadata.generation (InProgress), the conditions
`Reconciling=True` (InProgress) and `Stalled=True` (Failed), then a `Ready` condition (True: Current, else
InProgress), and with none of these: Current. The real library runs here: tools/kstatus, a small Go program
pinned by its go.mod and go.sum, built once by tools/kstatus/build.sh into the cache e2e/toolchain uses.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
import yaml

from e2e.health_checks import kstatus_results
from tests.documents import _model, _pod
from triton_operator.plan.status import Observed, Problem

GO = shutil.which("go")

pytestmark = pytest.mark.skipif(GO is None, reason="go is not installed (Debian package golang)")


def kstatus(*objects: dict[str, Any], text: str | None = None) -> list[dict[str, Any]]:
    """One result per object: kstatus's `status`, `message` and `conditions`, with the object's identity."""
    return kstatus_results(text if text is not None else "".join(json.dumps(o) + "\n" for o in objects))


def computed(body: dict[str, Any]) -> tuple[str, str]:
    [result] = kstatus(body)
    assert (result["kind"], result["name"]) == ("TritonModel", body["metadata"]["name"]), result
    return result["status"], result["message"]


WARM = [_pod("a", "d2", "True"), _pod("b", "d2", "True")]


def test_all_replicas_warm_at_the_current_generation_is_current() -> None:
    assert computed(_model(3, Observed(3, 2, "d2", "sel", pods=WARM))) == ("Current", "Resource is Ready")


def test_scaled_to_zero_is_current() -> None:
    assert computed(_model(2, Observed(2, 0, "d1", "sel")))[0] == "Current"


@pytest.mark.parametrize("pods", [
    [_pod("a", "d1", "True"), _pod("b", "d1", "True"), _pod("c", "d2", "False", reason="ModelWarming")],
    [_pod("a", "d2", "True"), _pod("b", "d2", "True", ready="False")],  # warm, readiness probe pending
    [],  # no pod yet
    # Every replica at the new config serves (Ready=True), the old one is not gone yet.
    [_pod("a", "d2", "True"), _pod("b", "d2", "True"), _pod("c", "d1", "True")],
], ids=["a-replica-warming", "warm-not-ready", "no-pod-yet", "old-replica-left"])
def test_a_rollout_is_in_progress(pods: list[dict]) -> None:
    status, message = computed(_model(4, Observed(4, 2, "d2", "sel", pods=pods)))
    assert status == "InProgress" and message.endswith("replicas at config d2 warmed"), message


def test_a_replica_that_fails_to_load_is_failed_with_tritons_reason() -> None:
    why = "model add-sub is UNAVAILABLE: ZeroDivisionError: division by zero"
    pods = [_pod("a", "d1", "True"), _pod("b", "d1", "True"), _pod("c", "d2", "False", reason="ModelLoadFailed", message=why)]
    [result] = kstatus(_model(5, Observed(5, 2, "d2", "sel", pods=pods)))
    assert (result["status"], result["message"]) == ("Failed", f"c: {why}"), result
    assert result["conditions"] == [{"type": "Stalled", "status": "True", "reason": "ModelLoadFailed", "message": f"c: {why}"}]


@pytest.mark.parametrize("problem", [
    Problem("InvalidSpec", "spec.batcher.preferredBatchSize[0]: preferred batch size 16 exceeds maxBatchSize"),
    Problem("StepModelMissing", "ensemble step model(s) tokenizer not found in namespace default; nothing is deployed"),
])
def test_a_spec_that_cannot_be_deployed_is_failed(problem: Problem) -> None:
    assert computed(_model(2, Observed(2, 1, None, "sel", problem=problem))) == ("Failed", problem.message)


def test_an_api_error_is_failed_even_while_the_replicas_serve() -> None:
    why = 'apply Deployment default/add-sub: 403 Forbidden: cannot patch resource "deployments"'
    body = _model(2, Observed(2, 2, "d2", "sel", pods=WARM, api_error=Problem("ApiError", why)))
    assert computed(body) == ("Failed", why)


def test_a_status_of_an_older_generation_is_in_progress_not_current() -> None:
    """The spec changed (generation 4) and the operator has not reconciled it yet: its Ready=True is about 3."""
    body = _model(4, Observed(3, 2, "d1", "sel", pods=[_pod("a", "d1", "True"), _pod("b", "d1", "True")]))
    assert computed(body) == (
        "InProgress", "TritonModel generation is 4, but latest observed generation is 3")


def test_a_stale_failed_status_is_in_progress_too() -> None:
    body = _model(7, Observed(6, 1, None, "sel", problem=Problem("InvalidSpec", "fixed in generation 7")))
    assert computed(body)[0] == "InProgress"


def test_a_deleted_model_is_terminating() -> None:
    body = _model(3, Observed(3, 2, "d2", "sel", pods=WARM))
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    assert computed(body)[0] == "Terminating"


def test_before_the_first_status_kstatus_says_current() -> None:
    """A limit of kstatus, not of the status: an object without any status gives it nothing to read, and it takes
    that for Current (the chart README says so). The operator's first status, written on its first reconcile,
    is InProgress (Reconciling=True) or Current or Failed from then on."""
    assert computed(_model(1, None)) == ("Current", "Resource is current")
    assert computed(_model(1, Observed(1, 2, "d1", "sel")))[0] == "InProgress"


def test_the_program_reads_yaml_streams_and_lists() -> None:
    """`kubectl get tritonmodels -o yaml` (a List) and a multi-document YAML file, as a person would pipe them."""
    ready = _model(3, Observed(3, 2, "d2", "sel", pods=WARM))
    failed = _model(2, Observed(2, 1, None, "sel", problem=Problem("InvalidSpec", "bad")))
    failed["metadata"]["name"] = "broken"
    stream = f"---\n{yaml.safe_dump(ready)}---\n# an empty document\n---\n{yaml.safe_dump(failed)}"
    assert [r["status"] for r in kstatus(text=stream)] == ["Current", "Failed"]
    listed = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [ready, failed]})
    assert [(r["name"], r["status"]) for r in kstatus(text=listed)] == [("add-sub", "Current"), ("broken", "Failed")]
