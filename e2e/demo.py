"""`make demo`: the whole product on an embedded local cluster, shown as it happens.

Brings up the local control plane and a fake GPU node (e2e/cluster.py, e2e/nodeagent),
installs the CRD, starts the operator, applies two examples (add-sub with warm-up and
the sentiment ensemble), prints live progress of the TritonModels and their replicas
(Loading -> Warming -> Ready, gated in), then sends a sample inference to each through
the Service's ready endpoints. The cluster is left running.

    python -m e2e.demo [--kubeconfig PATH] [--namespace demo] [--timeout 300]
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
import yaml
import tritonclient.grpc as grpcclient

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
EXAMPLES = [REPO / "examples" / "add-sub.yaml", REPO / "examples" / "sentiment-ensemble.yaml"]
GPU_NODE = "gpu-node-1"


def say(msg: str) -> None:
    print(msg, flush=True)


def kubectl(kubeconfig: Path, *args: str, capture: bool = True) -> str:
    out = subprocess.run(  # noqa: S603 - argument array
        [str(VENV_BIN / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        check=True, text=True, capture_output=capture,
    )
    return out.stdout if capture else ""


def get_json(kubeconfig: Path, *args: str) -> dict[str, Any]:
    return json.loads(kubectl(kubeconfig, "get", *args, "-o", "json"))


def bring_up(args: argparse.Namespace) -> Path:
    from e2e.cluster import LocalCluster, free_port

    if args.kubeconfig:
        return Path(args.kubeconfig)
    local = LocalCluster(REPO)
    kubeconfig = local.up()
    if "nodeagent" not in local.running():
        local.start_node_agent([GPU_NODE], 8)
    if "triton-operator" not in local.running():
        logf = open(local.logs / "triton-operator.log", "ab")  # noqa: SIM115 - handed to the child
        webhook = free_port()
        proc = subprocess.Popen(  # noqa: S603
            [str(VENV_BIN / "triton-operator"), "run", "--kubeconfig", str(kubeconfig), "--metrics-port", "0",
             "--liveness", "http://127.0.0.1:18080/healthz",
             # The admission webhook on loopback; `make cluster-down` stops the operator, which removes it.
             "--webhook-url", f"https://127.0.0.1:{webhook}", "--webhook-address", "127.0.0.1",
             "--webhook-port", str(webhook), "--webhook-configuration", "triton-operator-demo"],
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        pids = local.read_pids()
        pids["triton-operator"] = proc.pid
        local._write_pids(pids)
        say(f"[demo] Started the operator pid={proc.pid} log={local.logs / 'triton-operator.log'}")
    return kubeconfig


def wait_node(kubeconfig: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = get_json(kubeconfig, "nodes")["items"]
        for n in nodes:
            ready = [c for c in n["status"].get("conditions", []) if c["type"] == "Ready"]
            if ready and ready[0]["status"] == "True":
                gpus = n["status"].get("capacity", {}).get("nvidia.com/gpu", "0")
                say(f"[demo] Node {n['metadata']['name']} is Ready with nvidia.com/gpu={gpus}")
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
    raise TimeoutError("the operator registered no admission webhook; see .cluster/logs/triton-operator.log")


def refused_at_apply(kubeconfig: Path, namespace: str) -> None:
    """An ensemble whose step name has a typo: refused by the webhook before anything exists."""
    doc = next(d for d in yaml.safe_load_all(EXAMPLES[1].read_text()) if d and d["metadata"]["name"] == "sentiment")
    doc["metadata"]["name"] = "sentiment-typo"
    doc["spec"]["ensemble"]["steps"][1]["model"] = "clasifier"
    proc = subprocess.run(  # noqa: S603
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
    slices = get_json(kubeconfig, "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}")
    for s in slices["items"]:
        for ep in s.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready"):
                return ep["addresses"][0]
    raise RuntimeError(f"service {service} has no ready endpoint")


def sample_inference(kubeconfig: Path, namespace: str) -> None:
    addr = ready_address(kubeconfig, namespace, "add-sub")
    client = grpcclient.InferenceServerClient(f"{addr}:8001")
    a = np.array([[1, 2, 3, 4]], dtype=np.float32)
    b = np.array([[10, 20, 30, 40]], dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32"), grpcclient.InferInput("INPUT1", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    t = time.monotonic()
    res = client.infer("add-sub", inputs)
    ms = (time.monotonic() - t) * 1000
    say(f"[demo] add-sub via endpoint {addr}:8001: {a[0].tolist()} + {b[0].tolist()} = "
        f"{res.as_numpy('OUTPUT0')[0].tolist()} ({ms:.1f} ms, first request after the gate opened)")

    addr = ready_address(kubeconfig, namespace, "sentiment")
    client = grpcclient.InferenceServerClient(f"{addr}:8001")
    texts = np.array([[b"a great and really good demo"], [b"bad, awful and boring"]], dtype=np.object_)
    inp = grpcclient.InferInput("TEXT", list(texts.shape), "BYTES")
    inp.set_data_from_numpy(texts)
    res = client.infer("sentiment", [inp])
    labels = [x.decode() if isinstance(x, bytes) else str(x) for x in res.as_numpy("LABEL").reshape(-1)]
    for text, label in zip(texts.reshape(-1), labels, strict=True):
        say(f"[demo] sentiment via endpoint {addr}:8001: {text.decode()!r} -> {label}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.demo")
    p.add_argument("--kubeconfig", help="use this cluster (with an operator running) instead of the local one")
    p.add_argument("--namespace", default="demo")
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    say("[demo] Bringing up the local control plane, a GPU node and the operator…")
    kubeconfig = bring_up(args)
    wait_node(kubeconfig, 90)
    kubectl(kubeconfig, "apply", "--server-side", "-f", str(REPO / "crds" / "tritonmodels.yaml"))
    kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/tritonmodels.serving.triton-operator.dev")
    say("[demo] Installed the TritonModel CRD")
    wait_webhook(kubeconfig, 60)
    ns_exists = subprocess.run(  # noqa: S603
        [str(VENV_BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "get", "namespace", args.namespace],
        capture_output=True,
    ).returncode == 0
    if not ns_exists:
        kubectl(kubeconfig, "create", "namespace", args.namespace)
    for f in EXAMPLES:
        kubectl(kubeconfig, "apply", "-n", args.namespace, "-f", str(f))
        say(f"[demo] Applied {f.relative_to(REPO)}")
    refused_at_apply(kubeconfig, args.namespace)
    say("[demo] Watching the TritonModels: a replica joins its Service only after Triton has loaded the desired "
        "config and finished warm-up")
    progress(kubeconfig, args.namespace, ["add-sub", "sentiment"], args.timeout)
    kubectl(kubeconfig, "get", "tritonmodels", "-n", args.namespace, capture=False)
    sample_inference(kubeconfig, args.namespace)
    say(f"[demo] Done in {time.monotonic() - t0:.0f}s. The cluster keeps running:")
    say(f"  export KUBECONFIG={kubeconfig}")
    say(f"  .venv/bin/kubectl get tritonmodels,pods,endpointslices -n {args.namespace}")
    say("  make cluster-down     # stop everything")
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
