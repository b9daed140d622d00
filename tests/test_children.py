"""Pure rendering of a TritonModel's Kubernetes children, status computation, and the fetch init step."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from triton_operator.api.v1alpha1 import WARMED_CONDITION, TritonModel
from triton_operator.fetch import FetchError, copy_repository, fetch_uri
from triton_operator.files import load_paths
from triton_operator.plan.planner import contains
from triton_operator.plan.status import Observed, Problem, as_dict, status_changed, transitions
from triton_operator.plan.status import compute_status as typed_status
from triton_operator.render.kubernetes import (
    ANNOTATION_DIGEST,
    CONFIGMAP_LIMIT,
    RepositoryTooLarge,
    render_children,
)
from triton_operator.render.modelconfig import render_repository
from triton_operator.validate import check_documents


def compute_status(obs: Observed, previous: dict | None) -> dict:
    """The status as the API server stores it (the planner's typed `TritonModelStatus`, dumped)."""
    return as_dict(typed_status(obs, previous))


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


def test_deployment_shape() -> None:
    m = _model(replicas=2, responseCache=True, server={"gpus": 2, "cacheSize": "32Mi", "args": ["--log-verbose=1"]})
    dep = _children(m)["Deployment"]
    spec = dep["spec"]
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    assert pod["readinessGates"] == [{"conditionType": WARMED_CONDITION}]
    (triton,) = pod["containers"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert {p["containerPort"] for p in triton["ports"]} == {8000, 8001, 8002}
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["startupProbe"]["failureThreshold"] * triton["startupProbe"]["periodSeconds"] >= 600
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
    (fetch,) = pod["initContainers"]
    assert fetch["args"][:1] == ["fetch"]
    assert fetch["securityContext"]["runAsNonRoot"] is True
    assert spec["template"]["metadata"]["annotations"]["serving.triton-operator.dev/poll-interval-ms"] == "200"
    digest = spec["template"]["metadata"]["annotations"][ANNOTATION_DIGEST]
    assert digest == render_repository([m])["m"].digest


def test_grace_period_makes_room_for_the_users_own_exit_timeout() -> None:
    """server.args come after the operator's: Triton takes the user's --exit-timeout-secs, so SIGKILL must wait for it."""
    for args in (["--exit-timeout-secs=120"], ["--exit-timeout-secs", "120"]):
        pod = _children(_model(server={"args": args}))["Deployment"]["spec"]["template"]["spec"]
        (triton,) = pod["containers"]
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


# ---------------------------------------------------------------- server-side apply: what counts as "differs"


def test_contains_ignores_server_defaults_but_sees_changes() -> None:
    desired = {"spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}}}
    existing = {"spec": {"replicas": 2, "revisionHistoryLimit": 10,
                         "template": {"spec": {"containers": [{"name": "a", "image": "x", "imagePullPolicy": "IfNotPresent"}]}}}}
    assert contains(existing, desired)
    desired["spec"]["replicas"] = 3
    assert not contains(existing, desired)


# ---------------------------------------------------------------- status


def _pod(name: str, digest: str, gate: str | None, running: bool = True, reason: str = "ModelWarmed", msg: str = "") -> dict:
    conds = [] if gate is None else [{"type": WARMED_CONDITION, "status": gate, "reason": reason, "message": msg,
                                      "lastTransitionTime": "2026-01-01T00:00:05Z"},
                                     {"type": "Ready", "status": gate}]  # the kubelet follows the gate
    state = {"running": {"startedAt": "2026-01-01T00:00:01Z"}} if running else {"waiting": {"reason": "PodInitializing"}}
    return {
        "metadata": {"name": name, "annotations": {ANNOTATION_DIGEST: digest}},
        "spec": {"readinessGates": [{"conditionType": WARMED_CONDITION}]},  # as the template renders it
        "status": {"conditions": conds, "containerStatuses": [{"name": "tritonserver", "state": state}]},
    }


def _conds(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def test_status_ready_when_every_replica_is_warm() -> None:
    obs = Observed(3, 2, "d1", "sel", pods=[_pod("a", "d1", "True"), _pod("b", "d1", "True")])
    st = compute_status(obs, None)
    c = _conds(st)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "AllReplicasWarmed")
    assert c["Progressing"]["status"] == "False" and c["Degraded"]["status"] == "False"
    assert all(x["observedGeneration"] == 3 for x in st["conditions"])
    assert st["warmedReplicas"] == 2 and st["configDigest"] == "d1"
    assert st["replicaStates"][0]["warmupSeconds"] == 4.0


def test_status_not_ready_until_warmed_replicas_are_ready_pods() -> None:
    """Warmed but not yet Ready (readiness probe not passed yet): not in the Service, so not Ready."""
    pods = [_pod("a", "d1", "True"), _pod("b", "d1", "True")]
    pods[1]["status"]["conditions"][1]["status"] = "False"
    st = compute_status(Observed(3, 2, "d1", "sel", pods=pods), None)
    c = _conds(st)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ReplicasJoining")
    assert c["Progressing"]["reason"] == "RollingOut" and st["warmedReplicas"] == 2


def test_status_rollout_counts_only_replicas_at_the_desired_digest() -> None:
    obs = Observed(4, 2, "d2", "sel", pods=[_pod("a", "d1", "True"), _pod("b", "d1", "True"),
                                            _pod("c", "d2", "False", reason="ModelWarming")])
    c = _conds(compute_status(obs, None))
    assert c["Ready"]["status"] == "False" and c["Progressing"]["reason"] == "RollingOut"


def test_status_degraded_carries_tritons_reason() -> None:
    why = "model m is UNAVAILABLE: ZeroDivisionError: division by zero"
    obs = Observed(1, 1, "d1", "sel", pods=[_pod("a", "d1", "False", reason="ModelLoadFailed", msg=why)])
    st = compute_status(obs, None)
    c = _conds(st)
    assert c["Degraded"]["status"] == "True" and "ZeroDivisionError" in c["Degraded"]["message"]
    assert st["replicaStates"][0]["state"] == "Failed" and "ZeroDivisionError" in st["replicaStates"][0]["message"]


def test_status_problem_blocks_everything() -> None:
    obs = Observed(1, 1, None, "sel", problem=Problem("StepModelMissing", "step model x not found"))
    c = _conds(compute_status(obs, None))
    assert c["Ready"]["reason"] == "StepModelMissing" and c["Degraded"]["status"] == "True"


def test_transition_time_moves_only_when_status_flips() -> None:
    obs = Observed(1, 1, "d1", "sel", pods=[_pod("a", "d1", "False", reason="ModelWarming")])
    first = compute_status(obs, None)
    old = {**first, "conditions": [{**c, "lastTransitionTime": "2020-01-01T00:00:00Z"} for c in first["conditions"]]}
    again = compute_status(obs, old)
    assert not status_changed(old, again), "the same observation must produce the same status (no write)"
    assert not transitions(old, again)
    obs.pods = [_pod("a", "d1", "True")]
    later = compute_status(obs, old)
    ready = _conds(later)["Ready"]
    assert ready["lastTransitionTime"] != "2020-01-01T00:00:00Z"
    assert _conds(later)["Degraded"]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    assert {c["type"] for c in transitions(old, later)} == {"Ready", "Progressing"}


# ---------------------------------------------------------------- fetch


def test_fetch_copies_the_configmap_tree_without_its_bookkeeping(tmp_path: Path) -> None:
    # the kubelet's atomic-writer layout: ..<timestamp>/ holds the files, ..data links to it, entries link into ..data
    src = tmp_path / "config"
    stamp = src / "..2026_01_01_00_00_00.1"
    (stamp / "m" / "1").mkdir(parents=True)
    (stamp / "m" / "config.pbtxt").write_text('name: "m"\n')
    (stamp / "m" / "1" / "model.py").write_text("pass\n")
    os.symlink(stamp.name, src / "..data")
    os.symlink("..data/m", src / "m")
    dst = tmp_path / "models"
    dst.mkdir()
    assert copy_repository(src, dst) == 2
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()) == ["m/1/model.py", "m/config.pbtxt"]
    assert not any(p.name.startswith("..") for p in dst.iterdir())


def test_fetch_pvc_source_and_path_escape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton_operator import fetch

    root = tmp_path / "pvc"
    (root / "claim" / "models" / "m").mkdir(parents=True)
    (root / "claim" / "models" / "m" / "model.py").write_text("pass\n")
    monkeypatch.setattr(fetch, "PVC_ROOT", root)
    repo = tmp_path / "repo"
    fetch_uri("m", "pvc://claim/models/m", repo)
    assert (repo / "m" / "1" / "model.py").read_text() == "pass\n"
    with pytest.raises(FetchError, match="escapes"):
        fetch_uri("m", "pvc://claim/../../etc", repo)
    with pytest.raises(FetchError, match="unsupported uri"):
        fetch_uri("m", "ftp://example/x", repo)


def test_warmup_files_become_binary_configmap_data() -> None:
    m = _model(
        inputs=[{"name": "I", "dataType": "FP32", "dims": [4]}],
        source={"inline": {"model.py": "pass\n"}, "warmupFiles": {"i.bin": base64.b64encode(b"\xff" * 16).decode()}},
        modelWarmup=[{"name": "w", "inputs": {"I": {"dataType": "FP32", "dims": [4], "inputDataFile": "i.bin"}}}],
    )
    cm = _children(m)["ConfigMap"]
    assert list(cm["binaryData"].values()) == [base64.b64encode(b"\xff" * 16).decode()]


# ---------------------------------------------------------------- the reconciler's cache


def test_primed_pods_merge_under_the_watch_and_never_revive_a_deleted_pod() -> None:
    from triton_operator.controller.cache import Cache

    def pod(name: str, uid: str, rv: str) -> dict:
        return {"metadata": {"name": name, "uid": uid, "namespace": "ns", "resourceVersion": rv,
                             "labels": {"serving.triton-operator.dev/model": "m"}}}

    cache = Cache()
    cache.put_pod(pod("a", "ua", "7"))  # the watch delivered a newer a ...
    cache.put_pod(pod("b", "ub", "5"), deleted=True)  # ... and b's deletion, before the LIST answered
    cache.prime_pods("ns", "m", [pod("a", "ua", "6"), pod("b", "ub", "4"), pod("c", "uc", "6")])
    bucket = cache.pods[("ns", "m")]
    assert sorted(bucket) == ["a", "c"] and bucket["a"]["metadata"]["resourceVersion"] == "7"
    assert ("ns", "m") in cache.primed


def test_sweep_forgets_what_a_list_lacks_unless_observed_since() -> None:
    import time

    from triton_operator.api.kinds import WATCHED
    from triton_operator.controller.cache import Cache

    def obj(kind: str, name: str, uid: str) -> dict:
        return {"kind": kind, "metadata": {"name": name, "uid": uid, "namespace": "ns",
                                           "labels": {"serving.triton-operator.dev/model": "m"}}}

    cache = Cache()
    cache.put_model(obj("TritonModel", "m", "um"))
    cache.put_model(obj("TritonModel", "gone", "ug"))  # deleted while the watch was down
    cache.put_child(obj("Deployment", "m", "ud"))  # deleted while the watch was down
    cache.put_child(obj("Service", "m", "us"))
    cache.put_pod(obj("Pod", "m-1", "up1"))  # deleted while the watch was down
    since = time.monotonic()
    cache.put_pod(obj("Pod", "m-2", "up2"))  # observed after the LIST was sent: may be newer than it
    listed = {k.kind: set() for k in WATCHED} | {"TritonModel": {"um"}, "Service": {"us"}}

    dropped = cache.sweep("ns", listed, since)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in dropped) == [
        ("Deployment", "m"), ("Pod", "m-1"), ("TritonModel", "gone")]
    assert list(cache.models["ns"]) == ["m"]
    assert list(cache.children) == [("Service", "ns", "m")]
    assert list(cache.pods[("ns", "m")]) == ["m-2"]
    assert cache.sweep("ns", listed, since) == []


def test_forget_model_spares_a_newer_object_of_the_same_name() -> None:
    from triton_operator.controller.cache import Cache

    cache = Cache()
    cache.put_model({"kind": "TritonModel", "metadata": {"name": "m", "uid": "new", "namespace": "ns"}})
    assert not cache.forget_model("ns", "m", "old") and "m" in cache.models["ns"]
    assert cache.forget_model("ns", "m", "new") and "m" not in cache.models["ns"]
