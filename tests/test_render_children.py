"""Pure rendering of a TritonModel's Kubernetes children (`render.kubernetes`): shape, rollout triggers,
the repository ConfigMap and its limit, sources and credentials."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tests.documents import _uri_ensemble, _uri_model
from triton_operator.api.pod import ANNOTATION_DIGEST, WARMED_CONDITION
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.files import load_paths
from triton_operator.render.kubernetes import CONFIGMAP_LIMIT, Options, RepositoryTooLarge, render_children
from triton_operator.render.modelconfig import render_repository
from triton_operator.validate import check_documents

ROOT = Path(__file__).resolve().parent.parent
UID = "00000000-0000-0000-0000-000000000001"


def _model(name: str = "m", **spec: object) -> TritonModel:
    body = {
        "apiVersion": "serving.triton-operator.dev/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {"backend": "python", "source": {"inline": {"model.py": "pass\n"}}, **spec},
    }
    return TritonModel.model_validate(body)


def _children(model: TritonModel, others: list[TritonModel] = ()) -> dict[str, dict]:  # type: ignore[assignment]
    rendered = render_repository([model, *others])
    return {c["kind"]: c for c in render_children(model, rendered, UID, "ns")}


def test_children_and_owner_references() -> None:
    kids = _children(_model(replicas=1))
    assert set(kids) == {"ConfigMap", "Deployment", "Service"}, "no PodDisruptionBudget for a single replica"
    for c in kids.values():
        (ref,) = c["metadata"]["ownerReferences"]
        assert ref["kind"] == "TritonModel" and ref["uid"] == UID and ref["controller"] is True
    assert "PodDisruptionBudget" in _children(_model(replicas=3))


def test_without_the_gate_tritons_own_readiness_admits_the_replica() -> None:
    pod = _children(_model(warmupGate={"enabled": False}))["Deployment"]["spec"]["template"]["spec"]
    assert "readinessGates" not in pod
    (triton,) = pod["containers"]
    assert triton["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert triton["readinessProbe"]["periodSeconds"] == 1
    # ... and the startup probe holds liveness off while the model loads.
    assert triton["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["startupProbe"]["failureThreshold"] * triton["startupProbe"]["periodSeconds"] >= 600
    assert "initialDelaySeconds" not in triton["livenessProbe"]


def test_deployment_shape() -> None:
    m = _model(replicas=2, responseCache=True, server={"gpus": 2, "cacheSize": "32Mi", "args": ["--log-verbose=1"]})
    dep = _children(m)["Deployment"]
    spec = dep["spec"]
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    assert pod["readinessGates"] == [{"conditionType": WARMED_CONDITION}]
    triton, probe = pod["containers"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert {p["containerPort"] for p in triton["ports"]} == {8000, 8001, 8002}
    # The gate admits the replica; the container's readiness (tritonserver's port open: it opens it only once its
    # models are loaded) keeps a restarted one out. The `probe` container answers it, holding each probe until
    # tritonserver's HTTP port opens. No startup probe: its success is a kubelet sync next to READY.
    assert triton["readinessProbe"] == {"httpGet": {"path": "/ready", "port": 8090}, "periodSeconds": 1,
                                        "timeoutSeconds": 10, "failureThreshold": 1}
    assert probe["name"] == "probe"
    assert spec["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "tritonserver"
    assert probe["args"] == ["probe", "--listen", ":8090", "--target", "127.0.0.1:8000", "--hold", "8",
                             "--gate-settle", "0.03", "--head-start", "0.5", "--repository", "/models",
                             "--fail-threshold", "3", "--model", m.triton_name]
    off = _children(_model(warmupGate={"failedRequestThreshold": 0}))["Deployment"]["spec"]["template"]["spec"]
    assert off["containers"][1]["args"][off["containers"][1]["args"].index("--fail-threshold") + 1] == "0", \
        "warmupGate.failedRequestThreshold reaches the probe"
    assert pod["shareProcessNamespace"] is True, "the probe watches the Python stubs"
    assert probe["image"] == Options().operator_image  # the operator's image, as the fetch step's
    assert probe["ports"] == [{"name": "probe", "containerPort": 8090, "protocol": "TCP"}]
    assert "nvidia.com/gpu" not in probe["resources"].get("limits", {})
    assert probe["securityContext"]["readOnlyRootFilesystem"] is True
    assert "startupProbe" not in triton
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["livenessProbe"]["initialDelaySeconds"] == 600
    args = triton["args"]
    assert "--model-control-mode=explicit" in args and "--load-model=m" in args
    assert "--strict-readiness=true" in args
    # Graceful termination: serve through a preStop sleep, then drain on SIGTERM, all inside the grace period.
    assert triton["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert "--exit-timeout-secs=20" in args
    assert pod["terminationGracePeriodSeconds"] == 30
    assert f"--cache-config=local,size={32 * 2**20}" in args
    assert args[-1] == "--log-verbose=1"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    # Every file is in the ConfigMap: tritonserver reads its volume, with no fetch step before it.
    assert "initContainers" not in pod
    assert {"name": "repository", "mountPath": "/models", "readOnly": True} in triton["volumeMounts"]
    assert [v["name"] for v in pod["volumes"]] == ["repository", "tmp", "dshm"]
    assert spec["template"]["metadata"]["annotations"]["serving.triton-operator.dev/poll-interval-ms"] == "200"
    digest = spec["template"]["metadata"]["annotations"][ANNOTATION_DIGEST]
    assert digest == render_repository([m])["m"].digest


def test_the_fetch_step_assembles_the_repository_when_some_of_it_is_not_in_the_configmap() -> None:
    """A uri source: `fetch` copies the ConfigMap and the rest into an emptyDir, which tritonserver mounts instead of
    the ConfigMap (an ensemble with such a step: tests/test_sources.py)."""
    for source in ({"uri": "https://example.com/m.tar.gz", "sha256": "a" * 64}, {"uri": "pvc://claim/m"}):
        pod = _children(_model(source=source))["Deployment"]["spec"]["template"]["spec"]
        (fetch,) = pod["initContainers"]
        assert fetch["args"][:5] == ["fetch", "--from", "/config", "--to", "/models"]
        assert fetch["image"] == Options().operator_image
        assert {"name": "models", "mountPath": "/models"} in fetch["volumeMounts"]
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in pod["containers"][0]["volumeMounts"]
        assert {"name": "models", "emptyDir": {"sizeLimit": "10Gi"}} in pod["volumes"]


def test_the_repository_volumes_and_the_fetch_step_are_bounded() -> None:
    """issue 32: the emptyDirs have a sizeLimit (the kubelet evicts a pod past it), fetch is told the same caps it
    enforces itself, and it runs with requests and limits of its own."""
    uri = {"uri": "https://example.com/m.tar.gz"}
    pod = _children(_model(source=uri))["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"] == {"name": "models", "emptyDir": {"sizeLimit": "10Gi"}}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}}
    (fetch,) = pod["initContainers"]
    assert fetch["args"][5:11] == ["--max-bytes", str(10 << 30), "--max-files", "100000", "--timeout", "3600"]
    assert fetch["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"},
                                  "limits": {"cpu": "1", "memory": "256Mi"}}
    # Each from the spec; fetch.maxBytes unset is the volume's limit.
    server = {"repositorySizeLimit": "2Gi", "tmpSizeLimit": "512Mi", "fetch": {"maxFiles": 50, "timeoutSeconds": 60}}
    pod = _children(_model(source=uri, server=server))["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["emptyDir"] == {"sizeLimit": "2Gi"} and volumes["tmp"]["emptyDir"] == {"sizeLimit": "512Mi"}
    assert pod["initContainers"][0]["args"][5:11] == ["--max-bytes", str(2 << 30), "--max-files", "50", "--timeout", "60"]
    server["fetch"]["maxBytes"] = "1.5Gi"  # type: ignore[index]
    pod = _children(_model(source=uri, server=server))["Deployment"]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["args"][5:7] == ["--max-bytes", str(3 << 29)]
    # Without a fetch step there is no `models` volume; /tmp is bounded all the same.
    pod = _children(_model())["Deployment"]["spec"]["template"]["spec"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}} in pod["volumes"]


def test_grace_period_makes_room_for_the_users_own_exit_timeout() -> None:
    """server.args come after the operator's: Triton takes the user's --exit-timeout-secs, so SIGKILL must wait for it."""
    for args in (["--exit-timeout-secs=120"], ["--exit-timeout-secs", "120"]):
        pod = _children(_model(server={"args": args}))["Deployment"]["spec"]["template"]["spec"]
        triton = pod["containers"][0]
        assert triton["args"][-len(args):] == args
        assert pod["terminationGracePeriodSeconds"] == 5 + 120 + 5
    pod = _children(_model(server={"args": ["--log-verbose=1"]}))["Deployment"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 30


def test_config_change_rolls_the_deployment() -> None:
    a = _children(_model(maxBatchSize=4))["Deployment"]["spec"]["template"]
    b = _children(_model(maxBatchSize=8))["Deployment"]["spec"]["template"]
    assert a["metadata"]["annotations"][ANNOTATION_DIGEST] != b["metadata"]["annotations"][ANNOTATION_DIGEST]


def test_configmap_holds_the_repository_at_its_paths() -> None:
    kids = _children(_model())
    cm, dep = kids["ConfigMap"], kids["Deployment"]
    items = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "repository")["configMap"]["items"]
    paths = {i["path"]: cm["data"][i["key"]] for i in items}
    assert set(paths) == {"m/config.pbtxt", "m/1/model.py"}
    assert "triton-operator.config-digest" in paths["m/config.pbtxt"]


def test_ensemble_repository_includes_steps() -> None:
    loaded = check_documents(load_paths([ROOT / "examples" / "sentiment-ensemble.yaml"]))
    models = {m.name: m for _, m in loaded.models}
    rendered = render_repository(list(models.values()))
    kids = {c["kind"]: c for c in render_children(models["sentiment"], rendered, UID, "ns")}
    items = next(v for v in kids["Deployment"]["spec"]["template"]["spec"]["volumes"] if v["name"] == "repository")
    dirs = {i["path"].split("/")[0] for i in items["configMap"]["items"]}
    assert dirs == {"sentiment", "tokenizer", "classifier"}
    ann = kids["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert set(ann["serving.triton-operator.dev/triton-steps"].split(",")) == {"tokenizer", "classifier"}
    # The probe checks the ensemble and every step; their Python stubs are visible to it in the shared namespace.
    pod = kids["Deployment"]["spec"]["template"]["spec"]
    probe = next(c for c in pod["containers"] if c["name"] == "probe")
    named = probe["args"][probe["args"].index("--model"):]
    assert named[::2] == ["--model"] * 3 and named[1] == "sentiment" and set(named[3::2]) == {"tokenizer", "classifier"}
    assert pod["shareProcessNamespace"] is True


def test_repository_over_the_configmap_limit_is_refused() -> None:
    big = "x" * (CONFIGMAP_LIMIT + 1)
    with pytest.raises(RepositoryTooLarge, match="over the ConfigMap limit"):
        _children(_model(source={"inline": {"model.py": "pass\n", "weights.txt": big}}))


def test_credentials_are_referenced_by_secret_name_never_copied() -> None:
    m = _model(source={"uri": "s3://bucket/models/m", "credentialsSecret": "s3-creds"})
    kids = _children(m)
    blob = json.dumps(kids["ConfigMap"])
    assert "s3-creds" not in blob and "AWS_" not in blob
    (fetch,) = kids["Deployment"]["spec"]["template"]["spec"]["initContainers"]
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in fetch["env"]}
    assert refs == {"s3-creds"}
    assert "--uri" in fetch["args"] and "m=s3://bucket/models/m" in fetch["args"]


def test_pvc_source_mounts_the_claim_read_only() -> None:
    kids = _children(_model(source={"uri": "pvc://models/add-sub"}))
    pod = kids["Deployment"]["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert vol["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}


def test_warmup_files_become_binary_configmap_data() -> None:
    m = _model(
        inputs=[{"name": "I", "dataType": "FP32", "dims": [4]}],
        source={"inline": {"model.py": "pass\n"}, "warmupFiles": {"i.bin": base64.b64encode(b"\xff" * 16).decode()}},
        modelWarmup=[{"name": "w", "inputs": {"I": {"dataType": "FP32", "dims": [4], "inputDataFile": "i.bin"}}}],
    )
    cm = _children(m)["ConfigMap"]
    assert list(cm["binaryData"].values()) == [base64.b64encode(b"\xff" * 16).decode()]


# ---------------------------------------------------------------- volume names, credentials in one replica

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def _pod(model: TritonModel, *others: TritonModel) -> dict:
    return _children(model, list(others))["Deployment"]["spec"]["template"]["spec"]


def test_volume_names_are_dns_labels_for_claims_and_secrets_named_with_dots_or_at_length() -> None:
    """A claim or Secret may be named as a DNS subdomain (dots, up to 253); a volume only as a DNS label (63)."""
    import re

    long_a, long_b = "c" * 70 + "-a", "c" * 70 + "-b"  # the same first 63 characters
    m = _model(versions=[{"version": 1, "source": {"uri": "pvc://models.team-a/m"}},
                         {"version": 2, "source": {"uri": f"pvc://{long_a}/m"}},
                         {"version": 3, "source": {"uri": f"pvc://{long_b}/m"}}],
               source=None, modelFiles={"uri": "gs://bucket/labels", "credentialsSecret": "gcs.key"})
    pod = _pod(m)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert len(volumes) == len(pod["volumes"]), f"two volumes share a name: {[v['name'] for v in pod['volumes']]}"
    bad = [n for n in volumes if len(n) > 63 or not re.fullmatch(_DNS_LABEL, n)]
    assert not bad, f"volume names the API server refuses: {bad}"
    claims = {v["persistentVolumeClaim"]["claimName"] for v in volumes.values() if "persistentVolumeClaim" in v}
    assert claims == {"models.team-a", long_a, long_b}
    assert {v["secret"]["secretName"] for v in volumes.values() if "secret" in v} == {"gcs.key"}
    (fetch,) = pod["initContainers"]
    assert {mount["name"] for mount in fetch["volumeMounts"]} <= set(volumes)
    assert {mount["mountPath"] for mount in fetch["volumeMounts"] if mount["name"].startswith("pvc-")} == {
        "/sources/pvc/models.team-a", f"/sources/pvc/{long_a}", f"/sources/pvc/{long_b}"}


def test_a_name_that_makes_a_volume_name_keeps_it() -> None:
    """No rollout on upgrade for the names that always worked."""
    pod = _pod(_model(source={"uri": "pvc://models/m"}, modelFiles={"uri": "gs://b/l", "credentialsSecret": "gcs-key"}))
    assert {"pvc-models", "gcs-gcs-key"} <= {v["name"] for v in pod["volumes"]}


def _check(*bodies: dict) -> list[tuple[str, str, str]]:
    from triton_operator.validate import Document

    loaded = check_documents([Document(f"d#{i}", b) for i, b in enumerate(bodies)])
    return [(e.model, e.path, e.rule) for e in loaded.errors]


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_an_ensembles_steps_with_two_secrets_of_one_scheme_are_refused_on_the_ensemble(scheme: str) -> None:
    """Two S3 Secrets: the last one's AWS_* variables won, so bucket A was fetched with Secret B's keys. Two GCS
    Secrets: two volumes at /var/run/secrets/gcs, a pod the API server refuses."""
    a = _uri_model("a", uri=f"{scheme}://bucket-a/m", credentialsSecret="keys-a")
    b = _uri_model("b", uri=f"{scheme}://bucket-b/m", credentialsSecret="keys-b")
    errors = _check(a, b, _uri_ensemble("a", "b"))
    assert errors == [("TritonModel/ens", "spec.ensemble.steps", "credentials-secret")], errors
    # Each step alone is fine: its own replicas fetch one source.
    assert _check(a, b) == []


def test_a_secret_and_ambient_credentials_of_one_scheme_in_one_replica_are_refused_naming_both() -> None:
    body = _uri_model("m", uri="s3://bucket-a/m", credentialsSecret="keys-a")
    body["spec"]["modelFiles"] = {"uri": "s3://public/labels"}
    from triton_operator.validate import Document

    [error] = check_documents([Document("d#0", body)]).errors
    assert (error.path, error.rule) == ("spec.modelFiles.credentialsSecret", "credentials-secret")
    assert "spec.source names Secret 'keys-a'" in error.message and "ambient" in error.message, error.message


def test_one_secret_per_scheme_is_accepted_and_renders_one_set_of_variables_and_one_key_mount() -> None:
    a = _uri_model("a", uri="s3://bucket-a/m", credentialsSecret="keys")
    b = _uri_model("b", uri="s3://bucket-b/m", credentialsSecret="keys")
    c = _uri_model("c", uri="gs://bucket-c/m", credentialsSecret="gcs-key")
    ens = _uri_ensemble("a", "b", "c")
    assert _check(a, b, c, ens) == []
    models = [TritonModel.model_validate(x) for x in (ens, a, b, c)]
    pod = _pod(*models)
    (fetch,) = pod["initContainers"]
    names = [e["name"] for e in fetch["env"]]
    assert len(names) == len(set(names)), f"a variable set twice in the fetch step: {names}"
    paths = [mount["mountPath"] for mount in fetch["volumeMounts"]]
    assert len(paths) == len(set(paths)), f"two volumes at one mount path: {paths}"
