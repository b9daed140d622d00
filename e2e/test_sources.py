"""`spec.source.uri` on the real node: the `fetch` init container (our image, as 65532, read-only root) places a
model's files from a real source before tritonserver starts.

- `pvc://`: a PersistentVolume (hostPath, a directory on this machine, which is every node's) bound to a claim;
  the kubelet mounts the claim read-only into `fetch`.
- `s3://`: a real S3 server (versitygw, built from its Go module) listening on a node's address, with the
  credentials in a Secret, as the docs say (docs/howto/model-sources.md); a wrong credential surfaces on the TritonModel's status as
  Degraded, reason SourceFetchFailed, with fetch's own message.
- `https://` (issue 32): a presigned URL (its signature in the query) on a real HTTPS server on a node's address,
  whose archive unpacks past spec.server.fetch.maxBytes: fetch stops at the cap, and the status says so in fetch's
  line, the signature redacted everywhere but the pod's own args.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from e2e.cluster import session_root
from e2e.kube import ApiError, Kube, wait_for
from e2e.objectstores import S3Server
from e2e.operator_fixtures import (
    OperatorHandle,
    add_sub,
    apply,
    is_model_ready,
    load_examples,
    model_condition,
    model_pods,
    one_ready_pod,
    wait_model,
)
from e2e.traffic import infer_add_sub
from tests.https_server import serve

pytestmark = pytest.mark.cluster

VOLUMES = session_root() / ".cluster" / "volumes"


def _example(name: str) -> dict[str, dict]:
    """examples/sources/<name>.yaml's documents by kind."""
    return {d["kind"]: d for d in load_examples(f"sources/{name}")}


MODEL_PY = add_sub()["spec"]["source"]["inline"]["model.py"]


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
        docs = _example("pvc")
        model = docs["TritonModel"]["metadata"]["name"]
        _readable_dir(root / "models" / "add-sub")
        (root / "models" / "add-sub" / "model.py").write_text(MODEL_PY)
        (root / "models" / "add-sub" / "model.py").chmod(0o644)
        pv = f"{namespace}-store"
        kube.create({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv, "labels": {"e2e.triton-operator.io/test": "true"}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "hostPath": {"path": str(root), "type": "Directory"},
                     "claimRef": {"namespace": namespace, "name": docs["PersistentVolumeClaim"]["metadata"]["name"]}},
        })
        try:
            apply(kubeconfig, namespace, docs["PersistentVolumeClaim"])
            wait_for("the example's claim bound to the PersistentVolume", lambda: (
                kube.get("PersistentVolumeClaim", "model-store", namespace).get("status") or {}).get("phase") == "Bound", 60)
            apply(kubeconfig, namespace, docs["TritonModel"])
            _served(kube, namespace, model)
            pod = one_ready_pod(kube, namespace, model)
            claims = [v["persistentVolumeClaim"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
            assert claims == [{"claimName": "model-store", "readOnly": True}], claims
        finally:
            kube.delete("TritonModel", model, namespace)
            wait_for("the model's pods gone", lambda: not model_pods(kube, namespace, model), 120)
            kube.delete("PersistentVolumeClaim", "model-store", namespace)
            kube.delete("PersistentVolume", pv)
    finally:
        shutil.rmtree(VOLUMES / namespace, ignore_errors=True)


def test_a_model_fetched_from_s3_with_its_secret_and_a_wrong_secret_is_source_fetch_failed(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any, tmp_path: Path) -> None:
    """examples/sources/s3.yaml against versitygw on a node's address. First with a wrong secret key: the
    TritonModel says why (Degraded, SourceFetchFailed, fetch's line); with the right one, the kubelet's next try of
    `fetch` succeeds and the model serves, with no pod deleted by hand."""
    node_ip = nodes.real(nodes.names[0]).ip
    docs = _example("s3")
    model = docs["TritonModel"]["metadata"]["name"]
    bucket, _, prefix = docs["TritonModel"]["spec"]["source"]["uri"].removeprefix("s3://").partition("/")
    with S3Server(tmp_path / "s3", host=node_ip) as s3:
        client = s3.client()
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key=f"{prefix}/model.py", Body=MODEL_PY.encode())
        secret = docs["Secret"]
        secret["stringData"] = s3.env(secret_key="not-the-secret")  # noqa: S106 - wrong on purpose
        apply(kubeconfig, namespace, secret, docs["TritonModel"])
        tm = wait_model(kube, namespace, model, lambda tm: model_condition(tm, "Degraded").get("reason")
                        == "SourceFetchFailed", "Degraded, SourceFetchFailed", 120)
        message = model_condition(tm, "Degraded")["message"]
        assert f"fetch: s3://{bucket}/{prefix}: access denied (" in message, message
        assert "check the Secret named in credentialsSecret" in message, message
        assert model_condition(tm, "Ready")["status"] == "False"
        assert model_condition(tm, "Stalled")["status"] == "True"
        assert s3.secret_key not in json.dumps(tm), "a credential leaked into the TritonModel's status"
        [pod] = model_pods(kube, namespace, model)

        secret["stringData"] = s3.env()
        apply(kubeconfig, namespace, secret)
        # The kubelet retries the failed init container with back-off (10 s, 20 s, 40 s, ...): its env is read anew.
        _served(kube, namespace, model)
        [served] = model_pods(kube, namespace, model)
        assert served["metadata"]["uid"] == pod["metadata"]["uid"], "the pod was replaced instead of retried"
        tm = kube.get("TritonModel", model, namespace)
        assert model_condition(tm, "Degraded")["status"] == "False", model_condition(tm, "Degraded")


def _bomb(size: int) -> bytes:
    """A .tar.gz of a few KiB holding model.py and `size` bytes of zeros."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("model.py", MODEL_PY.encode()), ("zeros.bin", b"\0" * size)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_source_past_the_fetch_cap_is_source_fetch_failed_with_fetchs_line_and_no_secret(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any, tmp_path: Path) -> None:
    """A presigned https:// URL whose 8 KiB archive unpacks to 8 MiB, with spec.server.fetch.maxBytes 2Mi. The fetch
    init container (our image: Debian's Python 3.11, no tarfile data filter) trusts the test CA through
    SSL_CERT_FILE, pointing at a file of spec.modelFiles (in the ConfigMap it reads)."""
    node_ip = nodes.real(nodes.names[0]).ip
    signature = "e2e0SECRET0signature"
    name = "add-sub-capped"
    (tmp_path / "https").mkdir()
    gen = serve(tmp_path / "https", host=node_ip)
    https = next(gen)
    try:
        archive = _bomb(8 << 20)
        assert len(archive) < 64 << 10
        https["/add-sub.tar.gz"] = archive
        doc = add_sub(name)
        doc["spec"]["source"] = {"uri": https.url("/add-sub.tar.gz") + f"?X-Amz-Expires=600&X-Amz-Signature={signature}"}
        doc["spec"]["modelFiles"] = {"inline": {"ca.pem": https.ca_file.read_text()}}
        doc["spec"]["server"] = {"env": [{"name": "SSL_CERT_FILE", "value": f"/config/{name}/ca.pem"}],
                                 "fetch": {"maxBytes": "2Mi"}}
        apply(kubeconfig, namespace, doc)
        tm = wait_model(kube, namespace, name, lambda tm: model_condition(tm, "Degraded").get("reason")
                        == "SourceFetchFailed", "Degraded, SourceFetchFailed", 180)
        [pod] = model_pods(kube, namespace, name)
        degraded = model_condition(tm, "Degraded")
        assert degraded["status"] == "True", degraded
        assert degraded["message"] == (
            f"{pod['metadata']['name']}: fetch: https://{node_ip}:{https.port}/add-sub.tar.gz?<redacted>: more than "
            "2.0 MiB to write into the model repository (the cap: spec.server.fetch.maxBytes)"), degraded
        assert https.requests and https.requests[0].startswith("/add-sub.tar.gz?"), https.requests  # fetched, refused
        assert signature not in json.dumps(tm["status"]), "the signature leaked into the TritonModel's status"
        assert signature not in json.dumps(pod["status"]), "the signature leaked into the pod's status"
        # The refused fetch exits and the kubelet starts it again (an init container of a Deployment's pod), so the
        # line can be in the instance before the one running now (CI once read an empty log from a fresh restart).
        logs = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/log?container=fetch"

        def refused_fetch_log() -> str:
            found = ""
            for query in ("", "&previous=true"):
                try:
                    text = kube.request_text("GET", logs + query)
                except ApiError:  # no previous instance yet
                    continue
                assert signature not in text, text
                found = found or (text if "more than 2.0 MiB" in text else "")
            return found

        log = wait_for("the fetch container's log line of the refused fetch", refused_fetch_log, 60)
        assert "?<redacted>" in log and signature not in log, log
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["models"]["emptyDir"] == {"sizeLimit": "10Gi"} and volumes["tmp"]["emptyDir"] == {"sizeLimit": "4Gi"}
        [fetch] = pod["spec"]["initContainers"]
        assert fetch["resources"]["limits"]["memory"] == "256Mi", fetch["resources"]
    finally:
        kube.delete("TritonModel", name, namespace)
        wait_for("the model's pods gone", lambda: not model_pods(kube, namespace, name), 120)
        gen.close()
