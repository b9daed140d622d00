"""spec.server's pod settings on the real node, and the `fetch` step's ambient credentials.

Two models fetch add-sub from a real S3 server (versitygw on a node's address) with no `credentialsSecret`:

- one from a private bucket, as a replica with a ServiceAccount gets credentials where no workload identity
  exists: the user's own Secret, through `spec.server.envFrom`, read by boto3's default chain (versitygw has no
  STS, so IRSA's web identity token cannot be exchanged here; tests/test_fetch_objectstores.py shows that path
  taken). It also carries every other pod setting, each checked on the pod the API server admitted;
- one from a public bucket with no credentials at all: requests go anonymous.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from e2e.kube import ApiError, Kube
from e2e.objectstores import S3Server
from e2e.operator_fixtures import OperatorHandle, add_sub, apply, is_model_ready, one_ready_pod, wait_model
from e2e.traffic import infer_add_sub

pytestmark = pytest.mark.cluster

MODEL_PY = add_sub()["spec"]["source"]["inline"]["model.py"]
API_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # noqa: S105 - a path, no secret


def _public_read(bucket: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:ListBucket"],
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]})


def _model(name: str, uri: str, **server: Any) -> dict:
    doc = add_sub(name)
    doc["spec"]["source"] = {"uri": uri}
    doc["spec"]["server"] = server
    return doc


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def test_pod_settings_and_ambient_s3_credentials_on_the_real_node(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any, tmp_path: Path) -> None:
    node_ip = nodes.real(nodes.names[0]).ip
    priority = f"{namespace}-inference"[:63]
    with S3Server(tmp_path / "s3", host=node_ip) as s3:
        client = s3.client()
        for bucket in ("private", "public"):
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="add-sub/model.py", Body=MODEL_PY.encode())
        client.put_bucket_policy(Bucket="public", Policy=_public_read("public"))
        endpoint = [{"name": "AWS_ENDPOINT_URL", "value": s3.endpoint}, {"name": "AWS_REGION", "value": s3.region},
                    # Neither pod is on EC2: keep boto3 from asking the instance metadata address, off this machine.
                    {"name": "AWS_EC2_METADATA_DISABLED", "value": "true"}]
        kube.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": priority, "labels": {"e2e.triton-operator.io/test": "true"}},
                     "value": 1000, "globalDefault": False})
        try:
            apply(kubeconfig, namespace,
                  {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "model-reader"}},
                  {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "aws-env"},
                   "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}},
                  {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "registry"},
                   "type": "kubernetes.io/dockerconfigjson",
                   "stringData": {".dockerconfigjson": json.dumps({"auths": {"registry.invalid": {"auth": "eDp5"}}})}},
                  _model("private-s3", "s3://private/add-sub", serviceAccountName="model-reader",
                         envFrom=[{"secretRef": {"name": "aws-env"}}], env=endpoint,
                         imagePullSecrets=[{"name": "registry"}], priorityClassName=priority,
                         podLabels={"team": "vision"}, podAnnotations={"example.com/cost-center": "cc-42"},
                         topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                     "whenUnsatisfiable": "ScheduleAnyway"}]),
                  _model("public-s3", "s3://public/add-sub", env=endpoint))
            for name in ("private-s3", "public-s3"):
                wait_model(kube, namespace, name, is_model_ready, "Ready", 180)
                pod = one_ready_pod(kube, namespace, name)
                np.testing.assert_array_equal(infer_add_sub(pod["status"]["podIP"], name),
                                              np.array([[11, 22, 33, 44]], dtype=np.float32))

            # Where fetch's credentials came from, in its own log.
            private, public = one_ready_pod(kube, namespace, "private-s3"), one_ready_pod(kube, namespace, "public-s3")
            assert "Found S3 credentials source=env" in nodes.container_log(private, "fetch")
            assert "Found no S3 credentials: requests go anonymous" in nodes.container_log(public, "fetch")

            # The pod the API server admitted: every setting, and no API token in any container.
            spec, meta = private["spec"], private["metadata"]
            assert spec["serviceAccountName"] == "model-reader"
            assert spec["automountServiceAccountToken"] is False
            assert spec["imagePullSecrets"] == [{"name": "registry"}]
            assert spec["priorityClassName"] == priority and spec["priority"] == 1000, "resolved by admission"
            assert spec["topologySpreadConstraints"][0]["labelSelector"] == {
                "matchLabels": {"serving.triton-operator.dev/model": "private-s3"}}
            assert meta["labels"]["team"] == "vision"
            assert meta["annotations"]["example.com/cost-center"] == "cc-42"
            for pod in (private, public):
                assert not [v for v in pod["spec"]["volumes"] if "projected" in v], "a token volume was mounted"
                for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
                    assert all(m["mountPath"] != API_TOKEN_DIR for m in c.get("volumeMounts", ())), c["name"]
            # env and envFrom reached tritonserver too (fetch's are proven by its fetch).
            environ = _environ(nodes.container_pid(private, "tritonserver"))
            assert environ["AWS_REGION"] == s3.region and environ["AWS_ACCESS_KEY_ID"] == s3.access_key
            assert environ["HOME"] == "/tmp"
            assert not Path(f"/proc/{nodes.container_pid(private, 'tritonserver')}/root{API_TOKEN_DIR}").exists()
        finally:
            for name in ("private-s3", "public-s3"):
                kube.delete("TritonModel", name, namespace)
            try:
                kube.delete("PriorityClass", priority)
            except ApiError:
                pass
