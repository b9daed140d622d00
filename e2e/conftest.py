"""pytest fixtures for tests against the local control plane and the GPU node agent.

Owns the session's cluster (an existing reachable `KUBECONFIG` - another root's `LocalCluster`
keeps its logs and agent state under that root - or `LocalCluster` started here and stopped at
the end only if this session started it), the node agent (one node `gpu-node-1`
with 4 GPUs, run as a subprocess, or the one `python -m e2e.cluster up --gpu-node` started), a
fresh namespace per test, `isolated_cluster` (a control plane, node agent and operator of a test's
own, for tests that disrupt the control plane), and the diagnostics attached to a failed test's
report (plus the operator's log when the test used the `operator` fixture from
`operator_fixtures.py` or `isolated_cluster`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.cluster import REPO_ROOT, LocalCluster, agent_state_dir
from e2e.kube import ApiError, Kube, condition, wait_for
from e2e.operator_fixtures import (  # noqa: F401 - fixture
    OPERATOR_NAMESPACE_PREFIX,
    OperatorHandle,
    operator,
    start_operator,
    summary_lines,
)
from e2e.testing import diagnostics

GPU_NODE = "gpu-node-1"
GPU_COUNT = 8


@dataclass
class ClusterHandle:
    kubeconfig: Path
    logs: Path | None  # control-plane logs, when the cluster is ours
    local: LocalCluster | None


@dataclass
class NodeAgentHandle:
    node: str
    gpus: int
    state_dir: Path
    log_path: Path | None
    process: subprocess.Popen[bytes] | None

    def pod_dir(self, uid: str) -> Path:
        return self.state_dir / "pods" / uid

    def container_log(self, pod: dict, container: str) -> Path:
        return self.pod_dir(pod["metadata"]["uid"]) / "logs" / f"{container}.log"

    def container_pid(self, pod: dict, container: str) -> int:
        return int((self.pod_dir(pod["metadata"]["uid"]) / "run" / f"{container}.pid").read_text())


def _reachable(kubeconfig: str) -> bool:
    try:
        return Kube(kubeconfig, timeout=5).request("GET", "/readyz") is not None
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return False


def _local_cluster_of(kubeconfig: str) -> LocalCluster | None:
    """The LocalCluster whose admin kubeconfig this is (`python -m e2e.cluster up --root R`), if any."""
    path = Path(kubeconfig).resolve()
    if path.name == "kubeconfig" and path.parent.name == ".cluster" and (path.parent / "state.json").exists():
        return LocalCluster(path.parent.parent)
    return None


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterHandle]:
    env = os.environ.get("KUBECONFIG")
    local = LocalCluster(REPO_ROOT)
    if env and Path(env).resolve() != local.kubeconfig.resolve() and _reachable(env):
        other = _local_cluster_of(env)
        if other is not None and other.healthy():
            # Another root's control plane: its logs and node-agent state stay under that root. Never stopped here.
            yield ClusterHandle(other.kubeconfig, other.logs, other)
            return
        yield ClusterHandle(Path(env), None, None)
        return
    started = not local.healthy()
    kubeconfig = local.up()
    try:
        yield ClusterHandle(kubeconfig, local.logs, local)
    finally:
        if started:
            local.down()


@pytest.fixture(scope="session")
def kubeconfig(cluster: ClusterHandle) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def kube(kubeconfig: Path) -> Kube:
    return Kube(kubeconfig)


def _node_ready(kube: Kube, name: str) -> bool:
    node = kube.get_or_none("Node", name)
    if node is None:
        return False
    ready = condition(node, "Ready")
    taints = [t["key"] for t in node["spec"].get("taints") or []]
    return bool(ready and ready["status"] == "True" and "node.kubernetes.io/not-ready" not in taints)


@pytest.fixture(scope="session")
def node_agent(cluster: ClusterHandle, kube: Kube) -> Iterator[NodeAgentHandle]:
    local = cluster.local
    if local is not None and "nodeagent" in local.running():  # started by `e2e.cluster up --gpu-node`
        wait_for(f"node {GPU_NODE} Ready", lambda: _node_ready(kube, GPU_NODE), 60)
        gpus = int(kube.get("Node", GPU_NODE)["status"]["capacity"].get("nvidia.com/gpu", "0"))  # as it was started
        yield NodeAgentHandle(GPU_NODE, gpus, agent_state_dir(local.dir, "nodeagent"), local.logs / "nodeagent.log", None)
        return
    if local is not None:
        # Recorded in .cluster/pids: a session killed hard leaves no agent that `make cluster-down` misses.
        name = "nodeagent-pytest"
        proc = local.start_node_agent([GPU_NODE], GPU_COUNT, ["--crash-backoff", "1"], name=name)
        state_dir, log_path = agent_state_dir(local.dir, name), local.logs / f"{name}.log"
    else:
        state_dir = agent_state_dir(REPO_ROOT / ".cluster", "nodeagent-pytest")
        log_path = REPO_ROOT / ".cluster" / "logs" / "nodeagent-pytest.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "e2e.nodeagent", "--kubeconfig", str(cluster.kubeconfig), "--node", GPU_NODE,
                "--gpus", str(GPU_COUNT), "--state-dir", str(state_dir), "--crash-backoff", "1"]
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, cwd=REPO_ROOT,  # noqa: S603
                                    stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(f"node {GPU_NODE} Ready", lambda: proc.poll() is None and _node_ready(kube, GPU_NODE), 60)
        assert proc.poll() is None, f"node agent exited with {proc.returncode}; see {log_path}"
        yield NodeAgentHandle(GPU_NODE, GPU_COUNT, state_dir, log_path, proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if local is not None:
            local.stop_component("nodeagent-pytest")


def _namespace_name(request: pytest.FixtureRequest, for_operator: bool) -> str:
    stem = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower().removeprefix("test_"))[:40].strip("-")
    if for_operator:  # inside the operator's watch
        stem = f"{OPERATOR_NAMESPACE_PREFIX}{stem}"[:40].strip("-")
    return f"{stem}-{uuid.uuid4().hex[:5]}"


def _create_namespace(kube: Kube, name: str) -> None:
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name,
                                                                       "labels": {"e2e.triton-operator.io/test": "true"}}})
    wait_for(f"default ServiceAccount in {name}", lambda: kube.get_or_none("ServiceAccount", "default", name), 30)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube: Kube) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount) for one test; deleted afterwards."""
    name = _namespace_name(request, "operator" in request.fixturenames)
    _create_namespace(kube, name)
    yield name
    with contextlib.suppress(ApiError):  # pods first: the namespace controller only starts after a delay
        kube.request("DELETE", f"/api/v1/namespaces/{name}/pods", {"kind": "DeleteOptions", "apiVersion": "v1"})
    with contextlib.suppress(ApiError):
        kube.delete("Namespace", name)
    # Pods stop through the node agent (SIGTERM, grace period): wait so no process outlives its test.
    wait_for(f"pods in {name} to be gone", lambda: not kube.items("Pod", name), 120)


@dataclass
class IsolatedCluster:
    """A control plane of one test's own, with its node agent, its operator and a namespace the operator watches."""

    local: LocalCluster
    kube: Kube
    node_agent: NodeAgentHandle
    operator: OperatorHandle
    namespace: str


#: Where `isolated_cluster` keeps its control plane: `LocalCluster(ISOLATED_ROOT)`, i.e. `.cluster/isolated/.cluster/`.
ISOLATED_ROOT = REPO_ROOT / ".cluster" / "isolated"


@pytest.fixture
def isolated_cluster(request: pytest.FixtureRequest) -> Iterator[IsolatedCluster]:
    """A fresh control plane (own ports, certificates, etcd data and logs under `ISOLATED_ROOT`), a node agent
    (`gpu-node-1`, 8 GPUs) and an operator for one test that disrupts them; everything is stopped afterwards.

    The session's cluster, node agent and operator are not touched: other tests never see the disruption.
    """
    local = LocalCluster(ISOLATED_ROOT)
    local.down(quiet=True)  # whatever a killed session left, and its etcd data
    kubeconfig = local.up()
    try:
        kube = Kube(kubeconfig)
        name = "nodeagent-pytest"
        proc = local.start_node_agent([GPU_NODE], GPU_COUNT, ["--crash-backoff", "1"], name=name)
        log_path = local.logs / f"{name}.log"
        wait_for(f"node {GPU_NODE} Ready", lambda: proc.poll() is None and _node_ready(kube, GPU_NODE), 60)
        agent = NodeAgentHandle(GPU_NODE, GPU_COUNT, agent_state_dir(local.dir, name), log_path, proc)
        op = start_operator(kubeconfig, kube, local.logs)
        try:
            ns = _namespace_name(request, for_operator=True)
            _create_namespace(kube, ns)
            yield IsolatedCluster(local, kube, agent, op, ns)
        finally:
            op.stop()
    finally:
        local.down()  # the node agent first (it stops its pods), then the control plane; wipes etcd data


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    iso: IsolatedCluster | None = funcargs.get("isolated_cluster")
    if iso is not None:
        kube, ns, agent, logs, op = iso.kube, iso.namespace, iso.node_agent, iso.local.logs, iso.operator
    else:
        kube = funcargs.get("kube")
        ns = funcargs.get("namespace")
        agent = funcargs.get("node_agent")
        cluster = funcargs.get("cluster")
        logs = cluster.logs if cluster is not None else REPO_ROOT / ".cluster" / "logs"
        op = funcargs.get("operator")
    text = diagnostics(kube, ns, agent.state_dir if agent else None, logs)
    report.sections.append(("cluster diagnostics", text))
    if op is not None:
        report.sections.append(("operator log", op.log_tail(ns)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = summary_lines()
    if lines:
        terminalreporter.write_sep("-", "operator measurements")
        for line in lines:
            terminalreporter.write_line(line)
