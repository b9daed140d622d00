"""bench.floor's rendering and request plan, and bench.scale's rows against the floor (pure parts, no cluster)."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from typing import Any

from bench.floor import UID_PLACEHOLDER, plan
from bench.readme import part
from bench.scale import NAMESPACE, floor_rows, model_docs, to_floor


def test_floor_plan_renders_every_model_with_our_children_and_a_converged_status() -> None:
    models = plan(model_docs(3))
    assert sorted(models) == ["add-sub-0000", "add-sub-0001", "add-sub-0002"]
    m = models["add-sub-0001"]
    assert [c["kind"] for c in m.children] == ["ConfigMap", "Deployment", "Service"]
    assert all(c["metadata"]["namespace"] == NAMESPACE for c in m.children)
    assert m.status["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in m.status["conditions"]}["Ready"] == "True"
    assert m.status["configDigest"]


def test_floor_requests_are_three_posts_then_the_status_with_the_owner_uid_filled_in() -> None:
    m = plan(model_docs(1))["add-sub-0000"]
    reqs = m.requests("uid-1")
    assert [(r.method, r.path) for r in reqs] == [
        ("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps"),
        ("POST", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"),
        ("POST", f"/api/v1/namespaces/{NAMESPACE}/services"),
        ("PATCH", f"/apis/serving.triton-operator.dev/v1alpha1/namespaces/{NAMESPACE}/tritonmodels/add-sub-0000/status"),
    ]
    assert reqs[-1].content_type == "application/merge-patch+json" and reqs[-1].body == {"status": m.status}
    for r in reqs[:3]:
        assert [ref["uid"] for ref in r.body["metadata"]["ownerReferences"]] == ["uid-1"]
    dumped = json.dumps([r.body for r in reqs])
    assert UID_PLACEHOLDER not in dumped
    # The rendered children stay as rendered: the next model's uid goes into a copy.
    assert UID_PLACEHOLDER in json.dumps(m.children)


def _phase(impl: str, n: int, seconds: float, cpu: float, converged: int | None = None) -> dict[str, Any]:
    return {"impl": impl, "models": n, "converged": n if converged is None else converged,
            "converge_seconds": seconds, "cpu_seconds_until_converged": {"operator": cpu}}


def test_floor_rows_divide_by_the_floor_at_the_same_size_and_judge_at_the_big_size() -> None:
    phases = [_phase("ours", 100, 3.0, 1.0), _phase("usual", 100, 6.0, 2.0), _phase("floor", 100, 2.0, 0.5),
              _phase("ours", 1000, 24.0, 10.0), _phase("usual", 1000, 60.0, 50.0), _phase("floor", 1000, 20.0, 4.0)]
    ratio, cpu = (asdict(r) for r in floor_rows((100, 1000), phases, 1000))
    assert part(ratio["ours"], "100") == "1.50x" and part(ratio["ours"], "1000") == "1.20x"
    assert part(ratio["usual"], "1000") == "3.00x" and part(ratio["floor"], "1000") == "1.00x"
    assert ratio["target"] == "<= 1.3x at 1000" and ratio["met"] is True
    assert part(cpu["ours"], "1000") == "10.0 ms (0.20x usual)" and part(cpu["usual"], "1000") == "50.0 ms"
    assert part(cpu["floor"], "100") == "5.0 ms"
    assert cpu["met"] is True  # 10 ms <= 50 ms / 4


def test_floor_rows_fail_their_targets_and_leave_out_unconverged_runs() -> None:
    phases = [_phase("ours", 1000, 30.0, 20.0), _phase("usual", 1000, 60.0, 50.0), _phase("floor", 1000, 20.0, 4.0)]
    ratio, cpu = floor_rows((1000,), phases, 1000)
    assert ratio.met is False and cpu.met is False  # 1.5x; 20 ms > 12.5 ms
    assert to_floor(_phase("ours", 1000, 30.0, 1.0, converged=999), phases[2]) is None
    assert to_floor(phases[0], None) is None
    ratio, cpu = floor_rows((1000,), phases[:2], 1000)  # no floor in the run: no verdict
    assert ratio.met is None and ratio.ours == "1000: -" and ratio.floor == "1000: -"


def test_gate_floor_pod_has_only_the_readiness_gate_and_no_probe() -> None:
    from bench.gate_floor import CONDITION, floor_pod

    pod = floor_pod("ns", "triton:1", "Never")
    assert pod["spec"]["readinessGates"] == [{"conditionType": CONDITION}]
    [c] = pod["spec"]["containers"]
    assert c["image"] == "triton:1" and c["imagePullPolicy"] == "Never" and c["command"] == ["sleep", "infinity"]
    assert not {"readinessProbe", "startupProbe", "livenessProbe"} & set(c)
    assert "imagePullPolicy" not in floor_pod("ns", "triton:1")["spec"]["containers"][0]


def test_gate_floor_patch_sets_the_condition_by_type() -> None:
    from bench.gate_floor import CONDITION, condition_patch

    [cond] = condition_patch(True, 0.0)["status"]["conditions"]
    assert cond == {"type": CONDITION, "status": "True", "lastTransitionTime": "1970-01-01T00:00:00Z"}
    assert condition_patch(False, 0.0)["status"]["conditions"][0]["status"] == "False"


def test_gate_floor_watch_records_each_change_of_ready_for_its_pod_only() -> None:
    from bench.gate_floor import ReadyWatch

    watch = ReadyWatch.__new__(ReadyWatch)  # no watch thread (it needs a cluster): only the event handling
    watch.name, watch.ready, watch.containers_ready, watch.changes = "gate-floor", None, None, []
    watch.lock = threading.Lock()

    def pod(name: str, ready: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"conditions": [
            {"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": ready}]}}

    watch._on_event("MODIFIED", pod("gate-floor", "False"), 1.0)
    watch._on_event("MODIFIED", pod("gate-floor", "False"), 2.0)
    watch._on_event("MODIFIED", pod("other", "True"), 2.5)
    watch._on_event("MODIFIED", pod("gate-floor", "True"), 3.0)
    assert watch.changes == [(1.0, "False"), (3.0, "True")] and watch.containers_ready == "True"
    assert watch.ready_since("True", 2.0) == 3.0 and watch.ready_since("True", 3.5) is None
    assert watch.ready_since("False", 0.5) == 1.0
