"""The bound on upgrade rollouts on real nodes (issue 42 item 3, `plan.upgrade`): an operator upgrade that renders
another pod template for models nobody changed rolls at most `--max-upgrade-rollouts` of their Deployments at once;
the others wait (Progressing=True, reason UpgradeRolloutWaiting) on their old pods, and clients of every model's
Service lose no request.

The upgrade: the test's own host-process operator, run with `--max-upgrade-rollouts 1`, is stopped and started again
with another `--default-triton-image`, which names the same tritonserver image under another tag (tagged with `ctr`
on every node: no pull), as a new operator version with a new default image would; the models name no image. Restarted
once more mid-way (one model rolling, another waiting), it must keep the bound: it counts again from the Deployments.
A TritonPool of one replica with one pooled model is upgraded in the same bound: its Deployment counts as one, and
its replica hands the model over to the new one before it goes, so the pooled model's Service fails no request either.

A sampler thread LISTs the namespace's Deployments and TritonModels while the upgrade runs: a Deployment is in an
upgrade rollout when its template names the new reference (or its labels carry the operator's `upgrade-rollout-started`
record) and its rollout is not finished, as `kubectl rollout status` judges it.

The second test fills a node's GPUs (pause pods of one GPU each, beside a 2-replica and a 1-replica model pinned to
that node): the 2-replica model rolls without a surge pod (never more than its 2 pods not terminating), the
1-replica one keeps its surge, which cannot be scheduled and says so (Progressing reason
UpgradeRolloutUnschedulable, naming nvidia.com/gpu) until the test frees a GPU; no request fails.

The third fills the node's GPUs beside a GPU pool of 2 replicas: the pool's surge pod cannot be scheduled, so an old
replica hands its copy over to the other and goes first, its GPU going to the new pod (the rollout goes on without a
surge pod); no pod is left Pending, and the pooled models' Services fail no request.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from e2e.images import PAUSE_IMAGE, TRITON_REF
from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad, Tally
from e2e.operator_fixtures import (
    OperatorHandle,
    add_sub,
    apply,
    is_model_ready,
    live_pods,
    model_condition,
    record,
    start_operator,
    wait_model,
)
from e2e.pool import pool_doc, pooled_add_sub
from e2e.testing import delete_namespace
from triton_operator.api.kinds import LABEL_MODEL
from triton_operator.api.pod import TRITON_CONTAINER
from triton_operator.api.pool import LABEL_POOL
from triton_operator.plan.upgrade import (
    LABEL_STARTED,
    NO_SURGE,
    RECORD,
    ROLLING_WITHOUT_SURGE,
    UPGRADE_STARTED,
    UPGRADE_UNSCHEDULABLE,
    UPGRADE_WAITING,
)

pytestmark = pytest.mark.cluster

#: The same image as TRITON_REF under another name: the "new default image" of the upgrade.
NEW_REF = "localhost/triton-operator/tritonserver:upgrade-bound"
MODELS = ("ub-a", "ub-b", "ub-c")
LIMIT = 1
#: A pool of one replica with one pooled model: its Deployment counts against the same bound, and its replica hands
#: the model over to the new one before it goes (`plan.pool.rollout`).
POOL, POOLED = "ubpool", "ub-p"
OWNED_SELECTOR = "app.kubernetes.io/managed-by=triton-operator"


def _image(obj: dict[str, Any]) -> str | None:
    """The tritonserver container's image of a Deployment (its template) or of a Pod."""
    spec = obj["spec"]["template"]["spec"] if "template" in obj["spec"] else obj["spec"]  # a LIST's items have no kind
    return next((c["image"] for c in spec["containers"] if c["name"] == TRITON_CONTAINER), None)


def _finished(dep: dict[str, Any]) -> bool:
    """`kubectl rollout status`'s judgement: the controller saw the latest spec, every replica is updated and
    available, and no replica of an older template is left."""
    spec, status = dep["spec"], dep.get("status") or {}
    wanted, updated = spec.get("replicas", 1), status.get("updatedReplicas", 0)
    return (status.get("observedGeneration", 0) >= dep["metadata"]["generation"] and updated >= wanted
            and status.get("replicas", 0) == updated and status.get("availableReplicas", 0) >= updated)


def _rolling(deployments: list[dict[str, Any]]) -> set[str]:
    """The Deployments in an unfinished upgrade rollout: on the new template, or with the operator's record."""
    return {d["metadata"]["name"] for d in deployments if not _finished(d) and (
        _image(d) == NEW_REF or LABEL_STARTED in (d["metadata"].get("labels") or {}))}


class _Sampler:
    """LISTs the namespace's model Deployments and TritonModels until stopped: the most Deployments seen in an upgrade
    rollout in one LIST, and every model seen waiting for a slot."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kube, self.namespace = Kube(kubeconfig, timeout=5), namespace
        self.max_rolling, self.samples = 0, 0
        self.rolling_now: set[str] = set()
        self.over: list[str] = []  # the samples above the bound, as "+<s>s [names]"
        self.waiting: set[str] = set()
        self.waiting_now: set[str] = set()
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="upgrade-sampler", daemon=True)
        self._t0 = time.monotonic()

    def start(self) -> _Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(15)

    def _sample(self) -> None:
        deps = self.kube.items("Deployment", self.namespace, labelSelector=OWNED_SELECTOR)  # the models' and pool's
        models = self.kube.items("TritonModel", self.namespace) + self.kube.items("TritonPool", self.namespace)
        rolling = _rolling(deps)
        waiting = {m["metadata"]["name"] for m in models
                   if model_condition(m, "Progressing").get("reason") == UPGRADE_WAITING}
        self.rolling_now, self.waiting_now = rolling, waiting
        self.waiting |= waiting
        self.max_rolling = max(self.max_rolling, len(rolling))
        if len(rolling) > LIMIT:
            self.over.append(f"+{time.monotonic() - self._t0:.1f}s {sorted(rolling)}")
        self.samples += 1

    def _loop(self) -> None:
        while not self._halt.is_set():
            try:
                self._sample()
            except Exception as exc:  # noqa: BLE001 - a transient API error is one sample lost, reported at the end
                self.errors.append(repr(exc)[:200])
            self._halt.wait(0.2)  # the sampling period, not a wait for a condition


def _upgraded(kube: Kube, namespace: str, name: str) -> bool:
    """The model Ready, its Deployment on the new reference with its rollout finished, its only live pod on it."""
    dep = kube.items("Deployment", namespace, labelSelector=f"{LABEL_MODEL}={name}")
    pods = live_pods(kube, namespace, name)
    return (is_model_ready(kube.get("TritonModel", name, namespace)) and len(dep) == 1 and _image(dep[0]) == NEW_REF
            and _finished(dep[0]) and len(pods) == 1 and _image(pods[0]) == NEW_REF)


def _pool_upgraded(kube: Kube, namespace: str) -> bool:
    """The pooled model Ready, the pool's Deployment on the new reference with its rollout finished, its one live
    replica on it."""
    dep = kube.get("Deployment", f"{POOL}-pool", namespace)
    pods = [p for p in kube.items("Pod", namespace, labelSelector=f"{LABEL_POOL}={POOL}")
            if not p["metadata"].get("deletionTimestamp")]
    return (is_model_ready(kube.get("TritonModel", POOLED, namespace)) and _image(dep) == NEW_REF and _finished(dep)
            and len(pods) == 1 and _image(pods[0]) == NEW_REF)


def _misplaced_records(kube: Kube, namespace: str) -> list[str]:
    """Where the operator's record is not as `plan.upgrade` says: each model Deployment carries all of it in its own
    labels, none of it in its annotations (whose changes bump its generation, and which its ReplicaSets copy), its
    selector or its pod template; no ReplicaSet carries any of it."""
    out = []
    for d in kube.items("Deployment", namespace, labelSelector=LABEL_MODEL):
        meta, name = d["metadata"], d["metadata"]["name"]
        if missing := set(RECORD) - set(meta.get("labels") or {}):
            out.append(f"Deployment {name}: no label {sorted(missing)}")
        template = d["spec"]["template"]["metadata"]
        for where, keys in (("annotations", meta.get("annotations")), ("selector", d["spec"]["selector"]["matchLabels"]),
                            ("template labels", template.get("labels")), ("template annotations", template.get("annotations"))):
            if found := set(RECORD) & set(keys or {}):
                out.append(f"Deployment {name}: {sorted(found)} in its {where}")
    for rs in kube.items("ReplicaSet", namespace, labelSelector=LABEL_MODEL):
        meta = rs["metadata"]
        if found := set(RECORD) & {*(meta.get("labels") or {}), *(meta.get("annotations") or {})}:
            out.append(f"ReplicaSet {meta['name']}: {sorted(found)}")
    return out


def _start_loads(kubeconfig: Path, namespace: str, names: Iterable[str], loads: list[ServiceLoad]) -> dict[str, Tally]:
    """A load through each model's Service (1 thread x 5 requests/s), added to `loads` as it starts (the caller's
    `finally` stops them), until each has answered 10 times; returns their tallies then, which the upgrade's requests
    are counted from: before, kube-proxy may not have the new Services' endpoints yet (a refused connection)."""
    for name in names:
        loads.append(ServiceLoad(kubeconfig, namespace, name, name, threads=1, rate=5.0, refresh=0.5).start())
    for load in loads:
        wait_for(f"{load.model} answering the load", lambda load=load: load.tally().sent - load.tally().failed >= 10, 60)
    return {load.model: load.tally() for load in loads}


def _tag_new_ref(cluster: Any) -> None:
    if cluster.local is None:
        pytest.skip("needs this project's own local cluster (ctr on the nodes' containerd)")
    for node in cluster.local.nodes():
        node.ctr("images", "tag", "--force", TRITON_REF, NEW_REF)


def _upgrade(op: OperatorHandle, sampler: _Sampler) -> bool:
    """The operator restarted on the new default image, and once more while one model rolls and another waits.
    Returns whether that second restart happened (a rollout may finish between two samples of a fast machine)."""
    op.stop()
    op.argv[op.argv.index("--default-triton-image") + 1] = NEW_REF
    op.start()
    wait_for("one model rolling and another waiting", lambda: (sampler.rolling_now and sampler.waiting_now)
             or (sampler.waiting and not sampler.waiting_now), 180)
    if not (sampler.rolling_now and sampler.waiting_now):
        return False
    op.restart()
    return True


def test_an_operator_upgrade_rolls_at_most_the_bound_of_unchanged_models(
        kube: Kube, kubeconfig: Path, cluster: Any, tmp_path: Path) -> None:
    prefix = f"ub{uuid.uuid4().hex[:4]}"
    namespace = f"{prefix}-models"
    _tag_new_ref(cluster)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {"e2e.triton-operator.io/test": "true"}}})
    op = start_operator(kubeconfig, kube, cluster.logs or tmp_path, pattern=f"{prefix}-*",
                        log_name=f"operator-{prefix}.log", webhook=False,
                        args=("--max-upgrade-rollouts", str(LIMIT)))
    loads: list[ServiceLoad] = []
    sampler = _Sampler(kubeconfig, namespace)
    try:
        wait_for("the default ServiceAccount", lambda: kube.get_or_none("ServiceAccount", "default", namespace), 30)
        apply(kubeconfig, namespace, *(add_sub(name) for name in MODELS), pool_doc(POOL, 1, "256Mi"),
              pooled_add_sub(POOLED, POOL))
        for name in (*MODELS, POOLED):
            wait_model(kube, namespace, name, is_model_ready, "Ready", 300)
        for d in kube.items("Deployment", namespace, labelSelector=OWNED_SELECTOR):
            assert _image(d) == TRITON_REF, d["metadata"]["name"]
        warmup = _start_loads(kubeconfig, namespace, (*MODELS, POOLED), loads)

        sampler.start()
        t0 = time.monotonic()
        restarted = _upgrade(op, sampler)
        for name in MODELS:
            wait_for(f"{name} Ready on {NEW_REF}, its rollout finished", lambda name=name: _upgraded(kube, namespace, name),
                     600)
        wait_for(f"pool {POOL} on {NEW_REF}, its rollout finished, {POOLED} Ready",
                 lambda: _pool_upgraded(kube, namespace), 600)
        took = time.monotonic() - t0
        sampler.stop()
        tallies = {load.model: load.stop() - warmup[load.model] for load in loads}
        events = [e for e in kube.items("Event", namespace) if e.get("reason") == UPGRADE_STARTED]
        misplaced = _misplaced_records(kube, namespace)
    finally:
        sampler.stop()
        for load in loads:
            load.__exit__()
        op.stop()
        delete_namespace(kube, namespace)  # the operator stopped first

    started = {name: sum(e["involvedObject"]["name"] == name for e in events) for name in (*MODELS, POOL)}
    failed = sum(t.failed for t in tallies.values())
    record("upgrade bound: 3 unchanged models and a pool, --max-upgrade-rollouts 1, upgrade took", f"{took:.1f}s")
    record("upgrade bound: most in an upgrade rollout at once",
           f"{sampler.max_rolling} in {sampler.samples} samples; waited: {sorted(sampler.waiting)}; "
           f"restart mid-way: {restarted}")
    record("upgrade bound: requests during the upgrade", "; ".join(f"{m}: {t.summary()}" for m, t in tallies.items()))
    record("upgrade bound: failed requests before it (the load's start)", {m: t.failed for m, t in warmup.items()})
    assert not sampler.over, f"more than {LIMIT} Deployment(s) in an upgrade rollout at once: {sampler.over}"
    assert sampler.max_rolling == LIMIT, f"no sample saw an upgrade rollout ({sampler.samples} samples)"
    assert sampler.samples > 10 * len(sampler.errors), f"too many samples lost: {sampler.errors[:5]}"
    assert sampler.waiting, f"no model was seen {UPGRADE_WAITING}"
    assert failed == 0, "; ".join(f"{load.model}: {tallies[load.model].summary()}, load started {load.started_at}, "
                                  f"first failures {load.samples}" for load in loads)
    for m, t in tallies.items():
        assert t.sent - t.failed >= 20, f"{m}: the load did not really run: {t.summary()}"
    assert all(started.values()), f"{UPGRADE_STARTED} Events per model and pool: {started}"
    assert not misplaced, misplaced


GPU = "nvidia.com/gpu"
FILLER = "gpu-filler"
#: A container that asks nothing of the pod security admission (as e2e/test_metrics_api.py runs its pause pods).
RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
              "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}}


def _gpus_of(pod: dict[str, Any]) -> int:
    return sum(int(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0)
                   or ((c.get("resources") or {}).get("requests") or {}).get(GPU, 0))
               for c in pod["spec"].get("containers") or ())


def _free_gpus(kube: Kube, node: str) -> int:
    """The node's GPUs no pod holds: what the scheduler sees (a terminating pod holds its GPU until it is gone)."""
    allocatable = int(kube.get("Node", node)["status"]["allocatable"].get(GPU, "0"))
    held = sum(_gpus_of(p) for p in kube.items("Pod", None, fieldSelector=f"spec.nodeName={node}")
               if p["status"].get("phase") not in ("Succeeded", "Failed"))
    return allocatable - held


def _fill(kube: Kube, namespace: str, node: str) -> None:
    """Pause pods of one GPU each on `node` until none is free (each scheduled before the next is counted)."""
    made = [0]

    def full() -> bool:
        fillers = kube.items("Pod", namespace, labelSelector=f"app={FILLER}")
        if any(p["status"].get("phase") != "Running" for p in fillers):
            return False
        # A terminating pod's GPU (an earlier test's namespace going) is free a moment later: filled around it, the
        # node had a GPU free by the upgrade (a rehearsal's pool surge pod was scheduled, at eaf47d1).
        if any(p["metadata"].get("deletionTimestamp") and _gpus_of(p)
               for p in kube.items("Pod", None, fieldSelector=f"spec.nodeName={node}")):
            return False
        if _free_gpus(kube, node) <= 0:
            return True
        made[0] += 1
        kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{FILLER}-{made[0]}",
                                                                     "labels": {"app": FILLER}},
                     "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "containers": [{
                         "name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "IfNotPresent",
                         "securityContext": RESTRICTED, "resources": {"limits": {GPU: "1"}}}]}}, namespace)
        return False

    wait_for(f"every GPU of {node} in use", full, 120)


def _unscheduled(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") == "Pending" and any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in pod["status"].get("conditions") or ())


class _PodSampler(threading.Thread):
    """LISTs the namespace's model pods and TritonModels until stopped (or, with `label` LABEL_POOL and `kind`
    TritonPool, its pool pods and TritonPools): per model (pool), the most pods not terminating at once, the pods
    seen Pending as Unschedulable, and the Progressing reasons seen."""

    def __init__(self, kubeconfig: Path, namespace: str, label: str = LABEL_MODEL, kind: str = "TritonModel") -> None:
        super().__init__(name="full-gpus-sampler", daemon=True)
        self.kube, self.namespace = Kube(kubeconfig, timeout=5), namespace
        self.label, self.kind = label, kind
        self.most: dict[str, int] = {}
        self.unscheduled: dict[str, set[str]] = {}
        self.reasons: dict[str, dict[str, str]] = {}  # model -> Progressing reason -> its last message
        self.samples = 0
        self.errors: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                pods = self.kube.items("Pod", self.namespace, labelSelector=self.label)
                by_model: dict[str, list[dict[str, Any]]] = {}
                for pod in pods:
                    by_model.setdefault(pod["metadata"]["labels"][self.label], []).append(pod)
                for model, its in by_model.items():
                    alive = [p for p in its if not p["metadata"].get("deletionTimestamp")]
                    self.most[model] = max(self.most.get(model, 0), len(alive))
                    self.unscheduled.setdefault(model, set()).update(p["metadata"]["name"] for p in alive
                                                                     if _unscheduled(p))
                for tm in self.kube.items(self.kind, self.namespace):
                    c = model_condition(tm, "Progressing")
                    self.reasons.setdefault(tm["metadata"]["name"], {})[c.get("reason", "")] = c.get("message", "")
                self.samples += 1
            except Exception as exc:  # noqa: BLE001 - a transient API error is one sample lost, reported at the end
                self.errors.append(repr(exc)[:200])
            self.halt.wait(0.2)  # the sampling period, not a wait for a condition


def _on_new_ref(kube: Kube, namespace: str, name: str, replicas: int) -> bool:
    dep = kube.items("Deployment", namespace, labelSelector=f"{LABEL_MODEL}={name}")
    pods = live_pods(kube, namespace, name)
    return (is_model_ready(kube.get("TritonModel", name, namespace)) and len(dep) == 1 and _image(dep[0]) == NEW_REF
            and _finished(dep[0]) and len(pods) == replicas and all(_image(p) == NEW_REF for p in pods))


def test_on_a_node_whose_gpus_are_all_in_use_an_upgrade_rolls_a_2_replica_model_without_a_surge_pod(
        kube: Kube, kubeconfig: Path, cluster: Any, nodes: Any, tmp_path: Path) -> None:
    prefix = f"ug{uuid.uuid4().hex[:4]}"
    namespace = f"{prefix}-models"
    node = nodes.node
    _tag_new_ref(cluster)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {"e2e.triton-operator.io/test": "true"}}})
    op = start_operator(kubeconfig, kube, cluster.logs or tmp_path, pattern=f"{prefix}-*",
                        log_name=f"operator-{prefix}.log", webhook=False, args=("--max-upgrade-rollouts", "1"))
    models = {"two": 2, "one": 1}
    loads: list[ServiceLoad] = []
    sampler = _PodSampler(kubeconfig, namespace)
    try:
        wait_for("the default ServiceAccount", lambda: kube.get_or_none("ServiceAccount", "default", namespace), 30)
        docs = []
        for name, replicas in models.items():
            doc = add_sub(name)
            doc["spec"]["replicas"] = replicas
            doc["spec"]["server"] = {"gpus": 1, "nodeSelector": {"kubernetes.io/hostname": node}}
            docs.append(doc)
        apply(kubeconfig, namespace, *docs)
        for name in models:
            wait_model(kube, namespace, name, is_model_ready, "Ready", 300)
        _fill(kube, namespace, node)
        warmup = _start_loads(kubeconfig, namespace, models, loads)

        sampler.start()
        op.stop()
        op.argv[op.argv.index("--default-triton-image") + 1] = NEW_REF
        op.start()
        # Either order: "two" rolls first (no surge), then "one", whose surge waits; or "one" first, "two" waiting.
        wait_for(f"one saying {UPGRADE_UNSCHEDULABLE}", lambda: UPGRADE_UNSCHEDULABLE in sampler.reasons.get("one", {}),
                 600)
        # A GPU freed: the surge pod takes it, and the rest of the upgrade goes on.
        freed = kube.items("Pod", namespace, labelSelector=f"app={FILLER}")[0]["metadata"]["name"]
        kube.delete("Pod", freed, namespace)
        for name, replicas in models.items():
            wait_for(f"{name} Ready on {NEW_REF}", lambda name=name, replicas=replicas: _on_new_ref(
                kube, namespace, name, replicas), 600)
        sampler.halt.set()
        sampler.join(15)
        tallies = {load.model: load.stop() - warmup[load.model] for load in loads}
        strategy = {d["metadata"]["name"]: d["spec"]["strategy"]
                    for d in kube.items("Deployment", namespace, labelSelector=LABEL_MODEL)}
        fillers = kube.items("Pod", namespace, labelSelector=f"app={FILLER}")
    finally:
        sampler.halt.set()
        for load in loads:
            load.__exit__()
        op.stop()
        delete_namespace(kube, namespace)

    record("full GPUs: most model pods not terminating at once", sampler.most)
    record("full GPUs: pods seen Pending as Unschedulable", {m: sorted(p) for m, p in sampler.unscheduled.items()})
    record("full GPUs: Progressing reasons seen", {m: sorted(r) for m, r in sampler.reasons.items()})
    record("full GPUs: requests during the upgrade", "; ".join(f"{m}: {t.summary()}" for m, t in tallies.items()))
    assert sampler.samples > 10 * len(sampler.errors), f"too many samples lost: {sampler.errors[:5]}"
    assert sampler.most.get("two") == 2, f"the 2-replica model had a surge pod: {sampler.most}"
    assert strategy["two"] == NO_SURGE, strategy
    assert sampler.most.get("one") == 2, f"the 1-replica model rolled without its surge pod: {sampler.most}"
    said = sampler.reasons.get("one", {}).get(UPGRADE_UNSCHEDULABLE, "")
    assert GPU in said, f"{UPGRADE_UNSCHEDULABLE}: {said!r}"
    assert UPGRADE_UNSCHEDULABLE not in sampler.reasons.get("two", {}), sampler.reasons["two"]
    assert all(p["status"].get("phase") == "Running" for p in fillers), "a filler lost its GPU"
    failed = sum(t.failed for t in tallies.values())
    assert failed == 0, "; ".join(f"{load.model}: {tallies[load.model].summary()}, first failures {load.samples}"
                                  for load in loads)
    for m, t in tallies.items():
        assert t.sent - t.failed >= 20, f"{m}: the load did not really run: {t.summary()}"


def test_on_a_node_whose_gpus_are_all_in_use_a_pools_upgrade_goes_on_without_its_surge_pod(
        kube: Kube, kubeconfig: Path, cluster: Any, nodes: Any, tmp_path: Path) -> None:
    """A GPU pool of 2 replicas (one GPU each) with two 1-copy pooled models, on a node whose other GPUs pause pods
    hold. The upgrade's surge pod cannot be scheduled (Progressing reason UpgradeRolloutUnschedulable); an old
    replica is marked leaving and its copy placed on the other one; once it serves there, the Deployment rolls
    without a surge pod (Event UpgradeRolloutWithoutSurge), deletes the leaving replica and gives its GPU to the new
    pod, then hands the other over as usual. No pod is left Pending, no filler loses its GPU, and the pooled models'
    Services fail no request."""
    prefix = f"ug{uuid.uuid4().hex[:4]}"
    namespace = f"{prefix}-pool"
    node = nodes.node
    pool, pooled = "gp", ("gp-a", "gp-b")
    _tag_new_ref(cluster)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {"e2e.triton-operator.io/test": "true"}}})
    op = start_operator(kubeconfig, kube, cluster.logs or tmp_path, pattern=f"{prefix}-*",
                        log_name=f"operator-{prefix}.log", webhook=False, args=("--max-upgrade-rollouts", "1"))
    loads: list[ServiceLoad] = []
    sampler = _PodSampler(kubeconfig, namespace, LABEL_POOL, "TritonPool")
    try:
        wait_for("the default ServiceAccount", lambda: kube.get_or_none("ServiceAccount", "default", namespace), 30)
        doc = pool_doc(pool, 2, "256Mi")
        doc["spec"]["capacity"] = {"memoryPerGpu": "256Mi"}
        doc["spec"]["server"] |= {"gpus": 1, "nodeSelector": {"kubernetes.io/hostname": node}}
        apply(kubeconfig, namespace, doc, *(pooled_add_sub(name, pool) for name in pooled))
        for name in pooled:
            wait_model(kube, namespace, name, is_model_ready, "Ready", 300)
        _fill(kube, namespace, node)
        warmup = _start_loads(kubeconfig, namespace, pooled, loads)

        sampler.start()
        t0 = time.monotonic()
        op.stop()
        op.argv[op.argv.index("--default-triton-image") + 1] = NEW_REF
        op.start()

        def upgraded() -> bool:
            dep = kube.get("Deployment", f"{pool}-pool", namespace)
            pods = [p for p in kube.items("Pod", namespace, labelSelector=f"{LABEL_POOL}={pool}")
                    if not p["metadata"].get("deletionTimestamp")]
            return (_image(dep) == NEW_REF and _finished(dep) and len(pods) == 2
                    and all(_image(p) == NEW_REF for p in pods)
                    and all(is_model_ready(kube.get("TritonModel", name, namespace)) for name in pooled))
        wait_for(f"pool {pool} on {NEW_REF}, its rollout finished, {', '.join(pooled)} Ready", upgraded, 600)
        took = time.monotonic() - t0
        sampler.halt.set()
        sampler.join(15)
        tallies = {load.model: load.stop() - warmup[load.model] for load in loads}
        events = [f"{e.get('reason')}: {e.get('message')}" for e in kube.items("Event", namespace)
                  if (e.get("involvedObject") or {}).get("name") == pool]
        fillers = kube.items("Pod", namespace, labelSelector=f"app={FILLER}")
        pending = [p["metadata"]["name"] for p in kube.items("Pod", namespace, labelSelector=f"{LABEL_POOL}={pool}")
                   if p["status"].get("phase") == "Pending"]
        strategy = kube.get("Deployment", f"{pool}-pool", namespace)["spec"]["strategy"]
    finally:
        sampler.halt.set()
        for load in loads:
            load.__exit__()
        op.stop()
        delete_namespace(kube, namespace)

    most, reasons = sampler.most.get(pool, 0), sampler.reasons.get(pool, {})
    record("full GPUs, a pool of 2: upgrade took", f"{took:.1f}s; most pool pods not terminating at once {most}")
    record("full GPUs, a pool of 2: Progressing reasons seen", sorted(reasons))
    record("full GPUs, a pool of 2: requests during the upgrade", "; ".join(f"{m}: {t.summary()}"
                                                                           for m, t in tallies.items()))
    assert sampler.samples > 10 * len(sampler.errors), f"too many samples lost: {sampler.errors[:5]}"
    assert UPGRADE_UNSCHEDULABLE in reasons, f"the surge pod was never seen unschedulable: {reasons}"
    assert GPU in reasons[UPGRADE_UNSCHEDULABLE], reasons[UPGRADE_UNSCHEDULABLE]
    without = [e for e in events if e.startswith(f"{ROLLING_WITHOUT_SURGE}: ")]
    record("full GPUs, a pool of 2: the pool's Events", events)
    assert without, f"no {ROLLING_WITHOUT_SURGE} Event on the pool: {events}"
    assert most <= 3, f"more than the 2 replicas and the one surge pod at once: {most}"
    assert not pending, f"pool pods left Pending: {pending}"
    assert strategy != NO_SURGE, f"the pool kept the upgrade's strategy after the rollout: {strategy}"
    assert all(p["status"].get("phase") == "Running" for p in fillers), "a filler lost its GPU"
    failed = sum(t.failed for t in tallies.values())
    assert failed == 0, "; ".join(f"{load.model}: {tallies[load.model].summary()}, first failures {load.samples}"
                                  for load in loads)
    for m, t in tallies.items():
        assert t.sent - t.failed >= 10, f"{m}: the load did not really run: {t.summary()}"
