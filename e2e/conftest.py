"""pytest fixtures for tests against the local cluster: a real control plane and real nodes.

Owns the session's cluster (an existing reachable `KUBECONFIG` - another root's `LocalCluster`
keeps its logs under that root - or `LocalCluster` started here with two real nodes, containerd +
kubelet + the fake-GPU device plugin each, and kube-proxy, stopped at the end only if this session
started it), `nodes` (what tests read from the nodes: container logs through the API server, host
pids through containerd), a fresh namespace per test, `isolated_cluster` (a control plane, a node and
an operator of a test's own, for tests that disrupt the control plane), and the diagnostics attached
to a failed test's report (plus the operator's log when the test used the `operator` fixture from
`operator_fixtures.py` or `isolated_cluster`).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.cluster import LocalCluster, session_root
from e2e.kube import Kube, condition, wait_for
from e2e.node import Node
from e2e.operator_fixtures import (  # noqa: F401 - fixture
    OPERATOR_NAMESPACE_PREFIX,
    SESSION_LABEL,
    OperatorHandle,
    operator,
    record_admission_webhooks,
    start_operator,
    summary_lines,
)
from e2e.testing import delete_namespace, diagnostics

GPU_NODE = "gpu-node-1"


@dataclass
class ClusterHandle:
    kubeconfig: Path
    logs: Path | None  # control-plane logs, when the cluster is ours
    local: LocalCluster | None


@dataclass
class NodesHandle:
    """The cluster's GPU nodes as tests see them: names, GPU counts, and what runs on them.

    Container logs come through the API server (`kubectl logs`' path: API server -> kubelet), so
    they work on any cluster; host pids need our own nodes (containerd's task list).
    """

    kube: Kube
    local: LocalCluster | None
    names: list[str]
    gpus: dict[str, int]

    @property
    def node(self) -> str:
        return self.names[0]

    def real(self, name: str) -> Node:
        if self.local is None:
            pytest.skip("needs this project's own local cluster (host access to the node's containerd)")
        return self.local.node(name)

    def of(self, pod: dict) -> Node:
        return self.real(pod["spec"]["nodeName"])

    def container_log(self, pod: dict, container: str, previous: bool = False) -> str:
        md = pod["metadata"]
        path = f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/log"
        query = f"?container={container}" + ("&previous=true" if previous else "")
        return self.kube.request_text("GET", path + query)

    def container_pid(self, pod: dict, container: str) -> int:
        return self.of(pod).container_pid(pod, container)


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
    local = LocalCluster(session_root())
    if env and Path(env).resolve() != local.kubeconfig.resolve() and _reachable(env):
        other = _local_cluster_of(env)
        if other is not None and other.healthy():
            # Another root's control plane: its logs and node-agent state stay under that root. Never stopped here.
            yield ClusterHandle(other.kubeconfig, other.logs, other)
            return
        yield ClusterHandle(Path(env), None, None)
        return
    started = not local.reusable()
    kubeconfig = local.up()
    try:
        yield ClusterHandle(kubeconfig, local.logs, local)
    finally:
        try:
            record_admission_webhooks(Kube(kubeconfig), os.environ.get("PYTEST_XDIST_WORKER", "cluster"))
        finally:  # a measurement that fails must not leave the cluster running
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
def nodes(cluster: ClusterHandle, kube: Kube) -> NodesHandle:
    """The GPU nodes (`nvidia.com/gpu.present=true`), each Ready."""
    names = sorted(n["metadata"]["name"] for n in kube.items("Node", label_selector={"nvidia.com/gpu.present": "true"}))
    assert names, "the cluster has no GPU node (label nvidia.com/gpu.present=true)"
    for name in names:
        wait_for(f"node {name} Ready", lambda name=name: _node_ready(kube, name), 120)
    gpus = {n: int(kube.get("Node", n)["status"]["allocatable"].get("nvidia.com/gpu", "0")) for n in names}
    return NodesHandle(kube, cluster.local, names, gpus)


def _namespace_name(request: pytest.FixtureRequest, for_operator: bool) -> str:
    stem = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower().removeprefix("test_"))[:40].strip("-")
    if for_operator:  # inside the operator's watch
        stem = f"{OPERATOR_NAMESPACE_PREFIX}{stem}"[:40].strip("-")
    return f"{stem}-{uuid.uuid4().hex[:5]}"


def _create_namespace(kube: Kube, name: str) -> None:
    labels = {"e2e.triton-operator.io/test": "true"}
    if name.startswith(OPERATOR_NAMESPACE_PREFIX):  # reviewed by the session operator's webhook
        labels[SESSION_LABEL[0]] = SESSION_LABEL[1]
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    wait_for(f"default ServiceAccount in {name}", lambda: kube.get_or_none("ServiceAccount", "default", name), 30)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube: Kube) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount) for one test; deleted afterwards."""
    name = _namespace_name(request, "operator" in request.fixturenames)
    _create_namespace(kube, name)
    yield name
    delete_namespace(kube, name)


@dataclass
class IsolatedCluster:
    """A control plane of one test's own, with one real node, its operator and a namespace the operator watches."""

    local: LocalCluster
    kube: Kube
    nodes: NodesHandle
    operator: OperatorHandle
    namespace: str


#: Where `isolated_cluster` keeps its control plane: `LocalCluster(ISOLATED_ROOT)`, i.e. `.cluster/isolated/.cluster/`
#: under the session's root.
ISOLATED_ROOT = session_root() / ".cluster" / "isolated"


@pytest.fixture
def control_plane(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A control plane with no nodes for one test, under its module's `ROOT` (`.cluster/<name>`): whatever a killed
    run left there is stopped first, and everything is stopped afterwards."""
    local = LocalCluster(request.module.ROOT, nodes=())
    with local.running_fresh():
        yield local


@pytest.fixture
def isolated_cluster(request: pytest.FixtureRequest) -> Iterator[IsolatedCluster]:
    """A fresh control plane (own ports, certificates, etcd data and logs under `ISOLATED_ROOT`), one real node
    (`gpu-node-1` with `DEFAULT_GPUS` fake GPUs, its own subnet, bridge and cgroups; no kube-proxy: the session's owns the host's
    iptables) and a host-process operator for one test that disrupts them; everything is stopped afterwards.

    The session's cluster and operator are not touched: other tests never see the disruption.
    """
    local = LocalCluster(ISOLATED_ROOT, nodes=(GPU_NODE,), kube_proxy=False)
    # Whatever a killed session left goes first; afterwards the kubelet, every container and the node's host
    # state, then the control plane.
    with local.running_fresh() as kubeconfig:
        kube = Kube(kubeconfig)
        handle = NodesHandle(kube, local, [GPU_NODE], {GPU_NODE: local.gpus})
        op = start_operator(kubeconfig, kube, local.logs)
        try:
            ns = _namespace_name(request, for_operator=True)
            _create_namespace(kube, ns)
            yield IsolatedCluster(local, kube, handle, op, ns)
        finally:
            op.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    iso: IsolatedCluster | None = funcargs.get("isolated_cluster")
    if iso is not None:
        kube, ns, logs, op = iso.kube, iso.namespace, iso.local.logs, iso.operator
    else:
        kube = funcargs.get("kube")
        ns = funcargs.get("namespace")
        cluster = funcargs.get("cluster")
        logs = cluster.logs if cluster is not None else session_root() / ".cluster" / "logs"
        op = funcargs.get("operator")
    text = diagnostics(kube, ns, logs)
    report.sections.append(("cluster diagnostics", text))
    if op is not None:
        report.sections.append(("operator log", op.log_tail(ns)))


#: What pytest-xdist workers measured (`make test`), collected by the controller as each worker finishes.
_WORKER_LINES: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the measurements to the controller's summary
        workeroutput["operator_measurements"] = summary_lines()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    _WORKER_LINES.extend(getattr(node, "workeroutput", {}).get("operator_measurements", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = summary_lines() + sorted(_WORKER_LINES)
    if lines:
        terminalreporter.write_sep("-", "operator measurements")
        for line in lines:
            terminalreporter.write_line(line)
