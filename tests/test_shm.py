"""A replica's /dev/shm (`spec.server.shmSize`): rendered as a memory-backed emptyDir, refused above the memory limit,
and the Python backend's own shm settings in server.args held to it. The live 200 MB response is
e2e/test_shm.py's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.documents import body, validation_errors
from triton_operator.api.v1alpha1 import SHM_SIZE_DEFAULT, TritonModel, quantity_bytes
from triton_operator.render.kubernetes import render_children
from triton_operator.render.modelconfig import render_repository
from triton_operator.validate import Document, check_documents
from triton_operator.validate.rules import python_shm_settings


def _pod(**server: Any) -> dict[str, Any]:
    model = TritonModel.model_validate(body(**server))
    kids = {c["kind"]: c for c in render_children(model, render_repository([model]), "uid", "ns")}
    return dict(kids["Deployment"]["spec"]["template"]["spec"])


def _shm(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    [volume] = [v for v in pod["volumes"] if v["name"] == "dshm"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    return volume, mount


@pytest.mark.parametrize(("server", "size"), [
    ({}, SHM_SIZE_DEFAULT),
    ({"shmSize": "256Mi"}, "256Mi"),
    ({"resources": {"limits": {"memory": "512Mi"}}}, "512Mi"),  # the default, capped at the memory limit
    ({"resources": {"limits": {"memory": "8Gi"}}}, SHM_SIZE_DEFAULT),
    ({"shmSize": "2Gi", "resources": {"limits": {"memory": "2Gi"}}}, "2Gi"),
])
def test_every_replica_gets_a_memory_backed_dev_shm_of_shm_size(server: dict[str, Any], size: str) -> None:
    pod = _pod(**server)
    volume, mount = _shm(pod)
    assert volume == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    assert mount == {"name": "dshm", "mountPath": "/dev/shm"}
    for c in pod["containers"][1:] + pod.get("initContainers", []):
        assert all(m["name"] != "dshm" for m in c.get("volumeMounts", ())), f"{c['name']} mounts /dev/shm"


def test_the_default_holds_a_batch_of_eight_1080p_rgb_images_in_fp32_in_and_out() -> None:
    """The Python backend's region holds a request's inputs and its response (measured on 2.51: one 200 MB response
    grew an instance's region to 192 MiB, fallocated). A step that takes the uint8 batch and returns it in FP32."""
    batch = 8 * 1080 * 1920 * 3
    assert quantity_bytes(SHM_SIZE_DEFAULT) >= batch + batch * 4 + (1 << 20)


def test_a_change_of_shm_size_makes_new_pods() -> None:
    def digest(**server: Any) -> str:
        model = TritonModel.model_validate(body(**server))
        dep = render_children(model, render_repository([model]), "uid", "ns")[1]
        return str(dep["spec"]["template"]["metadata"]["annotations"]["serving.triton-operator.dev/pod-digest"])

    assert digest() != digest(shmSize="2Gi")


@pytest.mark.parametrize(("server", "path", "message"), [
    ({"shmSize": "2Gi", "resources": {"limits": {"memory": "1Gi"}}}, "spec.server.shmSize",
     "above the tritonserver container's memory limit (spec.server.resources.limits.memory: 1Gi)"),
    ({"shmSize": "1.5G", "resources": {"limits": {"memory": "1Gi"}}}, "spec.server.shmSize", "above"),
    ({"shmSize": "512Ki"}, "spec.server.shmSize", "must be at least 1Mi"),
])
def test_shm_size_is_refused_above_the_memory_limit_and_below_1mi(server: dict[str, Any], path: str, message: str) -> None:
    errors = validation_errors(body(**server))
    assert [(e.path, e.rule) for e in errors] == [(path, "shm-size")], errors
    assert message in errors[0].message


def test_shm_size_at_the_memory_limit_and_the_capped_default_are_accepted() -> None:
    assert not validation_errors(body(shmSize="1Gi", resources={"limits": {"memory": "1Gi"}}))
    assert not validation_errors(body(resources={"limits": {"memory": "300Mi"}}))


def test_python_shm_settings_are_read_as_tritonserver_takes_them() -> None:
    args = ["--log-verbose=1", "--backend-config=python,shm-default-byte-size=4194304",
            "--backend-config", "python,shm-growth-byte-size=1048576",
            "--backend-config=onnxruntime,shm-default-byte-size=1", "--backend-config=python,stub-timeout-seconds=60"]
    assert python_shm_settings(args) == [(1, "shm-default-byte-size", "4194304"), (3, "shm-growth-byte-size", "1048576")]


@pytest.mark.parametrize(("args", "server", "message"), [
    # 2 instances (the body's CPU group) of 768 MiB each in the default 1 GiB
    (["--backend-config=python,shm-default-byte-size=805306368"], {},
     "for each of the replica's 2 Python model instance(s) is 1610612736 bytes, over /dev/shm's 1073741824 "
     "(spec.server.shmSize 1Gi, the default)"),
    (["--backend-config=python,shm-default-byte-size=67108864"], {"shmSize": "64Mi"}, "2 Python model instance(s)"),
    (["--backend-config=python,shm-growth-byte-size=134217728"], {"shmSize": "64Mi"},
     "every region growth would fail"),
    (["--backend-config=python,shm-default-byte-size=64MB"], {}, "takes a whole number of bytes"),
    (["--backend-config=python,shm-default-byte-size=4096"], {}, "must be at least 1048576"),
    (["--backend-config=python,shm-growth-byte-size=0"], {}, "must be more than 0"),
])
def test_python_shm_settings_that_contradict_shm_size_are_refused_naming_the_arg(
        args: list[str], server: dict[str, Any], message: str) -> None:
    errors = validation_errors(body(args=["--log-verbose=1", *args], **server))
    assert [(e.path, e.rule) for e in errors] == [("spec.server.args[1]", "shm-backend-config")], errors
    assert message in errors[0].message, errors[0].message


def test_python_shm_settings_that_fit_are_accepted() -> None:
    assert not validation_errors(body(args=["--backend-config=python,shm-default-byte-size=67108864",
                                            "--backend-config=python,shm-growth-byte-size=16777216"]))


def test_an_ensembles_replica_counts_the_python_instances_of_every_step() -> None:
    """Three steps of 2 instances each load in the ensemble's replica: 6 x 200 MiB is over its 1 GiB."""
    def step(name: str) -> dict[str, Any]:
        return body(name=name)

    ensemble = {
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": "e"},
        "spec": {"platform": "ensemble", "maxBatchSize": 4,
                 "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
                 "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
                 "server": {"args": ["--backend-config=python,shm-default-byte-size=209715200"]},
                 "ensemble": {"steps": [
                     {"model": "a", "inputMap": {"INPUT": "IN"}, "outputMap": {"OUTPUT": "T1"}},
                     {"model": "b", "inputMap": {"INPUT": "T1"}, "outputMap": {"OUTPUT": "T2"}},
                     {"model": "c", "inputMap": {"INPUT": "T2"}, "outputMap": {"OUTPUT": "OUT"}}]}}}
    loaded = check_documents([Document(f"d#{i}", b) for i, b in enumerate([step("a"), step("b"), step("c"), ensemble])])
    assert [(e.model, e.path, e.rule) for e in loaded.errors] == [
        ("TritonModel/e", "spec.server.args[0]", "shm-backend-config")], loaded.errors
    assert "6 Python model instance(s)" in loaded.errors[0].message
