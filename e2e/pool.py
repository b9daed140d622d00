"""Pools as the e2e tests see them (issue 29): the documents of a TritonPool and of its models (`pool_doc`,
`pooled_add_sub`, `pooled_ensemble`: every model answers add-sub's request, so `e2e.load.ServiceLoad` loads any of
them), what a pool replica's Triton says (`served_digest`, asked at the pod's IP), and `PoolAudit`, which samples,
while a test changes a pool, that no pooled model's EndpointSlice lists a replica as ready where Triton does not have
that model (and every step of its ensemble) READY at the desired config digest.
"""

from __future__ import annotations

import errno
import http.client
import json
import threading
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import urllib3

from e2e.inplace import ADD_SUB_PY
from e2e.kube import ApiError, Kube, wait_for
from e2e.load import ServiceLoad, Tally
from e2e.testing import is_ready
from tests.timing import scaled
from triton_operator.api.pod import DIGEST_PARAMETER
from triton_operator.api.pool import LABEL_POOL
from triton_operator.api.v1alpha1 import GROUP, VERSION

API_VERSION = f"{GROUP}/{VERSION}"
LABEL_SERVICE_NAME = "kubernetes.io/service-name"

#: A step that hands its input on: the second step of `pooled_ensemble`.
COPY_PY = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())]) for r in requests]
'''

_VECTOR = {"dataType": "FP32", "dims": [4]}


# -- documents ----------------------------------------------------------------------------------


def pool_doc(name: str, replicas: int, memory_per_replica: str) -> dict:
    """A CPU pool whose replicas spread over the nodes (at most one more on a node than on another), with a small
    tritonserver: the CPU these tests may take is two cores for everything."""
    return {"apiVersion": API_VERSION, "kind": "TritonPool", "metadata": {"name": name},
            "spec": {"replicas": replicas, "capacity": {"memoryPerReplica": memory_per_replica},
                     "server": {"resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                              "limits": {"memory": "3Gi"}},
                                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                               "whenUnsatisfiable": "DoNotSchedule"}]}}}


def pooled_add_sub(name: str, pool: str, copies: int = 1, memory: str = "64Mi", init_seconds: float = 0.0) -> dict:
    """add-sub (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1) on `pool`, one CPU instance; its initialize
    sleeps `init_seconds` (`parameters.initSeconds`: changing it is a config-only update, a new digest)."""
    return {"apiVersion": API_VERSION, "kind": "TritonModel", "metadata": {"name": name},
            "spec": {"pool": pool, "memory": memory, "replicas": copies, "backend": "python", "maxBatchSize": 8,
                     "inputs": [{"name": "INPUT0", **_VECTOR}, {"name": "INPUT1", **_VECTOR}],
                     "outputs": [{"name": "OUTPUT0", **_VECTOR}, {"name": "OUTPUT1", **_VECTOR}],
                     "instanceGroups": [{"kind": "CPU", "count": 1}],
                     "parameters": {"initSeconds": str(init_seconds)},
                     "source": {"inline": {"model.py": ADD_SUB_PY}}}}


def pooled_ensemble(name: str, pool: str, copies: int = 1, memory: str = "64Mi") -> list[dict]:
    """An ensemble `name` answering as add-sub does (OUTPUT0 = INPUT0 + INPUT1) through two pooled steps,
    `<name>-sum` (add-sub) then `<name>-copy` (hands OUTPUT0 on), both with no copies of their own: the steps first,
    the ensemble last."""
    step_sum = pooled_add_sub(f"{name}-sum", pool, 0, memory)
    step_copy = {"apiVersion": API_VERSION, "kind": "TritonModel", "metadata": {"name": f"{name}-copy"},
                 "spec": {"pool": pool, "memory": memory, "replicas": 0, "backend": "python", "maxBatchSize": 8,
                          "inputs": [{"name": "INPUT", **_VECTOR}], "outputs": [{"name": "OUTPUT", **_VECTOR}],
                          "instanceGroups": [{"kind": "CPU", "count": 1}],
                          "source": {"inline": {"model.py": COPY_PY}}}}
    ensemble = {"apiVersion": API_VERSION, "kind": "TritonModel", "metadata": {"name": name},
                "spec": {"pool": pool, "replicas": copies, "platform": "ensemble", "maxBatchSize": 8,
                         "inputs": [{"name": "INPUT0", **_VECTOR}, {"name": "INPUT1", **_VECTOR}],
                         "outputs": [{"name": "OUTPUT0", **_VECTOR}],
                         "ensemble": {"steps": [
                             {"model": f"{name}-sum", "inputMap": {"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
                              "outputMap": {"OUTPUT0": "summed"}},
                             {"model": f"{name}-copy", "inputMap": {"INPUT": "summed"},
                              "outputMap": {"OUTPUT": "OUTPUT0"}}]}}}
    return [step_sum, step_copy, ensemble]


# -- what the API says --------------------------------------------------------------------------


def pooled_models(kube: Kube, namespace: str) -> dict[str, dict]:
    """name -> TritonModel, of the namespace's pooled models."""
    return {tm["metadata"]["name"]: tm for tm in kube.items("TritonModel", namespace) if (tm.get("spec") or {}).get("pool")}


def model_slices(kube: Kube, namespace: str) -> list[dict]:
    """Every EndpointSlice of the namespace that belongs to a Service (whoever manages it: kube-proxy takes the union
    of a Service's slices, so a slice the operator did not write would carry traffic all the same)."""
    return [s for s in kube.items("EndpointSlice", namespace) if LABEL_SERVICE_NAME in (s["metadata"].get("labels") or {})]


def pool_pods(kube: Kube, namespace: str) -> dict[str, dict]:
    """name -> Pod, of every pool replica of the namespace."""
    return {p["metadata"]["name"]: p for p in kube.items("Pod", namespace, label_selector=LABEL_POOL)}


def replica_pods(kube: Kube, namespace: str, pool: str) -> list[dict]:
    """The pool's live replicas (not terminating)."""
    return [p for p in kube.items("Pod", namespace, label_selector={LABEL_POOL: pool})
            if not p["metadata"].get("deletionTimestamp")]


def placement(tm: dict) -> list[str]:
    return list((tm.get("status") or {}).get("placement") or ())


def triton_name(tm: dict) -> str:
    return str(tm["spec"].get("modelName") or tm["metadata"]["name"])


def closure(name: str, models: dict[str, dict]) -> list[str]:
    """`name` and every model its ensemble reaches, by TritonModel name (a step not found is listed all the same:
    Triton cannot have it READY, so an endpoint that needs it is judged so)."""
    out: list[str] = []
    todo = [name]
    while todo:
        n = todo.pop()
        if n in out:
            continue
        out.append(n)
        todo += [s["model"] for s in (((models.get(n) or {}).get("spec") or {}).get("ensemble") or {}).get("steps", ())]
    return out


def listed(endpoint: dict) -> bool:
    """Whether kube-proxy may send a new connection to the endpoint: ready (unset reads as ready), or serving (while
    it is terminating, kube-proxy falls back to serving endpoints when a Service has no ready one)."""
    cond = endpoint.get("conditions") or {}
    return bool(cond.get("ready", True) or cond.get("serving"))


# -- what a replica's Triton says ---------------------------------------------------------------


class Unanswered(Exception):
    """Triton's answer did not come (a timeout on a loaded machine): proves nothing either way."""


def _get(ip: str, path: str) -> tuple[int, bytes] | None:
    """(status, body) of a GET to the replica's HTTP port on a new connection; None when nothing listens there."""
    conn = http.client.HTTPConnection(ip, 8000, timeout=3)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (ConnectionRefusedError, ConnectionResetError):
        return None  # nothing listens: its tritonserver is not running
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return None  # the pod's address is gone
        raise Unanswered(f"GET http://{ip}:8000{path}: {e!r}") from e  # a timeout, on a loaded machine
    finally:
        conn.close()


def served_digest(ip: str, model: str) -> str | None:
    """The digest parameter of the config Triton at `ip` has READY for `model` ("" for a READY model without one);
    None when it has no READY copy or does not answer at all (its tritonserver is not running)."""
    ready = _get(ip, f"/v2/models/{model}/ready")
    if ready is None or ready[0] != 200:
        return None
    config = _get(ip, f"/v2/models/{model}/config")
    if config is None or config[0] != 200:
        return None
    params = json.loads(config[1]).get("parameters") or {}
    return str((params.get(DIGEST_PARAMETER) or {}).get("string_value", ""))


def ready_on(ip: str, models: Iterable[str]) -> list[str]:
    """Those of `models` (Triton names) that Triton at `ip` has READY."""
    return [m for m in models if served_digest(ip, m) is not None]


def wait_placed_everywhere(kube: Kube, namespace: str, names: Iterable[str], timeout: float) -> dict[str, dict]:
    """Waits until each model is Ready=True for its generation with every copy at the desired digest (reason
    AllCopiesWarmed, not CopiesUpdating); returns them all."""
    names = list(names)

    def probe() -> dict[str, dict] | None:
        models = pooled_models(kube, namespace)
        pending = [n for n in names if not model_ready(models.get(n)) or next(
            c for c in models[n]["status"]["conditions"] if c["type"] == "Ready").get("reason") != "AllCopiesWarmed"]
        return None if pending else models
    return wait_for(f"pooled models {sorted(names)} Ready, every copy at the desired digest", probe, timeout, 0.5)


def model_ready(tm: dict | None) -> bool:
    if tm is None:
        return False
    c = next((c for c in (tm.get("status") or {}).get("conditions") or () if c["type"] == "Ready"), {})
    gen = tm["metadata"]["generation"]
    return c.get("status") == "True" and c.get("observedGeneration") == gen and tm["status"].get("observedGeneration") == gen


# -- the audit ----------------------------------------------------------------------------------


class PoolAudit:
    """Samples, until stopped: every endpoint that a pooled model's EndpointSlices list for traffic (`listed`) must be
    a pool replica where Triton, asked at the endpoint's address, has the model and every step of its ensemble READY
    at an accepted config digest: the one its TritonModel's status names (`configDigest`), or the one it named before
    (during an in-place Swap the replica serves the previous config until the new one is READY). The model's status
    is read again before a digest is judged wrong (the operator may have loaded the new config a moment before it
    wrote the new digest).

    An endpoint newly listed must be serving at once: no lag is allowed on the way in. On the way out, a replica that
    stops serving under an endpoint that stayed listed (its tritonserver killed, its pod going) is allowed `LAG`
    seconds after it was last seen serving there, or until `LAG` seconds after its pod was first seen not Ready
    (whichever is later): the kubelet must see the container gone, and then the operator write the slice. Each such
    case is kept in `lagged`.

    A sample that meets a `TRANSIENT` error is dropped and counted; any other exception stops the audit, and leaving
    the `with` block fails with its traceback. Leaving it also fails unless `min_samples` samples judged a listed
    endpoint. `changes[model]` is every distinct set of listed pods the samples saw, in order (with seconds since
    the start)."""

    LAG = 3.0
    TRANSIENT = (ApiError, urllib3.exceptions.HTTPError, Unanswered)
    INTERVAL = 0.3

    def __init__(self, kube: Kube, namespace: str, *, min_samples: int) -> None:
        self.kube, self.namespace, self.min_samples = kube, namespace, min_samples
        self.samples = 0
        self.judged = 0  # samples that judged at least one listed endpoint
        self.endpoints_judged = 0
        self.violations: list[str] = []
        self.lagged: list[str] = []
        self.errors: list[str] = []
        self.failure: str | None = None
        self.changes: dict[str, list[tuple[float, frozenset[str]]]] = {}
        self._digests: dict[str, list[str]] = {}  # model -> its distinct status.configDigest values, in order
        self._serving_at: dict[tuple[str, str], float] = {}  # (model, pod) -> when last judged serving while listed
        self._not_ready_since: dict[str, float] = {}  # pod -> when first seen not Ready
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pool-audit", daemon=True)
        self._start = time.monotonic()

    def __enter__(self) -> PoolAudit:
        self._start = time.monotonic()
        self._thread.start()
        wait_for("the pool audit's first samples", lambda: self.samples >= 2 or self.errors or self.failure, 30)
        assert self.failure is None, f"the pool audit stopped on an exception it cannot classify:\n{self.failure}"
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop()
        if exc_type is not None:
            return  # the test's own failure is the one to read
        self.check()

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(30)

    def check(self) -> None:
        assert self.failure is None, f"the pool audit stopped on an exception it cannot classify:\n{self.failure}"
        assert not self.violations, (f"{len(self.violations)} endpoint(s) listed where the model was not READY at "
                                     f"the desired digest: {self.violations[:10]}")
        assert self.judged >= self.min_samples, (
            f"the pool audit judged listed endpoints in {self.judged} samples, fewer than the {self.min_samples} this "
            f"scenario produces ({self.samples} samples in all; errors: {self.errors[:5]})")

    def summary(self) -> str:
        return (f"{self.samples} samples, {self.judged} judging {self.endpoints_judged} listed endpoints, "
                f"{len(self.violations)} violations, {len(self.lagged)} lagging exits, {len(self.errors)} transient "
                "errors")

    def _run(self) -> None:
        while not self._halt.wait(self.INTERVAL):
            try:
                self.sample()
            except self.TRANSIENT as e:  # the API server busy for a moment, a replica answering too late
                self.errors.append(repr(e))
            except Exception:  # noqa: BLE001 - not the audit's to judge: stop, and fail the test that runs it
                self.failure = traceback.format_exc()
                return

    def _accepted(self, name: str, models: dict[str, dict]) -> set[str]:
        digest = ((models.get(name) or {}).get("status") or {}).get("configDigest")
        seen = self._digests.setdefault(name, [])
        if digest and (not seen or seen[-1] != digest):
            seen.append(digest)
        return set(seen[-2:])

    def sample(self) -> None:
        """One sample: read the models, their slices and the pool's pods, then ask Triton about every listed
        endpoint."""
        models = pooled_models(self.kube, self.namespace)
        slices = model_slices(self.kube, self.namespace)
        pods = pool_pods(self.kube, self.namespace)
        now = time.monotonic()
        for name, pod in pods.items():
            if is_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
                self._not_ready_since.pop(name, None)
            else:
                self._not_ready_since.setdefault(name, now)
        current: dict[str, dict[str, str]] = {}  # model -> listed pod -> address
        for s in slices:
            model = s["metadata"]["labels"][LABEL_SERVICE_NAME]
            if model not in models:
                continue
            for ep in s.get("endpoints") or ():
                if listed(ep):
                    pod = (ep.get("targetRef") or {}).get("name") or "?"
                    for address in ep.get("addresses") or ():
                        current.setdefault(model, {})[pod] = address
        for name in models:
            pods_listed = frozenset(current.get(name, {}))
            history = self.changes.setdefault(name, [])
            if not history or history[-1][1] != pods_listed:
                history.append((now - self._start, pods_listed))
        answers: dict[tuple[str, str], str | None] = {}
        judged = 0
        for name, listed_pods in sorted(current.items()):
            for pod, address in sorted(listed_pods.items()):
                judged += 1
                self._judge(name, pod, address, models, pods, answers, now)
        for key in [k for k in self._serving_at if k[1] not in current.get(k[0], {})]:
            del self._serving_at[key]  # out of the slice: back in only by serving at once
        self.samples += 1
        self.judged += bool(judged)
        self.endpoints_judged += judged

    def _judge(self, name: str, pod: str, address: str, models: dict[str, dict], pods: dict[str, dict],
               answers: dict[tuple[str, str], str | None], now: float) -> None:
        wrong = []
        for step in closure(name, models):
            tm = models.get(step)
            if tm is None:
                wrong.append(f"{step}: no such pooled TritonModel")
                continue
            key = (address, triton_name(tm))
            if key not in answers:
                answers[key] = served_digest(address, triton_name(tm))
            accepted = self._accepted(step, models)
            if answers[key] not in accepted:
                fresh = self.kube.get_or_none("TritonModel", step, self.namespace)  # its status may have just moved
                accepted = self._accepted(step, {step: fresh} if fresh else {})
            if answers[key] not in accepted:
                wrong.append(f"{step} READY at {answers[key]}, accepted {sorted(accepted)}")
        at = f"+{now - self._start:.1f}s {name} on {pod} ({address})"
        if not wrong:
            self._serving_at[(name, pod)] = now
            return
        since = self._serving_at.get((name, pod))
        p = pods.get(pod)
        pod_state = "gone" if p is None else ("Ready" if is_ready(p) else "not Ready") + (
            ", terminating" if p["metadata"].get("deletionTimestamp") else "")
        not_ready = self._not_ready_since.get(pod)
        if since is not None and (now - since <= self.LAG or (not_ready is not None and now - not_ready <= self.LAG)):
            self.lagged.append(f"{at}: still listed {now - since:.1f}s after it last served there (pod "
                               f"{pod_state}): {'; '.join(wrong)}")
            return
        why = "newly listed" if since is None else f"listed {now - since:.1f}s after it last served there"
        self.violations.append(f"{at}: {why} (pod {pod_state}): {'; '.join(wrong)}")


def status_figures(pool: dict) -> dict[str, Any]:
    """The pool's status figures a test reads: used and free per replica (bytes), models per replica."""
    st = pool.get("status") or {}
    return {r["pod"]: {"models": sorted(r.get("models") or ()), "used": r.get("used"), "free": r.get("free")}
            for r in st.get("replicaModels") or ()}


# -- load through every model's Service ---------------------------------------------------------


class PoolLoads:
    """A `ServiceLoad` per pooled model, each through its Service's ClusterIP (kube-proxy picks the replica), started
    once the model can be reached: its slice lists a ready endpoint and one request through the ClusterIP was answered
    (until kube-proxy's next rule sync, at most a second or so, the ClusterIP refuses: that is before the model's
    first endpoint, not a failure). A request of that first probe that reached a replica and was not answered
    correctly is a failure (`probe_failures`).

    Light on purpose (one thread, `RATE` requests a second per model, the slices re-read every second): twenty of
    these run beside the pool on two cores."""

    RATE = 4.0

    def __init__(self, kubeconfig: Path, kube: Kube, namespace: str) -> None:
        self.kubeconfig, self.kube, self.namespace = kubeconfig, kube, namespace
        self.loads: dict[str, ServiceLoad] = {}
        self.stopped: dict[str, Tally] = {}
        self.probe_failures: list[str] = []
        self.start_errors: dict[str, str] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._starters: list[threading.Thread] = []

    def __enter__(self) -> PoolLoads:
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        for load in self.loads.values():
            load._halt.set()  # a test that failed midway: stop sending

    def start_when_serving(self, names: Iterable[str], timeout: float = 300.0) -> None:
        for name in names:
            t = threading.Thread(target=self._start_one, args=(name, timeout), name=f"start-{name}", daemon=True)
            t.start()
            self._starters.append(t)

    def wait_started(self, timeout: float) -> None:
        for t in self._starters:
            t.join(timeout)
        assert not self.start_errors, f"loads that could not start: {self.start_errors}"
        assert not any(t.is_alive() for t in self._starters), "load starters still waiting"

    def _start_one(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + scaled(timeout)
        try:
            while not any(listed(ep) and (ep.get("conditions") or {}).get("ready", True)
                          for s in self.kube.items("EndpointSlice", self.namespace,
                                                   label_selector={LABEL_SERVICE_NAME: name})
                          for ep in s.get("endpoints") or ()):
                if self._halt.wait(0.5) or time.monotonic() > deadline:
                    raise TimeoutError(f"no ready endpoint for {name} in {scaled(timeout):.0f}s")
            ip = self.kube.get("Service", name, self.namespace)["spec"]["clusterIP"]
            while True:
                answer = infer_over_http(ip, name)
                if answer == "":
                    break
                if not answer.startswith("refused"):
                    with self._lock:
                        self.probe_failures.append(f"{name} via {ip}: {answer}")
                if self._halt.wait(0.2) or time.monotonic() > deadline:
                    raise TimeoutError(f"{name}'s ClusterIP {ip} did not answer in {timeout:.0f}s: {answer}")
            load = ServiceLoad(self.kubeconfig, self.namespace, name, name, threads=1, rate=self.RATE, refresh=1.0)
            with self._lock:
                self.loads[name] = load.start()
        except Exception as e:  # noqa: BLE001 - said by wait_started, in the test's thread
            self.start_errors[name] = repr(e)

    def stop(self, name: str) -> Tally:
        tally = self.loads[name].stop()
        self.stopped[name] = tally
        return tally

    def stop_all(self) -> dict[str, Tally]:
        for name in list(self.loads):
            if name not in self.stopped:
                self.stop(name)
        return dict(self.stopped)

    def failures(self) -> dict[str, list[str]]:
        """model -> samples of its failed requests (with the endpoint history its load saw), for the failed ones."""
        return {name: [*load.samples, *load.endpoint_history[-6:]] for name, load in self.loads.items()
                if load.tally().failed}


def infer_over_http(ip: str, model: str) -> str:
    """One add-sub request to `ip`:8000 on a new connection: "" when answered correctly, "refused: ..." when no
    connection was made (the ClusterIP before kube-proxy's sync), else what went wrong."""
    a, b = [1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": a},
                                  {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": b}],
                       "outputs": [{"name": "OUTPUT0"}]})
    conn = http.client.HTTPConnection(ip, 8000, timeout=10)
    try:
        conn.connect()
    except OSError as e:
        conn.close()
        return f"refused: {e!r}"
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    if resp.status != 200:
        return f"HTTP {resp.status}: {data[:200].decode(errors='replace')}"
    out = next(o for o in json.loads(data)["outputs"] if o["name"] == "OUTPUT0")["data"]
    return "" if out == [11.0, 22.0, 33.0, 44.0] else f"wrong answer {out}"
