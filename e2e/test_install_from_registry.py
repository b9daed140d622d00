"""The operator installed as the README tells a user: the chart from an OCI registry, the image pulled by digest (issue
42 item 2).

The other cluster tests preload the operator image into each node's containerd (`ctr import`); here nothing is preloaded
under the reference the pod runs. `tools/release.py` pushes the test clusters' operator archive (crane) and this
checkout's packaged chart (`helm push`) to go-containerregistry's registry on a free 127.0.0.1 port, in the network
namespace the nodes' containerd run in (the test's own: the nodes are processes of this machine). A bare pod of the
image is refused first: a node sends every registry it was not told of to a closed port (e2e/node.py). Then each node's
containerd is told that registry speaks plain HTTP through its `config_path` (`certs.d/<host:port>/hosts.toml`, read
at each pull: no restart), `helm install <release> oci://<registry>/charts/triton-operator --version <v>` with
`image.digest`, and the kubelet pulls `<registry>/triton-operator@sha256:...`: its events say "Successfully pulled",
the container's imageID is the pushed digest, and the operator it runs makes add-sub Ready and answer an inference.
containerd resolves the digest at the registry but fetches only blobs its content store lacks: the pushed archive is
the one the nodes preload under the chart's default reference, so its layers are there already (the pull takes
milliseconds; the README's install on a real cluster fetches them).

What the pod runs is that archive with one label added to its image config (`distinct_copy`, `crane mutate`): an image
of its own (another config digest, so another image ID), whose manifest and config blob the pull fetches. Pulled under
the archive's own digest, it would be the preloaded image by ID, and containerd 1.6's CRI image store then loses the
preloaded tag: seen on these nodes, after such a pull every pod naming `ghcr.io/triton-operator/triton-operator:0.1.0`
(the probe and fetch image of every other test's replicas) went to ErrImagePull, though containerd still listed that
reference; with the copy, the tag still runs after the pull and after the pulled reference is removed.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from e2e import images
from e2e.images import TRITON_REF
from e2e.kube import Kube, wait_for
from e2e.node_registry import forget_pulled, hosts_toml
from e2e.operator_fixtures import add_sub, apply, ensure_crd, helm, is_model_ready, record, wait_model
from e2e.testing import container_status, delete_namespace, ready_addresses, wait_gone
from e2e.traffic import infer_add_sub
from tools import release

pytestmark = pytest.mark.cluster

#: Not the session's `trop`: its own fullname, ServiceAccount, webhook configuration and admission policies.
RELEASE = "trop-oci"


def distinct_copy(registry: str, tag: str) -> str:
    """`<registry>/triton-operator:<tag>` with one label added to its config, pushed under the same tag; returns the
    copy's digest. The layers are the same; the image ID is not the preloaded image's (module docstring)."""
    crane = str(release.registry_bin() / "crane")
    ref = f"{registry}/{release.IMAGE_REPOSITORY}:{tag}"
    subprocess.run([crane, "mutate", "--insecure", "--label", "dev.triton-operator.e2e=pulled", ref, "-t", ref],
                   capture_output=True, text=True, check=True)
    return subprocess.run([crane, "digest", "--insecure", ref], capture_output=True, text=True,
                          check=True).stdout.strip()


@dataclass
class Registry:
    """The local registry at `address` (HOST:PORT on 127.0.0.1) and the nodes' containerd."""

    address: str
    nodes: Any
    dirs: list[Path] = field(default_factory=list)

    def tell_nodes(self) -> None:
        """Every node's containerd pulls from it over plain HTTP (`certs.d/<host:port>/hosts.toml`: read at each pull,
        no restart)."""
        for name in self.nodes.names:
            d = self.nodes.real(name).root / "certs.d" / self.address
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts.toml").write_text(hosts_toml(self.address))
            self.dirs.append(d)


@pytest.fixture
def registry(nodes: Any) -> Iterator[Registry]:
    """The local registry, not yet known to the nodes; before and after, no node holds a reference pulled from such a
    registry, and afterwards the nodes forget this one."""
    sockets = [nodes.real(name).containerd_address for name in nodes.names]  # skips on a cluster not of ours
    for socket in sockets:
        forget_pulled(socket)
    with release.local_registry() as address:
        handle = Registry(address, nodes)
        try:
            yield handle
        finally:
            for d in handle.dirs:
                shutil.rmtree(d, ignore_errors=True)
            for socket in sockets:
                forget_pulled(socket)


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
        delete_namespace(kube, op_ns, grace=1)


def pull_events(kube: Kube, namespace: str, pod: str) -> list[str]:
    """The kubelet's Pulled events of `pod`, their messages."""
    return [e.get("message") or "" for e in kube.items("Event", namespace, field_selector={
        "involvedObject.name": pod, "reason": "Pulled"})]


def preloaded_still_present(kube: Kube, namespace: str, node: str) -> str:
    """The kubelet's Pulled message for a bare pod, on `node`, of the reference every other test's replicas run (the
    preloaded operator image, by tag); the pod is deleted then. "already present" is what the tests after this one
    need: a pull of it goes to the closed port."""
    image = images.chart_operator_ref()
    pod = kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "preloaded", "namespace": namespace},
                       "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                                "containers": [{"name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
                                                "command": ["sleep", "60"]}]}})
    try:
        def said() -> str | None:
            events = kube.items("Event", namespace, field_selector={"involvedObject.uid": pod["metadata"]["uid"]})
            return next((e.get("message") or "" for e in events if e.get("reason") in ("Pulled", "Pulling", "Failed")),
                        None)

        return str(wait_for(f"the kubelet's word on {image} for pod preloaded", said, 60))
    finally:
        kube.delete("Pod", "preloaded", namespace, grace_period_seconds=0)


def refused_pull(kube: Kube, namespace: str, image: str) -> str:
    """The kubelet's message when a bare pod of `image` fails to pull it; the pod is deleted then."""
    pod = kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pull-refused", "namespace": namespace},
                       "spec": {"containers": [{"name": "c", "image": image}], "terminationGracePeriodSeconds": 0}})
    try:
        def failed() -> str | None:
            events = kube.items("Event", namespace, field_selector={"involvedObject.uid": pod["metadata"]["uid"]})
            said = [e.get("message") or "" for e in events if e.get("reason") in ("Failed", "Pulled")]
            return next((m for m in said if m.startswith(("Failed to pull image", "Successfully pulled"))), None)

        return str(wait_for(f"the kubelet's pull of {image} for pod pull-refused", failed, 60))
    finally:
        kube.delete("Pod", "pull-refused", namespace)


def test_helm_install_from_oci_pulls_the_operator_by_digest_and_serves_add_sub(
    kubeconfig: Path, kube: Kube, nodes: Any, registry: Registry, namespace: str, tmp_path: Path,
) -> None:
    # `registry` before `namespace`: the namespace, and the replicas running the pulled reference, go first.
    staged = release.Release(release.version(), tmp_path)
    archive = next(i for i in images.build_all(log=lambda _: None) if i.ref == images.chart_operator_ref()).archive
    release.push_image(archive, registry.address, staged.version)
    digest = distinct_copy(registry.address, staged.version)
    chart = release.push_chart(release.build_chart(staged), registry.address)
    assert chart == f"oci://{registry.address}/charts/triton-operator"
    repository = f"{registry.address}/{release.IMAGE_REPOSITORY}"
    ref = f"{repository}@{digest}"
    for name in nodes.names:  # nothing under the reference the pod runs: the kubelet must pull it
        assert ref not in images.containerd_images(nodes.real(name).containerd_address), name
    # Until a node is told of the registry, its pulls go to the closed port of every unknown registry (e2e/node.py):
    # what makes the pull below work is the hosts.toml, and nothing a node pulls leaves the machine.
    refused = refused_pull(kube, namespace, ref)
    assert "127.0.0.1:1:" in refused, refused
    registry.tell_nodes()

    t0 = time.monotonic()
    with installed_from(kubeconfig, kube, chart, staged.version, namespace,
                        "--set", f"image.repository={repository}", "--set", f"image.digest={digest}") as op_ns:
        record("helm install from oci:// until the operator is ready (s)", round(time.monotonic() - t0, 1))
        (pod,) = [p for p in kube.items("Pod", op_ns, label_selector={"app.kubernetes.io/instance": RELEASE})
                  if not p["metadata"].get("deletionTimestamp")]
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "operator"]
        assert container["image"] == ref
        status = container_status(pod, "operator")
        assert status["imageID"].rsplit("@", 1)[-1] == digest, status  # the image the container runs
        pulled = pull_events(kube, op_ns, pod["metadata"]["name"])
        assert any(m.startswith(f'Successfully pulled image "{ref}"') for m in pulled), pulled
        record("operator image pulled from the local registry", next(m for m in pulled if m.startswith("Successfully")))
        # containerd keeps what it pulled under the reference, at the pushed digest
        assert images.containerd_images(nodes.real(pod["spec"]["nodeName"]).containerd_address).get(ref) == digest

        apply(kubeconfig, namespace, add_sub())
        wait_model(kube, namespace, "add-sub", is_model_ready, "Ready", 300)
        # The replica's own containers from the operator's image (the `probe` beside tritonserver) run it by digest too.
        template = kube.get("Deployment", "add-sub", namespace)["spec"]["template"]["spec"]
        ours = [c["image"] for c in template.get("initContainers", []) + template["containers"]
                if c["name"] != "tritonserver"]
        assert ours and set(ours) == {ref}, ours
        ip = wait_for("a ready endpoint of add-sub", lambda: next(iter(ready_addresses(kube, namespace, "add-sub")),
                                                                   None), 30)
        np.testing.assert_array_equal(infer_add_sub(ip), [[11, 22, 33, 44]])
        # The node that pulled still runs the preloaded operator image by its tag, without a pull (module docstring).
        message = preloaded_still_present(kube, namespace, pod["spec"]["nodeName"])
        assert "already present on machine" in message, message
        kube.delete("TritonModel", "add-sub", namespace)  # while its operator still runs
        wait_gone(kube, "TritonModel", namespace, "add-sub")
