"""What of an operator upgrade could reach a running replica without restarting tritonserver (issue 42 item 3, "or
better"): measured on the real node, not done by the operator.

Every replica runs the operator's image beside tritonserver (its `probe` container; its `fetch` init container), so a
new operator image changes every model's pod template, and a Deployment replaces every pod whose template changed.
A Pod's container images are among the few fields of a running pod the API server lets change: this test patches a
running replica's `probe` container to the operator's image under another tag (tagged on the node, no pull), as a
new operator version would, and follows what the kubelet does. Asserted: the probe container alone is replaced (a
new container ID on the new image), tritonserver keeps its container and its restart count (no cold start, its
models stay loaded), the replica's gate is True again and it serves; the Deployment keeps its ReplicaSet (no
rollout). Recorded, not asserted: how long the replica was out of its Service (a container of the pod restarting
makes the pod not Ready until it runs again) and the requests that failed through the Service meanwhile. The old
probe takes the pod's grace period to stop: on SIGTERM it keeps answering until tritonserver's port closes (what a
pod deletion needs), which here never happens, so the kubelet kills it at the end of the grace period.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from e2e.healing import answers, python_model, serving
from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad
from e2e.operator_fixtures import OperatorHandle, apply, gate, record
from e2e.testing import endpoint_ready
from triton_operator.api.pod import PROBE_CONTAINER, TRITON_CONTAINER

pytestmark = pytest.mark.cluster


def _status(pod: dict[str, Any], container: str) -> dict[str, Any]:
    return next((c for c in (pod.get("status") or {}).get("containerStatuses") or () if c["name"] == container), {})


def _image(pod: dict[str, Any], container: str) -> str:
    return next(c["image"] for c in pod["spec"]["containers"] if c["name"] == container)


def test_a_running_replicas_probe_takes_a_new_image_without_restarting_tritonserver(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, cluster: Any) -> None:
    if cluster.local is None:
        pytest.skip("needs this project's own local cluster (ctr on the nodes' containerd)")
    apply(kubeconfig, namespace, python_model("add-sub", replicas=2))
    pods = serving(kube, namespace, "add-sub", 2)
    pod = pods[0]
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    old = _image(pod, PROBE_CONTAINER)
    base = old.split("@")[0]
    new = f"{base.rsplit(':', 1)[0] if ':' in base.rsplit('/', 1)[-1] else base}:in-place-probe"
    for node in cluster.local.nodes():
        node.ctr("images", "tag", "--force", old, new)
    triton_before, probe_before = _status(pod, TRITON_CONTAINER), _status(pod, PROBE_CONTAINER)
    replicasets = {rs["metadata"]["name"] for rs in kube.items("ReplicaSet", namespace)}

    with ServiceLoad(kubeconfig, namespace, "add-sub", threads=2, rate=10) as load:
        wait_for("the load answered", lambda: load.tally().sent - load.tally().failed > 10, 60)
        before = load.tally()
        t0 = time.monotonic()
        kube.patch("Pod", name, {"spec": {"containers": [{"name": PROBE_CONTAINER, "image": new}]}}, namespace)
        out: list[float] = []
        back: list[float] = []

        def replaced() -> dict[str, Any] | None:
            now = time.monotonic() - t0
            here = endpoint_ready(kube, namespace, "add-sub", ip)
            if not here and not out:
                out.append(now)
            elif here and out and not back:
                back.append(now)
            p = kube.get("Pod", name, namespace)
            probe = _status(p, PROBE_CONTAINER)
            done = (probe.get("containerID") != probe_before.get("containerID") and probe.get("ready")
                    and gate(p).get("status") == "True" and here)
            return p if done else None
        after = wait_for("the probe replaced on the new image, the replica gated True and in its Service", replaced,
                         120, 0.05)
        took = time.monotonic() - t0
        wait_for("the replica answering", lambda: answers(ip, "add-sub"), 30)
        phase = load.tally() - before

    triton_after, probe_after = _status(after, TRITON_CONTAINER), _status(after, PROBE_CONTAINER)
    record("probe in place: a running replica's probe on a new image",
           f"probe replaced and the replica back in {took:.1f}s; out of the Service at "
           f"{out[0] if out else 'never'}s, back at {back[0] if back else '-'}s; {phase.failed} of {phase.sent} "
           f"requests failed through the Service; tritonserver restarts {triton_after.get('restartCount')}")
    assert _image(after, PROBE_CONTAINER) == new, after["spec"]["containers"]
    assert probe_after.get("containerID") != probe_before.get("containerID") and probe_after.get("ready"), probe_after
    assert triton_after.get("containerID") == triton_before.get("containerID"), (triton_before, triton_after)
    assert triton_after.get("restartCount") == triton_before.get("restartCount"), (triton_before, triton_after)
    assert "running" in (triton_after.get("state") or {}), triton_after
    assert {rs["metadata"]["name"] for rs in kube.items("ReplicaSet", namespace)} == replicasets, \
        "a ReplicaSet came or went: the Deployment rolled"
    assert kube.get_or_none("Pod", name, namespace) is not None
