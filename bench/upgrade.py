"""Benchmark `upgrade`: one operator upgrade under client load, with the chart's bound on upgrade rollouts
(`upgrade.maxModelsRolling`, its default) and as a plain `helm upgrade` without it (`upgrade.maxModelsRolling=0`, which
the chart documents as no bound: every model rolls at once). Issue 42: an operator upgrade restarted every model at
once, with a surge GPU per model.

What is compared, on our own cluster (a control plane and one real node, containerd + kubelet, with `GPUS` fake GPUs:
one per model and per pool replica and `BOUND` more, the room the bound's surge pods need and no more; no kube-proxy): the operator
installed as users install it, by its chart (`helm upgrade --install` of charts/triton-operator, two operator replicas,
the image preloaded on the node), serving `len(MODELS)` add-sub models of one replica and one GPU each, and a GPU
TritonPool of `POOL_REPLICAS` replicas (one GPU each) with `len(POOLED)` pooled add-sub models of one copy. The upgrade
is a `helm upgrade` of that release that changes only the operator's image tag, to the same image under another tag
(`ctr images tag` on the node: no pull), as the issue measured it: the operator's image is also every replica's
`fetch` init container and `probe` container, so the new operator renders another pod template for every model nobody
changed, the very change a new operator version brings to every pod. Both variants run that same upgrade, from the
same tag to the same tag, on the same cluster, each on models of a namespace of its own created for it (the first
variant's namespace is deleted, and the release set back to the first tag, before the second's models are applied);
they differ only in `upgrade.maxModelsRolling`, set in the install and in the upgrade alike.

Not the 0.1.0 -> this tree upgrade of e2e/test_upgrade.py: 0.1.0 has no bound, so only the upgrade *to* this tree
could be measured with it, and each variant would need 0.1.0 installed from a registry again (its CRD adopted with
`--take-ownership`); the operator that decides how models roll is this tree's in both, as here. Not e2e/
test_upgrade_bound.py's operator process restarted with another flag either: that is no `helm upgrade`.

Client load: e2e.load.ServiceLoad through every model's Service, 1 thread x 5 requests/s each, to a ready endpoint
picked per request from the Service's EndpointSlices (`via="endpoints"`, followed with a watch, as kube-proxy
routes). A sampler (e2e/upgrade_sampler.py) LISTs the namespace's model Deployments, Pods and TritonModels every
0.2 s from just before the `helm upgrade` until every model serves on the new operator image. Reported for each
variant: the upgrade's duration (`helm upgrade` started -> every model Ready, its Deployment's rollout finished and
its one live pod on the new image), the most model Deployments rolling at once (unfinished, as `kubectl rollout
status` judges), the models seen waiting (Progressing reason UpgradeRolloutWaiting), failed requests, container
restarts (tritonserver's and the others'), new pods (each a tritonserver cold start), and pods seen Pending as
Unschedulable (a surge pod with no GPU free).

    python -m bench.upgrade        # or: make bench BENCH=upgrade
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e import images
from e2e.cluster import LocalCluster
from e2e.images import TRITON_REF
from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad, Tally
from e2e.operator_fixtures import add_sub, as_stream, helm, is_model_ready, kubectl
from e2e.pool import pool_doc, pooled_add_sub
from e2e.testing import delete_namespace, diagnostics
from e2e.upgrade_sampler import Record, Sampler
from triton_operator.api.kinds import LABEL_MANAGED_BY, LABEL_MODEL, MANAGED_BY
from triton_operator.api.pod import TRITON_CONTAINER
from triton_operator.api.pool import LABEL_POOL
from triton_operator.plan.upgrade import UPGRADE_STARTED, UPGRADE_WAITING, rollout_finished

from .common import REPO, CpuMeter, Result, Row, log, write_result
from .kubeenv import NODE, ROOT, ensure_namespace

CHART = REPO / "charts" / "triton-operator"
RELEASE, OPERATOR_NAMESPACE = "triton-operator", "triton-system"
MODELS = tuple(f"up-{i}" for i in range(1, 6))
#: A GPU pool and its pooled models (one copy each): its Deployment counts against the bound as a model's does.
POOL, POOL_REPLICAS, POOLED = "up-pool", 2, ("up-p1", "up-p2")
#: Every Deployment the upgrade rolls: the models' and the pool's (`<pool>-pool`).
DEPLOYMENTS = (*MODELS, f"{POOL}-pool")
#: The chart's default bound (values.yaml's upgrade.maxModelsRolling): what a user who sets nothing gets.
BOUND = int(yaml.safe_load((CHART / "values.yaml").read_text())["upgrade"]["maxModelsRolling"])
GPUS = len(MODELS) + POOL_REPLICAS + BOUND
OWNED = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
#: (result key, title, upgrade.maxModelsRolling)
VARIANTS = (("bounded", f"upgrade.maxModelsRolling={BOUND} (the chart's default)", BOUND),
            ("plain", "upgrade.maxModelsRolling=0 (no bound: a plain helm upgrade)", 0))
RATE = 5.0


def _refs() -> tuple[str, str]:
    """The operator image the chart names by default (preloaded on the node), and the same image under the tag the
    upgrade moves to."""
    old = images.chart_operator_ref()
    return old, f"{old}-bench-upgrade"


@dataclass
class Variant:
    key: str
    title: str
    bound: int
    namespace: str = ""
    helm_seconds: float = 0.0  # `helm upgrade --wait`: the operator's own Deployment rolled out
    offset: float = 0.0  # the helm upgrade's start, in the sampler's seconds (its timeline and spans count from it)
    seconds: float = 0.0  # helm upgrade started -> every model serving on the new image
    load: dict[str, dict[str, Any]] = field(default_factory=dict)  # model -> sent, failed, samples
    record: Record = field(default_factory=Record)
    started_events: dict[str, int] = field(default_factory=dict)  # model -> UpgradeRolloutStarted Events

    @property
    def sent(self) -> int:
        return sum(m["sent"] for m in self.load.values())

    @property
    def failed(self) -> int:
        return sum(m["failed"] for m in self.load.values())

    def restarts(self, triton: bool) -> int:
        return sum(n for key, n in self.record.restarts.items() if (key.rsplit("/", 1)[-1] == TRITON_CONTAINER) == triton)

    def new_pods(self) -> int:
        return sum(len(uids) for uids in self.record.new_pods.values())


def _values(local: LocalCluster, tag: str, bound: int) -> list[str]:
    """The chart values: the operator image's tag, the bound, the local tritonserver image, and the API server's
    address for the operator's pods (the kubelet's Service variables would give it; this cluster has no kube-proxy)."""
    port = (local.server() or "").rsplit(":", 1)[-1]
    return ["--set", f"image.tag={tag}", "--set", f"upgrade.maxModelsRolling={bound}",
            "--set", f"tritonImage={TRITON_REF}",
            "--set", "operator.extraEnv[0].name=KUBERNETES_SERVICE_HOST",
            "--set", f"operator.extraEnv[0].value={local.apiserver_address}",
            "--set", "operator.extraEnv[1].name=KUBERNETES_SERVICE_PORT",
            "--set-string", f"operator.extraEnv[1].value={port}"]


def _helm_upgrade(kubeconfig: Path, local: LocalCluster, tag: str, bound: int) -> float:
    t0 = time.monotonic()
    helm(kubeconfig, "upgrade", "--install", RELEASE, str(CHART), "-n", OPERATOR_NAMESPACE, "--create-namespace",
         *_values(local, tag, bound), "--wait", "--timeout", "300s", timeout=330)
    return time.monotonic() - t0


def _serving_on(kube: Kube, namespace: str, name: str, image: str) -> bool:
    """The model Ready, its Deployment's rollout finished, its one live pod's containers running `image` (the
    operator's: the probe) beside tritonserver."""
    if not is_model_ready(kube.get("TritonModel", name, namespace)):
        return False
    pods = [p for p in kube.items("Pod", namespace, labelSelector=f"{LABEL_MODEL}={name}")
            if not p["metadata"].get("deletionTimestamp")]
    containers = {c["name"]: c["image"] for p in pods for c in p["spec"]["containers"]}
    return (rollout_finished(kube.get("Deployment", name, namespace)) and len(pods) == 1
            and image in containers.values() and TRITON_CONTAINER in containers)


def _pool_on(kube: Kube, namespace: str, image: str) -> bool:
    """The pool's Deployment rolled out with its POOL_REPLICAS live pods running `image` (the operator's: the fetch
    server) beside tritonserver, and every pooled model Ready."""
    pods = [p for p in kube.items("Pod", namespace, labelSelector=f"{LABEL_POOL}={POOL}")
            if not p["metadata"].get("deletionTimestamp")]
    return (rollout_finished(kube.get("Deployment", f"{POOL}-pool", namespace)) and len(pods) == POOL_REPLICAS
            and all(image in {c["image"] for c in p["spec"]["containers"]} for p in pods)
            and all(is_model_ready(kube.get("TritonModel", name, namespace)) for name in POOLED))


def _models() -> list[dict[str, Any]]:
    docs = []
    for name in MODELS:
        doc = add_sub(name)
        doc["spec"]["replicas"] = 1
        doc["spec"]["server"] = {"gpus": 1}
        docs.append(doc)
    pool = pool_doc(POOL, POOL_REPLICAS, "256Mi")
    pool["spec"]["capacity"] = {"memoryPerGpu": "256Mi"}
    pool["spec"]["server"]["gpus"] = 1
    return [*docs, pool, *(pooled_add_sub(name, POOL) for name in POOLED)]


def run_variant(local: LocalCluster, kube: Kube, kubeconfig: Path, v: Variant) -> None:
    old, new = _refs()
    old_tag, new_tag = old.rsplit(":", 1)[1], new.rsplit(":", 1)[1]
    v.namespace = f"bench-upgrade-{v.key}"
    log(f"Variant {v.key}: helm upgrade --install with image.tag={old_tag} upgrade.maxModelsRolling={v.bound}")
    _helm_upgrade(kubeconfig, local, old_tag, v.bound)
    ensure_namespace(kube, v.namespace)
    stream = as_stream(_models())
    # The operator's webhook answers once a replica serves it: until then the apply is refused.
    wait_for("the models applied (the operator's webhook serving)", lambda: kubectl(
        kubeconfig, "apply", "-n", v.namespace, "-f", "-", stdin=stream, check=False).returncode == 0, 120, 1.0)
    for name in MODELS:
        wait_for(f"{name} serving on {old}", lambda name=name: _serving_on(kube, v.namespace, name, old), 600, 0.5)
    wait_for(f"pool {POOL} serving on {old}", lambda: _pool_on(kube, v.namespace, old), 600, 0.5)
    loads = {name: ServiceLoad(kubeconfig, v.namespace, name, name, threads=1, rate=RATE, refresh=0.2,
                               via="endpoints") for name in (*MODELS, *POOLED)}
    lister = Kube(kubeconfig, timeout=5)
    sampler = Sampler(lambda: (lister.items("Deployment", v.namespace, labelSelector=OWNED),
                               lister.items("Pod", v.namespace, labelSelector=OWNED),
                               lister.items("TritonModel", v.namespace)
                               + lister.items("TritonPool", v.namespace)),
                      bound=v.bound, waiting_reason=UPGRADE_WAITING)
    try:
        for load in loads.values():
            load.start()
        for name, load in loads.items():
            wait_for(f"{name} answering the load", lambda load=load: load.tally().sent - load.tally().failed >= 5, 60)
        before: dict[str, Tally] = {name: load.tally() for name, load in loads.items()}
        sampler.start()
        wait_for("the sampler's first sample", lambda: sampler.record.samples, 30, 0.05)
        log(f"Variant {v.key}: helm upgrade to image.tag={new_tag}")
        t0 = time.monotonic()
        v.offset = t0 - sampler.started
        v.helm_seconds = _helm_upgrade(kubeconfig, local, new_tag, v.bound)
        for name in MODELS:
            wait_for(f"{name} serving on {new}", lambda name=name: _serving_on(kube, v.namespace, name, new), 900, 0.2)
        wait_for(f"pool {POOL} serving on {new}", lambda: _pool_on(kube, v.namespace, new), 900, 0.2)
        v.seconds = time.monotonic() - t0
        v.record = sampler.stop()
        for name, load in loads.items():
            t = load.stop() - before[name]
            v.load[name] = {"sent": t.sent, "failed": t.failed, "seconds": round(t.seconds, 1),
                            "failure_samples": list(load.samples)}
        v.started_events = {name: sum(e["involvedObject"]["name"] == name for e in kube.items("Event", v.namespace)
                                      if e.get("reason") == UPGRADE_STARTED) for name in (*MODELS, POOL)}
    except BaseException:
        print(diagnostics(kube, v.namespace, local.logs))
        raise
    finally:
        sampler.stop()
        for load in loads.values():
            load.__exit__()
    r = v.record
    log(f"Variant {v.key}: {v.seconds:.1f}s (helm {v.helm_seconds:.1f}s); most rolling at once {r.max_rolling} "
        f"{r.most}; waited {r.waited(UPGRADE_WAITING)}; pending {sorted(r.pending)}; restarts {r.restarts}; "
        f"new pods {v.new_pods()}; requests {v.failed} failed of {v.sent}; {r.samples} samples, {len(r.errors)} lost")
    delete_namespace(kube, v.namespace)


def run() -> Path:
    started, meter = time.monotonic(), CpuMeter()
    old, new = _refs()
    # A root of its own beside the other benchmarks' (its node has GPUS GPUs, theirs 16).
    local = LocalCluster(ROOT.with_name(f"{ROOT.name}-upgrade"), nodes=(NODE,), gpus=GPUS, kube_proxy=False)
    variants = [Variant(key, title, bound) for key, title, bound in VARIANTS]
    with local.running_fresh() as kubeconfig:
        local.node(NODE).ctr("images", "tag", "--force", old, new)
        kube = Kube(kubeconfig)
        for v in variants:
            run_variant(local, kube, kubeconfig, v)
    return write_result(_result(variants, old, new), started, meter)


def _s(x: float) -> str:
    return f"{x:.1f} s"


def _result(variants: list[Variant], old: str, new: str) -> Result:
    ours, plain = variants
    result = Result(
        name="upgrade",
        title=f"Operator upgrade under load, {len(MODELS)} models and a pool: the chart's bound vs a plain helm upgrade",
        method=(
            "Our own cluster: a control plane and one real node (containerd + kubelet) with "
            f"{GPUS} fake GPUs, one per model and per pool replica and {BOUND} more (the room the bound's surge pods "
            "need); no kube-proxy. The operator installed by its chart (helm upgrade --install of "
            f"charts/triton-operator: two replicas, the image preloaded), {len(MODELS)} add-sub TritonModels of one "
            f"replica and one GPU each, and a TritonPool of {POOL_REPLICAS} replicas of one GPU each with "
            f"{len(POOLED)} pooled add-sub models of one copy. The upgrade: "
            f"a helm upgrade of that release changing only image.tag, {old.rsplit(':', 1)[1]} -> "
            f"{new.rsplit(':', 1)[1]}, the same image under another tag (tagged on the node, no pull), as issue 42 "
            "measured it: the operator's image is also every replica's fetch and probe container (a pool replica's "
            "fetch server), so every model's and the pool's pod template changes with nobody changing them, as with "
            "a new operator version. Run twice, on the "
            "same cluster, each time on fresh models in a namespace of their own: with upgrade.maxModelsRolling="
            f"{BOUND} (the chart's default) and with upgrade.maxModelsRolling=0 (no bound: a plain helm upgrade, "
            "every model at once). Client load throughout: e2e.load.ServiceLoad through every model's Service, "
            f"1 thread x {RATE:.0f} requests/s each (the pooled models' too), to a ready endpoint of its "
            "EndpointSlices picked per request (as kube-proxy routes). A sampler LISTs the operator's Deployments, "
            "Pods, TritonModels and TritonPools every 0.2 s. Duration: helm upgrade started -> every model Ready, its "
            "rollout finished and its one live pod on the new image, and the pool's rollout finished with its "
            "replicas on it. Rolling: a Deployment whose rollout is unfinished as kubectl rollout status judges."
        ),
    )

    def both(f: Any) -> tuple[str, str]:
        return f(ours), f(plain)

    result.rows = [
        Row("helm upgrade -> every model and the pool Ready on the new operator image", *both(lambda v: _s(v.seconds))),
        Row("helm upgrade --wait itself (the operator's own Deployment)", *both(lambda v: _s(v.helm_seconds))),
        Row("Deployments (models' and the pool's) rolling at once, most seen",
            f"{ours.record.max_rolling} (bound {BOUND})", f"{plain.record.max_rolling} (no bound)",
            f"<= {BOUND}", 1 <= ours.record.max_rolling <= BOUND and not ours.record.over),
        Row(f"models and pools seen waiting for a slot ({UPGRADE_WAITING})",
            *both(lambda v: f"{len(v.record.waited(UPGRADE_WAITING))} of {len(MODELS) + 1}")),
        Row("pods seen Pending for a GPU (Unschedulable)", *both(lambda v: str(len(v.record.pending)))),
        Row("requests failed / sent during the upgrade", *both(lambda v: f"{v.failed} / {v.sent}"), "0 failed",
            ours.failed == 0),
        Row("tritonserver container restarts", *both(lambda v: str(v.restarts(True))), "0", ours.restarts(True) == 0),
        Row("other container restarts", *both(lambda v: str(v.restarts(False)))),
        Row("new pods (each a tritonserver cold start; one per model and per pool replica needed, "
            f"{len(MODELS) + POOL_REPLICAS})", *both(lambda v: str(v.new_pods()))),
    ]
    for v in variants:
        if v.failed:
            result.notes.append(f"{v.title}: failed-request samples: "
                                f"{ {m: d['failure_samples'] for m, d in v.load.items() if d['failed']} }")
        if v.record.errors:
            result.notes.append(f"{v.title}: {len(v.record.errors)} of {v.record.samples + len(v.record.errors)} "
                                f"samples lost to API errors, e.g. {v.record.errors[0]}")
    result.notes.append(
        "Each model rolls with a surge pod (maxSurge 1, maxUnavailable 0: one replica each), which needs a GPU of "
        f"its own: the node has {BOUND} spare. Without the bound the surge pods beyond those stay Pending until a "
        "rolled model's old pod is gone and gives its GPU back. The pool rolls one replica at a time, each old "
        "replica going once its copies serve elsewhere (with its surge pod, or without it when that pod cannot be "
        "scheduled).")
    result.data = {
        "models": list(MODELS), "pool": {"name": POOL, "replicas": POOL_REPLICAS, "pooled": list(POOLED)},
        "gpus": GPUS, "bound": BOUND, "rate_per_model": RATE, "from": old, "to": new,
        "variants": {v.key: {
            "title": v.title, "bound": v.bound, "namespace": v.namespace, "seconds": round(v.seconds, 1),
            "helm_seconds": round(v.helm_seconds, 1), "max_rolling": v.record.max_rolling, "most": v.record.most,
            "over_bound": v.record.over, "waited": v.record.waited(UPGRADE_WAITING),
            "reasons": {k: sorted(s) for k, s in v.record.reasons.items()}, "pending": sorted(v.record.pending),
            "restarts": v.record.restarts, "new_pods": {k: len(s) for k, s in v.record.new_pods.items()},
            "started_events": v.started_events, "load": v.load, "samples": v.record.samples,
            "lost_samples": len(v.record.errors),
            # seconds since the helm upgrade started: (at, rolling, waiting, pending) and model -> [rolling, rolled]
            "timeline": [(round(t - v.offset, 2), *rest) for t, *rest in v.record.timeline],
            "spans": {k: [round(t - v.offset, 2) for t in span] for k, span in v.record.spans.items()},
        } for v in variants},
    }
    return result


if __name__ == "__main__":
    print(run())
