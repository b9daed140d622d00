"""Install order: the operator starts before its CRD exists, as Helm, Argo CD and Flux may well do it.

A control plane of the test's own (no nodes: the TritonModel has no replicas), the chart's RBAC for a
namespaced install (`crds.enabled=false`, so no CRD), and the operator started as the chart's
ServiceAccount (a token from the TokenRequest API): it cannot watch CRDs, which is how kopf alone never
noticed a CRD created later. The CRD is applied 10 s after the operator started; the operator must
then serve TritonModels without a restart.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from e2e.cluster import REPO_ROOT, LocalCluster, free_port, session_root
from e2e.images import TRITON_REF
from e2e.kube import ApiError, Kube, wait_for
from e2e.operator_fixtures import CHART, CRDS, OPERATOR, helm, kubectl

pytestmark = pytest.mark.cluster

ROOT = session_root() / ".cluster" / "install-order"
TEAM = "team-a"


def _token_kubeconfig(kube: Kube, admin: Path, namespace: str, sa: str, out: Path) -> Path:
    token = kube.service_account_token(namespace, sa)
    cfg = json.loads(admin.read_text())
    cfg["users"] = [{"name": sa, "user": {"token": token}}]
    cfg["contexts"][0]["context"]["user"] = sa
    out.write_text(json.dumps(cfg))
    out.chmod(0o600)
    return out


def test_operator_started_before_its_crd_serves_tritonmodels_once_the_crd_exists(
        control_plane: LocalCluster, tmp_path: Path) -> None:
    admin = control_plane.kubeconfig
    kube = Kube(admin)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}})
    helm(admin, "install", "trop", str(CHART), "--namespace", "triton-system", "--create-namespace",
         "--set", "crds.enabled=false", "--set", "replicaCount=0", "--set", f"watch.namespaces={{{TEAM}}}")
    with pytest.raises(ApiError):  # no CRD yet
        kube.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/tritonmodels.serving.triton-operator.dev")
    as_chart = _token_kubeconfig(kube, admin, "triton-system", "trop-triton-operator", tmp_path / "operator.kubeconfig")

    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    log_path = control_plane.logs / "operator-install-order.log"
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(
            [str(OPERATOR), "run", "--kubeconfig", str(as_chart), "--namespace", TEAM, "--metrics-port", "0",
             "--liveness", liveness, "--drift-interval", "5", "--default-triton-image", TRITON_REF],
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
    try:
        wait_for("the operator waiting for its CRD", lambda: "Waiting for the TritonModel CRD" in log_path.read_text(),
                 60)
        with urllib.request.urlopen(liveness, timeout=5) as resp:
            assert resp.status == 200  # alive while it waits: the kubelet's liveness probe does not restart it
        time.sleep(10)  # the scenario itself: the CRD arrives 10 s after the operator started
        assert proc.poll() is None, log_path.read_text()
        for crd in CRDS:  # the TritonModel CRD, and the TritonPool CRD with it as the chart has them
            kubectl(admin, "apply", "--server-side", "-f", str(crd))
        wait_for("the operator finding its CRD", lambda: "Found the TritonModel CRD" in log_path.read_text(), 60)
        wait_for("the CRD's OpenAPI schema", lambda: kube.request(
            "GET", "/openapi/v3/apis/serving.triton-operator.dev/v1alpha1"), 60)
        model = {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
                 "metadata": {"name": "late", "namespace": TEAM},
                 "spec": {"replicas": 0, "backend": "python", "maxBatchSize": 8,
                          "inputs": [{"name": "x", "dataType": "FP32", "dims": [1]}],
                          "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
                          "source": {"inline": {"model.py": "class TritonPythonModel:\n    pass\n"}}}}
        kubectl(admin, "apply", "-f", "-", stdin=json.dumps(model))
        path = f"/apis/serving.triton-operator.dev/v1alpha1/namespaces/{TEAM}/tritonmodels/late"
        tm = wait_for("the TritonModel reconciled (status written, children created)", lambda: (
            t := kube.request("GET", path)).get("status", {}).get("observedGeneration") == 1 and t, 60)
        assert kube.get_or_none("Deployment", "late", TEAM) is not None, tm["status"]
        assert proc.poll() is None, "the operator restarted instead of picking the CRD up"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
