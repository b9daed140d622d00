"""A rollout of a pool's pod template on the real node (issue 42, item 3): every pooled model keeps a ready copy
throughout, and a replica goes only once its copies serve elsewhere (`plan.pool.rollout`).

A pool of 2 replicas carries three add-sub models of one copy each, so each model is on one replica alone: a replica
deleted before its copies serve elsewhere leaves a model with no endpoint at all. Under client load through each
model's Service (its ready endpoints, refreshed from its EndpointSlices), a change of the pool's pod annotations
rolls its Deployment (maxSurge 1, maxUnavailable 0). Checked:
- 0 failed requests to each model, and no moment when a model's Service had no ready endpoint once it had one;
- at most 3 pool pods at any moment (one surge);
- each replica of the old template was marked leaving before it went, and the new replicas carry the handover
  condition, True, which is what made them Ready;
- every endpoint the slices listed served the model at its digest (`PoolAudit`);
- the models end Ready on the 2 new replicas, each on one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad, Tally
from e2e.operator_fixtures import OperatorHandle, apply, is_model_ready, record
from e2e.pool import PoolAudit, placement, pool_doc, pooled_add_sub, replica_pods
from triton_operator.api.pool import ANNOTATION_LEAVING, HANDOVER_CONDITION, LABEL_POOL, LABEL_POOL_TEMPLATE

pytestmark = pytest.mark.cluster

POOL = "rolling"
MODELS = ("ra", "rb", "rc")


class PodSampler:
    """Samples the pool's pods until stopped: the most seen at once (not terminating), and every pod seen marked
    leaving (with the template it had), by name."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.most = 0
        self.leaving: dict[str, str] = {}
        self.samples = 0
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pool-pods", daemon=True)

    def __enter__(self) -> PodSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                pods = self.kube.items("Pod", self.namespace, label_selector={LABEL_POOL: POOL})
            except Exception as e:  # noqa: BLE001 - counted; a test reading no sample fails on `samples`
                self.errors.append(repr(e))
            else:
                live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
                self.most = max(self.most, len(live))
                for p in pods:
                    if ANNOTATION_LEAVING in (p["metadata"].get("annotations") or {}):
                        self.leaving[p["metadata"]["name"]] = p["metadata"]["labels"].get(LABEL_POOL_TEMPLATE, "")
                self.samples += 1
            self._halt.wait(0.3)


def _templates(kube: Kube, namespace: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["labels"].get(LABEL_POOL_TEMPLATE, "")
            for p in replica_pods(kube, namespace, POOL)}


def _handed_over(pod: dict) -> bool:
    return any(c.get("type") == HANDOVER_CONDITION and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


class Loads:
    """Client load through each model's Service (1 thread x 5 requests/s, to its ready endpoints refreshed from its
    EndpointSlices), started and answering on entry, stopped on exit (`tallies`)."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.loads = {m: ServiceLoad(kubeconfig, namespace, m, m, threads=1, rate=5.0, refresh=0.2, via="endpoints")
                      for m in MODELS}
        self.tallies: dict[str, Tally] = {}

    def __enter__(self) -> Loads:
        for load in self.loads.values():
            load.start()
        try:
            for m, load in self.loads.items():
                wait_for(f"{m} answering", lambda load=load: load.tally().sent - load.tally().failed >= 3, 60)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.tallies = {m: load.stop() for m, load in self.loads.items()}

    def answering_after(self, what: str) -> None:
        """Each model answered 5 requests more (a few seconds on the replicas left after `what`)."""
        for m, load in self.loads.items():
            sent = load.tally().sent
            wait_for(f"{m} answering after {what}", lambda load=load, sent=sent: load.tally().sent >= sent + 5, 30)

    def served_throughout(self, label: str) -> None:
        """Recorded under `label`; asserted: no request failed, and once a model had a ready endpoint it never had
        none."""
        for m, load in self.loads.items():
            record(f"{label}: {m}", f"{self.tallies[m].summary()}; ready endpoints {load.ready_history}")
        for m, load in self.loads.items():
            assert self.tallies[m].failed == 0 and self.tallies[m].sent >= 10, f"{m}: {self.tallies[m].summary()}"
            first = next(i for i, s in enumerate(load.ready_sets) if s)
            assert all(load.ready_sets[first:]), f"{m} had no ready endpoint at a moment: {load.ready_history}"


def test_a_pool_rollout_moves_each_replicas_copies_before_it_goes_and_fails_no_request(
        operator: OperatorHandle, kube: Kube, kubeconfig: Path, namespace: str) -> None:
    apply(kubeconfig, namespace, pool_doc(POOL, 2, "256Mi"), *(pooled_add_sub(m, POOL) for m in MODELS))
    for m in MODELS:
        wait_for(f"{m} Ready on pool {POOL}", lambda m=m: is_model_ready(kube.get("TritonModel", m, namespace)), 240)
    before = _templates(kube, namespace)
    assert len(before) == 2 and len(set(before.values())) == 1, before
    assert all(_handed_over(p) for p in replica_pods(kube, namespace, POOL)), \
        "a replica that replaces none is handed over at once (its gate holds its Ready)"

    with PoolAudit(kube, namespace, min_samples=20) as audit, PodSampler(kube, namespace) as pods, \
            Loads(kubeconfig, namespace) as loads:
        # A change of the pod template: the pool's Deployment rolls.
        kube.patch("TritonPool", POOL, {"spec": {"server": {"podAnnotations": {"rollout": "2"}}}}, namespace,
                   type="merge")
        started = time.monotonic()

        def rolled() -> dict[str, str] | None:
            now = _templates(kube, namespace)
            new = set(now.values()) - set(before.values())
            done = len(now) == 2 and len(new) == 1 and not set(now) & set(before) and all(
                is_model_ready(kube.get("TritonModel", m, namespace)) for m in MODELS)
            return now if done else None

        after = wait_for("both replicas replaced, every model Ready", rolled, 420)
        took = time.monotonic() - started
        loads.answering_after("the rollout")
    record("pool rollout: 2 replicas replaced, every model Ready", f"{took:.1f}s; most pool pods at once "
           f"{pods.most}; marked leaving {sorted(pods.leaving)}")
    loads.served_throughout("pool rollout")
    assert not audit.violations, audit.violations
    assert pods.samples >= 10, pods.errors[-3:]
    assert pods.most <= 3, f"{pods.most} pool pods at once: one surge pod at most"
    assert set(pods.leaving) == set(before), f"each old replica marked leaving before it went: {pods.leaving}"
    new_pods = replica_pods(kube, namespace, POOL)
    assert sorted(p["metadata"]["name"] for p in new_pods) == sorted(after)
    assert all(_handed_over(p) for p in new_pods), "the new replicas are Ready through their handover gate"
    for m in MODELS:
        tm = kube.get("TritonModel", m, namespace)
        assert len(placement(tm)) == 1 and placement(tm)[0] in after, (m, placement(tm), after)


def test_a_pool_scaled_down_moves_the_leaving_replicas_copies_first_and_fails_no_request(
        operator: OperatorHandle, kube: Kube, kubeconfig: Path, namespace: str) -> None:
    """A pool of 3 replicas, three 1-copy models spread one per replica, scaled to 2: the replica that goes is marked
    leaving, its model loaded on another replica, and only then does the Deployment take 2 replicas and remove it.
    No model is ever without a ready endpoint, and no request fails."""
    # The replicas up first: models applied beside the pool were placed on the replicas up at the time (a rehearsal
    # at 5e20d8f put two on one replica), and the test needs one model alone on each.
    apply(kubeconfig, namespace, pool_doc(POOL, 3, "256Mi"))
    wait_for("3 pool replicas Ready", lambda: len(rs := replica_pods(kube, namespace, POOL)) == 3 and all(
        _handed_over(p) and any(c.get("type") == "Ready" and c.get("status") == "True"
                                for c in p["status"].get("conditions") or ()) for p in rs), 240, 0.5)
    apply(kubeconfig, namespace, *(pooled_add_sub(m, POOL) for m in MODELS))
    for m in MODELS:
        wait_for(f"{m} Ready on pool {POOL}", lambda m=m: is_model_ready(kube.get("TritonModel", m, namespace)), 240)
    before = _templates(kube, namespace)
    assert len(before) == 3, before
    alone = {m: placement(kube.get("TritonModel", m, namespace)) for m in MODELS}
    assert sorted(r for p in alone.values() for r in p) == sorted(before), f"spread one per replica: {alone}"

    with PoolAudit(kube, namespace, min_samples=10) as audit, PodSampler(kube, namespace) as pods, \
            Loads(kubeconfig, namespace) as loads:
        kube.patch("TritonPool", POOL, {"spec": {"replicas": 2}}, namespace, type="merge")
        started = time.monotonic()

        def shrunk() -> dict[str, str] | None:
            now = _templates(kube, namespace)
            deployment = kube.get("Deployment", f"{POOL}-pool", namespace)
            done = (len(now) == 2 and deployment["spec"]["replicas"] == 2
                    and all(is_model_ready(kube.get("TritonModel", m, namespace)) for m in MODELS))
            return now if done else None

        after = wait_for("the pool at 2 replicas, every model Ready", shrunk, 240)
        took = time.monotonic() - started
        loads.answering_after("the scale-down")
    (gone,) = set(before) - set(after)
    moved = next(m for m, p in alone.items() if p == [gone])
    record("pool scale-down 3 -> 2", f"{took:.1f}s; marked leaving {sorted(pods.leaving)}; {moved} moved off {gone}")
    loads.served_throughout("pool scale-down")
    assert not audit.violations, audit.violations
    assert gone in pods.leaving, f"{gone} went without being marked leaving: {pods.leaving}"
    assert placement(kube.get("TritonModel", moved, namespace))[0] in after
