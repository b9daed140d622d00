"""A chart upgrade brings the new CRD (issue 28): `helm upgrade`, with nothing else, and new fields are kept.

Helm installs a chart's `crds/` once and never upgrades it; the chart therefore renders the CRD as a template
(`templates/crds.yaml`, generated from the pydantic models), on by default (`crds.enabled`) and kept on uninstall
(`crds.keep`, `helm.sh/resource-policy: keep`). On a control plane of the test's own (the CRD is cluster-wide: the
session's cluster shares one between its tests), with no operator replica (`replicaCount=0`: the CRD alone decides
what is kept):

- the chart as it was, with a CRD that lacks a field the current one has (`spec.server.nodeSelector`), and a
  TritonModel; setting the field there is pruned by the API server, silently;
- `helm upgrade` to the current chart with `crds.enabled=false`: the CRD is left exactly as it was (not upgraded, not
  deleted), and the field is still pruned;
- a plain `helm upgrade` to the current chart: the CRD is the current one, and the field, set, reads back;
- `helm uninstall`: the CRD and the TritonModel stay.

And the one step the move from `crds/` to a template costs a release installed by the chart as it was before: its
CRD was created from `crds/`, which Helm does not record as the release's, so a plain `helm upgrade` is refused
(Helm does not take over an object it did not make); `--take-ownership` does, once, as the chart README says.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import REPO_ROOT, LocalCluster, session_root
from e2e.kube import ApiError, Kube, condition, wait_for
from e2e.operator_fixtures import CHART, helm, helm_binary
from triton_operator import LEGACY_TRITON_IMAGE
from triton_operator.api.crd import chart_template, crd, pool_crd
from triton_operator.api.v1alpha1 import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.cluster

ROOT = session_root() / ".cluster" / "crd-upgrade"
CRD_NAME = f"{PLURAL}.{GROUP}"
POOL_CRD_NAME = f"tritonpools.{GROUP}"
RELEASE, RELEASE_NS, TEAM = "tro", "triton-system", "team-a"
#: The field the previous chart's CRD lacks: one no CEL rule of spec.server names, so that CRD is valid without it. The
#: pooled-model rules on spec that name it (issue 29: a pooled model sets no server field) are left out of the previous
#: CRD with it: that release came before pools.
FIELD = ("server", "nodeSelector")
SELECTOR = {"e2e.triton-operator.io/pool": "inference"}
MODEL = "kept"


def _previous_crd() -> dict[str, Any]:
    """The current CRD without FIELD: what the chart's previous release shipped."""
    doc = copy.deepcopy(crd())
    parent = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][FIELD[0]]
    assert FIELD[1] in parent["properties"], f"spec.{'.'.join(FIELD)} is gone from the CRD: pick another field"
    assert FIELD[1] not in json.dumps([r["rule"] for r in _rules(parent)]), "a CEL rule names the field"
    del parent["properties"][FIELD[1]]
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    named = f".{FIELD[0]}.{FIELD[1]}"
    spec["x-kubernetes-validations"] = [r for r in spec.get("x-kubernetes-validations", [])
                                        if named not in r.get("fieldPath", "") and FIELD[1] not in r["rule"]]
    parent["required"] = [r for r in parent.get("required", []) if r != FIELD[1]]
    if not parent["required"]:
        del parent["required"]
    # 0.1.x's CRD defaulted the image (issue 39 moved the default into the operator, a newer Triton).
    spec["properties"]["server"]["properties"]["image"]["default"] = LEGACY_TRITON_IMAGE
    return doc


def _rules(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        return [*node.get("x-kubernetes-validations", []), *(r for v in node.values() for r in _rules(v))]
    if isinstance(node, list):
        return [r for v in node for r in _rules(v)]
    return []


def _previous_chart(tmp_path: Path, layout: str) -> Path:
    """A copy of the chart at version 0.0.1 whose CRD is `_previous_crd()`: as a template (`layout="template"`, the
    chart since the CRD moved) or in `crds/` (`layout="crds"`, the chart before)."""
    old = tmp_path / f"triton-operator-{layout}"
    shutil.copytree(CHART, old)
    chart_yaml = old / "Chart.yaml"
    chart_yaml.write_text(re.sub(r"^version: .*$", "version: 0.0.1", chart_yaml.read_text(), flags=re.M))
    if layout == "template":
        (old / "templates" / "crds.yaml").write_text(chart_template(_previous_crd()))
    else:
        (old / "templates" / "crds.yaml").unlink()
        (old / "templates" / "crds-tritonpools.yaml").unlink()  # that chart came before TritonPools (issue 29)
        (old / "crds").mkdir()
        (old / "crds" / "tritonmodels.yaml").write_text(yaml.safe_dump(_previous_crd(), sort_keys=True))
    return old


def _differences(live: Any, want: Any, path: str = "") -> list[str]:
    """Where `live` differs from `want`: paths, with both values. An empty map and no map are the same (the API
    server drops the empty `properties` of a schema)."""
    if isinstance(live, dict) and isinstance(want, dict):
        return [d for k in sorted(set(live) | set(want), key=str)
                for d in _differences(live.get(k, {}), want.get(k, {}), f"{path}.{k}")]
    if isinstance(live, list) and isinstance(want, list) and len(live) == len(want):
        return [d for i, (a, b) in enumerate(zip(live, want, strict=True)) for d in _differences(a, b, f"{path}[{i}]")]
    return [] if live == want else [f"{path}: {str(live)[:80]} != {str(want)[:80]}"]


def _crd(kube: Kube) -> dict[str, Any]:
    return kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")


def _has_field(crd_doc: dict[str, Any]) -> bool:
    spec = crd_doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return FIELD[1] in spec["properties"][FIELD[0]]["properties"]


def _established(kube: Kube) -> bool:
    try:
        return (condition(_crd(kube), "Established") or {}).get("status") == "True"
    except ApiError:
        return False


def _model_path(name: str = MODEL) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{TEAM}/{PLURAL}/{name}"


def _apply_model(kube: Kube) -> None:
    wait_for("the CRD Established", lambda: _established(kube), 30)
    # The API server serves the new kind a moment after Established.
    wait_for("TritonModels served", lambda: _served(kube), 30)
    kube.request("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{TEAM}/{PLURAL}", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel", "metadata": {"name": MODEL},
        "spec": {"replicas": 0, "backend": "python", "maxBatchSize": 8,
                 "inputs": [{"name": "x", "dataType": "FP32", "dims": [1]}],
                 "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
                 "source": {"inline": {"model.py": "class TritonPythonModel:\n    pass\n"}}}})


def _served(kube: Kube) -> bool:
    try:
        return any(r["name"] == PLURAL for r in kube.request("GET", f"/apis/{GROUP}/{VERSION}")["resources"])
    except ApiError:
        return False


def _set_field(kube: Kube) -> Any:
    """Sets FIELD on the model (a merge patch, as `kubectl patch --type=merge` sends it) and reads it back: what the
    API server kept of it (None: pruned)."""
    kube.request("PATCH", _model_path(), {"spec": {FIELD[0]: {FIELD[1]: SELECTOR}}},
                 content_type="application/merge-patch+json")
    return (kube.request("GET", _model_path())["spec"].get(FIELD[0]) or {}).get(FIELD[1])


def _unset_field(kube: Kube) -> None:
    kube.request("PATCH", _model_path(), {"spec": {FIELD[0]: {FIELD[1]: None}}},
                 content_type="application/merge-patch+json")


def _helm_refused(kubeconfig: Path, *args: str) -> str:
    proc = subprocess.run([helm_binary(), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT)
    assert proc.returncode != 0, f"helm {' '.join(args)} was not refused:\n{proc.stdout}"
    return proc.stderr


def test_a_plain_helm_upgrade_brings_the_new_crd_and_crds_enabled_false_leaves_it_alone(
        control_plane: LocalCluster, tmp_path: Path) -> None:
    kubeconfig = control_plane.kubeconfig
    kube = Kube(kubeconfig)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}})
    previous = _previous_chart(tmp_path, "template")
    helm(kubeconfig, "install", RELEASE, str(previous), "--namespace", RELEASE_NS, "--create-namespace",
         "--set", "replicaCount=0")
    assert not _has_field(_crd(kube))
    _apply_model(kube)
    assert _set_field(kube) is None, "the previous CRD kept a field it does not have: the test would prove nothing"

    # crds.enabled=false: the release stops rendering the CRD, and Helm leaves it exactly as it is (keep).
    before = _crd(kube)
    helm(kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--set", "replicaCount=0",
         "--set", "crds.enabled=false")
    after = _crd(kube)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "the CRD was touched"
    assert not _has_field(after)
    assert _set_field(kube) is None, "pruned, as before: nothing upgraded the CRD"

    # A plain upgrade (crds.enabled defaults to true): the current CRD, and the field kept.
    helm(kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--set", "replicaCount=0")
    upgraded = _crd(kube)
    assert _has_field(upgraded)
    differ = _differences(upgraded["spec"]["versions"][0]["schema"], crd()["spec"]["versions"][0]["schema"])
    assert not differ, f"not the current CRD: {differ[:5]}"
    assert upgraded["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert upgraded["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert _set_field(kube) == SELECTOR
    # The former default image, which the API server stored in the model it defaulted, stays through the upgrade (no
    # model moves to another Triton by itself); a pooled model that carries it may still be changed (its CEL rule
    # lets that one value be), while one naming another image may not.
    assert kube.request("GET", _model_path())["spec"]["server"]["image"] == LEGACY_TRITON_IMAGE
    pooled = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel", "metadata": {"name": "pooled"},
              "spec": {"pool": "shared", "memory": "64Mi", "backend": "python", "maxBatchSize": 8,
                       "inputs": [{"name": "x", "dataType": "FP32", "dims": [1]}],
                       "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
                       "source": {"inline": {"model.py": "class TritonPythonModel:\n    pass\n"}},
                       "server": {"image": LEGACY_TRITON_IMAGE}}}
    kube.request("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{TEAM}/{PLURAL}", pooled)
    kube.request("PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/{TEAM}/{PLURAL}/pooled", {"spec": {"memory": "96Mi"}},
                 content_type="application/merge-patch+json")
    with pytest.raises(ApiError, match=r"spec\.server\.image"):
        kube.request("PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/{TEAM}/{PLURAL}/pooled",
                     {"spec": {"server": {"image": "nvcr.io/nvidia/tritonserver:26.03-py3"}}},
                     content_type="application/merge-patch+json")

    # Uninstall: the CRD and the TritonModel (with the field) stay.
    helm(kubeconfig, "uninstall", RELEASE, "--namespace", RELEASE_NS)
    assert _has_field(_crd(kube))
    assert kube.request("GET", _model_path())["spec"][FIELD[0]][FIELD[1]] == SELECTOR


def test_a_release_of_the_chart_with_crds_in_crds_dir_upgrades_once_with_take_ownership(
        control_plane: LocalCluster, tmp_path: Path) -> None:
    kubeconfig = control_plane.kubeconfig
    kube = Kube(kubeconfig)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}})
    helm(kubeconfig, "install", RELEASE, str(_previous_chart(tmp_path, "crds")), "--namespace", RELEASE_NS,
         "--create-namespace", "--set", "replicaCount=0")
    installed = _crd(kube)
    assert not _has_field(installed)
    assert "meta.helm.sh/release-name" not in (installed["metadata"].get("annotations") or {}), (
        "Helm recorded a CRD of crds/ as the release's: the plain upgrade below would not be refused")
    _apply_model(kube)
    assert _set_field(kube) is None

    err = _helm_refused(kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NS,
                        "--set", "replicaCount=0")
    assert f'CustomResourceDefinition "{CRD_NAME}"' in err and "exists and cannot be imported" in err, err
    assert _crd(kube)["metadata"]["resourceVersion"] == installed["metadata"]["resourceVersion"]

    helm(kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--set", "replicaCount=0",
         "--take-ownership")
    owned = _crd(kube)
    assert _has_field(owned) and owned["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert _set_field(kube) == SELECTOR
    # The TritonPool CRD, new with this chart, is created by the same upgrade, the release's and kept.
    pools = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{POOL_CRD_NAME}")
    assert pools["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert pools["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    differ = _differences(pools["spec"]["versions"][0]["schema"], pool_crd()["spec"]["versions"][0]["schema"])
    assert not differ, f"not the current TritonPool CRD: {differ[:5]}"
    _unset_field(kube)
    # From now on the release owns it: the next plain upgrade goes through.
    helm(kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--set", "replicaCount=0")
    assert _set_field(kube) == SELECTOR
