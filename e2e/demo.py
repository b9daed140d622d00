"""`make demo`: the whole product on an embedded local cluster, shown as it happens.

Brings up the local cluster (e2e/cluster.py: a control plane, two real GPU nodes - containerd and a
kubelet each, with our fake-GPU device plugin - and kube-proxy; the images built from our
Dockerfiles imported into each node), installs the operator with `helm upgrade --install
charts/triton-operator` (CRD included) and waits until it serves, applies three examples (add-sub
with warm-up, the sentiment ensemble, and examples/pool.yaml: a TritonPool of 3 replicas shared by
several models, one an ensemble), prints live progress of the TritonModels and their replicas
(Loading -> Warming -> Ready, gated in) and where each pooled model is placed, then sends a sample
inference to each through its Service's ClusterIP (kube-proxy). The cluster is left running.

With `--upgrade` (`make demo-upgrade`), then an operator upgrade to watch: a `helm upgrade` of the release that
changes only the operator's image tag, to the same image under another tag (tagged on every node), so that the new
operator renders another pod template for every model nobody changed (its image is every replica's `fetch` and
`probe` container), as a new operator version does; bench/upgrade.py measures the same upgrade. Under client load
through the Services of add-sub, sentiment and pool-add-sub, it prints each change as it happens
(e2e/upgrade_sampler.py): which Deployments roll, which models wait and why (their Progressing reason:
UpgradeRolloutWaiting while `upgrade.maxModelsRolling` others roll), pods Pending for want of a GPU, and the end
state: every model Ready on the new image, the most rolling at once, the requests failed.

    python -m e2e.demo [--kubeconfig PATH] [--namespace demo] [--timeout 300] [--upgrade]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import yaml
from tritonclient.utils import InferenceServerException

from e2e.images import TRITON_REF

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
EXAMPLES = [REPO / "examples" / "add-sub.yaml", REPO / "examples" / "sentiment-ensemble.yaml",
            REPO / "examples" / "pool.yaml"]
#: examples/pool.yaml's models that clients call (the others are the ensemble's steps), with a request and the
#: answer it must get: (input names, output name, inputs, expected output).
POOLED = {
    "pool-add-sub": (("INPUT0", "INPUT1"), "OUTPUT0", ([1, 2, 3, 4], [10, 20, 30, 40]), [11, 22, 33, 44]),
    "pool-scale": (("INPUT",), "OUTPUT", ([1, 2, 3, 4],), [2, 4, 6, 8]),
    "pool-pipeline": (("IN",), "OUT", ([1, 2, 3, 4],), [3, 5, 7, 9]),
}
POOL = "shared"


def say(msg: str) -> None:
    print(msg, flush=True)


def kubectl(kubeconfig: Path, *args: str, capture: bool = True) -> str:
    out = subprocess.run(
        [str(VENV_BIN / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        check=True, text=True, capture_output=capture,
    )
    return out.stdout if capture else ""


def get_json(kubeconfig: Path, *args: str) -> dict[str, Any]:
    return json.loads(kubectl(kubeconfig, "get", *args, "-o", "json"))


RELEASE, RELEASE_NAMESPACE = "triton-operator", "triton-system"


def bring_up(args: argparse.Namespace) -> Path:
    from e2e.cluster import LocalCluster

    if args.kubeconfig:
        return Path(args.kubeconfig)
    local = LocalCluster(REPO)
    stale = local.read_pids().get("triton-operator")  # a host-process operator from an older demo: never reused
    if stale is not None:
        local.stop_component("triton-operator")
        say(f"[demo] Stopped an operator process an older demo left pid={stale}")
    return local.up()


def helm_binary() -> str:
    out = subprocess.run(["bash", str(REPO / "e2e" / "toolchain" / "build.sh")],
                         check=True, capture_output=True, text=True).stdout
    return str(Path(out.strip().splitlines()[-1]) / "helm")


def install_operator(kubeconfig: Path, timeout: float) -> None:
    """`helm upgrade --install` of the chart, then wait until the operator serves: every replica Ready (each serves
    the webhook) and one of them holding the leader Lease (it reconciles). An operator that does not serve is
    never reused: replicas not Ready, or no leader, within the timeout fail the demo with the log."""
    # The custom metrics API (for examples/autoscaling.yaml) is off by default, so as not to take the group over
    # from an adapter already in a cluster (chart README, "Autoscaling"); the demo's own cluster has none.
    say("[demo] Installing the operator: helm upgrade --install triton-operator charts/triton-operator "
        f"--set customMetrics.enabled=true --set tritonImage={TRITON_REF}")
    subprocess.run([helm_binary(), "--kubeconfig", str(kubeconfig), "upgrade", "--install", RELEASE,
                    str(REPO / "charts" / "triton-operator"), "--namespace", RELEASE_NAMESPACE, "--create-namespace",
                    "--set", "customMetrics.enabled=true",
                    # The demo's nodes cannot pull NVIDIA's image: models that name none run the local CPU build.
                    "--set", f"tritonImage={TRITON_REF}",
                    # A cluster an older demo made has the CRD from the chart's former crds/, which Helm did not
                    # record as the release's: the first upgrade takes it over (chart README, "CRDs").
                    "--take-ownership",
                    "--wait", "--timeout", f"{int(timeout)}s"], check=True, capture_output=True, text=True)
    kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/tritonmodels.serving.triton-operator.dev")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = [p for p in get_json(kubeconfig, "pods", "-n", RELEASE_NAMESPACE, "-l",
                                    f"app.kubernetes.io/instance={RELEASE}")["items"]
                if not p["metadata"].get("deletionTimestamp")]
        ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in p["status"].get("conditions", []))]
        leases = get_json(kubeconfig, "leases", "-n", RELEASE_NAMESPACE)["items"]
        holder = next(((lease.get("spec") or {}).get("holderIdentity") or "" for lease in leases
                       if lease["metadata"]["name"] == f"{RELEASE}"), "")
        if ready and len(ready) == len(pods) and holder:
            for pod in ready:
                image = pod["spec"]["containers"][0]["image"]
                role = "leader" if holder.split("_")[0] == pod["metadata"]["name"] else "follower"
                say(f"[demo] Operator replica {RELEASE_NAMESPACE}/{pod['metadata']['name']} ({role}) on "
                    f"{pod['spec']['nodeName']} (image {image}, uid {pod['spec']['securityContext'].get('runAsUser')})")
            return
        time.sleep(0.5)
    log = subprocess.run([str(VENV_BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "logs", "-n",
                          RELEASE_NAMESPACE, f"deployment/{RELEASE}", "--tail=40"], capture_output=True, text=True)
    raise TimeoutError(f"the operator pod is not Ready after {timeout:.0f}s:\n{log.stdout}{log.stderr}")


def wait_nodes(kubeconfig: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = get_json(kubeconfig, "nodes")["items"]
        ready = [n for n in nodes if any(c["type"] == "Ready" and c["status"] == "True"
                                         for c in n["status"].get("conditions", []))]
        if ready and len(ready) == len(nodes):
            for n in ready:
                info = n["status"]["nodeInfo"]
                say(f"[demo] Node {n['metadata']['name']} is Ready: kubelet {info['kubeletVersion']}, "
                    f"{info['containerRuntimeVersion']}, nvidia.com/gpu={n['status']['allocatable'].get('nvidia.com/gpu', '0')}")
            return
        time.sleep(0.5)
    raise TimeoutError("no Ready node")


def wait_webhook(kubeconfig: Path, timeout: float) -> None:
    """Until some triton-operator webhook configuration carries a CA: before that, TritonModel writes are refused."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for vwc in get_json(kubeconfig, "validatingwebhookconfigurations")["items"]:
            hooks = vwc.get("webhooks") or []
            if any(h["name"] == "tritonmodels.serving.triton-operator.dev" and h["clientConfig"].get("caBundle")
                   for h in hooks):
                say(f"[demo] The operator's admission webhook is registered ({vwc['metadata']['name']})")
                return
        time.sleep(0.3)
    raise TimeoutError(f"the operator registered no admission webhook; see `kubectl logs -n {RELEASE_NAMESPACE} "
                       f"deployment/{RELEASE}`")


def refused_at_apply(kubeconfig: Path, namespace: str) -> None:
    """An ensemble whose step name has a typo: refused by the webhook before anything exists."""
    doc = next(d for d in yaml.safe_load_all(EXAMPLES[1].read_text()) if d and d["metadata"]["name"] == "sentiment")
    doc["metadata"]["name"] = "sentiment-typo"
    doc["spec"]["ensemble"]["steps"][1]["model"] = "clasifier"
    proc = subprocess.run(
        [str(VENV_BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "apply", "-n", namespace, "-f", "-"],
        input=json.dumps(doc), capture_output=True, text=True,
    )
    if proc.returncode == 0:
        raise RuntimeError("an ensemble naming a missing step was admitted")
    say("[demo] An ensemble naming a step that does not exist is refused at kubectl apply:")
    for line in proc.stderr.strip().splitlines():
        say(f"         {line}")


def progress(kubeconfig: Path, namespace: str, names: list[str], timeout: float) -> None:
    """Print every change of the TritonModels' replica states until all are Ready."""
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        items = {i["metadata"]["name"]: i for i in get_json(kubeconfig, "tritonmodels", "-n", namespace)["items"]}
        done = True
        for name in names:
            st = (items.get(name) or {}).get("status") or {}
            conds = {c["type"]: c for c in st.get("conditions", [])}
            ready = conds.get("Ready", {})
            replicas = ", ".join(
                f"{r['pod'].rsplit('-', 1)[-1]}={r['state']}" + (f" ({r['warmupSeconds']:.1f}s)" if r.get("warmupSeconds") else "")
                for r in st.get("replicaStates", [])
            )
            line = (
                f"{name:<12} Ready={ready.get('status', '-'):<5} reason={ready.get('reason', '-'):<18} "
                f"warmed={st.get('warmedReplicas', 0)}/{(items.get(name) or {}).get('spec', {}).get('replicas', '?')} "
                f"replicas[{replicas}]"
            )
            if seen.get(name) != line:
                seen[name] = line
                say(f"  {time.monotonic() - t0:6.1f}s  {line}")
            done = done and ready.get("status") == "True"
        if done:
            return
        time.sleep(0.5)
    raise TimeoutError(f"TritonModels not Ready within {timeout}s; see `kubectl describe tritonmodels -n {namespace}`")


def ready_address(kubeconfig: Path, namespace: str, service: str) -> str:
    """The Service's ClusterIP, once it has a ready endpoint: kube-proxy sends each connection to a warmed replica."""
    slices = get_json(kubeconfig, "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}")
    if not any((ep.get("conditions") or {}).get("ready") for s in slices["items"] for ep in s.get("endpoints") or []):
        raise RuntimeError(f"service {service} has no ready endpoint")
    return get_json(kubeconfig, "service", "-n", namespace, service)["spec"]["clusterIP"]


def through_kube_proxy(call: Any, seconds: float = 20.0) -> tuple[Any, str]:
    """`call()`, tried again while the ClusterIP refuses: kube-proxy programs a Service's first ready endpoint at
    its next rule sync (at most one a second, later on a busy machine), and rejects connections until then
    (refused, or no route to host).
    Returns the result and how long the answered call took, with the refused tries before it if any."""
    start = time.monotonic()
    deadline = start + seconds
    refused = 0
    while True:
        t = time.monotonic()
        try:
            res = call()
        except InferenceServerException as exc:
            # Before kube-proxy's sync a ClusterIP may also answer "No route to host" (nothing answers ARP for it).
            if not any(m in str(exc) for m in ("Connection refused", "No route to host")) or time.monotonic() > deadline:
                raise
            refused += 1
            time.sleep(0.2)
            continue
        took = f"{(time.monotonic() - t) * 1000:.1f} ms"
        if refused:
            took += f"; {refused} tries refused over {t - start:.1f} s before, until kube-proxy's next sync"
        return res, took


def sample_inference(kubeconfig: Path, namespace: str) -> None:
    addr = ready_address(kubeconfig, namespace, "add-sub")
    client = grpcclient.InferenceServerClient(f"{addr}:8001")
    a = np.array([[1, 2, 3, 4]], dtype=np.float32)
    b = np.array([[10, 20, 30, 40]], dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32"), grpcclient.InferInput("INPUT1", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    res, took = through_kube_proxy(lambda: client.infer("add-sub", inputs))
    say(f"[demo] add-sub via Service add-sub {addr}:8001: {a[0].tolist()} + {b[0].tolist()} = "
        f"{res.as_numpy('OUTPUT0')[0].tolist()} (first request after the gate opened: {took})")

    addr = ready_address(kubeconfig, namespace, "sentiment")
    client = grpcclient.InferenceServerClient(f"{addr}:8001")
    texts = np.array([[b"a great and really good demo"], [b"bad, awful and boring"]], dtype=np.object_)
    inp = grpcclient.InferInput("TEXT", list(texts.shape), "BYTES")
    inp.set_data_from_numpy(texts)
    res, _ = through_kube_proxy(lambda: client.infer("sentiment", [inp]))
    labels = [x.decode() if isinstance(x, bytes) else str(x) for x in res.as_numpy("LABEL").reshape(-1)]
    for text, label in zip(texts.reshape(-1), labels, strict=True):
        say(f"[demo] sentiment via Service sentiment {addr}:8001: {text.decode()!r} -> {label}")


def pool_placement(kubeconfig: Path, namespace: str, timeout: float) -> None:
    """Waits until every model of examples/pool.yaml is Ready, then prints where each is placed (its
    status.placement: pool replica pods) and what each replica of the pool carries (the pool's status)."""
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(EXAMPLES[2].read_text())
             if d and d["kind"] == "TritonModel"]
    deadline = time.monotonic() + timeout
    while True:
        items = {i["metadata"]["name"]: i for i in get_json(kubeconfig, "tritonmodels", "-n", namespace)["items"]}
        ready = {n: next((c for c in ((items.get(n) or {}).get("status") or {}).get("conditions", [])
                          if c["type"] == "Ready"), {}) for n in names}
        if all(c.get("status") == "True" for c in ready.values()):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"pooled models not Ready within {timeout}s: "
                               + ", ".join(f"{n}={c.get('reason', '-')}" for n, c in ready.items()))
        time.sleep(0.5)
    say(f"[demo] Pooled models placed on the replicas of TritonPool {POOL} (status.placement):")
    for n in names:
        st = items[n]["status"]
        where = ", ".join(st.get("placement") or []) or "(with its ensemble)"
        say(f"  {n:<14} Ready={ready[n]['status']} reason={ready[n].get('reason', '-'):<16} "
            f"copies={st.get('warmedReplicas', 0)}/{items[n]['spec'].get('replicas', 1)} on {where}")
    pool = get_json(kubeconfig, "tritonpool", POOL, "-n", namespace)
    for r in (pool.get("status") or {}).get("replicaModels") or []:
        say(f"  replica {r['pod']} on {r.get('node', '?')}: used {r.get('used')} free {r.get('free')}, "
            f"models {', '.join(r.get('models') or [])}")


def pooled_inference(kubeconfig: Path, namespace: str) -> None:
    """A request to each pooled model through its own Service (no selector: the operator's EndpointSlices list
    the replicas where that model is READY)."""
    for name, (inputs, output, values, expected) in POOLED.items():
        addr = ready_address(kubeconfig, namespace, name)
        client = grpcclient.InferenceServerClient(f"{addr}:8001")
        tensors = []
        for inp, v in zip(inputs, values, strict=True):
            t = grpcclient.InferInput(inp, [1, 4], "FP32")
            t.set_data_from_numpy(np.array([v], dtype=np.float32))
            tensors.append(t)
        res, took = through_kube_proxy(lambda client=client, name=name, tensors=tensors: client.infer(name, tensors))
        got = res.as_numpy(output)[0].tolist()
        if got != [float(x) for x in expected]:
            raise RuntimeError(f"{name} answered {got}, expected {expected}")
        say(f"[demo] {name} via Service {name} {addr}:8001: {' , '.join(str(v) for v in values)} -> {got} ({took})")


#: The models whose Services carry client load through the upgrade: (Service and model, ServiceLoad kind).
UPGRADE_LOAD = (("add-sub", "add-sub"), ("sentiment", "sentiment"), ("pool-add-sub", "add-sub"))


def upgrade_operator(kubeconfig: Path, namespace: str, timeout: float) -> None:
    """`helm upgrade` of the operator to its image under a new tag, watched: the changes of the namespace's
    Deployments, pods and Progressing reasons as they happen, then the end state (`--upgrade`)."""
    from e2e import images
    from e2e.cluster import LocalCluster
    from e2e.kube import Kube
    from e2e.load import ServiceLoad
    from e2e.upgrade_sampler import Sampler
    from triton_operator.api.kinds import LABEL_MANAGED_BY, MANAGED_BY
    from triton_operator.api.v1alpha1 import GROUP
    from triton_operator.plan.upgrade import UPGRADE_WAITING, rollout_finished

    old = images.chart_operator_ref()
    new = f"{old}-demo-upgrade"
    for node in LocalCluster(REPO).nodes():
        node.ctr("images", "tag", "--force", old, new)
    kube = Kube(kubeconfig, timeout=5)

    def custom(plural: str) -> list[dict[str, Any]]:
        return list(kube.request("GET", f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/{plural}")["items"])

    def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        owned = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        return (kube.items("Deployment", namespace, labelSelector=owned), kube.items("Pod", namespace, labelSelector=owned),
                custom("tritonmodels") + custom("tritonpools"))

    def upgraded() -> bool:
        """Every Deployment's template on the new image and rolled out, every pod (terminating ones too) on it, every
        TritonModel Ready."""
        deployments, pods, _ = read()
        return (all(new in {c["image"] for c in d["spec"]["template"]["spec"]["containers"]} and rollout_finished(d)
                    for d in deployments)
                and all(new in {c["image"] for c in p["spec"]["containers"]} for p in pods)
                and all(any(c["type"] == "Ready" and c["status"] == "True"
                            for c in (m.get("status") or {}).get("conditions") or ()) for m in custom("tritonmodels")))

    loads = [ServiceLoad(kubeconfig, namespace, service, service, threads=1, rate=2.0, kind=kind)
             for service, kind in UPGRADE_LOAD]
    t0 = time.monotonic()

    def show(at: float, lines: list[str]) -> None:
        for line in lines:
            say(f"  {time.monotonic() - t0:6.1f}s  {line}")

    sampler = Sampler(read, waiting_reason=UPGRADE_WAITING, period=0.5, on_change=show)
    say(f"[demo] Upgrading the operator: helm upgrade {RELEASE} charts/triton-operator --reset-then-reuse-values "
        f"--set image.tag={new.rsplit(':', 1)[1]}")
    say("[demo]   the same image under a new tag: it is also every replica's fetch and probe container, so the new "
        "operator renders another pod template for every model, as a new operator version would. At most "
        "upgrade.maxModelsRolling of them roll at once; the others wait (Progressing reason "
        f"{UPGRADE_WAITING}) on their old pods. Client load meanwhile through the Services of "
        f"{', '.join(s for s, _ in UPGRADE_LOAD)}.")
    try:
        for load in loads:
            load.start()
        sampler.start()
        subprocess.run([helm_binary(), "--kubeconfig", str(kubeconfig), "upgrade", RELEASE,
                        str(REPO / "charts" / "triton-operator"), "--namespace", RELEASE_NAMESPACE, "--reset-then-reuse-values",
                        "--set", f"image.tag={new.rsplit(':', 1)[1]}", "--wait", "--timeout", f"{int(timeout)}s"],
                       check=True, capture_output=True, text=True)
        say(f"  {time.monotonic() - t0:6.1f}s  helm upgrade done: the operator's own pods run {new}")
        deadline = time.monotonic() + 3 * timeout
        while not upgraded():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the models did not all roll to {new} within {3 * timeout:.0f}s; see "
                                   f"`kubectl get tritonmodels,deployments,pods -n {namespace}`")
            time.sleep(0.5)
        took = time.monotonic() - t0
    finally:
        record = sampler.stop()
        tallies = {load.service: load.stop() for load in loads}
    bound = next((a.split("=", 1)[1] for a in get_json(kubeconfig, "deployment", RELEASE, "-n", RELEASE_NAMESPACE)[
        "spec"]["template"]["spec"]["containers"][0].get("args") or () if a.startswith("--max-upgrade-rollouts=")), "?")
    say(f"[demo] Upgraded in {took:.0f}s: every Deployment rolled out on {new}, every TritonModel Ready")
    say(f"  most Deployments rolling at once: {record.max_rolling} {record.most} (upgrade.maxModelsRolling={bound})")
    say(f"  waited for a slot ({UPGRADE_WAITING}): {', '.join(record.waited(UPGRADE_WAITING)) or 'none'}")
    say(f"  pods Pending for want of room: {len(record.pending)}; container restarts: "
        f"{sum(record.restarts.values())}; new pods: {sum(len(u) for u in record.new_pods.values())}")
    for service, tally in tallies.items():
        say(f"  requests through Service {service}: {tally.failed} failed of {tally.sent}")
    kubectl(kubeconfig, "get", "tritonmodels,tritonpools", "-n", namespace, capture=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.demo")
    p.add_argument("--kubeconfig", help="use this cluster (with an operator running) instead of the local one")
    p.add_argument("--namespace", default="demo")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--upgrade", action="store_true",
                   help="then upgrade the operator (helm upgrade to its image under a new tag) and watch the models roll")
    args = p.parse_args(argv)
    if args.upgrade and args.kubeconfig:
        p.error("--upgrade tags the operator's image on the local cluster's nodes: not with --kubeconfig")
    t0 = time.monotonic()
    say("[demo] Bringing up the local cluster (control plane, two GPU nodes, images) and the operator…")
    kubeconfig = bring_up(args)
    wait_nodes(kubeconfig, 120)
    if not args.kubeconfig:
        install_operator(kubeconfig, args.timeout)
    wait_webhook(kubeconfig, 120)
    ns_exists = subprocess.run(
        [str(VENV_BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "get", "namespace", args.namespace],
        capture_output=True,
    ).returncode == 0
    if not ns_exists:
        kubectl(kubeconfig, "create", "namespace", args.namespace)
    for f in EXAMPLES[:2]:
        kubectl(kubeconfig, "apply", "-n", args.namespace, "-f", str(f))
        say(f"[demo] Applied {f.relative_to(REPO)}")
    refused_at_apply(kubeconfig, args.namespace)
    say("[demo] Watching the TritonModels: a replica joins its Service only after Triton has loaded the desired "
        "config and finished warm-up")
    progress(kubeconfig, args.namespace, ["add-sub", "sentiment"], args.timeout)
    kubectl(kubeconfig, "get", "tritonmodels", "-n", args.namespace, capture=False)
    sample_inference(kubeconfig, args.namespace)
    # The pool once the others serve: on two cores, its replicas loading beside add-sub's warm-up held that back
    # past the demo's timeout once (e2e/test_demo.py).
    kubectl(kubeconfig, "apply", "-n", args.namespace, "-f", str(EXAMPLES[2]))
    say(f"[demo] Applied {EXAMPLES[2].relative_to(REPO)}: a TritonPool of 3 replicas and the models placed on it")
    pool_placement(kubeconfig, args.namespace, args.timeout)
    pooled_inference(kubeconfig, args.namespace)
    if args.upgrade:
        upgrade_operator(kubeconfig, args.namespace, args.timeout)
    say(f"[demo] Done in {time.monotonic() - t0:.0f}s. The cluster keeps running:")
    say(f"  export KUBECONFIG={kubeconfig}")
    say(f"  .venv/bin/kubectl get tritonmodels,tritonpools,pods,endpointslices -n {args.namespace}")
    say(f"  .venv/bin/kubectl get nodes -o wide; .venv/bin/kubectl logs -n {RELEASE_NAMESPACE} deployment/{RELEASE}")
    say("  make cluster-down     # stop everything")
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
