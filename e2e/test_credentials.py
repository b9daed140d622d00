"""The operator's own API client and credential loader (issue 17: no `kubernetes` package in the operator process)
against a real kube-apiserver: `triton-operator run` with a kubeconfig whose user is a client certificate given as
`-data` (the admin's), then an `exec` credential plugin (a real script printing a ServiceAccount's token). Each time
kopf's watches (our login handler's credentials) and our own writes must work: a TritonModel is reconciled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.cluster import REPO_ROOT, LocalCluster, session_root
from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import CRD, OPERATOR, _crd_established, kubectl

pytestmark = pytest.mark.cluster

ROOT = session_root() / ".cluster" / "credentials"
TEAM = "team-c"


def _exec_kubeconfig(kube: Kube, admin: Path, out: Path) -> Path:
    """A kubeconfig whose user is an exec plugin (relative to the kubeconfig's directory) printing the token of a
    ServiceAccount bound to cluster-admin."""
    token = kube.service_account_token("default", "default")
    kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "exec-user"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "default"}]})
    plugin = out.parent / "bin" / "get-token"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": token, "expirationTimestamp": "2099-01-01T00:00:00Z"}}
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(0o700)
    cfg = json.loads(admin.read_text())
    cfg["users"] = [{"name": "exec", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                       "command": "./bin/get-token"}}}]
    cfg["contexts"][0]["context"]["user"] = "exec"
    out.write_text(json.dumps(cfg))
    out.chmod(0o600)
    return out


def _model(name: str) -> dict:
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
            "metadata": {"name": name, "namespace": TEAM},
            "spec": {"replicas": 0, "backend": "python", "maxBatchSize": 8,
                     "inputs": [{"name": "x", "dataType": "FP32", "dims": [1]}],
                     "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
                     "source": {"inline": {"model.py": "class TritonPythonModel:\n    pass\n"}}}}


def test_the_operator_runs_with_client_certificate_data_and_with_an_exec_plugin(
        control_plane: LocalCluster, tmp_path: Path) -> None:
    admin = control_plane.kubeconfig
    kube = Kube(admin)
    kubectl(admin, "apply", "--server-side", "-f", str(CRD))
    wait_for("CRD tritonmodels Established", lambda: _crd_established(kube), 30)
    wait_for("the CRD's OpenAPI schema", lambda: kube.request(
        "GET", "/openapi/v3/apis/serving.triton-operator.dev/v1alpha1"), 60)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}})
    assert "client-certificate-data" in json.loads(admin.read_text())["users"][0]["user"]
    configs = {"cert": admin, "exec": _exec_kubeconfig(kube, admin, tmp_path / "exec" / "kubeconfig")}
    for name, kubeconfig in configs.items():
        log_path = control_plane.logs / f"operator-credentials-{name}.log"
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(
                [str(OPERATOR), "run", "--kubeconfig", str(kubeconfig), "--namespace", TEAM, "--metrics-port", "0",
                 "--liveness", "", "--drift-interval", "5"],
                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
        try:
            kubectl(admin, "apply", "-f", "-", stdin=json.dumps(_model(name)))
            path = f"/apis/serving.triton-operator.dev/v1alpha1/namespaces/{TEAM}/tritonmodels/{name}"
            wait_for(f"TritonModel {name} reconciled (a watch event, our writes)", lambda path=path: kube.request(
                "GET", path).get("status", {}).get("observedGeneration") == 1, 60)
            assert kube.get_or_none("Deployment", name, TEAM) is not None
            assert proc.poll() is None, log_path.read_text()
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log = log_path.read_text()
        assert "_login' succeeded" in log, log
        assert "Traceback" not in log, log
