"""Repository ConfigMaps are immutable and content-addressed, and collected once no pod can need them (issue 12, #2).

A pod re-created for an old ReplicaSet (an eviction, a node loss, a stalled bad update) must fetch the files
its template was made for: each template names its own ConfigMap, which never changes. Pure: the render and
the garbage-collection decision.
"""

from __future__ import annotations

import re

from triton_operator.api.pod import ANNOTATION_DIGEST, repository_of
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.render.kubernetes import LABEL_MODEL, render_children, unused_repositories
from triton_operator.render.modelconfig import render_repository

UID = "00000000-0000-0000-0000-000000000001"


def _model(name: str = "m", files: dict[str, str] | None = None, **spec: object) -> TritonModel:
    return TritonModel.model_validate({
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": name},
        "spec": {"backend": "python", "source": {"inline": files or {"model.py": "pass\n"}}, **spec}})


def _kids(model: TritonModel) -> dict[str, dict]:
    return {c["kind"]: c for c in render_children(model, render_repository([model]), UID, "ns")}


def test_the_configmap_is_immutable_and_named_by_its_content() -> None:
    kids = _kids(_model())
    cm, dep = kids["ConfigMap"], kids["Deployment"]
    assert cm["immutable"] is True
    assert re.fullmatch(r"m-repository-[0-9a-f]{10}", cm["metadata"]["name"]), cm["metadata"]["name"]
    assert repository_of(dep["spec"]["template"]) == cm["metadata"]["name"]
    assert cm["metadata"]["labels"][LABEL_MODEL] == "m"
    assert cm["metadata"]["ownerReferences"][0]["uid"] == UID  # deleting the model deletes every one of them


def test_a_change_of_files_or_config_gets_a_new_configmap_and_the_same_content_the_same_one() -> None:
    a = _kids(_model(files={"model.py": "pass\n"}))["ConfigMap"]["metadata"]["name"]
    assert _kids(_model(files={"model.py": "pass\n"}))["ConfigMap"]["metadata"]["name"] == a
    assert _kids(_model(files={"model.py": "pass  # v2\n"}))["ConfigMap"]["metadata"]["name"] != a
    assert _kids(_model(files={"model.py": "pass\n", "extra.txt": "x"}))["ConfigMap"]["metadata"]["name"] != a
    assert _kids(_model(maxBatchSize=8))["ConfigMap"]["metadata"]["name"] != a
    # Only the replicas' count changed: the same repository, nothing to roll.
    assert _kids(_model(replicas=3))["ConfigMap"]["metadata"]["name"] == a


def test_two_models_with_the_same_files_never_share_a_configmap() -> None:
    """Each model owns (and may delete) its own: the name is also in the hash, not only in the prefix."""
    long = "a" * 62  # the longest names a TritonModel may have (a Service's), alike but for the last character
    one, two = _kids(_model(f"{long}x"))["ConfigMap"], _kids(_model(f"{long}y"))["ConfigMap"]
    assert one["metadata"]["name"] != two["metadata"]["name"]
    for cm in (one, two):
        assert len(cm["metadata"]["name"]) <= 253
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", cm["metadata"]["name"])


# -- garbage collection ---------------------------------------------------------------------------


def _cm(name: str) -> dict:
    return {"kind": "ConfigMap", "metadata": {"name": name, "labels": {LABEL_MODEL: "m"}}}


def _rs(name: str, repository: str, replicas: int, pods: int | None = None) -> dict:
    return {
        "kind": "ReplicaSet",
        "metadata": {"name": name, "labels": {LABEL_MODEL: "m"}},
        "spec": {"replicas": replicas, "template": {
            "metadata": {"annotations": {ANNOTATION_DIGEST: name}},
            "spec": {"volumes": [{"name": "repository", "configMap": {"name": repository, "items": []}},
                                 {"name": "models", "emptyDir": {}}]}}},
        "status": {"replicas": replicas if pods is None else pods},
    }


def test_a_configmap_an_active_replicaset_uses_is_kept() -> None:
    """A stalled bad update: the old ReplicaSet keeps its replicas, and re-creates any it loses from its own
    ConfigMap; the new one surges from the new ConfigMap."""
    cms = [_cm("m-repository-old"), _cm("m-repository-new")]
    rss = [_rs("m-1", "m-repository-old", 2), _rs("m-2", "m-repository-new", 1)]
    assert unused_repositories(cms, rss, "m-repository-new") == []


def test_a_configmap_no_replicaset_can_create_pods_from_is_collected() -> None:
    cms = [_cm("m-repository-old"), _cm("m-repository-new"), _cm("m-repository"), _cm("m-repository-gone")]
    rss = [_rs("m-1", "m-repository-old", 0), _rs("m-2", "m-repository-new", 2)]
    # the old ReplicaSet scaled to zero, the pre-content-addressed name, one no ReplicaSet names at all
    assert unused_repositories(cms, rss, "m-repository-new") == ["m-repository", "m-repository-gone",
                                                                  "m-repository-old"]


def test_the_desired_configmap_is_kept_before_its_replicaset_exists() -> None:
    """The reconcile applies the ConfigMap before the Deployment: no ReplicaSet names it yet."""
    assert unused_repositories([_cm("m-repository-new")], [_rs("m-1", "m-repository-old", 1)],
                               "m-repository-new") == []


def test_a_replicaset_scaled_down_but_with_pods_left_keeps_its_configmap() -> None:
    assert unused_repositories([_cm("m-repository-old")], [_rs("m-1", "m-repository-old", 0, pods=1)],
                               "m-repository-new") == []
