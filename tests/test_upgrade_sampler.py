"""e2e/upgrade_sampler.py, what bench/upgrade.py and `make demo-upgrade` read an operator upgrade with: on objects shaped
as the API server returns them, which Deployments count as rolling, which pods as Pending for want of room, what a
run of samples folds into (the most rolling at once, samples over a bound, restarts and new pods since the first
sample, the timeline), and the lines the demo prints."""

from __future__ import annotations

import threading
import time
from typing import Any

from e2e.upgrade_sampler import Record, Sampler, changes, owner, snapshot, unschedulable
from triton_operator.api.kinds import LABEL_MODEL, LABEL_POOL
from triton_operator.plan.upgrade import UPGRADE_WAITING

OLD, NEW = "op:1", "op:1-new"


def dep(name: str, *, rolled: bool = True, image: str = OLD) -> dict[str, Any]:
    """A Deployment of one replica: rolled out, or with a spec its controller has not finished rolling."""
    status = ({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1} if rolled else
              {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1})
    return {"metadata": {"name": name, "generation": 2}, "spec": {"replicas": 1, "template": {"spec": {"containers": [
        {"name": "tritonserver", "image": "triton"}, {"name": "probe", "image": image}]}}}, "status": status}


def pod(name: str, model: str, *, uid: str = "", pending: bool = False, restarts: int = 0,
        label: str = LABEL_MODEL) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running", "containerStatuses": [
        {"name": "tritonserver", "restartCount": restarts}, {"name": "probe", "restartCount": 0}]}
    if pending:
        status = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                      "reason": "Unschedulable", "message": "0/1 nodes: nvidia.com/gpu"}]}
    return {"metadata": {"name": name, "uid": uid or name, "labels": {label: model}}, "status": status}


def model(name: str, reason: str = "") -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True", "reason": "AllReplicasWarmed"}]
    if reason:
        conditions.append({"type": "Progressing", "status": "True", "reason": reason})
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


def test_a_pod_is_unschedulable_only_when_pending_with_the_schedulers_reason() -> None:
    assert unschedulable(pod("a", "m", pending=True))
    assert not unschedulable(pod("a", "m"))
    waiting = {"metadata": {"name": "b"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "True"}]}}  # scheduled, its containers not yet started
    assert not unschedulable(waiting)
    assert not unschedulable({"metadata": {"name": "c"}})


def test_a_pod_belongs_to_its_model_or_its_pool() -> None:
    assert owner(pod("a-1", "a")) == "a"
    assert owner(pod("p-1", "shared", label=LABEL_POOL)) == "shared"
    assert owner({"metadata": {"name": "loose"}}) == "loose"


def test_a_snapshot_reads_rolling_deployments_reasons_pending_pods_and_restarts() -> None:
    s = snapshot(1.5, [dep("a"), dep("b", rolled=False, image=NEW)],
                 [pod("a-1", "a", restarts=2), pod("b-1", "b"), pod("b-2", "b", pending=True)],
                 [model("a", "RolloutComplete"), model("b", UPGRADE_WAITING), model("c")])
    assert s.at == 1.5
    assert s.rolling == {"b"}
    assert s.reasons == {"a": "RolloutComplete", "b": UPGRADE_WAITING, "c": ""}
    assert s.pending == {"b-2"}
    assert s.restarts["a-1/tritonserver"] == 2 and s.restarts["b-1/probe"] == 0
    assert s.pods == {"a": {"a-1"}, "b": {"b-1", "b-2"}}
    assert s.images["b"] == {"triton", NEW}


def test_a_deployment_whose_controller_has_not_seen_its_spec_is_rolling() -> None:
    d = dep("a")
    d["metadata"]["generation"] = 3  # the operator's patch; observedGeneration still 2
    assert snapshot(0, [d], [], []).rolling == {"a"}


def test_a_deployment_of_no_replica_replaces_no_pod_and_does_not_count_as_rolling() -> None:
    step = dep("step")
    step["spec"]["replicas"] = 0
    step["metadata"]["generation"] = 3  # its new template, not observed yet: it rolls nothing
    assert snapshot(0, [step], [], []).rolling == frozenset()


def test_a_record_counts_from_its_first_sample() -> None:
    r = Record(bound=1, waiting_reason=UPGRADE_WAITING)
    before = snapshot(0, [dep("a"), dep("b")], [pod("a-1", "a", restarts=1), pod("b-1", "b")], [model("a"), model("b")])
    one = snapshot(1, [dep("a", rolled=False), dep("b")],
                   [pod("a-1", "a", restarts=1), pod("a-2", "a"), pod("b-1", "b")], [model("a"), model("b", UPGRADE_WAITING)])
    two = snapshot(2, [dep("a", rolled=False), dep("b", rolled=False)],
                   [pod("a-2", "a"), pod("b-1", "b", restarts=1), pod("b-2", "b", pending=True)],
                   [model("a"), model("b")])
    done = snapshot(3, [dep("a"), dep("b")], [pod("a-2", "a"), pod("b-2", "b")], [model("a"), model("b")])
    for s in (before, one, two, done):
        r.add(s)
    assert r.samples == 4
    assert r.max_rolling == 2 and r.most == ["a", "b"]
    assert r.over == ["+2.0s ['a', 'b']"]
    assert r.waited(UPGRADE_WAITING) == ["b"]
    assert r.pending == {"b-2"}
    assert r.restarts == {"b-1/tritonserver": 1}  # a-1's restart was before the first sample
    assert r.new_pods == {"a": {"a-2"}, "b": {"b-2"}}
    assert r.timeline == [(0, 0, 0, 0), (1, 1, 1, 0), (2, 2, 0, 1), (3, 0, 0, 0)]
    assert r.spans == {"a": [1, 3], "b": [2, 3]}


def test_without_a_bound_nothing_is_over_it() -> None:
    r = Record()
    r.add(snapshot(0, [dep("a", rolled=False), dep("b", rolled=False)], [], []))
    assert r.max_rolling == 2 and not r.over


def test_the_timeline_keeps_only_changes() -> None:
    r = Record()
    for at in range(5):
        r.add(snapshot(at, [dep("a")], [], []))
    assert r.timeline == [(0, 0, 0, 0)]


def test_changes_name_what_starts_and_ends_rolling_and_each_new_reason() -> None:
    before = snapshot(0, [dep("a"), dep("b")], [pod("a-1", "a"), pod("b-1", "b")], [model("a"), model("b")])
    assert changes(None, before) == []
    now = snapshot(1, [dep("a", rolled=False, image=NEW), dep("b")],
                   [pod("a-1", "a"), pod("a-2", "a", pending=True), pod("b-1", "b", restarts=1)],
                   [model("a", "UpgradeRolloutStarted"), model("b", UPGRADE_WAITING)])
    assert changes(before, now) == [
        f"a rolling (new pod template: {NEW})",
        "a Progressing reason=UpgradeRolloutStarted",
        f"b Progressing reason={UPGRADE_WAITING}",
        "pod a-2 Pending: no node has room (Unschedulable)",
        "container b-1/tritonserver restarted (1)",
    ]
    later = snapshot(2, [dep("a", image=NEW), dep("b")], [pod("a-2", "a"), pod("b-1", "b", restarts=1)],
                     [model("a"), model("b", UPGRADE_WAITING)])
    assert changes(now, later) == ["a rolled out", "a Progressing reason=-"]
    assert changes(later, later) == []
    assert changes(None, now) == ["a rolling"]


def test_the_sampler_reads_through_its_callable_and_reports_changes() -> None:
    state = {"deps": [dep("a")]}
    seen: list[str] = []
    sampler = Sampler(lambda: (state["deps"], [], []), on_change=lambda at, lines: seen.extend(lines))
    sampler.sample()
    state["deps"] = [dep("a", rolled=False)]
    sampler.sample()
    state["deps"] = [dep("a")]
    sampler.sample()
    assert seen == ["a rolling", "a rolled out"]
    assert sampler.record.samples == 3 and sampler.record.max_rolling == 1


def test_a_failed_read_is_one_sample_lost() -> None:
    calls = threading.Event()

    def read() -> Any:
        calls.set()
        raise ConnectionError("refused")

    sampler = Sampler(read, period=0.01).start()
    assert calls.wait(10)
    deadline = time.monotonic() + 10
    while not sampler.record.errors and time.monotonic() < deadline:
        time.sleep(0.01)
    record = sampler.stop()
    assert record.errors and "refused" in record.errors[0] and record.samples == 0
