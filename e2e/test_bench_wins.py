"""bench.stale's and bench.pool_routing's pure parts (no cluster): which config an answer names, the old config's
answers after "completed", what counts as the status saying so, the poll-mode baseline's Deployment, and how a
failed request is classified and counted. In e2e/ because both import the cluster harness (e2e.load)."""

from __future__ import annotations

from typing import Any

from bench.pool_routing import NO_ENDPOINT, NOT_LOADED, OTHER, Phase, classify, failures_by_kind, readiness_service
from bench.pool_routing import result as routing_result
from bench.stale import (
    Side,
    generation_model,
    generation_of,
    kstatus_done,
    per_second,
    poll_mode_children,
    stale_answers,
)
from bench.stale import result as stale_result
from triton_operator.api.pool import LABEL_POOL


def test_an_answer_names_the_generation_that_added_itself_to_every_element() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]
    assert generation_of(a, b, [13.0, 24.0, 35.0, 46.0]) == 2
    assert generation_of(a, b, [11.0, 22.0, 33.0, 44.0]) == 0
    assert generation_of(a, b, [13.0, 24.0, 35.0, 47.0]) is None, "elements that disagree name no generation"
    assert generation_of(a, b, [11.5, 22.5, 33.5, 44.5]) is None, "only whole generations"


def test_the_model_adds_its_generation_parameter_to_output0() -> None:
    doc = generation_model(7)
    assert doc["spec"]["parameters"]["generation"] == "7"
    py = doc["spec"]["source"]["inline"]["model.py"]
    assert "self.generation = float(params.get(\"generation\"" in py
    assert "(a + b + self.generation)" in py


def test_stale_answers_count_only_the_old_generation_after_completed() -> None:
    answers = [(9.0, "p1", 1), (10.5, "p1", 1), (10.8, "p2", 2), (12.0, "p2", 1), (13.0, "p1", 2)]
    st = stale_answers(answers, completed_at=10.0, old=1, new=2)
    assert (st.answers_after, st.old_after) == (4, 2)
    assert st.last_old_after_s == 2.0 and st.all_new_s == 2.0
    assert st.by_address == {"p1": 1, "p2": 1}
    assert st.first_new_s is not None and abs(st.first_new_s - 0.8) < 1e-9


def test_no_stale_answer_gives_zero_and_no_lateness() -> None:
    st = stale_answers([(9.0, "p1", 1), (9.5, "p1", 2), (11.0, "p1", 2)], completed_at=10.0, old=1, new=2)
    assert (st.old_after, st.last_old_after_s, st.all_new_s) == (0, None, 0.0)
    assert st.first_new_s == -0.5, "a new answer before completed is reported as negative"


def test_per_second_bins_answers_by_generation() -> None:
    out = per_second([(100.2, "a", 1), (100.9, "a", 2), (101.1, "a", 2), (99.0, "a", 1), (104.0, "a", 3)],
                     100.0, 102.5)
    assert out == [{"t": 0, "old": 1, "new": 1, "other": 0}, {"t": 1, "old": 0, "new": 1, "other": 0},
                   {"t": 2, "old": 0, "new": 0, "other": 0}]


def _tm(gen: int, observed: list[int], ready: str = "True", reason: str = "RolloutComplete") -> dict[str, Any]:
    types = ["Ready", "Progressing", "Degraded"]
    status = {"Ready": ready, "Progressing": "False", "Degraded": "False"}
    conds = [{"type": t, "status": status[t], "observedGeneration": o,
              **({"reason": reason} if t == "Progressing" else {})} for t, o in zip(types, observed, strict=True)]
    return {"metadata": {"generation": gen}, "status": {"conditions": conds}}


def test_the_status_says_done_only_when_every_condition_observed_the_generation_and_the_rollout_completed() -> None:
    assert kstatus_done(_tm(2, [2, 2, 2]))
    assert not kstatus_done(_tm(2, [2, 1, 2])), "a condition from the previous generation"
    assert not kstatus_done(_tm(2, [2, 2, 2], reason="RollingOut"))
    assert not kstatus_done(_tm(2, [2, 2, 2], ready="False"))
    assert not kstatus_done({"metadata": {"generation": 1}, "status": {}})


def test_the_poll_mode_baseline_reads_its_configmap_in_poll_mode_without_a_gate() -> None:
    objs = {o["kind"]: o for o in poll_mode_children(1, "plain", "ns")}
    assert set(objs) == {"ConfigMap", "Deployment", "Service"}
    assert "immutable" not in objs["ConfigMap"], "a ConfigMap the user edits in place"
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    triton = next(c for c in pod["containers"] if c["name"] == "tritonserver")
    assert "--model-control-mode=poll" in triton["args"]
    assert not any(a.startswith("--load-model") or a == "--model-control-mode=explicit" for a in triton["args"])
    assert "readinessGates" not in pod and [c["name"] for c in pod["containers"]] == ["tritonserver"]
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    volume = next(v for v in pod["volumes"] if v["name"] == "repository")
    assert volume["configMap"]["name"] == "plain-repository" == objs["ConfigMap"]["metadata"]["name"]
    # at the model's directory: the kubelet's ..data entries there are no models to Triton's poll
    assert sorted(i["path"] for i in volume["configMap"]["items"]) == ["1/model.py", "config.pbtxt"]
    mount = next(m for m in triton["volumeMounts"] if m["name"] == "repository")
    assert mount["mountPath"] == "/models/plain" and "--model-repository=/models" in triton["args"]
    assert any("generation" in v and "1" in v for v in objs["ConfigMap"]["data"].values())


def test_failures_are_classified_by_what_the_request_met() -> None:
    assert classify("HTTP 400: {\"error\":\"Request for unknown model: 'placed' is not found\"}") == NOT_LOADED
    assert classify("HTTP 400: {\"error\":\"Request for unknown model: 'placed' has no available versions\"}") \
        == NOT_LOADED
    assert classify("no ready endpoint in Service placed's EndpointSlices") == NO_ENDPOINT
    assert classify("ConnectionRefusedError: [Errno 111] Connection refused") == OTHER
    assert classify("wrong answer [1.0], expected [2.0]") == OTHER


def test_failures_by_kind_count_the_unclassified_as_no_endpoint_within_the_window() -> None:
    kinds = [(1.0, NOT_LOADED), (2.0, NOT_LOADED), (3.0, OTHER), (9.0, NOT_LOADED)]
    failed_at = [1.0, 2.0, 2.5, 3.0, 4.0, 9.0]
    assert failures_by_kind(kinds, failed_at, 0.5, 5.0) == {NOT_LOADED: 2, NO_ENDPOINT: 2, OTHER: 1}
    assert failures_by_kind(kinds, failed_at, 8.0, 10.0) == {NOT_LOADED: 1, NO_ENDPOINT: 0, OTHER: 0}


def test_the_readiness_service_selects_every_pool_pod_on_triton_http() -> None:
    svc = readiness_service("x")
    assert svc["spec"]["selector"] == {LABEL_POOL: "shared"}
    assert svc["spec"]["ports"][0]["port"] == 8000 and svc["spec"]["ports"][0]["name"] == "http"


def test_stale_rows_meet_the_target_only_with_no_old_answer_after_completed() -> None:
    ours, usual = Side("ours", completed_s=3.0), Side("usual", completed_s=1.0)
    ours.stale = stale_answers([(9.0, "a", 1), (11.0, "a", 2)], 10.0, 1, 2)
    usual.stale = stale_answers([(11.0, "b", 1), (40.0, "b", 1), (41.0, "b", 2)], 10.0, 1, 2)
    res = stale_result(ours, usual, ["--model-control-mode=poll"])
    first = res.rows[0]
    assert (first.ours, first.usual, first.met) == ("0 of 1", "2 of 3", True)
    assert res.rows[1].usual == "30.0 s" and res.rows[1].ours == "- (none)"
    assert "--model-control-mode=poll" in res.method and "model_management.md" in res.method
    ours.stale = stale_answers([(11.0, "a", 1)], 10.0, 1, 2)
    assert stale_result(ours, usual, []).rows[0].met is False


def test_pool_routing_rows_per_phase_and_a_note_when_ours_had_no_endpoint() -> None:
    quiet = Phase("unload", "unload", 5.0, {"ours": 10, "usual": 10},
                  {"ours": {NOT_LOADED: 0, NO_ENDPOINT: 0, OTHER: 0}, "usual": {NOT_LOADED: 6, NO_ENDPOINT: 0, OTHER: 0}})
    res = routing_result([quiet], {"ours": (10, 0), "usual": (10, 6)}, {"ours": {}, "usual": {}})
    assert (res.rows[0].ours, res.rows[0].usual, res.rows[0].met) == ("0 of 10", "6 of 10", True)
    assert not any("no ready endpoint" in n for n in res.notes)
    gap = Phase("move", "move", 5.0, {"ours": 10, "usual": 10},
                {"ours": {NOT_LOADED: 1, NO_ENDPOINT: 4, OTHER: 0}, "usual": {NOT_LOADED: 6, NO_ENDPOINT: 0, OTHER: 0}})
    res = routing_result([gap], {"ours": (10, 5), "usual": (10, 6)}, {"ours": {}, "usual": {}})
    assert res.rows[0].met is False and res.rows[1].ours == "4 / 0"
    assert any("no ready endpoint for some requests (move: 4)" in n for n in res.notes)
