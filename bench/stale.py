"""Benchmark `stale`: requests answered by the old config after an in-place config change has "completed".

On our own cluster (control plane, one real node with containerd + kubelet, the operator as a host process), in one
run, the same config-only change on two replicas of a model whose answers name the config that gave them: add-sub
(e2e/inplace.py's reloadable one) whose OUTPUT0 is INPUT0 + INPUT1 + `parameters.generation`, changed from
generation 1 to 2.

- ours: a TritonModel, changed in place (spec.rollout Swap, the default) by `kubectl apply` of the new spec;
  "completed" is when its status says so as Argo CD and Flux read it: every condition's observedGeneration is the
  new metadata.generation, Ready=True and Progressing=False with reason RolloutComplete.
- the usual approach without a gate: the same tritonserver and files in a plain Deployment that mounts its
  repository from a ConfigMap, with `--model-control-mode=poll` and Triton's default `--repository-poll-secs` (a poll
  every 15 s in its log)
  and the readiness probe of Triton's charts (bench/peers.py); the change is `kubectl apply` of the ConfigMap, and
  "completed" is when `kubectl rollout status deployment/<name>` returns (at once: no pod changes). The kubelet
  writes the new files into the running pods later, and each Triton reloads on its next poll.

Load through the Service's ready endpoints (e2e.load.ServiceLoad, `via="endpoints"`: the bench cluster has no
kube-proxy) runs from before the change until no answer of the old config has come for QUIET seconds after
"completed" (at most CAP seconds). Each answer records when it came and which generation gave it: the figure is
the number of answers from generation 1 after "completed", and the time from "completed" to the last of them.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.inplace import reloadable
from e2e.kube import Kube, condition, wait_for
from e2e.load import ServiceLoad

from .common import CpuMeter, Result, Row, log, ms, write_result
from .kubeenv import KUBECTL
from .models import checked, replace_once
from .peers import TRITON_CHART, describe_all
from .pods import Env, plain_children, pod_cluster, tritonmodel

NAMESPACE = "bench-stale"
REPLICAS = 2
OLD, NEW = 1, 2
#: After "completed", the load runs until no old answer has come for this long (at most CAP seconds).
QUIET, CAP = 30.0, 240.0
POLL_MODE_SOURCE = (
    "Triton's docs, docs/user_guide/model_management.md, \"Model Control Mode POLL\" (tritonserver "
    "--model-control-mode=poll, --repository-poll-secs left at its default: the log of this bench's first run showed a "
    "poll every 15 s); a ConfigMap mounted as a volume is updated "
    "in running pods by the kubelet's periodic sync (Kubernetes docs, concepts/configuration/configmap, \"Mounted "
    "ConfigMaps are updated automatically\")")
TRITON_DOCS_POLL = "https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_management.md"
K8S_DOCS_CONFIGMAP = "https://kubernetes.io/docs/concepts/configuration/configmap/#mounted-configmaps-are-updated-automatically"


def generation_model(generation: int, replicas: int = REPLICAS) -> dict[str, Any]:
    """The reloadable add-sub whose OUTPUT0 adds `parameters.generation`: each answer names its config."""
    doc = reloadable(replicas, init_seconds=0.5)
    py = doc["spec"]["source"]["inline"]["model.py"]
    py = replace_once(py, "        time.sleep(", "        self.generation = float(params.get(\"generation\", "
                      "{}).get(\"string_value\", \"0\"))\n        time.sleep(")
    py = replace_once(py, 'pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32))',
                      'pb_utils.Tensor("OUTPUT0", (a + b + self.generation).astype(np.float32))')
    doc["spec"]["source"]["inline"]["model.py"] = py
    doc["spec"]["parameters"]["generation"] = str(generation)
    return doc


def generation_of(a: list[float], b: list[float], out: list[float]) -> int | None:
    """The generation that gave `out` for inputs `a`, `b` (every element must agree), else None."""
    diffs = {round(float(o) - x - y, 3) for o, x, y in zip(out, a, b, strict=True)}
    if len(diffs) != 1:
        return None
    g = diffs.pop()
    return int(g) if g == int(g) else None


@dataclass
class Stale:
    """What the answers after "completed" say: how many came from the old config, and the last one's lateness."""

    completed_at: float
    answers_after: int = 0
    old_after: int = 0
    last_old_after_s: float | None = None  # "completed" -> the last old answer
    first_new_s: float | None = None  # "completed" -> the first new answer (negative: before)
    all_new_s: float | None = None  # "completed" -> the last old answer or "completed", whichever is later
    by_address: dict[str, int] = field(default_factory=dict)  # old answers after "completed" per replica


def stale_answers(answers: list[tuple[float, str, int]], completed_at: float, old: int, new: int) -> Stale:
    """From (answered at, address, generation) per correct answer: the old config's answers after `completed_at`."""
    out = Stale(completed_at)
    for t, address, g in answers:
        if g == new and (out.first_new_s is None or t - completed_at < out.first_new_s):
            out.first_new_s = t - completed_at
        if t <= completed_at:
            continue
        out.answers_after += 1
        if g == old:
            out.old_after += 1
            out.by_address[address] = out.by_address.get(address, 0) + 1
            late = t - completed_at
            out.last_old_after_s = late if out.last_old_after_s is None else max(out.last_old_after_s, late)
    out.all_new_s = max(0.0, out.last_old_after_s or 0.0)
    return out


class GenerationLoad(ServiceLoad):
    """ServiceLoad whose answers may add any whole generation to INPUT0 + INPUT1; keeps (time, address, generation)
    per answer. An answer that names no whole generation is a failure."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers: list[tuple[float, str, int]] = []
        self._answers_lock = threading.Lock()

    def _infer(self, target: tuple[str, int], a: list[float], b: list[float]) -> str:
        import http.client

        body = json.dumps({"inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": a},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": b},
        ], "outputs": [{"name": "OUTPUT0"}]})
        conn = http.client.HTTPConnection(target[0], target[1], timeout=self.timeout)
        try:
            conn.request("POST", f"/v2/models/{self.model}/infer", body,
                         {"Content-Type": "application/json", "Connection": "close"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            return f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        at = time.time()
        if resp.status != 200:
            return f"HTTP {resp.status}: {data[:200].decode(errors='replace')}"
        try:
            out = next(o for o in json.loads(data)["outputs"] if o["name"] == "OUTPUT0")["data"]
        except (ValueError, KeyError, StopIteration) as e:
            return f"unreadable answer ({e!r}): {data[:200].decode(errors='replace')}"
        g = generation_of(a, b, out)
        if g is None:
            return f"answer {out} names no generation for inputs {a} + {b}"
        with self._answers_lock:
            self.answers.append((at, target[0], g))
        return ""

    def snapshot(self) -> list[tuple[float, str, int]]:
        with self._answers_lock:
            return list(self.answers)


def kstatus_done(tm: dict[str, Any]) -> bool:
    """The TritonModel's status says the change is done: every condition observed the current generation,
    Ready=True and Progressing=False/RolloutComplete (what Flux's kstatus and the chart's Argo CD check read)."""
    gen = tm["metadata"].get("generation")
    conds = (tm.get("status") or {}).get("conditions") or []
    if not conds or any(c.get("observedGeneration") != gen for c in conds):
        return False
    ready, progressing = condition(tm, "Ready") or {}, condition(tm, "Progressing") or {}
    return ready.get("status") == "True" and progressing.get("status") == "False" \
        and progressing.get("reason") == "RolloutComplete"


def kubectl(kube: Kube, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run([str(KUBECTL), "--kubeconfig", str(kube.kubeconfig), *args], input=stdin,
                         capture_output=True, text=True, check=True, timeout=300)
    return out.stdout


def poll_mode_children(generation: int, name: str, namespace: str) -> list[dict[str, Any]]:
    """ConfigMap + Deployment + Service of the usual approach: Triton reads the ConfigMap volume in poll mode."""
    objs = plain_children(checked(tritonmodel(generation_model(generation), name, namespace)), name, namespace,
                          TRITON_CHART.probes)
    for obj in objs:
        if obj["kind"] == "ConfigMap":
            obj.pop("immutable", None)  # the operator names each repository by its content; a user edits one
        if obj["kind"] == "Deployment":
            obj["spec"]["replicas"] = REPLICAS
            triton = next(c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == "tritonserver")
            args = [a for a in triton["args"] if not a.startswith(("--model-control-mode", "--load-model"))]
            triton["args"] = [*args, "--model-control-mode=poll"]
            mount_at_model_dir(obj["spec"]["template"]["spec"], triton, name)
    return objs


def mount_at_model_dir(pod: dict[str, Any], triton: dict[str, Any], model: str) -> None:
    """The ConfigMap volume mounted at the model's own directory (<repository>/<model>), its items relative to it.

    Mounted at the repository's root, the kubelet's `..data` link and `..<timestamp>` directory are directories
    there, and Triton in poll mode tries to load each as a model (and, with strict readiness, never turns ready:
    seen in this bench's first run). Inside the model's directory Triton only warns that they are no version
    numbers and ignores them."""
    volume = next(v for v in pod["volumes"] if v["name"] == "repository")
    prefix = f"{model}/"
    for item in volume["configMap"]["items"]:
        if not item["path"].startswith(prefix):
            raise ValueError(f"a repository file outside the model's directory: {item['path']}")
        item["path"] = item["path"][len(prefix):]
    mount = next(m for m in triton["volumeMounts"] if m["name"] == "repository")
    mount["mountPath"] = f"{mount['mountPath'].rstrip('/')}/{model}"


@dataclass
class Side:
    key: str
    completed_s: float = 0.0  # the change's start -> "completed"
    stale: Stale | None = None
    sent: int = 0
    failed: int = 0
    failure_samples: list[str] = field(default_factory=list)
    series: list[dict[str, Any]] = field(default_factory=list)
    generations: list[dict[str, Any]] = field(default_factory=list)  # per second from the change: old/new answers
    ready_history: list[str] = field(default_factory=list)


def per_second(answers: list[tuple[float, str, int]], start: float, end: float) -> list[dict[str, Any]]:
    """Answers per second from `start` to `end` (wall clock), by generation: the picture's series."""
    n = max(0, int(end - start) + 1)
    out = [{"t": i, "old": 0, "new": 0, "other": 0} for i in range(n)]
    for t, _, g in answers:
        i = int(t - start)
        if 0 <= i < n:
            out[i]["old" if g == OLD else "new" if g == NEW else "other"] += 1
    return out


def measure(env: Env, key: str, service: str, change: Any, done: Any) -> Side:
    """Load on `service`; `change()` starts the change, `done()` blocks until it counts as completed."""
    side = Side(key)
    with GenerationLoad(env.kube.kubeconfig, env.namespace, service, service, via="endpoints") as load:
        wait_for(f"{key}: the load answered by generation {OLD}",
                 lambda: sum(g == OLD for _, _, g in load.snapshot()) > 50, 60)
        m0 = time.monotonic()
        t0 = time.time()
        change()
        done()
        completed = time.time()
        side.completed_s = completed - t0
        log(f"{key}: the change counts as completed {side.completed_s:.2f}s after it began")

        def quiet() -> bool:
            now = time.time()
            last_old = max((t for t, _, g in load.snapshot() if g == OLD), default=0.0)
            return now - completed >= QUIET and now - max(last_old, completed) >= QUIET

        try:
            wait_for(f"{key}: no answer of generation {OLD} for {QUIET:.0f}s", quiet, CAP, 0.5)
        except TimeoutError as e:
            log(f"{key}: {e}")
        end = time.time()
        tally = load.stop()
        answers = load.snapshot()
    side.stale = stale_answers(answers, completed, OLD, NEW)
    side.sent, side.failed = tally.sent, tally.failed
    side.failure_samples = list(load.samples)
    side.series = load.series(m0, time.monotonic())
    side.generations = per_second(answers, t0, end)
    side.ready_history = load.ready_history
    log(f"{key}: {side.stale.old_after} answers of the old config after completed (last "
        f"{ms(side.stale.last_old_after_s)} after); {tally.summary()}")
    return side


def run() -> Path:
    started, meter = time.monotonic(), CpuMeter()
    with pod_cluster(NAMESPACE) as env:
        kube, ns = env.kube, env.namespace
        kube.create(tritonmodel(generation_model(OLD), "ours", ns, REPLICAS))
        plain = poll_mode_children(OLD, "plain", ns)
        for obj in plain:
            kube.create(obj)
        wait_for("ours Ready with its replicas warmed", lambda: kstatus_done(kube.get("TritonModel", "ours", ns))
                 and (kube.get("TritonModel", "ours", ns)["status"].get("warmedReplicas") == REPLICAS), 300, 0.5)
        kubectl(kube, "rollout", "status", "-n", ns, "deployment/plain", "--timeout=300s")

        def apply_ours() -> None:
            doc = tritonmodel(generation_model(NEW), "ours", ns, REPLICAS)
            kubectl(kube, "apply", "-f", "-", stdin=yaml.safe_dump(doc))

        def ours_done() -> None:
            wait_for("ours: status says the change is complete", lambda: kstatus_done(
                kube.get("TritonModel", "ours", ns)), 300, 0.05)

        ours = measure(env, "ours", "ours", apply_ours, ours_done)

        new_cm = next(o for o in poll_mode_children(NEW, "plain", ns) if o["kind"] == "ConfigMap")

        def apply_plain() -> None:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
                f.write(yaml.safe_dump(new_cm))
                f.flush()
                kubectl(kube, "apply", "-f", f.name)

        def plain_done() -> None:
            kubectl(kube, "rollout", "status", "-n", ns, "deployment/plain", "--timeout=300s")

        usual = measure(env, "usual", "plain", apply_plain, plain_done)
        triton_args = next(c for c in next(o for o in plain if o["kind"] == "Deployment")["spec"]["template"]["spec"]
                           ["containers"] if c["name"] == "tritonserver")["args"]
    return write_result(result(ours, usual, triton_args), started, meter)


def _cell(side: Side) -> str:
    st = side.stale
    assert st is not None
    return f"{st.old_after} of {st.answers_after}"


def _late(side: Side) -> str:
    st = side.stale
    assert st is not None
    return "- (none)" if st.last_old_after_s is None else f"{st.last_old_after_s:.1f} s"


def result(ours: Side, usual: Side, triton_args: list[str]) -> Result:
    res = Result(
        name="stale",
        title="Answers of the old config after an in-place change has completed",
        method=(
            "Our own cluster (control plane, one real node: containerd + kubelet running real tritonserver pods, the "
            f"operator as a host process). {REPLICAS} replicas of a model whose answers name their config: the "
            "reloadable add-sub of e2e/inplace.py, with OUTPUT0 = INPUT0 + INPUT1 + parameters.generation; the "
            f"change sets generation {OLD} -> {NEW} (config only). Ours: a TritonModel changed in place (spec.rollout "
            "Swap, the default) by `kubectl apply`; completed = its status as Argo CD and Flux read it (every "
            "condition's observedGeneration is the new metadata.generation, Ready=True, Progressing=False "
            "RolloutComplete), polled every 50 ms. Usual approach without a gate: the same tritonserver and files "
            "in a plain Deployment with the readiness probe of Triton's charts "
            f"({describe_all(TRITON_CHART)}; {TRITON_CHART.source}), its repository mounted from a ConfigMap and "
            f"Triton in poll mode as Triton documents it ({POLL_MODE_SOURCE}; {TRITON_DOCS_POLL}, "
            f"{K8S_DOCS_CONFIGMAP}); the ConfigMap is mounted at the model's directory (/models/plain), since at the "
            "repository's root Triton in poll mode tries to load the kubelet's `..data` entries as models and "
            "never turns ready; tritonserver args {' '.join(triton_args)}. Its change is `kubectl apply` of "
            "the ConfigMap, completed = `kubectl rollout status deployment/plain` returning (no pod changes, so at "
            "once). Load throughout: e2e.load.ServiceLoad, 4 threads x 40 requests/s, each to a ready endpoint of "
            "the Service's EndpointSlices re-read every 100 ms (the bench cluster has no kube-proxy), until no "
            f"answer of the old config has come for {QUIET:.0f} s after completed (at most {CAP:.0f} s). Counted: "
            "answers of the old generation that arrived after completed, and completed -> the last of them. The "
            "local kubelet runs with syncFrequency 10 s (e2e/node.py; the kubelet's default is 1 min), which "
            "bounds how late it writes a changed ConfigMap into a running pod: with the default the usual "
            "approach's window would be longer."),
    )
    o, u = ours.stale, usual.stale
    assert o is not None and u is not None
    res.rows = [
        Row("answers of the old config after the change counts as completed (of all answers after it)", _cell(ours),
            _cell(usual), "0", o.old_after == 0),
        Row("completed -> the last answer of the old config", _late(ours), _late(usual)),
        Row("change -> completed (ours: status; usual: kubectl rollout status)", f"{ours.completed_s:.1f} s",
            f"{usual.completed_s:.1f} s"),
        Row("completed -> first answer of the new config (negative: before)",
            "-" if o.first_new_s is None else f"{o.first_new_s:.1f} s",
            "-" if u.first_new_s is None else f"{u.first_new_s:.1f} s"),
        Row("requests failed / sent under load, from before the change to the end", f"{ours.failed} / {ours.sent}",
            f"{usual.failed} / {usual.sent}"),
    ]
    for side in (ours, usual):
        if side.failure_samples:
            res.notes.append(f"Failed-request samples ({side.key}): {side.failure_samples}")
    res.data = {"replicas": REPLICAS, "generations": [OLD, NEW], "quiet_seconds": QUIET, "cap_seconds": CAP,
                "sides": {s.key: {**s.__dict__, "stale": s.stale.__dict__ if s.stale else None}
                          for s in (ours, usual)}}
    return res
