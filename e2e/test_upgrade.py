"""The upgrade test on the real node (issue 42 item 4): the previous release (0.1.0, `tools/previous.py`'s `PREVIOUS`,
built from its commit by `make prebuild`) installed from an OCI registry as a user installs it, models serving under
client load, `helm upgrade` to this tree's release from the same registry, then `helm rollback` to 0.1.0.

On a cluster of the test's own (`ROOT`: a control plane and one node with `GPUS` fake GPUs): CRDs are cluster-wide, and
the session's cluster holds this tree's, owned by its chart release. Here 0.1.0's chart creates 0.1.0's CRD (from its
`crds/`), the API server stores the models as 0.1.0's CRD defaults them (`spec.server.image` included), and the upgrade
must bring the new CRDs in place and reconcile those objects. One kube-proxy per network namespace (the session's owns
its iptables chains), so this cluster runs none, and two things a ClusterIP would do are done otherwise:

- the client load goes through each model's Service as kube-proxy routes it, from its EndpointSlices
  (`ServiceLoad(via="endpoints")`: a ready endpoint, picked per request, re-read every 0.2 s);
- the operator's pod reaches the API server at the address the `kubernetes` Service's endpoint names (the chart's
  `operator.extraEnv` sets KUBERNETES_SERVICE_HOST and _PORT, which the kubelet's Service variables would give).

The node's containerd pulls both operator images from the registry by digest (the probe beside every tritonserver is
the operator's image, so the upgrade rolls every model's pod once). 0.1.0's models name no Triton image: its CRD
stored its default, `nvcr.io/nvidia/tritonserver:24.10-py3` (`LEGACY_TRITON_IMAGE`), tagged on the node as the test
tritonserver, as 0.1.0's harness did; the upgrade keeps it.

The node has one GPU per served replica and `LIMIT` more: room for `LIMIT` surge pods, the bound
(`upgrade.maxModelsRolling=LIMIT`). A sampler lists the namespace's Deployments and Pods every 0.2 s through the
upgrade: the models rolling at once, pods Pending as Unschedulable (a surge GPU the node lacks), tritonserver restarts,
and each model's pod-template hashes (one new one per model: no second roll). The rollback to 0.1.0 (which has no
bound) rolls them all at once: its surge pods wait for GPUs, recorded, not asserted.

A TritonPool cannot exist in 0.1.0: one pooled model on a pool of one replica is added after the upgrade, serves, and
is deleted before the rollback (0.1.0 knows neither the kind nor a model's `spec.pool`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e import images
from e2e.cluster import LocalCluster, session_root
from e2e.images import TRITON_REF
from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad, Tally
from e2e.node_registry import forget_pulled, hosts_toml
from e2e.operator_fixtures import add_sub, apply, helm, helm_binary, is_model_ready, record
from e2e.pool import pool_doc, pooled_add_sub, pooled_ensemble
from e2e.testing import container_status, diagnostics
from e2e.upgrade_sampler import unschedulable
from tools import release
from triton_operator import LEGACY_TRITON_IMAGE
from triton_operator.api.kinds import LABEL_MODEL
from triton_operator.api.pod import TRITON_CONTAINER

pytestmark = pytest.mark.cluster

ROOT = session_root() / ".cluster" / "upgrade"
NODE = "gpu-node-1"
RELEASE, OP_NS, NS = "triton-operator", "triton-system", "team-a"
#: Own Deployments: two add-sub models, and an ensemble whose two steps have no replicas of their own.
MODELS = ("ua", "ub")
ENSEMBLE = "ue"
SERVED = (*MODELS, ENSEMBLE)
#: upgrade.maxModelsRolling
LIMIT = 1
#: A GPU per served replica, and LIMIT for the surge pods of the models rolling at once.
GPUS = len(SERVED) + LIMIT
POOL, POOLED = "upool", "upa"
CRD = "tritonmodels.serving.triton-operator.dev"


def documents() -> list[dict[str, Any]]:
    """The models 0.1.0 serves: own Deployments of one replica with one GPU each (the ensemble's steps none)."""
    own = [add_sub(name) for name in MODELS]
    steps_and_ensemble = pooled_ensemble(ENSEMBLE, "unused")
    for doc in steps_and_ensemble:  # the pooled ensemble of e2e/pool.py, as own Deployments: no pool, no memory
        doc["spec"].pop("pool")
        doc["spec"].pop("memory", None)
    for doc in [*own, steps_and_ensemble[-1]]:
        doc["spec"]["server"] = {"gpus": 1}
    return [*own, *steps_and_ensemble]


# -- the cluster, the registry and the releases ----------------------------------------------------------


@dataclass
class World:
    local: LocalCluster
    kube: Kube
    kubeconfig: Path
    registry: str
    chart: str  # oci://<registry>/charts/triton-operator
    digests: dict[str, str]  # version -> the operator image's digest in the registry

    def repository(self) -> str:
        return f"{self.registry}/{release.IMAGE_REPOSITORY}"

    def values(self, version: str) -> list[str]:
        """The --set flags of a release of `version`: its image by digest, one replica, the API server's address
        (no kube-proxy here)."""
        port = (self.local.server() or "").rsplit(":", 1)[-1]
        return ["--set", f"image.repository={self.repository()}", "--set", f"image.digest={self.digests[version]}",
                "--set", "replicaCount=1", "--set", "operator.extraEnv[0].name=KUBERNETES_SERVICE_HOST",
                "--set", f"operator.extraEnv[0].value={self.local.apiserver_address}",
                "--set", "operator.extraEnv[1].name=KUBERNETES_SERVICE_PORT",
                "--set-string", f"operator.extraEnv[1].value={port}"]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """A cluster of one node (no kube-proxy), the local registry known to its containerd, and both releases pushed
    there: 0.1.0 from the cache `make prebuild` fills, this tree's from the test clusters' operator archive."""
    previous = release.previous_release()
    if not (previous.image.is_file() and previous.chart.is_file()):
        pytest.fail(f"release {previous.version} is not in the cache ({previous.dist}): `make prebuild` builds it")
    current = release.Release(release.version(), tmp_path)
    archive = next(i for i in images.build_all(log=lambda _: None) if i.ref == images.chart_operator_ref()).archive
    local = LocalCluster(ROOT, nodes=(NODE,), gpus=GPUS, kube_proxy=False)
    with local.running_fresh() as kubeconfig, release.local_registry() as registry:
        node = local.node(NODE)
        hosts = node.root / "certs.d" / registry
        try:
            hosts.mkdir(parents=True, exist_ok=True)
            (hosts / "hosts.toml").write_text(hosts_toml(registry))
            node.ctr("images", "tag", "--force", TRITON_REF, LEGACY_TRITON_IMAGE)  # 0.1.0's CRD default
            digests = {previous.version: release.push_image(previous.image, registry, previous.version),
                       current.version: release.push_image(archive, registry, current.version)}
            release.push_chart(previous.chart, registry)
            chart = release.push_chart(release.build_chart(current), registry)
            kube = Kube(kubeconfig)
            kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            yield World(local, kube, kubeconfig, registry, chart, digests)
        finally:
            shutil.rmtree(hosts, ignore_errors=True)
            with contextlib.suppress(Exception):
                forget_pulled(node.containerd_address)


# -- what the test watches -------------------------------------------------------------------------------


def _finished(dep: dict[str, Any]) -> bool:
    """`kubectl rollout status`'s judgement: the controller saw the latest spec, every replica is updated and
    available, and no replica of an older template is left."""
    spec, status = dep["spec"], dep.get("status") or {}
    wanted, updated = spec.get("replicas", 1), status.get("updatedReplicas", 0)
    return (status.get("observedGeneration", 0) >= dep["metadata"]["generation"] and updated >= wanted
            and status.get("replicas", 0) == updated and status.get("availableReplicas", 0) >= updated)


@dataclass
class Phase:
    """What the sampler saw in one phase (the upgrade, the rollback)."""

    samples: int = 0
    max_rolling: int = 0
    over: list[str] = field(default_factory=list)  # samples with more than LIMIT rolling: "+<s>s [names]"
    unschedulable: set[str] = field(default_factory=set)  # pods seen Pending as Unschedulable
    restarts: dict[str, int] = field(default_factory=dict)  # "<pod>/<container>" -> restartCount > 0
    hashes: dict[str, set[str]] = field(default_factory=dict)  # model -> pod-template hashes of its pods
    uids: dict[str, set[str]] = field(default_factory=dict)  # model -> pod uids
    errors: list[str] = field(default_factory=list)


class Sampler:
    """LISTs the namespace's model Deployments and Pods every 0.2 s into the current `Phase`."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kube = Kube(kubeconfig, timeout=5)
        self.phase = Phase()
        self._t0 = time.monotonic()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="upgrade-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def next_phase(self) -> Phase:
        """Ends the current phase (returned) and starts another."""
        done, self.phase, self._t0 = self.phase, Phase(), time.monotonic()
        return done

    def stop(self) -> Phase:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(15)
        return self.phase

    def _sample(self) -> None:
        phase = self.phase
        deps = [d for d in self.kube.items("Deployment", NS, labelSelector=LABEL_MODEL)
                if d["metadata"]["name"] in SERVED]
        rolling = sorted(d["metadata"]["name"] for d in deps if not _finished(d))
        for pod in self.kube.items("Pod", NS, labelSelector=LABEL_MODEL):
            model = pod["metadata"]["labels"][LABEL_MODEL]
            if model not in SERVED:
                continue
            phase.hashes.setdefault(model, set()).add(pod["metadata"]["labels"].get("pod-template-hash", "?"))
            phase.uids.setdefault(model, set()).add(pod["metadata"]["uid"])
            if unschedulable(pod):
                phase.unschedulable.add(pod["metadata"]["name"])
            for c in pod["status"].get("containerStatuses") or ():
                if c.get("restartCount", 0):
                    phase.restarts[f"{pod['metadata']['name']}/{c['name']}"] = c["restartCount"]
        phase.max_rolling = max(phase.max_rolling, len(rolling))
        if len(rolling) > LIMIT:
            phase.over.append(f"+{time.monotonic() - self._t0:.1f}s {rolling}")
        phase.samples += 1

    def _loop(self) -> None:
        while not self._halt.is_set():
            try:
                self._sample()
            except Exception as exc:  # noqa: BLE001 - a transient API error is one sample lost, reported at the end
                self.phase.errors.append(repr(exc)[:200])
            self._halt.wait(0.2)  # the sampling period, not a wait for a condition


def _serving_on(kube: Kube, name: str, image: str) -> bool:
    """The model Ready, its Deployment's rollout finished, its one live pod warmed and running `image` (the operator's
    image by digest: the probe container) beside a tritonserver."""
    if not is_model_ready(kube.get("TritonModel", name, NS)):
        return False
    dep = kube.get("Deployment", name, NS)
    pods = [p for p in kube.items("Pod", NS, labelSelector=f"{LABEL_MODEL}={name}")
            if not p["metadata"].get("deletionTimestamp")]
    return _finished(dep) and len(pods) == 1 and image in {c["image"] for c in pods[0]["spec"]["containers"]} and any(
        c["name"] == TRITON_CONTAINER for c in pods[0]["spec"]["containers"])


def _operator_image(kube: Kube) -> str:
    (pod,) = [p for p in kube.items("Pod", OP_NS, labelSelector=f"app.kubernetes.io/instance={RELEASE}")
              if not p["metadata"].get("deletionTimestamp")]
    return container_status(pod, "operator")["imageID"].rsplit("@", 1)[-1]


def _helm_refused(kubeconfig: Path, *args: str) -> str:
    proc = subprocess.run([helm_binary(), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0, f"helm {' '.join(args[:3])} was not refused:\n{proc.stdout}"
    return proc.stderr


def _tallies(loads: dict[str, ServiceLoad]) -> dict[str, Tally]:
    return {name: load.tally() for name, load in loads.items()}


def _phase_tallies(now: dict[str, Tally], before: dict[str, Tally]) -> dict[str, Tally]:
    return {name: now[name] - before[name] for name in now}


# -- the test ---------------------------------------------------------------------------------------------


def test_helm_upgrade_from_0_1_0_keeps_models_serving_within_the_bound_and_rolls_back(world: World) -> None:
    try:
        _upgrade_and_roll_back(world)
    except BaseException:
        print(diagnostics(world.kube, NS, world.local.logs))  # this cluster's, which the conftest hook does not know
        raise


def _upgrade_and_roll_back(world: World) -> None:
    kube, kubeconfig = world.kube, world.kubeconfig
    old, new = release.PREVIOUS[0], release.version()
    assert old != new, f"the tree still says {old}: `make set-version` to the next release"
    old_ref, new_ref = (f"{world.repository()}@{world.digests[v]}" for v in (old, new))

    t0 = time.monotonic()
    helm(kubeconfig, "install", RELEASE, world.chart, "--version", old, "-n", OP_NS, "--create-namespace",
         "--plain-http", "--set", "customMetrics.enabled=false", *world.values(old), "--wait", "--timeout", "180s")
    assert _operator_image(kube) == world.digests[old]
    crd = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}")
    assert "meta.helm.sh/release-name" not in (crd["metadata"].get("annotations") or {}), "0.1.0's CRD is from crds/"
    apply(kubeconfig, NS, *documents())
    for name in SERVED:
        wait_for(f"{name} serving on {old}", lambda name=name: _serving_on(kube, name, old_ref), 240)
    stored = kube.get("TritonModel", MODELS[0], NS)["spec"]["server"]
    assert stored.get("image") == LEGACY_TRITON_IMAGE, f"0.1.0's CRD default not stored: {stored}"
    record("upgrade: 0.1.0 installed from oci:// and its models serving", f"{time.monotonic() - t0:.1f}s")

    loads = {name: ServiceLoad(kubeconfig, NS, name, name, threads=1, rate=5.0, refresh=0.2, via="endpoints").start()
             for name in SERVED}
    sampler = Sampler(kubeconfig)
    try:
        for name, load in loads.items():
            wait_for(f"{name} answering the load", lambda load=load: load.tally().sent - load.tally().failed >= 5, 60)
        start = _tallies(loads)
        before_uids = {name: {p["metadata"]["uid"] for p in kube.items("Pod", NS, labelSelector=f"{LABEL_MODEL}={name}")}
                       for name in SERVED}

        # 0.1.0's chart shipped its CRD in crds/, which Helm never records as the release's: a plain upgrade is
        # refused, nothing changed; --take-ownership adopts it once (docs/install.md, the chart's README).
        upgrade = ["upgrade", RELEASE, world.chart, "--version", new, "-n", OP_NS, "--plain-http", *world.values(new),
                   "--set", f"upgrade.maxModelsRolling={LIMIT}", "--set", f"tritonImage={TRITON_REF}",
                   "--wait", "--timeout", "180s"]
        refused = _helm_refused(kubeconfig, *upgrade)
        assert f'CustomResourceDefinition "{CRD}"' in refused and "cannot be imported" in refused, refused
        assert _operator_image(kube) == world.digests[old]
        before = _tallies(loads)
        sampler.start()
        t1 = time.monotonic()
        helm(kubeconfig, *upgrade, "--take-ownership")
        assert _operator_image(kube) == world.digests[new]
        for name in SERVED:
            wait_for(f"{name} serving on {new}", lambda name=name: _serving_on(kube, name, new_ref), 300)
        upgraded = sampler.next_phase()
        took = time.monotonic() - t1
        after_upgrade = _tallies(loads)
        crd = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}")
        assert crd["metadata"]["annotations"].get("meta.helm.sh/release-name") == RELEASE
        assert kube.get("TritonModel", MODELS[0], NS)["spec"]["server"].get("image") == LEGACY_TRITON_IMAGE

        # A pool, which 0.1.0 could not have: one pooled add-sub on one replica, served through its Service.
        apply(kubeconfig, NS, pool_doc(POOL, 1, "512Mi"), pooled_add_sub(POOLED, POOL))
        wait_for(f"{POOLED} Ready on pool {POOL}", lambda: is_model_ready(kube.get("TritonModel", POOLED, NS)), 180)
        with ServiceLoad(kubeconfig, NS, POOLED, POOLED, threads=1, rate=5.0, refresh=0.2, via="endpoints") as pooled:
            wait_for(f"{POOLED} answering", lambda: pooled.tally().sent - pooled.tally().failed >= 5, 60)
            pooled_tally = pooled.stop()
        kube.delete("TritonModel", POOLED, NS)  # 0.1.0 knows no pool: a user rolling back removes them first
        kube.delete("TritonPool", POOL, NS)
        wait_for("the pool's pods gone", lambda: not kube.items("Pod", NS, labelSelector=f"{LABEL_MODEL}={POOLED}")
                 and kube.get_or_none("TritonPool", POOL, NS) is None, 120)

        sampler.next_phase()
        t2 = time.monotonic()
        helm(kubeconfig, "rollback", RELEASE, "1", "-n", OP_NS, "--wait", "--timeout", "180s")
        assert _operator_image(kube) == world.digests[old]
        for name in SERVED:
            wait_for(f"{name} serving on {old} again", lambda name=name: _serving_on(kube, name, old_ref), 300)
        rolled_back = sampler.stop()
        back = time.monotonic() - t2
        end = _tallies(loads)
        for load in loads.values():
            load.stop()
    finally:
        sampler.stop()
        for load in loads.values():
            load.__exit__()

    warm, during, after = (_phase_tallies(b, a) for a, b in ((start, before), (before, after_upgrade),
                                                              (after_upgrade, end)))
    record("upgrade: 0.1.0 -> this tree, models rolling at once (bound, most seen)",
           f"{LIMIT}, {upgraded.max_rolling} in {upgraded.samples} samples; took {took:.1f}s")
    record("upgrade: requests before / during the upgrade / after it and the rollback",
           "; ".join(f"{m}: {warm[m].sent}/{warm[m].failed}, {during[m].sent}/{during[m].failed}, "
                     f"{after[m].sent}/{after[m].failed} sent/failed" for m in SERVED))
    record("upgrade: the pooled model added after it", pooled_tally.summary())
    record("upgrade: rollback to 0.1.0 (no bound)", f"{back:.1f}s, {rolled_back.max_rolling} rolling at once, "
           f"{len(rolled_back.unschedulable)} pod(s) Pending for a GPU")

    failed = {m: (warm[m].failed, during[m].failed, after[m].failed) for m in SERVED}
    assert not any(sum(f) for f in failed.values()), (
        f"failed requests (before, during, after): {failed}; samples: { {m: load.samples for m, load in loads.items()} }")
    for m in SERVED:
        assert during[m].sent - during[m].failed >= 10, f"{m}: the load did not run through the upgrade: {during[m]}"
    assert pooled_tally.failed == 0 and pooled_tally.sent >= 5, pooled_tally.summary()
    assert not upgraded.over, f"more than {LIMIT} model(s) rolling at once: {upgraded.over[:5]}"
    assert upgraded.max_rolling == LIMIT, f"no sample saw a model rolling ({upgraded.samples} samples)"
    assert upgraded.samples > 10 * len(upgraded.errors), f"too many samples lost: {upgraded.errors[:5]}"
    assert not upgraded.unschedulable, f"pods Pending for a GPU during the upgrade: {sorted(upgraded.unschedulable)}"
    restarts = {**upgraded.restarts, **rolled_back.restarts}
    assert not restarts, f"containers restarted: {restarts}"
    # One roll per model: its pods before, and one new template (the operator's image is in every pod).
    for m in SERVED:
        assert len(upgraded.hashes.get(m, ())) <= 2, f"{m} rolled more than once: {upgraded.hashes[m]}"
        new_uids = upgraded.uids.get(m, set()) - before_uids[m]
        assert len(new_uids) == 1, f"{m}: {len(new_uids)} new pods during the upgrade (one expected)"
