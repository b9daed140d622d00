"""`make release-push` against a real OCI registry (issue 42 item 2): go-containerregistry's registry, built from its
Go module (e2e/toolchain/registry), on a free 127.0.0.1 port.

The push is tools/release.py's own (crane for the image, `helm push` for the chart); what it wrote is then read
back by other clients: the manifest by plain HTTP (its sha256 is the digest the archive's index names) and the
chart by `helm pull` (byte for byte the packaged file). The image is the test clusters' operator archive (the
release's is the same Dockerfile built with SOURCE_DATE_EPOCH: building it here would add a build to each commit's
run); the chart is packaged from this checkout. Marked `cluster`: it needs the Go-built registry and helm, which
`make prebuild` builds, though no cluster.
"""

from __future__ import annotations

import hashlib
import subprocess
import urllib.request
from pathlib import Path

import pytest

from e2e import images
from tools import release

pytestmark = pytest.mark.cluster

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> release.Release:
    """dist/ as `make release` lays it out, for the image and the chart: the operator archive and `helm package`."""
    dist = tmp_path_factory.mktemp("dist")
    staged = release.Release(release.version(), dist)
    operator = next(i for i in images.build_all(log=lambda _: None) if i.ref == images.chart_operator_ref())
    release.place(operator.archive, staged.image)
    release.build_chart(staged)
    return staged


def manifest(registry: str, repository: str, reference: str) -> bytes:
    request = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{reference}",
                                     headers={"Accept": OCI_MANIFEST})
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
        return bytes(response.read())


def test_push_then_pull_back(staged: release.Release, tmp_path: Path) -> None:
    want = images.archive_digest(staged.image)
    with release.local_registry() as registry:
        assert registry.startswith("127.0.0.1:")
        assert release.push(staged, registry) == want
        by_tag = manifest(registry, release.IMAGE_REPOSITORY, staged.version)
        assert "sha256:" + hashlib.sha256(by_tag).hexdigest() == want
        assert manifest(registry, release.IMAGE_REPOSITORY, want) == by_tag
        pulled = release.pull_chart(registry, staged.version, tmp_path)
        assert pulled.read_bytes() == staged.chart.read_bytes()


def test_the_registry_listens_on_loopback_only() -> None:
    binary = release.registry_bin() / "local-registry"
    refused = subprocess.run([binary, "-addr", "0.0.0.0:0"], capture_output=True, text=True, timeout=30, check=False)
    assert refused.returncode != 0 and "only a loopback IP address" in refused.stderr
