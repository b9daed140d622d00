"""The status policies of `plan.status`, pure: what a TritonModel's conditions say for what was observed.

Pods here are what the API server returns for a replica: the template's readiness gate (or none, with
`warmupGate.enabled: false`), the kubelet's Ready condition, the operator's gate condition.
"""

from __future__ import annotations

from triton_operator.api.pod import ANNOTATION_DIGEST, WARMED_CONDITION
from triton_operator.plan.status import Observed, Problem, as_dict, replica_state, status_changed, transitions
from triton_operator.plan.status import compute_status as typed_status


def compute_status(obs: Observed, previous: dict | None) -> dict:
    """The status as the API server stores it (the planner's typed `TritonModelStatus`, dumped)."""
    return as_dict(typed_status(obs, previous))


def _pod(name: str, digest: str, *, gated: bool = True, gate: str | None = None, ready: bool = False,
         running: bool = True) -> dict:
    conds = [{"type": "Ready", "status": "True" if ready else "False"}]
    if gate is not None:
        conds.append({"type": WARMED_CONDITION, "status": gate, "reason": "ModelWarmed" if gate == "True" else "ModelWarming",
                      "message": "", "lastTransitionTime": "2026-01-01T00:00:05Z"})
    state = {"running": {"startedAt": "2026-01-01T00:00:01Z"}} if running else {"waiting": {"reason": "PodInitializing"}}
    return {
        "metadata": {"name": name, "annotations": {ANNOTATION_DIGEST: digest}},
        "spec": {"readinessGates": [{"conditionType": WARMED_CONDITION}]} if gated else {},
        "status": {"conditions": conds, "containerStatuses": [{"name": "tritonserver", "state": state}]},
    }


def _conds(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


# -- #1: warmupGate.enabled: false -------------------------------------------------------------


def test_without_the_gate_ready_follows_the_pods_readiness() -> None:
    """No gate, so no warmed condition is ever written: the pods' own Ready decides."""
    obs = Observed(2, 2, "d1", "sel", pods=[_pod("a", "d1", gated=False, ready=True),
                                            _pod("b", "d1", gated=False, ready=True)])
    st = compute_status(obs, None)
    c = _conds(st)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "AllReplicasReady"), c["Ready"]
    assert "warm-up gate disabled" in c["Ready"]["message"]
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "RolloutComplete")
    assert c["Degraded"]["status"] == "False"
    assert (st["readyReplicas"], st["warmedReplicas"]) == (2, 2)
    assert [s["state"] for s in st["replicaStates"]] == ["Ready", "Ready"]


def test_without_the_gate_a_replica_not_ready_yet_keeps_the_model_progressing() -> None:
    obs = Observed(2, 2, "d1", "sel", pods=[_pod("a", "d1", gated=False, ready=True),
                                            _pod("b", "d1", gated=False, ready=False)])
    c = _conds(compute_status(obs, None))
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ReplicasStarting"), c["Ready"]
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "RollingOut")


def test_without_the_gate_only_replicas_at_the_desired_digest_count() -> None:
    obs = Observed(3, 1, "d2", "sel", pods=[_pod("old", "d1", gated=False, ready=True),
                                            _pod("new", "d2", gated=False, ready=False)])
    c = _conds(compute_status(obs, None))
    assert c["Ready"]["status"] == "False" and c["Progressing"]["reason"] == "RollingOut"


def test_replica_state_of_a_pod_without_the_gate() -> None:
    assert replica_state(_pod("a", "d1", gated=False, ready=True)) | {"pod": None} == {
        "pod": None, "state": "Ready", "reason": "PodReady"}
    assert replica_state(_pod("a", "d1", gated=False, ready=False))["state"] == "Loading"
    assert replica_state(_pod("a", "d1", gated=False, running=False))["state"] == "Pending"


def test_with_the_gate_a_ready_pod_whose_gate_is_not_true_is_not_warmed() -> None:
    """The gate keeps its meaning: pod Ready alone never counts for a gated replica."""
    obs = Observed(1, 1, "d1", "sel", pods=[_pod("a", "d1", gate="False", ready=True)])
    st = compute_status(obs, None)
    assert _conds(st)["Ready"]["status"] == "False" and st["warmedReplicas"] == 0


# -- #10: a Deployment whose ReplicaSet cannot create pods --------------------------------------

QUOTA = ('pods "add-sub-6d4f-x2x9q" is forbidden: exceeded quota: no-pods, requested: pods=1, used: pods=0, '
         'limited: pods=0')


def _deployment(*conditions: dict) -> dict:
    return {"status": {"replicas": 0, "conditions": [
        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated", "message": "..."},
        *conditions]}}


def test_a_replica_failure_of_the_deployment_is_degraded_with_the_api_servers_message() -> None:
    dep = _deployment({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": QUOTA})
    st = compute_status(Observed(1, 1, "d1", "sel", deployment=dep, pods=[]), None)
    c = _conds(st)
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "FailedCreate"), c["Degraded"]
    assert QUOTA in c["Degraded"]["message"]
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "FailedCreate")
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "RolloutStalled")
    assert QUOTA in c["Progressing"]["message"]


def test_a_cleared_replica_failure_is_not_degraded() -> None:
    dep = _deployment({"type": "ReplicaFailure", "status": "False", "reason": "FailedCreate", "message": QUOTA})
    c = _conds(compute_status(Observed(1, 1, "d1", "sel", deployment=dep,
                                       pods=[_pod("a", "d1", gate="True", ready=True)]), None))
    assert c["Degraded"]["status"] == "False" and c["Ready"]["status"] == "True"


def test_a_failed_replica_is_reported_before_a_replica_failure() -> None:
    """Triton's own reason says more than the quota does about a model that also failed to load."""
    failed = _pod("a", "d1", gate="False")
    failed["status"]["conditions"][1].update(reason="ModelLoadFailed", message="boom")
    dep = _deployment({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": QUOTA})
    c = _conds(compute_status(Observed(1, 2, "d1", "sel", deployment=dep, pods=[failed]), None))
    assert c["Degraded"]["reason"] == "ModelLoadFailed"


# -- #9: a persistent API error ----------------------------------------------------------------


def test_a_persistent_api_error_is_degraded_naming_the_verb_and_the_kind() -> None:
    """The reconcile could not apply a child: Degraded says what the API server refused; Ready and
    Progressing still say what the replicas do (here: the old config serves)."""
    why = ('apply Deployment ns/m: 403 Forbidden: deployments.apps "m" is forbidden: User '
           '"system:serviceaccount:triton-system:triton-operator" cannot patch resource "deployments"')
    obs = Observed(2, 1, "d1", "sel", api_error=Problem("ApiError", why),
                   pods=[_pod("a", "d1", gate="True", ready=True)])
    c = _conds(compute_status(obs, None))
    assert (c["Degraded"]["status"], c["Degraded"]["reason"], c["Degraded"]["message"]) == ("True", "ApiError", why)
    assert c["Ready"]["status"] == "True" and c["Progressing"]["reason"] == "RolloutComplete"


def test_an_api_error_is_reported_before_a_failed_replica() -> None:
    failed = _pod("a", "d1", gate="False")
    failed["status"]["conditions"][1].update(reason="ModelLoadFailed", message="boom")
    obs = Observed(2, 1, "d1", "sel", api_error=Problem("ApiError", "apply ConfigMap ns/m-repository-0: 422 ..."),
                   pods=[failed])
    assert _conds(compute_status(obs, None))["Degraded"]["reason"] == "ApiError"


# -- rollouts, failures and transitions ------------------------------------------------------------


def _replica(name: str, digest: str, gate: str | None, running: bool = True, reason: str = "ModelWarmed", msg: str = "") -> dict:
    conds = [] if gate is None else [{"type": WARMED_CONDITION, "status": gate, "reason": reason, "message": msg,
                                      "lastTransitionTime": "2026-01-01T00:00:05Z"},
                                     {"type": "Ready", "status": gate}]  # the kubelet follows the gate
    state = {"running": {"startedAt": "2026-01-01T00:00:01Z"}} if running else {"waiting": {"reason": "PodInitializing"}}
    return {
        "metadata": {"name": name, "annotations": {ANNOTATION_DIGEST: digest}},
        "spec": {"readinessGates": [{"conditionType": WARMED_CONDITION}]},  # as the template renders it
        "status": {"conditions": conds, "containerStatuses": [{"name": "tritonserver", "state": state}]},
    }


def test_status_ready_when_every_replica_is_warm() -> None:
    obs = Observed(3, 2, "d1", "sel", pods=[_replica("a", "d1", "True"), _replica("b", "d1", "True")])
    st = compute_status(obs, None)
    c = _conds(st)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "AllReplicasWarmed")
    assert c["Progressing"]["status"] == "False" and c["Degraded"]["status"] == "False"
    assert all(x["observedGeneration"] == 3 for x in st["conditions"])
    assert st["warmedReplicas"] == 2 and st["configDigest"] == "d1"
    assert st["replicaStates"][0]["warmupSeconds"] == 4.0


def test_status_not_ready_until_warmed_replicas_are_ready_pods() -> None:
    """Warmed but not yet Ready (readiness probe not passed yet): not in the Service, so not Ready."""
    pods = [_replica("a", "d1", "True"), _replica("b", "d1", "True")]
    pods[1]["status"]["conditions"][1]["status"] = "False"
    st = compute_status(Observed(3, 2, "d1", "sel", pods=pods), None)
    c = _conds(st)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ReplicasJoining")
    assert c["Progressing"]["reason"] == "RollingOut" and st["warmedReplicas"] == 2


def test_status_rollout_counts_only_replicas_at_the_desired_digest() -> None:
    obs = Observed(4, 2, "d2", "sel", pods=[_replica("a", "d1", "True"), _replica("b", "d1", "True"),
                                            _replica("c", "d2", "False", reason="ModelWarming")])
    c = _conds(compute_status(obs, None))
    assert c["Ready"]["status"] == "False" and c["Progressing"]["reason"] == "RollingOut"


def test_status_degraded_carries_tritons_reason() -> None:
    why = "model m is UNAVAILABLE: ZeroDivisionError: division by zero"
    obs = Observed(1, 1, "d1", "sel", pods=[_replica("a", "d1", "False", reason="ModelLoadFailed", msg=why)])
    st = compute_status(obs, None)
    c = _conds(st)
    assert c["Degraded"]["status"] == "True" and "ZeroDivisionError" in c["Degraded"]["message"]
    assert st["replicaStates"][0]["state"] == "Failed" and "ZeroDivisionError" in st["replicaStates"][0]["message"]


def test_status_problem_blocks_everything() -> None:
    obs = Observed(1, 1, None, "sel", problem=Problem("StepModelMissing", "step model x not found"))
    c = _conds(compute_status(obs, None))
    assert c["Ready"]["reason"] == "StepModelMissing" and c["Degraded"]["status"] == "True"


def test_transition_time_moves_only_when_status_flips() -> None:
    obs = Observed(1, 1, "d1", "sel", pods=[_replica("a", "d1", "False", reason="ModelWarming")])
    first = compute_status(obs, None)
    old = {**first, "conditions": [{**c, "lastTransitionTime": "2020-01-01T00:00:00Z"} for c in first["conditions"]]}
    again = compute_status(obs, old)
    assert not status_changed(old, again), "the same observation must produce the same status (no write)"
    assert not transitions(old, again)
    obs.pods = [_replica("a", "d1", "True")]
    later = compute_status(obs, old)
    ready = _conds(later)["Ready"]
    assert ready["lastTransitionTime"] != "2020-01-01T00:00:00Z"
    assert _conds(later)["Degraded"]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    assert {c["type"] for c in transitions(old, later)} == {"Ready", "Progressing"}


# -- kstatus' Reconciling and Stalled (abnormal-true) --------------------------------------------


def _failed(name: str, digest: str) -> dict:
    return _replica(name, digest, "False", reason="ModelLoadFailed", msg="ZeroDivisionError")


KSTATUS_CASES = {
    "warm": Observed(2, 2, "d2", "sel", pods=[_replica("a", "d2", "True"), _replica("b", "d2", "True")]),
    "scaled to zero": Observed(2, 0, "d2", "sel"),
    "rolling out": Observed(2, 2, "d2", "sel", pods=[_replica("a", "d1", "True"), _replica("b", "d2", "False", reason="ModelWarming")]),
    "old replica left": Observed(2, 2, "d2", "sel", pods=[_replica("a", "d2", "True"), _replica("b", "d2", "True"),
                                                          _replica("c", "d1", "True")]),
    "failed load": Observed(2, 2, "d2", "sel", pods=[_replica("a", "d1", "True"), _failed("b", "d2")]),
    "failed old replica": Observed(2, 1, "d2", "sel", pods=[_replica("a", "d2", "True"), _failed("b", "d1")]),
    "invalid spec": Observed(2, 1, None, "sel", problem=Problem("InvalidSpec", "spec.batcher: bad")),
    "api error while rolling": Observed(2, 1, "d2", "sel", api_error=Problem("ApiError", "apply Deployment ns/m: 403"),
                                        pods=[_replica("a", "d2", "False", reason="ModelWarming")]),
    "api error, warm": Observed(2, 1, "d2", "sel", api_error=Problem("ApiError", "apply PodDisruptionBudget ns/m: 422"),
                                pods=[_replica("a", "d2", "True")]),
}


def test_stalled_restates_degraded_and_reconciling_a_rollout_nothing_stalls() -> None:
    for name, obs in KSTATUS_CASES.items():
        st = compute_status(obs, None)
        assert [x["type"] for x in st["conditions"]] == ["Ready", "Progressing", "Degraded", "Reconciling", "Stalled"], name
        c = _conds(st)
        stalled, reconciling, degraded = c["Stalled"], c["Reconciling"], c["Degraded"]
        assert (stalled["status"], stalled["reason"], stalled["message"]) == (
            degraded["status"], degraded["reason"], degraded["message"]), name
        moving = c["Progressing"]["status"] == "True" and degraded["status"] == "False"
        assert reconciling["status"] == ("True" if moving else "False"), name
        assert (reconciling["status"], stalled["status"]) != ("True", "True"), f"{name}: kstatus reads the first True one"
        assert all(x["observedGeneration"] == 2 for x in c.values()), name


def test_kstatus_conditions_per_case() -> None:
    """(Reconciling, Stalled) and the reason kstatus reports with the True one."""
    def pair(name: str) -> tuple[str, str, str]:
        c = _conds(compute_status(KSTATUS_CASES[name], None))
        true = [x for x in (c["Reconciling"], c["Stalled"]) if x["status"] == "True"]
        return c["Reconciling"]["status"], c["Stalled"]["status"], true[0]["reason"] if true else ""

    assert pair("warm") == pair("scaled to zero") == ("False", "False", "")
    assert pair("rolling out") == ("True", "False", "RollingOut")
    assert pair("old replica left") == ("True", "False", "RollingOut")  # Ready=True, but the old pod is still there
    assert pair("failed load") == pair("failed old replica") == ("False", "True", "ModelLoadFailed")
    assert pair("invalid spec") == ("False", "True", "InvalidSpec")
    assert pair("api error while rolling") == pair("api error, warm") == ("False", "True", "ApiError")
    rolling = _conds(compute_status(KSTATUS_CASES["api error while rolling"], None))
    assert rolling["Progressing"]["status"] == "True", "the replicas still roll: Progressing says so, Reconciling not"


def test_reconciling_and_stalled_get_no_events_of_their_own() -> None:
    obs = Observed(2, 2, "d2", "sel", pods=[_replica("a", "d1", "True"), _replica("b", "d2", "False", reason="ModelWarming")])
    rolling = compute_status(obs, None)
    assert {c["type"] for c in transitions(None, rolling)} == {"Ready"}, "a first status: one Event, Ready's"
    assert {c["type"] for c in transitions({"conditions": []}, rolling)} == {"Ready"}
    obs.pods = [_replica("a", "d1", "True"), _failed("b", "d2")]
    stalled = compute_status(obs, rolling)
    assert _conds(stalled)["Stalled"]["status"] == "True" and _conds(stalled)["Reconciling"]["status"] == "False"
    assert {c["type"] for c in transitions(rolling, stalled)} == {"Ready", "Progressing", "Degraded"}
    assert not transitions(stalled, compute_status(obs, stalled))


def _fetching(name: str, digest: str, **fetch: dict) -> dict:
    """A replica whose tritonserver waits on its `fetch` init container, in the given state/lastState."""
    pod = _replica(name, digest, None, running=False)
    pod["status"]["initContainerStatuses"] = [{"name": "fetch", **fetch}]
    return pod


FETCH_LOG = ("Copied rendered repository files=2 from=/config to=/models\n"
             "Fetching model files model=m version=1 uri=s3://models/m\n"
             "error: fetch failed: s3://models/m: access denied (InvalidAccessKeyId): check the Secret's "
             "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")


def test_a_failed_fetch_is_degraded_source_fetch_failed_with_fetchs_own_message() -> None:
    """First failure (terminated, exit 1) and after it, in back-off (waiting, lastState terminated): both say why."""
    for fetch in ({"state": {"terminated": {"exitCode": 1, "message": FETCH_LOG}}},
                  {"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting"}},
                   "lastState": {"terminated": {"exitCode": 1, "message": FETCH_LOG}}}):
        st = compute_status(Observed(2, 1, "d1", "sel", pods=[_fetching("a", "d1", **fetch)]), None)
        c = _conds(st)
        assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "SourceFetchFailed"), c["Degraded"]
        assert c["Degraded"]["message"] == ("a: fetch: s3://models/m: access denied (InvalidAccessKeyId): check the "
                                            "Secret's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        assert (c["Ready"]["reason"], c["Stalled"]["status"]) == ("SourceFetchFailed", "True")
        assert st["replicaStates"][0]["state"] == "Failed"


def test_a_fetch_that_runs_again_or_succeeded_is_not_a_failure() -> None:
    retrying = {"state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}},
                "lastState": {"terminated": {"exitCode": 1, "message": FETCH_LOG}}}
    done = {"state": {"terminated": {"exitCode": 0, "message": ""}}}
    for fetch in (retrying, done):
        st = compute_status(Observed(2, 1, "d1", "sel", pods=[_fetching("a", "d1", **fetch)]), None)
        assert _conds(st)["Degraded"]["status"] == "False", fetch
        assert st["replicaStates"][0]["state"] == "Pending"


def test_a_fetch_crash_without_its_error_line_reports_the_last_log_line_or_the_exit_code() -> None:
    crashed = {"state": {"terminated": {"exitCode": 137, "message": "Traceback ...\nMemoryError"}}}
    silent = {"state": {"terminated": {"exitCode": 2}}}
    got = [replica_state(_fetching("a", "d1", **f))["message"] for f in (crashed, silent)]
    assert got == ["fetch: MemoryError", "fetch: exit code 2"]


def test_a_replica_that_stopped_serving_is_degraded_and_no_rollout_is_said_to_stall() -> None:
    """Issue 33: an unloaded model (or a dead stub) in a running replica: not Ready, Degraded with the gate's reason,
    and Progressing about rollouts only (none is under way: every replica runs the desired config)."""
    why = "the Python stub of model tokenizer (pid 41) has exited; every request to it fails"
    for reason in ("ModelFailing", "TritonNotAnswering", "ModelLoadFailed"):
        pods = [_replica("a", "d1", "True"), _replica("b", "d1", "False", reason=reason, msg=why)]
        st = compute_status(Observed(5, 2, "d1", "sel", pods=pods), None)
        c = _conds(st)
        assert c["Ready"]["status"] == "False", reason
        assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", reason)
        assert "b: the Python stub" in c["Degraded"]["message"]
        assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "RolloutComplete"), reason
        assert "no rollout under way" in c["Progressing"]["message"]
        assert [s["state"] for s in st["replicaStates"]] == ["Ready", "Failed"]
        assert st["replicaStates"][1]["reason"] == reason and "pid 41" in st["replicaStates"][1]["message"]
    # Healed: the gate is True again, and so is everything else.
    pods = [_replica("a", "d1", "True"), _replica("b", "d1", "True")]
    c = _conds(compute_status(Observed(5, 2, "d1", "sel", pods=pods), None))
    assert (c["Ready"]["status"], c["Degraded"]["status"], c["Progressing"]["reason"]) == ("True", "False",
                                                                                         "RolloutComplete")
    # During a rollout a failed new replica still stalls it.
    pods = [_replica("a", "d1", "True"), _replica("b", "d2", "False", reason="ModelLoadFailed", msg="boom")]
    c = _conds(compute_status(Observed(6, 1, "d2", "sel", pods=pods), None))
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "RolloutStalled")
