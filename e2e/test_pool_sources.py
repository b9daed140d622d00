"""A pooled model whose files are at an https:// uri (issue 29), on the real node: the pool replica's `fetch-server`
sidecar (our image, as 65532, read-only root) fetches them into the replica's repository volume on the operator's
request, checked against the sha256 pin, and the operator loads the model from there with its config alone.

The HTTPS server runs on a node's address with a certificate signed by the cluster's CA, which every pod trusts
through its service account's `ca.crt` (the pool sets automountServiceAccountToken and points SSL_CERT_FILE there,
in its spec.server: credentials and trust for a pool's fetches come from the pool). Throughout, `e2e.pool.PoolAudit`
checks that the model's slice lists the replica only while Triton has it READY at the desired digest: at the first
load (beside a model at an s3:// uri pinned to its objectVersion, on a real S3 server, versitygw, with the pool's
credentials from a Secret through its envFrom), across an update of its pin (swapped in place), and while a wrong
sha256 is refused (SourceFetchFailed, naming the field and the uri, with an Event; the served copy stays). Deleted,
the models' files leave the volume: the sidecar, asked with the pool's key, holds nothing of them.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from e2e.cluster import session_root
from e2e.inplace import ADD_SUB_PY
from e2e.kube import Kube, wait_for
from e2e.objectstores import S3Server
from e2e.operator_fixtures import OperatorHandle, apply, kubectl, model_condition, record
from e2e.pool import PoolAudit, model_ready, pool_doc, pooled_add_sub, replica_pods, served_digest
from e2e.testing import routed
from e2e.traffic import infer_add_sub
from tests.https_server import serve
from triton_operator.api.pod import FETCH_SERVER_PORT, KEY_HEADER

pytestmark = pytest.mark.cluster

POOL = "fetching"
MODEL = "fetched-add-sub"
S3_MODEL = "s3-add-sub"
SA_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"


def _archive(comment: str) -> bytes:
    """add-sub's model.py in a .tar.gz, with a comment that makes each archive (and its sha256) its own."""
    code = f"# {comment}\n{ADD_SUB_PY}".encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("model.py")
        info.size = len(code)
        tar.addfile(info, io.BytesIO(code))
    return buf.getvalue()


def _model(uri: str, sha: str) -> dict[str, Any]:
    doc = pooled_add_sub(MODEL, POOL)
    doc["spec"]["source"] = {"uri": uri, "sha256": sha}
    return doc


def _ready(kube: Kube, namespace: str, name: str, timeout: float) -> dict[str, Any]:
    return wait_for(f"{name} Ready", lambda: _when(kube.get_or_none("TritonModel", name, namespace), model_ready),
                    timeout, 0.5)


def _when(value: Any, ok: Any) -> Any:
    """`value` when `ok(value)`, else None (a wait_for probe)."""
    return value if value is not None and ok(value) else None


def _sidecar_holds(kube: Kube, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """What the replica's fetch-server sidecar says it holds, asked at the pod's IP with the pool's key."""
    [sidecar] = [c for c in pod["spec"]["containers"] if c["name"] == "fetch-server"]
    [ref] = [e["valueFrom"]["secretKeyRef"] for e in sidecar["env"] if "valueFrom" in e]
    key = base64.b64decode(kube.get("Secret", ref["name"], namespace)["data"][ref["key"]]).decode()
    req = urllib.request.Request(f"http://{pod['status']['podIP']}:{FETCH_SERVER_PORT}/v1/models",
                                 headers={KEY_HEADER: key})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - a pod of this test's cluster
        return dict(json.loads(resp.read())["models"])


def test_a_pooled_https_model_is_fetched_swapped_in_place_refused_on_a_wrong_pin_and_freed(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any, tmp_path: Path) -> None:
    node_ip = nodes.real(nodes.names[0]).ip
    pki = session_root() / ".cluster" / "pki"
    (tmp_path / "https").mkdir()
    gen = serve(tmp_path / "https", host=node_ip, ca_files=(pki / "ca.crt", pki / "ca.key"))
    https = next(gen)
    s3 = S3Server(tmp_path / "s3", host=node_ip)
    s3.start()
    try:
        one, two = _archive("one"), _archive("two")
        https["/one.tgz"], https["/two.tgz"] = one, two
        # An s3:// object pinned to its version, read with the pool's credentials (a Secret through envFrom).
        client = s3.client()
        client.create_bucket(Bucket="models")
        client.put_bucket_versioning(Bucket="models", VersioningConfiguration={"Status": "Enabled"})
        version = client.put_object(Bucket="models", Key="add-sub.tgz", Body=_archive("s3"))["VersionId"]
        client.put_object(Bucket="models", Key="add-sub.tgz", Body=b"a later object, not the pinned one")
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pool-s3"}, "stringData": s3.env()}
        pool = pool_doc(POOL, 1, "512Mi")
        pool["spec"]["server"] |= {"automountServiceAccountToken": True,
                                   "env": [{"name": "SSL_CERT_FILE", "value": SA_CA}],
                                   "envFrom": [{"secretRef": {"name": "pool-s3"}}]}
        apply(kubeconfig, namespace, secret, pool)
        with PoolAudit(kube, namespace, min_samples=10) as audit:
            s3_doc = pooled_add_sub(S3_MODEL, POOL)
            s3_doc["spec"]["source"] = {"uri": "s3://models/add-sub.tgz", "objectVersion": version}
            apply(kubeconfig, namespace, _model(https.url("/one.tgz"), hashlib.sha256(one).hexdigest()), s3_doc)
            tm = _ready(kube, namespace, MODEL, 240)
            _ready(kube, namespace, S3_MODEL, 120)
            s3_service = routed(kube, namespace, S3_MODEL)
            np.testing.assert_array_equal(infer_add_sub(s3_service, S3_MODEL), np.array([[11, 22, 33, 44]], np.float32))
            first = tm["status"]["configDigest"]
            [pod] = replica_pods(kube, namespace, POOL)
            ip = pod["status"]["podIP"]
            assert served_digest(ip, MODEL) == first
            service = routed(kube, namespace, MODEL)
            np.testing.assert_array_equal(infer_add_sub(service, MODEL), np.array([[11, 22, 33, 44]], np.float32))
            assert _sidecar_holds(kube, namespace, pod)[MODEL]["digest"] == first
            assert "/one.tgz" in https.requests

            # a new pin: fetched beside the served copy, then swapped in place
            apply(kubeconfig, namespace, _model(https.url("/two.tgz"), hashlib.sha256(two).hexdigest()))
            second = wait_for("a new digest", lambda: _when(kube.get("TritonModel", MODEL, namespace)["status"].get(
                "configDigest"), lambda d: d not in (None, first)), 60)
            wait_for("the replica READY at the new digest", lambda: served_digest(ip, MODEL) == second, 120, 0.5)
            wait_for(f"{MODEL} Ready at the new digest", lambda: model_ready(
                kube.get("TritonModel", MODEL, namespace)), 60, 0.5)
            np.testing.assert_array_equal(infer_add_sub(service, MODEL), np.array([[11, 22, 33, 44]], np.float32))
            held = _sidecar_holds(kube, namespace, pod)[MODEL]
            assert held["digest"] == second, held

            # a wrong sha256: refused by name, the served copy left alone
            https["/three.tgz"] = _archive("three")
            uri = https.url("/three.tgz") + "?token=e2e0SECRET"
            apply(kubeconfig, namespace, _model(uri, "0" * 64))
            tm = wait_for("SourceFetchFailed", lambda: _when(kube.get("TritonModel", MODEL, namespace), lambda t: (
                model_condition(t, "Degraded").get("reason") == "SourceFetchFailed")), 120, 0.5)
            degraded = model_condition(tm, "Degraded")
            assert degraded["status"] == "True", degraded
            assert "spec.source.uri: " in degraded["message"], degraded
            assert f"https://{node_ip}:{https.port}/three.tgz?<redacted>" in degraded["message"], degraded
            assert "sha256 mismatch" in degraded["message"] and "e2e0SECRET" not in json.dumps(tm["status"]), degraded
            record("pool sources: a wrong sha256", degraded["message"])
            assert model_condition(tm, "Ready")["status"] == "True", "the copy at the previous pin still serves"
            assert served_digest(ip, MODEL) == second
            np.testing.assert_array_equal(infer_add_sub(service, MODEL), np.array([[11, 22, 33, 44]], np.float32))
            events = [e for e in kube.items("Event", namespace) if e["involvedObject"].get("name") == MODEL
                      and e.get("reason") == "SourceFetchFailed"]
            assert events, "no SourceFetchFailed Event on the model"
            held = _sidecar_holds(kube, namespace, pod)[MODEL]
            assert held["digest"] == second and held["failed"]["message"].startswith("spec.source.uri: "), held

            # deleted: unloaded, and their files gone from the volume
            kubectl(kubeconfig, "delete", "-n", namespace, "tritonmodel", MODEL, S3_MODEL, "--wait=true")
            wait_for("the models unloaded", lambda: served_digest(ip, MODEL) is None
                     and served_digest(ip, S3_MODEL) is None, 60, 0.5)
            wait_for("their files gone from the replica's volume", lambda: not _sidecar_holds(
                kube, namespace, pod), 60, 0.5)
        record("pool sources: audit", audit.summary())
        kubectl(kubeconfig, "delete", "-n", namespace, "tritonpool", POOL, "--wait=true")
    finally:
        s3.stop()
        gen.close()
