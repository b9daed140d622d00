"""`spec.server.shmSize` on the real node: a Python model whose response is 200 MB answers through its Service's
ClusterIP (kube-proxy), and the replica's /dev/shm, read in the tritonserver container's own mount namespace, is a
tmpfs of the configured size through which the response went. The same model with a 64 MiB /dev/shm (the container
runtime's default size) fails that request with the Python backend's own message: the size is what decides.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import OperatorHandle, apply, is_model_ready, one_ready_pod, record, wait_model
from triton_operator.api.v1alpha1 import SHM_SIZE_DEFAULT, quantity_bytes

pytestmark = pytest.mark.cluster

#: 50 million INT32: 200 MB, a batch of eight 1080p RGB images in FP32.
ELEMENTS = 50_000_000
MODEL_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.arange(n, dtype=np.int32))]))
        return responses
"""


def big_model(name: str, **server: Any) -> dict:
    """A Python model that returns `N` INT32 counting from 0: every byte of the response is checked."""
    return {
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": name},
        "spec": {
            "backend": "python", "batching": False,
            "inputs": [{"name": "N", "dataType": "INT64", "dims": [1]}],
            "outputs": [{"name": "OUT", "dataType": "INT32", "dims": [-1]}],
            "instanceGroups": [{"kind": "CPU", "count": 1}],
            "source": {"inline": {"model.py": MODEL_PY}},
            "server": {"resources": {"limits": {"memory": "3Gi"}}, **server},
        },
    }


def infer(address: str, model: str, n: int) -> np.ndarray:
    client = grpcclient.InferenceServerClient(f"{address}:8001")
    try:
        inp = grpcclient.InferInput("N", [1], "INT64")
        inp.set_data_from_numpy(np.array([n], dtype=np.int64))
        return client.infer(model, [inp], client_timeout=300).as_numpy("OUT")
    finally:
        client.close()


def through_cluster_ip(kube: Kube, namespace: str, model: str, n: int) -> np.ndarray:
    """One request to the Service's ClusterIP, once kube-proxy has its ready endpoint (its rule sync runs at most
    once a second, so the first connections may be refused)."""
    ip = kube.get("Service", model, namespace)["spec"]["clusterIP"]

    def attempt() -> bool:
        try:
            np.testing.assert_array_equal(infer(ip, model, 3), [0, 1, 2])
            return True
        except InferenceServerException as exc:
            if "Connection refused" in str(exc) or "No route to host" in str(exc):
                return False
            raise

    wait_for(f"kube-proxy to send {model}'s ClusterIP to its endpoint", attempt, 60, 0.2)
    return infer(ip, model, n)


def dev_shm(pid: int) -> tuple[str, str, int, int]:
    """/dev/shm as the process `pid` sees it: (fs type, mount options, size, bytes used)."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/dev/shm":
            sep = fields.index("-")
            fstype, super_options = fields[sep + 1], fields[sep + 3]
            st = os.statvfs(f"/proc/{pid}/root/dev/shm")
            return fstype, super_options, st.f_blocks * st.f_frsize, (st.f_blocks - st.f_bfree) * st.f_frsize
    raise AssertionError(f"no /dev/shm in the mount namespace of pid {pid}")


def test_a_200_mb_python_response_passes_through_the_service_and_dev_shm_has_its_size(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any) -> None:
    apply(kubeconfig, namespace, big_model("big"), big_model("small-shm", shmSize="64Mi"))
    for name in ("big", "small-shm"):
        wait_model(kube, namespace, name, is_model_ready, "Ready", 300)
    pod = one_ready_pod(kube, namespace, "big")
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": SHM_SIZE_DEFAULT}

    # /dev/shm in the tritonserver container's own mount namespace: the kubelet's tmpfs, at the size asked.
    pid = nodes.container_pid(pod, "tritonserver")
    fstype, options, size, used_before = dev_shm(pid)
    assert fstype == "tmpfs", (fstype, options)
    assert size == quantity_bytes(SHM_SIZE_DEFAULT), (size, options)
    assert f"size={quantity_bytes(SHM_SIZE_DEFAULT) // 1024}k" in options.split(","), options

    t0 = time.monotonic()
    out = through_cluster_ip(kube, namespace, "big", ELEMENTS)
    took = time.monotonic() - t0
    assert out.nbytes == 200_000_000 and out.dtype == np.int32
    np.testing.assert_array_equal(out, np.arange(ELEMENTS, dtype=np.int32))
    record("200 MB Python response through the ClusterIP (default shmSize)", f"{took:.1f}s")
    # The response went through this tmpfs: the stub's region grew to hold it, and stays grown.
    _, _, _, used_after = dev_shm(pid)
    assert used_after - used_before >= 190 * 2**20, (used_before, used_after)
    record("/dev/shm used by the Python backend after a 200 MB response", f"{used_after / 2**20:.0f} MiB")

    # The runtime's default size fails that request, with the Python backend's own reason: the size decides.
    small = one_ready_pod(kube, namespace, "small-shm")
    _, _, small_size, _ = dev_shm(nodes.container_pid(small, "tritonserver"))
    assert small_size == 64 * 2**20
    with pytest.raises(InferenceServerException, match="Failed to increase the shared memory pool size"):
        through_cluster_ip(kube, namespace, "small-shm", ELEMENTS)
