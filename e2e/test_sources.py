"""`spec.source.uri` on the real node: the `fetch` init container (our image, as 65532, read-only root) places a
model's files from a real source before tritonserver starts.

- `pvc://`: a PersistentVolume (hostPath, a directory on this machine, which is every node's) bound to a claim;
  the kubelet mounts the claim read-only into `fetch`.
- `s3://`: a real S3 server (versitygw, built from its Go module) listening on a node's address, with the
  credentials in a Secret, as the README says; a wrong credential surfaces on the TritonModel's status as
  Degraded, reason SourceFetchFailed, with fetch's own message.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from e2e.cluster import REPO_ROOT
from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import OperatorHandle, is_model_ready, model_pods, wait_model
from e2e.test_operator import add_sub, apply, infer_add_sub, one_ready_pod

pytestmark = pytest.mark.cluster

VOLUMES = REPO_ROOT / ".cluster" / "volumes"


def _uri_model(name: str, uri: str, **source: str) -> tuple[dict, str]:
    """add-sub with its model.py behind `uri` instead of inline; also returns that model.py."""
    doc = add_sub(name)
    model_py = doc["spec"]["source"]["inline"]["model.py"]
    doc["spec"]["source"] = {"uri": uri, **source}
    return doc, model_py


def _readable_dir(path: Path) -> Path:
    """A directory the fetch container (uid 65532) can read, with every parent up to VOLUMES searchable."""
    path.mkdir(parents=True, exist_ok=True)
    for p in [path, *path.relative_to(VOLUMES).parents]:
        (VOLUMES / p if p != path else p).chmod(0o755)
    return path


def _served(kube: Kube, namespace: str, name: str) -> None:
    tm = wait_model(kube, namespace, name, is_model_ready, "Ready", 180)
    assert tm["status"]["configDigest"]
    pod = one_ready_pod(kube, namespace, name)
    got = infer_add_sub(pod["status"]["podIP"], name)
    np.testing.assert_array_equal(got, np.array([[11, 22, 33, 44]], dtype=np.float32))


def test_a_model_fetched_from_a_pvc_bound_to_a_hostpath_volume_is_served(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: object) -> None:
    root = _readable_dir(VOLUMES / namespace / "store")
    try:
        doc, model_py = _uri_model("from-pvc", "pvc://model-store/models/add-sub")
        _readable_dir(root / "models" / "add-sub")
        (root / "models" / "add-sub" / "model.py").write_text(model_py)
        (root / "models" / "add-sub" / "model.py").chmod(0o644)
        pv = f"{namespace}-store"
        kube.create({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv, "labels": {"e2e.triton-operator.io/test": "true"}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "hostPath": {"path": str(root), "type": "Directory"},
                     "claimRef": {"namespace": namespace, "name": "model-store"}},
        })
        try:
            kube.create({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "model-store", "namespace": namespace},
                "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                         "resources": {"requests": {"storage": "1Gi"}}},
            })
            wait_for("the claim bound to the PersistentVolume", lambda: (
                kube.get("PersistentVolumeClaim", "model-store", namespace).get("status") or {}).get("phase") == "Bound", 60)
            apply(kubeconfig, namespace, doc)
            _served(kube, namespace, "from-pvc")
            pod = one_ready_pod(kube, namespace, "from-pvc")
            claims = [v["persistentVolumeClaim"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
            assert claims == [{"claimName": "model-store", "readOnly": True}], claims
        finally:
            kube.delete("TritonModel", "from-pvc", namespace)
            wait_for("the model's pods gone", lambda: not model_pods(kube, namespace, "from-pvc"), 120)
            kube.delete("PersistentVolumeClaim", "model-store", namespace)
            kube.delete("PersistentVolume", pv)
    finally:
        shutil.rmtree(VOLUMES / namespace, ignore_errors=True)
