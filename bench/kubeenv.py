"""The benchmarks' own Kubernetes: a LocalCluster under /tmp with one real node, and operator processes.

Never the shared `.cluster/` of the repository: other people's e2e sessions run there, and a second
operator on one cluster would fight theirs. The cluster is `e2e.cluster.LocalCluster` with another
root (its own ports, certificates and etcd) plus the API server's audit log, so every request can be
attributed to the client that sent it (by user agent). Also owns scraping Prometheus text (the API
server's and the operator's /metrics) and reading a process's peak RSS.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from e2e.cluster import LocalCluster, Ports, free_port, pid_alive
from e2e.images import TRITON_REF
from e2e.kube import RESOURCES, Kube, condition, wait_for
from e2e.testing import metric_samples
from triton_operator.api import kinds
from triton_operator.api.timestamps import parse_rfc3339
from triton_operator.api.v1alpha1 import GROUP

from .common import REPO, log

ROOT = Path(os.environ.get("BENCH_CLUSTER_ROOT", "/tmp/bench-cluster"))
CRD = REPO / "crds" / "tritonmodels.yaml"
POOL_CRD = REPO / "crds" / "tritonpools.yaml"
KUBECTL = Path(sys.executable).parent / "kubectl"
OPERATOR = Path(sys.executable).parent / "triton-operator"
NODE = "bench-node-1"

# The e2e client speaks plain paths per kind; teach it the kinds the operator reads and writes (all namespaced).
for _kind in kinds.ALL:
    RESOURCES.setdefault(_kind.kind, (_kind.prefix, _kind.plural, True))

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
"""


class BenchCluster(LocalCluster):
    """A LocalCluster whose API server also writes an audit log (metadata only: who, verb, resource)."""

    def __init__(self, root: Path = ROOT) -> None:
        # One real node (containerd + kubelet + the fake-GPU plugin); no kube-proxy: the benches dial pods
        # directly, and an e2e session on the same machine may own the host's kube-proxy rules.
        super().__init__(root, nodes=(NODE,), gpus=16, kube_proxy=False)
        self.audit_log = self.logs / "audit.log"

    def _apiserver_args(self, ports: Ports) -> list[str]:
        policy = self.dir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        return [*super()._apiserver_args(ports), f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}", "--audit-log-format=json", "--audit-log-mode=batch",
                "--audit-log-maxsize=0"]

    def fresh(self) -> Path:
        """A control plane with an empty etcd (down first if one runs), and the TritonModel CRD installed."""
        self.down(quiet=True)
        self.audit_log.unlink(missing_ok=True)
        kubeconfig = self.up()
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CRD))
        kube = Kube(kubeconfig)
        wait_for("CRD Established", lambda: _established(kube), 60)
        return kubeconfig

    # -- the node -----------------------------------------------------------------------------------

    def start_agent(self) -> None:
        """The node is part of `up`: waits until it is Ready (kept for the benches' own vocabulary)."""
        kube = Kube(self.kubeconfig)
        wait_for(f"node {NODE} Ready", lambda: _node_ready(kube), 90)

    def container_pid(self, pod: dict, container: str) -> int:
        return self.node(pod["spec"]["nodeName"]).container_pid(pod, container)


def _established(kube: Kube) -> bool:
    crd = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/tritonmodels.{GROUP}")
    c = condition(crd, "Established")
    return bool(c and c["status"] == "True")


def _node_ready(kube: Kube) -> bool:
    node = kube.get_or_none("Node", NODE)
    c = condition(node or {}, "Ready")
    return bool(c and c["status"] == "True")


def kubectl(kubeconfig: Path, *args: str) -> str:
    out = subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args],
                         capture_output=True, text=True, check=True, timeout=120)
    return out.stdout


def own_netns() -> bool:
    """This process runs in a network namespace of its own (not the host's, where kube-proxy's chains are shared)."""
    try:
        return os.readlink("/proc/self/ns/net") != os.readlink("/proc/1/ns/net")
    except OSError:  # in e2e/netns-python's namespace, /proc/1/ns is not ours to read: ask which interfaces we see
        try:
            lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
        except OSError:
            return False
        return {ln.split(":", 1)[0].strip() for ln in lines} == {"lo"}


@dataclass
class PoolBench:
    """What a pool benchmark runs against (`pool_bench`)."""

    cluster: BenchCluster
    kubeconfig: Path
    kube: Kube
    op: OperatorProcess


@contextlib.contextmanager
def pool_bench(cluster: BenchCluster, namespace: str, log_name: str,
               program: list[str] | None = None) -> Iterator[PoolBench]:
    """The pool benchmarks' start: a fresh control plane with both CRDs (`BenchCluster.fresh`, then the TritonPool
    CRD until served), the node Ready, the namespace with its default ServiceAccount, and our operator (its log
    `cluster.logs / log_name`; `program`: `OperatorProcess.ours`). At the end, however it ends: the operator stopped
    and the cluster down (which flushes the audit log: read it after the block)."""
    kubeconfig = cluster.fresh()
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(POOL_CRD))
    op: OperatorProcess | None = None
    try:
        cluster.start_agent()
        kube = Kube(kubeconfig)
        wait_for("TritonPool CRD served", lambda: kube.request(
            "GET", f"/apis/{GROUP}/v1alpha1/tritonpools"), 60)
        ensure_namespace(kube, namespace)
        op = OperatorProcess.ours(kubeconfig, cluster.logs / log_name, program=program).start()
        yield PoolBench(cluster, kubeconfig, kube, op)
    finally:
        if op is not None:
            op.stop()
        cluster.down(quiet=True)


def ensure_namespace(kube: Kube, name: str) -> None:
    if kube.get_or_none("Namespace", name) is None:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(f"default ServiceAccount in {name}", lambda: kube.get_or_none("ServiceAccount", "default", name), 60)


# -- Prometheus text -------------------------------------------------------------------------------


def apiserver_requests(kube: Kube) -> Counter[str]:
    """`apiserver_request_total` summed by "VERB resource[/subresource]" (all clients)."""
    text = kube.request("GET", "/metrics", timeout=30)
    out: Counter[str] = Counter()
    for labels, value in metric_samples(text, "apiserver_request_total").items():
        d = dict(labels)
        res = d.get("resource", "") + (f"/{d['subresource']}" if d.get("subresource") else "")
        out[f"{d.get('verb', '?')} {res}"] += value
    return out


def delta(after: Counter[str], before: Counter[str]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0) > 0}


def audit_requests(path: Path, since: float, until: float, agent_prefix: str | None = None) -> dict[str, Counter[str]]:
    """Requests in the audit log between two wall-clock times, by user agent then "VERB resource[/sub]".

    Only the ResponseComplete (or Panic) stage is logged, so each request is one line; a watch is
    logged when it ends. `agent_prefix` keeps only user agents starting with it.
    """
    out: dict[str, Counter[str]] = {}
    if not path.exists():
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            try:
                received = parse_rfc3339(ev.get("requestReceivedTimestamp"))  # microseconds
            except ValueError:
                continue
            if received is None:
                continue
            t = received.timestamp()
            if not since <= t <= until:
                continue
            agent = (ev.get("userAgent") or "?").split(" ")[0]
            if agent_prefix and not agent.startswith(agent_prefix):
                continue
            ref = ev.get("objectRef") or {}
            res = ref.get("resource", ev.get("requestURI", "?").split("?")[0]) + (
                f"/{ref['subresource']}" if ref.get("subresource") else "")
            out.setdefault(agent, Counter())[f"{ev.get('verb', '?')} {res}"] += 1
    return out


WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection", "POST", "PUT", "PATCH", "DELETE")


def writes_of(requests: dict[str, float] | Counter[str]) -> float:
    return sum(v for k, v in requests.items() if k.split(" ")[0] in WRITE_VERBS)


# -- processes -----------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM / VmPeak (kB) of a live process."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "VmPeak"):
                out[key] = int(value.split()[0])
    return out


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a live process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    return {name: t for name, pid in pids.items() if (t := cpu_seconds(pid)) is not None}


def cpu_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 2) for k in after}


@dataclass
class OperatorProcess:
    """One operator subprocess with its metrics and liveness endpoints on free loopback ports."""

    argv: list[str]
    log_path: Path
    metrics_port: int | None = None
    liveness_url: str | None = None
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def ours(cls, kubeconfig: Path, log_path: Path, *extra: str, program: list[str] | None = None) -> OperatorProcess:
        """`triton-operator run` (or `program run`: the same CLI another way, bench/pool_trace.py) on our cluster."""
        metrics, live = free_port(), free_port()
        url = f"http://127.0.0.1:{live}/healthz"
        argv = [*(program or [str(OPERATOR)]), "run", "--kubeconfig", str(kubeconfig), "--metrics-port", str(metrics),
                "--metrics-address", "127.0.0.1", "--liveness", url, "--default-triton-image", TRITON_REF, *extra]
        return cls(argv, log_path, metrics, url)

    def start(self) -> OperatorProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as logf:
            self.process = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True,
                                            env={**os.environ, **self.env})
        if self.liveness_url:
            wait_for("the operator's liveness endpoint", lambda: self._alive_and(self._live), 60, 0.1)
        log(f"Started operator pid={self.pid} log={self.log_path}")
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _alive_and(self, check: Callable[[], bool]) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"operator exited with {self.process.returncode}; log {self.log_path}:\n"
                               + self.log_path.read_text(errors="replace")[-3000:])
        return check()

    def _live(self) -> bool:
        try:
            with urllib.request.urlopen(self.liveness_url, timeout=2) as resp:  # noqa: S310 - 127.0.0.1
                return resp.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            return resp.read().decode()

    def writes(self) -> dict[str, float]:
        """`triton_operator_api_writes_total` by "kind/verb"."""
        return {f"{dict(k)['kind']}/{dict(k)['verb']}": v
                for k, v in metric_samples(self.metrics(), "triton_operator_api_writes_total").items()}

    def memory(self) -> dict[str, int]:
        return proc_status(self.pid)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def others_operators() -> list[str]:
    out = subprocess.run(["pgrep", "-af", "triton-operator run"], capture_output=True, text=True, check=False)
    return [ln for ln in out.stdout.splitlines() if "pgrep" not in ln]


@contextlib.contextmanager
def running(op: OperatorProcess) -> Iterator[OperatorProcess]:
    op.start()
    try:
        yield op
    finally:
        op.stop()


def watch_forever(kube: Kube, kind: str, namespace: str, on_event: Callable[[str, dict[str, Any], float], None],
                  stop: Callable[[], bool], resource_version: str | None = None) -> None:
    """Calls `on_event(type, object, received_at)` for every watch event until `stop()`; re-watches on expiry."""
    rv = resource_version
    while not stop():
        try:
            if rv is None:
                rv = kube.list(kind, namespace)["metadata"]["resourceVersion"]
            for ev in kube.watch(kind, namespace, resource_version=rv, timeout_seconds=30):
                now = time.time()
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    rv = None
                    break
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if ev.get("type") != "BOOKMARK":
                    on_event(ev["type"], obj, now)
                if stop():
                    return
        except Exception:  # noqa: BLE001 - a dropped watch is re-established from the last resourceVersion
            if stop():
                return
            time.sleep(0.2)


class BackgroundWatch:
    """A watch of one kind in one namespace on a daemon thread, while the `with` block runs: `_on_event(type,
    object, received_at)` gets every event (`watch_forever`)."""

    kind = ""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=watch_forever, daemon=True, args=(
            Kube(kube.kubeconfig), self.kind, namespace, self._on_event, self._stop.is_set))

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _on_event(self, typ: str, obj: dict[str, Any], t: float) -> None:
        raise NotImplementedError


def pid_of(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def create_all(kube: Kube, docs: list[dict[str, Any]]) -> dict[str, float]:
    """Creates `docs` (8 at a time); when the API server answered each create, by name (time.time())."""
    created: dict[str, float] = {}

    def create(doc: dict[str, Any]) -> None:
        kube.create(doc)
        created[doc["metadata"]["name"]] = time.time()

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(create, docs))
    return created


def delete_all(kube: Kube, kind: str, names: list[str], namespace: str) -> None:
    """Deletes the `kind` objects `names` of `namespace`, 8 at a time."""
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda n: kube.delete(kind, n, namespace), names))
