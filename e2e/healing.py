"""Faults inside a serving replica and how tests and benches follow its heal (issue 33): the models faults are made
on (`python_model`, with an optional memory hog; `sentiment`), the Python stubs of a model found through the pod's
cgroup (`stubs_of`), the model's repository key (`repository_key`), `serving` (every replica warmed and in the
Service), and `measure`, which runs a fault under load and times the replica out of the endpoints, back in, and
answering again (`Outcome`).
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad
from e2e.operator_fixtures import add_sub, gate, is_model_ready, live_pods, load_examples, model_condition, wait_model
from e2e.testing import endpoint_ready, ready_addresses
from triton_operator.api.pod import REPOSITORY_KEY_ENV

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
    cgroup (on the host) whose command runs the stub for `<repository>/<model>/<version>/model.py`, or (a model a pool
    replica loaded from a request, which runs from a directory Triton made) whose instance name, the command's 8th
    argument, is `<model>_<group>_<n>`."""
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
        if not argv[0].endswith(STUB) or len(argv) < 2:
            continue
        if Path(argv[1].decode()).parts[-3:-2] == (model,) or (
                len(argv) > 8 and re.fullmatch(re.escape(model) + r"_\d+_\d+", argv[8].decode())):
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


def picky_model(name: str, replicas: int = 2) -> dict:
    """add-sub as `name`, whose code raises `ValueError` when INPUT0's first element is negative: the ordinary way a
    Python model refuses input (issue 39, H2). Its warm-up sample (zeros and random data in INPUT1) passes. No batcher:
    each execution has one request, so a bad request fails alone (a raise fails every request of its batch; and an
    error response of one request, `InferenceResponse(error=...)`, is not counted as failed by Triton 2.51, measured)."""
    doc = python_model(name, replicas)
    doc["spec"].pop("batcher", None)
    code = doc["spec"]["source"]["inline"]["model.py"]
    line = '            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()\n'
    code = code.replace(line, line + '            if a.size and a.reshape(-1)[0] < 0:\n'
                        '                raise ValueError("negative input")\n', 1)
    assert "negative input" in code, "the add-sub example changed: the refusal did not go in"
    doc["spec"]["source"]["inline"]["model.py"] = code
    return doc


class BadClients:
    """Threads sending `model` requests whose INPUT0 is negative through the Service's ClusterIP, without a pause,
    until the context ends: the client of issue 39 that took replicas out."""

    def __init__(self, kube: Kube, namespace: str, model: str, threads: int = 3) -> None:
        svc = kube.get("Service", model, namespace)["spec"]
        port = next(p["port"] for p in svc["ports"] if p.get("name") == "http")
        self.url = f"http://{svc['clusterIP']}:{port}/v2/models/{model}/infer"
        self.failed = self.answered = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._send, daemon=True) for _ in range(threads)]

    def _send(self) -> None:
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [-1, -1, -1, -1]},
                           {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}
        while not self._stop.is_set():
            code = post(self.url, body, timeout=10)
            with self._lock:
                self.failed += code != 200
                self.answered += code == 200

    def __enter__(self) -> BadClients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)
