"""The operator installed as the README tells a user: the chart from an OCI registry, the image pulled by digest (issue
42 item 2).

The other cluster tests preload the operator image into each node's containerd (`ctr import`); here nothing is preloaded
under the reference the pod runs. `tools/release.py` pushes the test clusters' operator archive (crane) and this
checkout's packaged chart (`helm push`) to go-containerregistry's registry on a free 127.0.0.1 port, in the network
namespace the nodes' containerd run in (the test's own: the nodes are processes of this machine). Each node's containerd
is told that registry speaks plain HTTP through its `config_path` (`certs.d/<host:port>/hosts.toml`, read at each pull:
no restart). Then `helm install <release> oci://<registry>/charts/triton-operator --version <v>` with `image.digest`,
and the kubelet pulls `<registry>/triton-operator@sha256:...`: its events say "Successfully pulled", the container's
imageID is the pushed digest, and the operator it runs makes add-sub Ready and answer an inference.

The release is a second one beside the session's chart operator (e2e/operator_fixtures.py, `op-*` namespaces, which
owns the CRDs): namespaced (`watch.namespaces` = this test's namespace, not an `op-*` one; its webhook reviews only
that namespace), `crds.enabled=false`, as the chart README says for every release after the first, one replica.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from e2e import images
from e2e.images import TRITON_REF
from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import add_sub, apply, ensure_crd, helm, is_model_ready, record, wait_model
from e2e.testing import container_status, delete_namespace, ready_addresses, wait_gone
from tools import release

pytestmark = pytest.mark.cluster

#: Not the session's `trop`: its own fullname, ServiceAccount, webhook configuration and admission policies.
RELEASE = "trop-oci"


def hosts_toml(registry: str) -> str:
    """containerd's host configuration for `registry` (HOST:PORT): plain HTTP, for pulls and tag resolution only."""
    return (f'server = "http://{registry}"\n\n[host."http://{registry}"]\n'
            '  capabilities = ["pull", "resolve"]\n')


@pytest.fixture
def registry(nodes: Any) -> Iterator[str]:
    """The local registry (HOST:PORT on 127.0.0.1), known to every node's containerd while the test runs; afterwards
    the node forgets it, and the references pulled from it are removed from containerd (their layers are the
    preloaded image's, shared)."""
    nodes.real(nodes.names[0])  # skips on a cluster not of this project's making: no host access to containerd
    with release.local_registry() as address:
        dirs = []
        for name in nodes.names:
            d = nodes.real(name).root / "certs.d" / address
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts.toml").write_text(hosts_toml(address))
            dirs.append(d)
        try:
            yield address
        finally:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
            for name in nodes.names:
                socket = nodes.real(name).containerd_address
                pulled = [r for r in images.containerd_images(socket) if r.startswith(f"{address}/")]
                if pulled:
                    subprocess.run(["ctr", "--address", socket, "-n", "k8s.io", "images", "rm", *pulled],
                                   capture_output=True, check=False)


@contextlib.contextmanager
def installed_from(kubeconfig: Path, kube: Kube, chart: str, version: str, namespace: str, *sets: str) -> Iterator[str]:
    """`helm install RELEASE <chart> --version <version> -n <namespace>-op --create-namespace`, waited for;
    uninstalled (and its namespace deleted) afterwards. Yields the release's namespace."""
    op_ns = f"{namespace}-op"
    ensure_crd(kubeconfig, kube)  # the session release's, or applied here: this release leaves them alone
    try:
        helm(kubeconfig, "install", RELEASE, chart, "--version", version, "-n", op_ns, "--create-namespace",
             "--plain-http", "--set", "crds.enabled=false", "--set", "replicaCount=1",
             "--set", f"watch.namespaces={{{namespace}}}", "--set", f"tritonImage={TRITON_REF}", *sets,
             "--wait", "--timeout", "180s")
        yield op_ns
    finally:
        with contextlib.suppress(AssertionError):
            helm(kubeconfig, "uninstall", RELEASE, "--namespace", op_ns, "--wait", "--timeout", "90s")
        delete_namespace(kube, op_ns)


def infer_add_sub(address: str) -> list[float]:
    """add-sub's OUTPUT0 (a + b) for one request at `address` (host:port of gRPC)."""
    client = grpcclient.InferenceServerClient(address)
    try:
        a, b = np.array([[1, 2, 3, 4]], np.float32), np.array([[10, 20, 30, 40]], np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32"), grpcclient.InferInput("INPUT1", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        return [float(x) for x in client.infer("add-sub", inputs, client_timeout=30).as_numpy("OUTPUT0")[0]]
    finally:
        client.close()


def pull_events(kube: Kube, namespace: str, pod: str) -> list[str]:
    """The kubelet's Pulled events of `pod`, their messages."""
    return [e.get("message") or "" for e in kube.items("Event", namespace, field_selector={
        "involvedObject.name": pod, "reason": "Pulled"})]


def test_helm_install_from_oci_pulls_the_operator_by_digest_and_serves_add_sub(
    kubeconfig: Path, kube: Kube, nodes: Any, namespace: str, registry: str, tmp_path: Path,
) -> None:
    staged = release.Release(release.version(), tmp_path)
    archive = next(i for i in images.build_all(log=lambda _: None) if i.ref == images.chart_operator_ref()).archive
    digest = release.push_image(archive, registry, staged.version)
    chart = release.push_chart(release.build_chart(staged), registry)
    assert chart == f"oci://{registry}/charts/triton-operator"
    repository = f"{registry}/{release.IMAGE_REPOSITORY}"
    ref = f"{repository}@{digest}"
    for name in nodes.names:  # nothing under the reference the pod runs: the kubelet must pull it
        assert ref not in images.containerd_images(nodes.real(name).containerd_address), name

    t0 = time.monotonic()
    with installed_from(kubeconfig, kube, chart, staged.version, namespace,
                        "--set", f"image.repository={repository}", "--set", f"image.digest={digest}") as op_ns:
        record("helm install from oci:// until the operator is ready (s)", round(time.monotonic() - t0, 1))
        (pod,) = [p for p in kube.items("Pod", op_ns, label_selector={"app.kubernetes.io/instance": RELEASE})
                  if not p["metadata"].get("deletionTimestamp")]
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "operator"]
        assert container["image"] == ref
        status = container_status(pod, "operator")
        assert status["imageID"] == ref, status
        pulled = pull_events(kube, op_ns, pod["metadata"]["name"])
        assert any(m.startswith(f'Successfully pulled image "{ref}"') for m in pulled), pulled
        record("operator image pulled from the local registry", next(m for m in pulled if m.startswith("Successfully")))
        assert ref in images.containerd_images(nodes.real(pod["spec"]["nodeName"]).containerd_address)

        apply(kubeconfig, namespace, add_sub())
        wait_model(kube, namespace, "add-sub", is_model_ready, "Ready", 300)
        # The replica's own containers from the operator's image (the `probe` beside tritonserver) run it by digest too.
        template = kube.get("Deployment", "add-sub", namespace)["spec"]["template"]["spec"]
        ours = [c["image"] for c in template.get("initContainers", []) + template["containers"]
                if c["name"] != "tritonserver"]
        assert ours and set(ours) == {ref}, ours
        ip = wait_for("a ready endpoint of add-sub", lambda: next(iter(ready_addresses(kube, namespace, "add-sub")),
                                                                   None), 30)
        assert infer_add_sub(f"{ip}:8001") == [11.0, 22.0, 33.0, 44.0]
        kube.delete("TritonModel", "add-sub", namespace)  # while its operator still runs
        wait_gone(kube, "TritonModel", namespace, "add-sub")
