"""The operator under test: the chart installed with `helm`, or `triton-operator run` as a host process.

Owns the session's operator (`ChartOperator`: `helm upgrade --install charts/triton-operator`, the
operator running in-cluster from the image built from our Dockerfile, under the chart's
ServiceAccount; shared by every test, each in its own `op-*` namespace), the host-process operator
(`OperatorHandle`, kept for tests that need their own control plane or a second operator), their
logs and metrics (`writes()` sums `triton_operator_api_writes_total`), `kubectl` and `helm` for
tests that act as a user would, and the TritonModel vocabulary tests are written in
(`model_condition`, `wait_model`, `load_examples`, `add_sub`, `apply`, `live_pods`, `rolled_out`,
`one_ready_pod`). Measurements tests take (latencies, counts) are
collected with `record()` and printed at the end of the session.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import functools
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import REPO_ROOT, free_port, session_root
from e2e.images import TRITON_REF
from e2e.kube import RESOURCES, ApiError, Kube, condition, wait_for
from e2e.testing import metric_samples, ready_addresses, ready_endpoints
from tests.timing import scaled
from triton_operator.api import kinds
from triton_operator.api.kinds import LABEL_MODEL
from triton_operator.api.pod import WARMED_CONDITION as WARMED
from triton_operator.api.v1alpha1 import GROUP, VERSION

ANNOTATION_DIGEST = f"{GROUP}/config-digest"
CRD = REPO_ROOT / "crds" / "tritonmodels.yaml"
#: The TritonPool CRD (issue 29): installed wherever the TritonModel CRD is, as the chart does (crds.enabled).
POOL_CRD = REPO_ROOT / "crds" / "tritonpools.yaml"
CRDS = (CRD, POOL_CRD)
EXAMPLES = REPO_ROOT / "examples"
KUBECTL = REPO_ROOT / ".venv" / "bin" / "kubectl"
OPERATOR = REPO_ROOT / ".venv" / "bin" / "triton-operator"
CHART = REPO_ROOT / "charts" / "triton-operator"
DRIFT_INTERVAL = 5.0
#: The session operator watches only namespaces named so (the `namespace` fixture of a test that uses
#: `operator`): on a shared cluster it leaves alone every other test's TritonModels and operators.
OPERATOR_NAMESPACE_PREFIX = "op-"
#: ... and its webhook reviews only namespaces labelled so (the same `namespace` fixture sets it).
SESSION_LABEL = ("e2e.triton-operator.io/operator", "session")
#: The session's release: `helm -n triton-system ... trop`.
RELEASE, RELEASE_NAMESPACE = "trop", "triton-system"

# The e2e client speaks plain paths per kind; teach it the kinds the operator reads and writes (all namespaced).
for _kind in kinds.ALL:
    RESOURCES.setdefault(_kind.kind, (_kind.prefix, _kind.plural, True))

#: name -> value, printed in the terminal summary (observed latencies and counts).
MEASUREMENTS: dict[str, Any] = {}


def record(name: str, value: Any) -> None:
    MEASUREMENTS[name] = value


# -- kubectl ---------------------------------------------------------------------------------


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(kubeconfig), *args],
        input=stdin, capture_output=True, text=True, timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def load_examples(name: str) -> list[dict]:
    """Every document of examples/<name>.yaml (TritonModels, and the Secrets or claims they need)."""
    return [d for d in yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()) if d]


def as_stream(docs: list[dict]) -> str:
    """Documents for `kubectl apply -f -`: JSON documents in a YAML stream.

    JSON, because kubectl reads YAML 1.1, where a bare `y` (a tensor name in the corpus) is a boolean;
    a stream, not a List, because kubectl validates a List on the client, never on the server.
    """
    return "\n---\n".join(json.dumps(d) for d in docs)


# -- the operator process --------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def helm_binary() -> str:
    """helm, built from its Go module by the toolchain script (cached by pins)."""
    proc = subprocess.run(["bash", str(REPO_ROOT / "e2e" / "toolchain" / "build.sh")],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=3600)
    assert proc.returncode == 0, f"e2e/toolchain/build.sh failed:\n{proc.stderr[-3000:]}"
    return str(Path(proc.stdout.strip().splitlines()[-1]) / "helm")


def helm(kubeconfig: Path, *args: str, timeout: float = 300) -> str:
    proc = subprocess.run([helm_binary(), "--kubeconfig", str(kubeconfig), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@dataclass
class OperatorHandle:
    argv: list[str]
    process: subprocess.Popen[bytes] | None
    log_path: Path
    metrics_url: str
    liveness_url: str
    drift_interval: float

    @property
    def webhook_configuration(self) -> str:
        return self.argv[self.argv.index("--webhook-configuration") + 1]

    @property
    def logs_dir(self) -> Path:
        return self.log_path.parent

    def start(self) -> None:
        offset = self.log_size()
        with open(self.log_path, "ab") as logf:
            self.process = subprocess.Popen(
                self.argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
                start_new_session=True)
        wait_for("the operator's liveness endpoint", lambda: self.alive() and _liveness_ok(self.liveness_url), 60)
        if "--webhook-url" in self.argv:  # TritonModel writes are refused until the API server trusts our new CA
            wait_for("the operator's webhook CA published",
                     lambda: self.alive() and "Published the webhook CA" in self.log_since(offset), 30)

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        """A new operator process (same ports, same log): its metrics start from zero."""
        self.stop()
        self.start()

    def kill(self) -> int:
        """SIGKILL, as the OOM killer or a node failure would: no cleanup handler runs. Returns the pid."""
        assert self.process is not None and self.alive(), "the operator is not running"
        pid = self.process.pid
        self.process.kill()
        self.process.wait()
        return pid

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its state (caches, broken connections) but runs nothing until `thaw`."""
        assert self.process is not None and self.alive(), "the operator is not running"
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.process is not None and self.alive():
            self.process.send_signal(signal.SIGCONT)

    def samples(self, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Every sample of one metric family, keyed by its sorted labels."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:  # noqa: S310 - 127.0.0.1
            return metric_samples(resp.read().decode(), metric)

    def samples_of_every_replica(self, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
        """`samples` summed over the operator's replicas (one here): what every replica did, such as the admission
        reviews the webhook Service spread over them."""
        return self.samples(metric)

    def writes(self) -> dict[str, float]:
        """`triton_operator_api_writes_total` by "kind/verb"."""
        return {f"{dict(k)['kind']}/{dict(k)['verb']}": v
                for k, v in self.samples("triton_operator_api_writes_total").items()}

    def total_writes(self) -> float:
        return sum(self.writes().values())

    def reconciles(self) -> float:
        return sum(self.samples("triton_operator_reconciles_total").values())

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int = 0) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def log_tail(self, namespace: str | None, lines: int = 60) -> str:
        text = self.log_since().splitlines()
        mine = [ln for ln in text if namespace and (f"namespace={namespace} " in ln or f"{namespace}/" in ln)]
        return "\n".join(
            [f"(operator {'running' if self.alive() else 'not running'}; log {self.log_path})",
             f"-- lines about namespace {namespace} (last {lines}):", *mine[-lines:],
             f"-- last {lines // 2} lines:", *text[-(lines // 2):]]
        )


def _liveness_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - 127.0.0.1
            return resp.status == 200
    except OSError:
        return False


def _crd_established(kube: Kube, plural: str = "tritonmodels") -> bool:
    try:
        crd = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{GROUP}")
    except ApiError:
        return False
    c = condition(crd, "Established")
    return bool(c and c["status"] == "True")


def crds_established(kube: Kube) -> bool:
    """Both CRDs (TritonModel, TritonPool) Established."""
    return all(_crd_established(kube, plural) for plural in ("tritonmodels", "tritonpools"))


def apply_crds(kubeconfig: Path, kube: Kube) -> None:
    """Both CRDs, applied server-side from crds/, Established and their OpenAPI v3 published (kubectl validates on
    the server, fieldValidation=Strict, only once it is)."""
    for path in CRDS:
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    wait_for("CRDs tritonmodels and tritonpools Established", lambda: crds_established(kube), 30)
    wait_for("the CRDs' OpenAPI v3 schema", lambda: kube.request("GET", f"/openapi/v3/apis/{GROUP}/{VERSION}"), 60)


def ensure_crd(kubeconfig: Path, kube: Kube) -> None:
    """The TritonModel and TritonPool CRDs, served: as they are when the cluster has them (the session's release owns
    them), else applied from crds/ server-side. For a second chart release in a cluster, which leaves the CRDs to the
    first (`crds.enabled=false`, chart README)."""
    for path, plural in ((CRD, "tritonmodels"), (POOL_CRD, "tritonpools")):
        try:
            kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{GROUP}")
        except ApiError:
            kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    wait_for("CRDs tritonmodels and tritonpools Established", lambda: crds_established(kube), 30)


def repository_key_file(logs: Path) -> Path:
    """The repository master key of the session's host-run operators (`--repository-key-file`): made once, so that a
    restarted operator derives the keys its replicas hold (a new key would roll every model to new pods)."""
    path = logs / "repository-master-key"
    if not path.exists():
        logs.mkdir(parents=True, exist_ok=True)
        path.write_text(base64.b64encode(os.urandom(48)).decode() + "\n")
        path.chmod(0o600)
    return path


def start_operator(kubeconfig: Path, kube: Kube, logs: Path, *, pattern: str = f"{OPERATOR_NAMESPACE_PREFIX}*",
                   log_name: str = "operator-pytest.log", webhook: bool = True,
                   args: tuple[str, ...] = ()) -> OperatorHandle:
    """The CRDs (TritonModel, TritonPool), applied server-side, and a running `triton-operator run` watching
    `pattern` namespaces, with `args` added to its command line (e.g. `--max-upgrade-rollouts 1`).

    Logs to `<logs>/<log_name>` (emptied first); metrics, liveness and the webhook on free loopback ports.
    """
    apply_crds(kubeconfig, kube)
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / log_name
    metrics_port, liveness_port, webhook_port = free_port(), free_port(), free_port()
    liveness = f"http://127.0.0.1:{liveness_port}/healthz"
    argv = [str(OPERATOR), "run", "--kubeconfig", str(kubeconfig), "--namespace", pattern,
            "--metrics-port", str(metrics_port),
            "--metrics-address", "127.0.0.1", "--liveness", liveness, "--drift-interval", str(DRIFT_INTERVAL),
            "--repository-key-file", str(repository_key_file(logs)), "--default-triton-image", TRITON_REF, *args]
    log_path.write_bytes(b"")
    if webhook:
        # The admission webhook, called by the API server on loopback; its configuration is this
        # session's own (the namespaces it reviews are the operator's: `pattern`).
        argv += ["--webhook-url", f"https://127.0.0.1:{webhook_port}", "--webhook-address", "127.0.0.1",
                 "--webhook-port", str(webhook_port), "--webhook-configuration", f"triton-operator-pytest-{webhook_port}"]
        # A session killed hard leaves its webhook configuration behind, pointing at a closed port: gone first.
        for vwc in kube.request("GET", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations")["items"]:
            if vwc["metadata"]["name"].startswith("triton-operator-pytest-"):
                kube.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
                                       f"{vwc['metadata']['name']}")
    handle = OperatorHandle(argv, None, log_path, f"http://127.0.0.1:{metrics_port}/metrics", liveness, DRIFT_INTERVAL)
    try:
        handle.start()
    except BaseException:
        handle.stop()
        raise
    return handle


class ChartOperator(OperatorHandle):
    """The operator as users run it: installed by `helm` from charts/triton-operator, two pods (the chart's
    default) running the image built from our Dockerfile as 65532 with a read-only root filesystem, under the
    chart's ServiceAccount. Both serve the webhook; the holder of the leader Lease reconciles.

    Same vocabulary as the host-process `OperatorHandle`, about the one that reconciles: `pod()` is the
    leader's pod, `kill()` SIGKILLs the leader's container (its main process on the node; the kubelet
    restarts it, as a follower), `start()` waits until every replica runs and a live process leads,
    `freeze()`/`thaw()` stop and continue every replica (a hung operator), logs and metrics are the leader's.
    """

    def __init__(self, kubeconfig: Path, kube: Kube, logs: Path, pid_of: Callable[[dict], int],
                 values: list[str]) -> None:
        super().__init__([], None, logs / "operator-pytest.log", "", "", DRIFT_INTERVAL)
        self.kubeconfig, self.kube, self.pid_of, self.values = kubeconfig, kube, pid_of, values
        self.fullname = f"{RELEASE}-triton-operator"
        self.replicas = 2  # the chart's default
        self._killed: tuple[str, int] = ("", 0)  # the pod whose container kill() hit, and its restartCount then
        # freeze(): the Lease's holder then and each pod's restartCount; thaw(): when (the writers' clock is ours)
        self._frozen: tuple[str, dict[str, int]] | None = None
        self._thawed_at: datetime.datetime | None = None

    @property
    def webhook_configuration(self) -> str:
        return self.fullname

    @property
    def webhook_service(self) -> str:
        return f"{self.fullname}-webhook"

    def install(self) -> None:
        """The release that owns the CRDs in the session's cluster (crds.enabled, the chart's default: TritonModel and
        TritonPool). It takes a CRD over if it exists without it (`--take-ownership`): applied by a test with
        kubectl, or kept by a release uninstalled earlier; other releases in the same cluster set crds.enabled=false
        (`ensure_crd`)."""
        helm(self.kubeconfig, "upgrade", "--install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
             "--create-namespace", "--take-ownership", *self.values)
        self.start()

    def reconfigure(self, *sets: str) -> None:
        """`helm upgrade --reuse-values` with `sets` (e.g. `--set customMetrics.enabled=true`), the Deployment's
        rollout complete (no replica of the old pod template left), then `start()`: every replica serves and a
        live process leads."""
        helm(self.kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--reuse-values",
             *sets, "--wait", "--timeout", "180s")
        kubectl(self.kubeconfig, "rollout", "status", "-n", RELEASE_NAMESPACE, f"deployment/{self.fullname}",
                "--timeout=180s", timeout=200)
        self.values = [*self.values, *sets]
        self.start()

    def pods(self) -> list[dict]:
        """The operator's live pods, by name."""
        pods = self.kube.items("Pod", RELEASE_NAMESPACE, label_selector={"app.kubernetes.io/instance": RELEASE})
        return sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"])

    def holder(self) -> str:
        """The leader Lease's holderIdentity (`<pod name>_<process id>`), or "" while nobody holds it."""
        lease = self.kube.get_or_none("Lease", self.fullname, RELEASE_NAMESPACE)
        return ((lease or {}).get("spec") or {}).get("holderIdentity") or ""

    def pod(self) -> dict | None:
        """The leader's pod (else any, while nobody leads)."""
        pods = self.pods()
        leader = self.holder().split("_")[0]
        return next((p for p in pods if p["metadata"]["name"] == leader), pods[0] if pods else None)

    @staticmethod
    def _operator_status(pod: dict | None) -> dict:
        for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
            if cs["name"] == "operator":
                return cs
        return {}

    def _container(self) -> dict:
        return self._operator_status(self.pod())

    @staticmethod
    def _metrics_url_of(pod: dict | None) -> str:
        return f"http://{((pod or {}).get('status') or {}).get('podIP')}:8081/metrics"

    @property
    def metrics_url(self) -> str:  # type: ignore[override]
        return self._metrics_url_of(self.pod())

    @metrics_url.setter
    def metrics_url(self, _: str) -> None:
        pass

    def samples_of_every_replica(self, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
        total: dict[tuple[tuple[str, str], ...], float] = {}
        for pod in self.pods():
            url = self._metrics_url_of(pod)

            def read(url: str = url) -> str:
                with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a pod of this cluster
                    return str(resp.read().decode())

            # A connection reset or refused (the replica restarting after an earlier test's kill: CI at 8e27636) is
            # asked again, not a failure of the test that counts.
            text = wait_for(f"the metrics of operator pod {pod['metadata']['name']} ({url})", read, 60, 0.5)
            for labels, value in metric_samples(text, metric).items():
                total[labels] = total.get(labels, 0.0) + value
        return total

    def alive(self) -> bool:
        return "running" in (self._container().get("state") or {})

    def start(self) -> None:
        """Waits until every operator replica runs and is ready, and is a ready endpoint of the webhook Service
        (the API server sends reviews only there; it lags the pod's Ready by a moment), the one `kill()` hit has
        been restarted by its kubelet, and a live process holds the Lease (its log says it became the leader
        under the identity the Lease holds)."""
        killed, before = self._killed

        why = ["not checked yet"]

        def lost_after_thaw() -> list[tuple[str, int, str]] | None:
            """Frozen replicas race on waking: the leader renews, or a follower that saw no renewal for the lease
            duration takes the Lease and the old leader's process exits to restart as a follower (CI at 7cb89db: a
            test started while that restart was under way, and the API server sent its review to the exiting
            pod). None until the Lease was written after the thaw (that write decided the race); then the old
            holder's pod, to be restarted, if the holder changed."""
            if self._frozen is None or self._thawed_at is None:
                return []
            holder, restarts = self._frozen
            spec = (self.kube.get_or_none("Lease", self.fullname, RELEASE_NAMESPACE) or {}).get("spec") or {}
            renewed = spec.get("renewTime") or ""
            if not renewed or datetime.datetime.fromisoformat(renewed.replace("Z", "+00:00")) <= self._thawed_at:
                why[0] = f"the Lease not written since the thaw at {self._thawed_at.isoformat()} (renewTime {renewed!r})"
                return None
            if not holder or spec.get("holderIdentity") == holder:
                return []
            old = holder.split("_")[0]
            return [(old, restarts.get(old, 0), "the leader when frozen, which lost the Lease")]

        def up() -> bool:
            lost = lost_after_thaw()
            if lost is None:
                return False
            pods = self.pods()
            unready = [p["metadata"]["name"] for p in pods if self._operator_status(p).get("ready") is not True]
            if len(pods) < self.replicas or unready:
                why[0] = f"{len(pods)} pods of {self.replicas}, not ready: {unready}"
                return False
            serving = ready_addresses(self.kube, RELEASE_NAMESPACE, self.webhook_service)
            if missing := [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("podIP") not in serving]:
                why[0] = f"not yet ready endpoints of {self.webhook_service}: {missing}"
                return False
            # A pod whose process died (the one kill() hit, or a frozen leader that lost the Lease) must have been
            # restarted by its kubelet; one replaced since (a helm upgrade rolled the Deployment) has nothing left to
            # restart.
            for name, count, what in [*([(killed, before, "killed")] if killed else []), *lost]:
                hit = next((p for p in pods if p["metadata"]["name"] == name), None)
                if hit is not None and self._operator_status(hit).get("restartCount", 0) <= count:
                    why[0] = f"{name} ({what}) not restarted yet"
                    return False
            holder = self.holder()
            if not (holder and f"identity={holder}" in self.log_since() and "Became the leader" in self.log_since()):
                why[0] = f"the Lease's holder {holder!r} is not a live process that says it became the leader"
                return False
            return True

        try:
            wait_for(f"{self.replicas} operator replicas running and ready, and a live leader", up, 180)
        except TimeoutError as e:
            raise TimeoutError(f"{e}: {why[0]}") from None
        self._killed = ("", 0)
        self._frozen = self._thawed_at = None

    def stop(self) -> None:
        """`helm uninstall`: the chart's objects go, and the operator pod stops through its kubelet."""
        with contextlib.suppress(AssertionError):
            helm(self.kubeconfig, "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait")

    def kill(self) -> int:
        """SIGKILLs the leader's container; returns its pid on the node."""
        pod = self.pod()
        assert pod is not None and self.alive(), "the operator is not running"
        self._killed = (pod["metadata"]["name"], self._operator_status(pod).get("restartCount", 0))
        pid = self.pid_of(pod)
        os.kill(pid, signal.SIGKILL)
        return pid

    def freeze(self) -> None:
        """SIGSTOPs every replica: the pods are there, nothing answers (a hung or overloaded operator)."""
        pods = [p for p in self.pods() if "running" in (self._operator_status(p).get("state") or {})]
        assert pods, "the operator is not running"
        self._frozen = (self.holder(), {p["metadata"]["name"]: self._operator_status(p).get("restartCount", 0)
                                        for p in pods})
        for p in pods:
            os.kill(self.pid_of(p), signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONTs every replica; `start()` then waits until the race on the Lease they wake to is settled."""
        self._thawed_at = datetime.datetime.now(datetime.UTC)  # before any of them can write again
        for p in self.pods():
            if "running" in (self._operator_status(p).get("state") or {}):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid_of(p), signal.SIGCONT)

    def restart(self) -> None:
        self.kill()
        self.start()

    def log_since(self, offset: int = 0) -> str:
        pod = self.pod()
        if pod is None:
            return ""
        md = pod["metadata"]
        try:
            text = self.kube.request_text(
                "GET", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/log?container=operator", timeout=15)
        except Exception:  # noqa: BLE001 - a container that is not up yet has no log
            return ""
        return text[offset:]

    def log_size(self) -> int:
        return len(self.log_since())

    @property
    def logs_dir(self) -> Path:
        return self.log_path.parent

    def log_tail(self, namespace: str | None, lines: int = 60) -> str:
        text = self.log_since().splitlines()
        mine = [ln for ln in text if namespace and (f"namespace={namespace} " in ln or f"{namespace}/" in ln)]
        return "\n".join(
            [f"(operator pod {((self.pod() or {}).get('metadata') or {}).get('name')}, "
             f"{'running' if self.alive() else 'not running'}; helm release {RELEASE_NAMESPACE}/{RELEASE})",
             f"-- lines about namespace {namespace} (last {lines}):", *mine[-lines:],
             f"-- last {lines // 2} lines:", *text[-(lines // 2):]]
        )


#: The session operator's leader Lease duration (chart value leaderElection.leaseSeconds).
LEASE_SECONDS = 6


def session_values() -> list[str]:
    """The chart values of the session's operator: serve `op-*` namespaces (cluster-wide RBAC), review only the
    namespaces labelled for the session, a 5 s drift interval for quick tests."""
    key, value = SESSION_LABEL
    return ["--set", f"watch.namespacePattern={OPERATOR_NAMESPACE_PREFIX}*", "--set", f"tritonImage={TRITON_REF}",
            "--set", f"operator.driftInterval={int(DRIFT_INTERVAL)}",
            # A shorter Lease than the chart's 15 s, so that tests which kill the leader wait less for a follower.
            "--set", f"leaderElection.leaseSeconds={LEASE_SECONDS}", "--set", "leaderElection.renewSeconds=4",
            "--set", "leaderElection.retrySeconds=1",
            "--set-string", f"webhook.namespaceSelector.matchLabels.{key.replace('.', chr(92) + '.')}={value}"]


@pytest.fixture(scope="session")
def operator(cluster: Any, kubeconfig: Path, kube: Kube, nodes: Any) -> Iterator[OperatorHandle]:
    """The chart, installed once for the whole session; uninstalled at the end.

    Depends on `nodes` so that the operator pod has somewhere to run; tests' namespaces are gone by
    the time it is uninstalled, so no replica is left whose gate nobody tends.
    """
    handle = ChartOperator(kubeconfig, kube, cluster.logs or session_root() / ".cluster" / "logs",
                           lambda pod: nodes.container_pid(pod, "operator"), session_values())
    try:
        handle.install()
    except BaseException:
        print(handle.log_tail(None))
        handle.stop()
        raise
    try:
        yield handle
    finally:
        handle.stop()


# -- TritonModel vocabulary --------------------------------------------------------------------


def model_condition(tm: dict, type_: str) -> dict:
    return condition(tm, type_) or {}


def wait_model(kube: Kube, namespace: str, name: str, pred: Callable[[dict], Any], what: str,
               timeout: float = 120.0, interval: float = 0.25) -> dict:
    def probe() -> dict | None:
        tm = kube.get("TritonModel", name, namespace)
        return tm if pred(tm) else None

    return wait_for(f"TritonModel {namespace}/{name} {what}", probe, timeout, interval)


def is_model_ready(tm: dict) -> bool:
    """Ready=True for the current generation."""
    c = model_condition(tm, "Ready")
    st = tm.get("status") or {}
    return (c.get("status") == "True" and c.get("observedGeneration") == tm["metadata"]["generation"]
            and st.get("observedGeneration") == tm["metadata"]["generation"])


def gate(pod: dict) -> dict:
    return condition(pod, WARMED) or {}


def model_pods(kube: Kube, namespace: str, name: str) -> list[dict]:
    return kube.items("Pod", namespace, label_selector={LABEL_MODEL: name})


def wait_writes_settle(op: OperatorHandle, quiet: float, timeout: float = 90.0) -> dict[str, float]:
    """Waits until the operator has written nothing for `quiet` seconds; returns the counters then. `timeout` is
    scaled (tests/timing.py); `quiet`, what "settled" means, is not."""
    deadline = time.monotonic() + scaled(timeout)
    last = op.writes()
    since = time.monotonic()
    while True:
        time.sleep(0.5)
        now = op.writes()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
        if time.monotonic() >= deadline:
            raise TimeoutError(f"operator writes did not settle for {quiet}s within {timeout}s: {now}")


def record_admission_webhooks(kube: Kube, label: str) -> None:
    """What the API server's admission webhooks cost this cluster's writes since the API server last started, from its
    own metrics, per webhook: calls, their mean latency, how many took over 1 s, and calls that failed for the
    webhook's own sake (a timeout, a refused connection: `calling_webhook_error`) rather than a denial. Recorded at a
    cluster's end (e2e/conftest.py)."""
    try:
        text = kube.request_text("GET", "/metrics", timeout=30)
    except Exception as exc:  # noqa: BLE001 - a measurement, never a failure: the control plane may be down
        record(f"admission webhooks ({label})", f"not read: {exc}")
        return
    # Only the admission webhooks' families (HELP, TYPE and samples): the rest of the API server's metrics is
    # megabytes that `metric_samples` would parse once per metric asked.
    text = "\n".join(ln for ln in text.splitlines() if "apiserver_admission_webhook_" in ln)

    def per_hook(metric: str, keep: Callable[[dict[str, str]], bool] = lambda _: True) -> dict[str, float]:
        out: dict[str, float] = {}
        for labels, value in metric_samples(text, metric).items():
            got = dict(labels)
            if keep(got):
                out[got.get("name", "")] = out.get(got.get("name", ""), 0.0) + value
        return out

    duration = "apiserver_admission_webhook_admission_duration_seconds"
    calls, seconds = per_hook(f"{duration}_count"), per_hook(f"{duration}_sum")
    within_1s = per_hook(f"{duration}_bucket", lambda got: float(got.get("le", "nan")) == 1.0)
    failed = per_hook("apiserver_admission_webhook_rejection_count_total",
                      lambda got: got.get("error_type") == "calling_webhook_error")
    for hook, n in sorted(calls.items()):
        mean = seconds.get(hook, 0.0) / n if n else 0.0
        record(f"admission webhook {hook} ({label})",
               f"{n:.0f} calls, mean {mean * 1000:.0f} ms, {n - within_1s.get(hook, 0.0):.0f} over 1 s, "
               f"{failed.get(hook, 0.0):.0f} failed calling it")


def summary_lines() -> list[str]:
    return [f"{k}: {v}" for k, v in MEASUREMENTS.items()]


def apply(kubeconfig: Path, namespace: str, *docs: dict) -> None:
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=as_stream(list(docs)))


def add_sub(name: str = "add-sub", strategy: str | None = None) -> dict:
    """The add-sub example as `name`; `strategy` sets spec.rollout.strategy (NewPods: a config change rolls the
    Deployment, for the tests of that path; the default, InPlace, reloads replicas: e2e/test_inplace.py)."""
    doc = load_examples("add-sub")[0]
    doc["metadata"]["name"] = name
    if strategy:
        doc["spec"]["rollout"] = {"strategy": strategy}
    return doc


def live_pods(kube: Kube, namespace: str, model: str) -> list[dict]:
    return [p for p in model_pods(kube, namespace, model) if not p["metadata"].get("deletionTimestamp")]


def digest_of(pod: dict) -> str:
    return (pod["metadata"].get("annotations") or {}).get(ANNOTATION_DIGEST, "")


def rolled_out(kube: Kube, namespace: str, name: str, digest: str, replicas: int) -> bool:
    """Exactly `replicas` pods exist (terminating ones included), all at `digest`, all warmed."""
    pods = model_pods(kube, namespace, name)
    return len(pods) == replicas and all(
        digest_of(p) == digest and gate(p).get("status") == "True" and not p["metadata"].get("deletionTimestamp")
        for p in pods)


def one_ready_pod(kube: Kube, namespace: str, name: str) -> dict:
    return wait_for(f"one warmed pod of {name}", lambda: next(
        (p for p in live_pods(kube, namespace, name) if gate(p).get("status") == "True"), None), 60)


def _two_ready_replicas(kube: Kube, kubeconfig: Path, namespace: str, doc: dict) -> dict:
    doc["spec"]["replicas"] = 2
    apply(kubeconfig, namespace, doc)
    tm = wait_model(kube, namespace, "add-sub", lambda tm: is_model_ready(tm) and tm["status"]["warmedReplicas"] == 2,
                    "Ready with 2 warmed replicas", 180)
    wait_for("2 ready endpoints", lambda: len(ready_endpoints(kube, namespace, "add-sub")) == 2, 30)
    return tm
