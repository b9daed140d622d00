"""A node's containerd and a local OCI registry (tools/release.py's): how a node is told of one, and how it forgets
what it pulled from one. Used by e2e/test_install_from_registry.py and e2e/test_upgrade.py."""

from __future__ import annotations

import re
import subprocess

from e2e import images
from tools import release


def hosts_toml(registry: str) -> str:
    """containerd's host configuration for `registry` (HOST:PORT): plain HTTP, for pulls and tag resolution only."""
    return (f'server = "http://{registry}"\n\n[host."http://{registry}"]\n'
            '  capabilities = ["pull", "resolve"]\n')


#: What a session pulled from its local registry (any port: a killed session's too), in a node's containerd.
PULLED = re.compile(rf"^127\.0\.0\.1:\d+/{release.IMAGE_REPOSITORY}[@:]")


def forget_pulled(socket: str) -> None:
    """Removes the references pulled from local registries from the containerd at `socket` (its root outlives the
    session; their layers are the preloaded image's, shared, and stay); a failure says so."""
    pulled = [r for r in images.containerd_images(socket) if PULLED.match(r)]
    if pulled:
        subprocess.run(["ctr", "--address", socket, "-n", "k8s.io", "images", "rm", *pulled],
                       capture_output=True, check=True)
        assert not [r for r in images.containerd_images(socket) if PULLED.match(r)], socket
