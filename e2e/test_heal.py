"""A replica that stops serving while its tritonserver runs leaves the Service within a second and is healed with no
person (issue 33).

For each fault, load runs through the ClusterIP of a 2-replica model (`e2e.load.ServiceLoad`), and the test records
the time from the fault until the bad replica's endpoint is `ready: false`, the requests that failed, what the
operator did (its Events on the pod), and the time until the replica answered again through the Service:

- the Python stub of a model SIGKILLed inside one replica (found through the pod's cgroup, not by name);
- the stub of an ensemble step SIGKILLed;
- the model unloaded through Triton's repository API, with the operator's key;
- a request that makes the Python model allocate past its container's memory limit (the kernel kills it);
- the replica's tritonserver SIGSTOPped for 10 s, then SIGCONTed;
- and a single-replica model whose stub is killed comes back by itself.

What is asserted is behaviour: the replica left the endpoints, the status said why (Degraded) and Progressing did
not call it a stalled rollout, it came back and served, and the operator recorded the heal. Times are recorded,
not asserted (`make bench BENCH=faults` measures them on purpose).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad
from e2e.operator_fixtures import (
    OperatorHandle,
    gate,
    is_model_ready,
    load_examples,
    model_condition,
    record,
    wait_model,
)
from e2e.test_operator import add_sub, apply, endpoint_ready, live_pods
from e2e.testing import ready_addresses
from triton_operator.api.v1alpha1 import REPOSITORY_KEY_ENV
from triton_operator.render.repository_key import KEY_HEADER

pytestmark = pytest.mark.cluster

STUB = b"triton_python_backend_stub"
#: A request whose INPUT0 starts with this makes the `hog` model allocate past its container's memory limit.
HOG_TRIGGER = -7777.0


@dataclass
class Outcome:
    """What one fault did, as the test saw it (seconds from the fault)."""

    left: float | None = None  # the bad replica's endpoint turned ready: false
    back: float | None = None  # ... and ready again
    served: float | None = None  # ... and answered a request of its own
    failed: int = 0
    sent: int = 0
    gate_reasons: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)  # the TritonModel's Degraded reasons while it healed
    progressing: list[str] = field(default_factory=list)
    action: str = ""

    def line(self) -> str:
        def s(x: float | None) -> str:
            return "never" if x is None else f"{x:.2f}s"
        return (f"out of the endpoints {s(self.left)}, ready again {s(self.back)}, served again {s(self.served)}; "
                f"{self.failed} of {self.sent} requests failed; gate {self.gate_reasons}; action: {self.action}")


def python_model(name: str, replicas: int = 2, hog: bool = False, memory: str | None = None) -> dict:
    """add-sub (a Python model) as `name`; `hog`: a request with INPUT0[0] == HOG_TRIGGER allocates 2 GiB."""
    doc = add_sub(name)
    doc["spec"]["replicas"] = replicas
    if hog:
        code = doc["spec"]["source"]["inline"]["model.py"]
        line = '            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()\n'
        code = code.replace(line, line + f'            if a.size and a.reshape(-1)[0] == {HOG_TRIGGER}:\n'
                            '                hog = np.ones((2 << 30) // 8)  # 2 GiB, written: resident\n'
                            '                a = a + hog[:1].astype(a.dtype) - 1\n', 1)
        assert str(HOG_TRIGGER) in code, "the add-sub example changed: the hog's trigger did not go in"
        doc["spec"]["source"]["inline"]["model.py"] = code
    if memory:
        doc["spec"].setdefault("server", {})["resources"] = {"limits": {"memory": memory}, "requests": {"memory": memory}}
    return doc


def sentiment(replicas: int = 2) -> list[dict]:
    docs = load_examples("sentiment-ensemble")
    for d in docs:
        if d["metadata"]["name"] == "sentiment":
            d["spec"]["replicas"] = replicas
    return docs


def stubs_of(nodes: Any, pod: dict, model: str) -> list[int]:
    """The Python stub processes of `model` in the pod's tritonserver container: the processes of that container's
    cgroup (on the host) whose command runs the stub for `<repository>/<model>/<version>/model.py`."""
    pid = nodes.container_pid(pod, "tritonserver")
    # Any hierarchy the container's cgroup is in (cgroup v2, or a v1 controller on a hybrid host) lists its processes.
    dirs = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for root in ((Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")) if not controllers
                     else (Path("/sys/fs/cgroup", controllers.split(",")[0].removeprefix("name=")),)):
            dirs.append(root / path.lstrip("/"))
    found = next((d for d in dirs if (d / "cgroup.procs").is_file() and d != Path("/sys/fs/cgroup")), None)
    assert found is not None, f"no cgroup directory of tritonserver (pid {pid}) among {dirs}"
    procs = (found / "cgroup.procs").read_text().split()
    out = []
    for p in procs:
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(STUB) and len(argv) > 1 and Path(argv[1].decode()).parts[-3:-2] == (model,):
            out.append(int(p))
    return out


def repository_key(kube: Kube, namespace: str, name: str) -> str:
    """The model's repository key, read as the cluster's admin from the Secret its Deployment names."""
    template = kube.get("Deployment", name, namespace)["spec"]["template"]["spec"]
    (ref,) = [e["valueFrom"]["secretKeyRef"] for e in template["containers"][0]["env"] if e["name"] == REPOSITORY_KEY_ENV]
    secret = kube.get("Secret", ref["name"], namespace)
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def post(url: str, body: dict, headers: dict[str, str] | None = None, timeout: float = 60) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",  # noqa: S310 - http:// to a pod of this test
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http:// to a pod of this test
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def heal_events(kube: Kube, namespace: str, pod: str, skip: frozenset[str] = frozenset()) -> list[str]:
    """The operator's heal Events on the pod (but those named in `skip`: the ones before a fault)."""
    return [f"{e.get('reason')}: {e.get('message')}" for e in kube.items("Event", namespace)
            if (e.get("involvedObject") or {}).get("name") == pod and e["metadata"]["name"] not in skip
            and e.get("reason") in ("Healed", "HealFailed", "HealDeleted")]


def event_names(kube: Kube, namespace: str) -> frozenset[str]:
    return frozenset(e["metadata"]["name"] for e in kube.items("Event", namespace))


def serving(kube: Kube, namespace: str, model: str, replicas: int) -> list[dict]:
    """Waits until the model is Ready with `replicas` warmed pods, each in the Service; returns them."""
    wait_model(kube, namespace, model, is_model_ready, "Ready", 240)

    def all_in() -> list[dict] | None:
        pods = live_pods(kube, namespace, model)
        ok = len(pods) == replicas and all(gate(p).get("status") == "True" and endpoint_ready(
            kube, namespace, model, p["status"]["podIP"]) for p in pods)
        return pods if ok else None

    return wait_for(f"{replicas} replicas of {model} in the Service", all_in, 120)


def answers(ip: str, model: str) -> bool:
    """Whether the replica at `ip` answers one inference of `model` (add-sub's inputs, or the sentiment ensemble's)."""
    if model == "sentiment":
        body: dict = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a good film"]}]}
    else:
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                           {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
    return post(f"http://{ip}:8000/v2/models/{model}/infer", body, timeout=10) == 200


def measure(kube: Kube, namespace: str, model: str, pod: dict, load: ServiceLoad, fault: Callable[[], None],
            after: Callable[[], None] | None = None, timeout: float = 180) -> Outcome:
    """Runs `fault` against `pod` under `load`, and follows the replica's endpoint out and back in (polled back to
    back: what is measured is the system's latency, not the poll's), then until the replica answers again."""
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    out = Outcome()
    replicas = len(ready_addresses(kube, namespace, model))
    earlier = event_names(kube, namespace)
    before = load.tally()
    t0 = time.monotonic()
    fault()
    while out.left is None:
        assert time.monotonic() - t0 < 60, f"the replica never left the endpoints: {load.endpoint_history[-5:]}"
        if not endpoint_ready(kube, namespace, model, ip):
            out.left = time.monotonic() - t0
        else:
            time.sleep(0.005)
    if after is not None:
        after()
    while out.served is None:
        now = time.monotonic()
        assert now - t0 < timeout, (f"the replica did not serve again within {timeout:.0f}s: {out.line()}; "
                                    f"endpoints {load.endpoint_history[-5:]}; events {heal_events(kube, namespace, name)}")
        p = kube.get_or_none("Pod", name, namespace)
        reason = gate(p).get("reason", "") if p and not p["metadata"].get("deletionTimestamp") else "(pod replaced)"
        if reason and (not out.gate_reasons or out.gate_reasons[-1] != reason):
            out.gate_reasons.append(reason)
        tm = kube.get("TritonModel", model, namespace)
        for type_, seen in (("Degraded", out.degraded), ("Progressing", out.progressing)):
            c = model_condition(tm, type_)
            r = f"{c.get('status')}/{c.get('reason')}"
            if not seen or seen[-1] != r:
                seen.append(r)
        if reason == "(pod replaced)":  # the operator deleted it: back once its replacement is in the Service
            ready = ready_addresses(kube, namespace, model) - {ip}
            if out.back is None and len(ready) >= replicas:
                out.back = time.monotonic() - t0
            if out.back is not None and all(answers(a, model) for a in ready):
                out.served = time.monotonic() - t0
        else:
            if out.back is None and endpoint_ready(kube, namespace, model, ip):
                out.back = time.monotonic() - t0
            if out.back is not None and answers(ip, model):
                out.served = time.monotonic() - t0
        time.sleep(0.05)
    phase = load.tally() - before
    out.failed, out.sent = phase.failed, phase.sent
    p = kube.get_or_none("Pod", name, namespace)
    restarts = sum(cs.get("restartCount", 0) for cs in ((p or {}).get("status") or {}).get("containerStatuses") or ())
    events = heal_events(kube, namespace, name, earlier)
    out.action = "; ".join(events) or (f"container restarted ({restarts} restarts)" if restarts else "none recorded")
    return out


def finish(kube: Kube, namespace: str, model: str, what: str, out: Outcome, load: ServiceLoad) -> None:
    record(f"heal: {what}", out.line())
    print(f"{what}: {out.line()}\n  degraded {out.degraded}\n  progressing {out.progressing}\n"
          f"  endpoints {load.endpoint_history[-6:]}\n  failed samples {load.samples[:5]}")
    # Healed: Ready, not Degraded, and Progressing never called it a stalled rollout.
    wait_model(kube, namespace, model, lambda tm: is_model_ready(tm) and model_condition(tm, "Degraded").get(
        "status") == "False", "Ready and not Degraded", 120)
    assert not any(r.endswith("RolloutStalled") for r in out.progressing), out.progressing


# -- the faults ---------------------------------------------------------------------------------------------


def test_a_killed_python_stub_takes_the_replica_out_at_once_and_a_reload_heals_it(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any) -> None:
    apply(kubeconfig, namespace, python_model("add-sub"))
    pod = serving(kube, namespace, "add-sub", 2)[0]
    with ServiceLoad(kubeconfig, namespace, "add-sub", threads=4, rate=20) as load:
        wait_for("the load answered", lambda: load.tally().sent - load.tally().failed > 20, 60)
        stubs = stubs_of(nodes, pod, "add-sub")
        assert stubs, "no Python stub of add-sub in the pod's cgroup"
        out = measure(kube, namespace, "add-sub", pod, load, lambda: [os.kill(p, signal.SIGKILL) for p in stubs])
        finish(kube, namespace, "add-sub", "Python stub SIGKILL", out, load)
    assert any(r in ("ModelFailing", "Healing") for r in out.gate_reasons), out.gate_reasons
    assert any(d.startswith("True/") for d in out.degraded), f"never Degraded while it healed: {out.degraded}"
    assert out.action.startswith("Healed: ") and "add-sub" in out.action, out.action


def test_a_killed_stub_of_an_ensemble_step_is_healed_by_reloading_that_step(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any) -> None:
    apply(kubeconfig, namespace, *sentiment(2))
    pod = serving(kube, namespace, "sentiment", 2)[0]
    with ServiceLoad(kubeconfig, namespace, "sentiment", model="sentiment", kind="sentiment", threads=4,
                     rate=20) as load:
        wait_for("the load answered", lambda: load.tally().sent - load.tally().failed > 20, 60)
        stubs = stubs_of(nodes, pod, "tokenizer")
        assert stubs, "no Python stub of tokenizer in the pod's cgroup"
        out = measure(kube, namespace, "sentiment", pod, load, lambda: [os.kill(p, signal.SIGKILL) for p in stubs])
        finish(kube, namespace, "sentiment", "ensemble step stub SIGKILL", out, load)
    assert out.action.startswith("Healed: ") and "loaded tokenizer again" in out.action, out.action


def test_a_model_unloaded_through_the_repository_api_leaves_at_once_and_is_loaded_again(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    apply(kubeconfig, namespace, python_model("add-sub"))
    pod = serving(kube, namespace, "add-sub", 2)[0]
    key = repository_key(kube, namespace, "add-sub")
    url = f"http://{pod['status']['podIP']}:8000/v2/repository/models/add-sub/unload"
    with ServiceLoad(kubeconfig, namespace, "add-sub", threads=4, rate=20) as load:
        wait_for("the load answered", lambda: load.tally().sent - load.tally().failed > 20, 60)
        codes: list[int] = []
        out = measure(kube, namespace, "add-sub", pod, load, lambda: codes.append(post(url, {}, {KEY_HEADER: key})))
        assert codes == [200], f"the unload with the operator's key was refused: {codes}"
        finish(kube, namespace, "add-sub", "model unloaded (repository API, operator's key)", out, load)
    assert out.action.startswith("Healed: "), out.action


def test_a_stub_killed_by_its_memory_limit_is_healed(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    apply(kubeconfig, namespace, python_model("hog", hog=True, memory="1Gi"))
    pod = serving(kube, namespace, "hog", 2)[0]
    url = f"http://{pod['status']['podIP']}:8000/v2/models/hog/infer"
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [HOG_TRIGGER, 0, 0, 0]},
                       {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}
    with ServiceLoad(kubeconfig, namespace, "hog", model="hog", threads=4, rate=20) as load:
        wait_for("the load answered", lambda: load.tally().sent - load.tally().failed > 20, 60)
        codes: list[int] = []
        out = measure(kube, namespace, "hog", pod, load, lambda: codes.append(post(url, body, timeout=1)))
        finish(kube, namespace, "hog", "Python model over its memory limit", out, load)
    assert codes and codes[0] != 200, f"the allocating request was answered: {codes}"
    assert out.action != "none recorded", out.action


def test_a_stopped_tritonserver_leaves_the_service_and_rejoins_when_continued(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any) -> None:
    apply(kubeconfig, namespace, python_model("add-sub"))
    pod = serving(kube, namespace, "add-sub", 2)[0]
    pid = nodes.container_pid(pod, "tritonserver")
    stopped: list[float] = []

    def stop() -> None:
        os.kill(pid, signal.SIGSTOP)
        stopped.append(time.monotonic())

    def resume() -> None:
        # The fault lasts 10 s (a hang, not a crash): this waits for no state.
        time.sleep(max(0.0, stopped[0] + 10 - time.monotonic()))
        os.kill(pid, signal.SIGCONT)

    try:
        with ServiceLoad(kubeconfig, namespace, "add-sub", threads=4, rate=20, timeout=3) as load:
            wait_for("the load answered", lambda: load.tally().sent - load.tally().failed > 20, 60)
            out = measure(kube, namespace, "add-sub", pod, load, stop, after=resume)
            finish(kube, namespace, "add-sub", "tritonserver SIGSTOP 10 s", out, load)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert nodes.container_pid(kube.get("Pod", pod["metadata"]["name"], namespace), "tritonserver") == pid, \
        "a stop of 10 s is a hang to ride out, not a reason to restart tritonserver"


def test_a_single_replica_whose_stub_dies_comes_back_by_itself(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any) -> None:
    apply(kubeconfig, namespace, python_model("add-sub", replicas=1))
    (pod,) = serving(kube, namespace, "add-sub", 1)
    with ServiceLoad(kubeconfig, namespace, "add-sub", threads=2, rate=10) as load:
        wait_for("the load answered", lambda: load.tally().sent - load.tally().failed > 10, 60)
        stubs = stubs_of(nodes, pod, "add-sub")
        out = measure(kube, namespace, "add-sub", pod, load, lambda: [os.kill(p, signal.SIGKILL) for p in stubs])
        finish(kube, namespace, "add-sub", "single replica, stub SIGKILL", out, load)
    assert out.action.startswith("Healed: "), out.action
    assert any(d.startswith("True/") for d in out.degraded), out.degraded


def test_a_replica_that_breaks_again_soon_after_a_heal_is_replaced_by_a_new_pod(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any) -> None:
    apply(kubeconfig, namespace, python_model("add-sub"))
    pod = serving(kube, namespace, "add-sub", 2)[0]
    name = pod["metadata"]["name"]
    with ServiceLoad(kubeconfig, namespace, "add-sub", threads=4, rate=20) as load:
        wait_for("the load answered", lambda: load.tally().sent - load.tally().failed > 20, 60)
        first = measure(kube, namespace, "add-sub", pod, load,
                        lambda: [os.kill(p, signal.SIGKILL) for p in stubs_of(nodes, pod, "add-sub")])
        assert first.action.startswith("Healed: "), first.action
        wait_for("the healed replica's gate True", lambda: gate(kube.get("Pod", name, namespace)).get("status") == "True",
                 60)
        # Broken again within the window: a reload would pile up another dead copy; the pod is replaced.
        before = load.tally()
        for p in stubs_of(nodes, kube.get("Pod", name, namespace), "add-sub"):
            os.kill(p, signal.SIGKILL)
        replaced = time.monotonic()
        wait_for("the pod deleted", lambda: (kube.get_or_none("Pod", name, namespace) or {}).get(
            "metadata", {}).get("deletionTimestamp") or kube.get_or_none("Pod", name, namespace) is None, 60)
        serving(kube, namespace, "add-sub", 2)
        took = time.monotonic() - replaced
        failed = (load.tally() - before).failed
        events = [f"{e.get('reason')}: {e.get('message')}" for e in kube.items("Event", namespace)
                  if (e.get("involvedObject") or {}).get("name") == name and e.get("reason") == "HealDeleted"]
    record("heal: broken again within the window", f"first {first.line()}; then the pod was deleted and its "
           f"replacement served {took:.1f}s after the second kill, {failed} requests failed; {events}")
    assert events and "broke again" in events[0], events
    assert name not in {p["metadata"]["name"] for p in live_pods(kube, namespace, "add-sub")}
