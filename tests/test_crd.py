"""The CRD is generated from the pydantic models; crds/ must match, and the schema must be structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tools.previous import PREVIOUS, previous_file
from triton_operator.api.crd import crd, crd_yaml, pool_crd
from triton_operator.api.v1alpha1 import TritonModel

ROOT = Path(__file__).resolve().parent.parent


def _walk(node: Any, path: str = ""):  # type: ignore[no-untyped-def]
    if isinstance(node, dict):
        yield path, node
        for k, v in node.get("properties", {}).items():
            yield from _walk(v, f"{path}.{k}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_checked_in_crd_is_current() -> None:
    checked_in = (ROOT / "crds" / "tritonmodels.yaml").read_text()
    assert checked_in == crd_yaml(), "crds/tritonmodels.yaml is stale: run `make crd` and commit the result"


def test_triton_operator_crd_command_prints_it(capsys) -> None:  # type: ignore[no-untyped-def]
    from triton_operator.cli.main import main

    assert main(["crd"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == crd()


def test_checked_in_pool_crd_is_current() -> None:
    checked_in = (ROOT / "crds" / "tritonpools.yaml").read_text()
    assert checked_in == crd_yaml(pool_crd()), "crds/tritonpools.yaml is stale: run `make crd` and commit the result"


def test_triton_operator_crd_command_prints_the_pool_crd(capsys) -> None:  # type: ignore[no-untyped-def]
    from triton_operator.cli.main import main

    assert main(["crd", "--kind", "TritonPool"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == pool_crd()


@pytest.mark.parametrize("make", [crd, pool_crd], ids=["TritonModel", "TritonPool"])
def test_schema_is_structural(make: Any) -> None:
    schema = make()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    forbidden = {"anyOf", "oneOf", "allOf", "$ref", "$defs", "title", "patternProperties", "propertyNames", "const"}
    for path, node in _walk(schema):
        assert not forbidden & set(node), f"{path or '<root>'} uses {forbidden & set(node)}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        if node.get("type") == "array":
            assert "items" in node, f"{path} array without items"


@pytest.mark.parametrize("make", [crd, pool_crd], ids=["TritonModel", "TritonPool"])
def test_every_spec_field_is_described(make: Any) -> None:
    spec = make()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    undocumented = [
        p for p, node in _walk(spec, "spec") if not node.get("description") and not p.endswith(("[]", "{}"))
        and not p.startswith("spec.server.tolerations")
    ]
    assert not undocumented, f"fields without a description (kubectl explain shows nothing): {undocumented}"


def test_defaults_enums_and_cel_are_present() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    props = spec["properties"]
    assert props["batching"]["default"] is True
    assert props["maxBatchSize"]["default"] == 4
    assert "BYTES" in props["inputs"]["items"]["properties"]["dataType"]["enum"]
    assert props["instanceGroups"]["items"]["properties"]["kind"]["enum"] == ["GPU", "CPU", "AUTO", "MODEL"]
    rules = [v["rule"] for v in spec["x-kubernetes-validations"]]
    assert any("preferredBatchSize" in r for r in rules)
    assert any("ensemble" in r and "batcher" in r for r in rules)


@pytest.mark.parametrize("make", [crd, pool_crd], ids=["TritonModel", "TritonPool"])
def test_subresources_and_printer_columns(make: Any) -> None:
    version = make()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Ready", "Replicas", "Age"} <= columns
    assert ("Warmed" if make is crd else "Free") in columns


def test_the_reference_pages_are_current() -> None:
    """docs/reference/tritonmodel.md and tritonpool.md hold the references `triton-operator docs` generates."""
    from triton_operator.api.reference import pool_reference_markdown, reference_markdown, update

    for page, reference in (("tritonmodel.md", reference_markdown()), ("tritonpool.md", pool_reference_markdown())):
        text = (ROOT / "docs" / "reference" / page).read_text()
        assert reference in text, f"docs/reference/{page} is stale: run `make docs`"
        assert update(text) == text


def test_a_page_marking_no_reference_is_refused() -> None:
    from triton_operator.api.reference import BEGIN, update

    with pytest.raises(ValueError, match=r"^no .* marker$"):
        update("# a page\n")
    with pytest.raises(ValueError, match="one marker without the other"):
        update(f"{BEGIN}\n| field |\n")


def test_the_pool_crd_refuses_what_a_pool_cannot_be() -> None:
    """The pool's rules a glance at one object can check: one capacity, and a capacity that matches gpus."""
    spec = pool_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["capacity"]
    rules = {v["fieldPath"]: v["rule"] for v in spec["x-kubernetes-validations"]}
    assert "self.server.gpus >= 1" in rules[".capacity.memoryPerGpu"]
    capacity = spec["properties"]["capacity"]
    assert capacity["x-kubernetes-validations"][0]["rule"] == "has(self.memoryPerGpu) != has(self.memoryPerReplica)"
    assert spec["properties"]["replicas"]["maximum"] == 1000


def test_the_pool_placement_strategy_is_an_enum_with_no_stored_default() -> None:
    """A default in the CRD would be stored in every pool the API server admits, and then stay Spread when the pool
    adds autoscaling later: the default is decided by the operator (`TritonPoolSpec.placement_strategy`)."""
    version = pool_crd()["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "default" not in spec["properties"]["placement"]
    strategy = spec["properties"]["placement"]["properties"]["strategy"]
    assert strategy["enum"] == ["Spread", "Pack"] and "default" not in strategy
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["placementStrategy"]["enum"] == ["Spread", "Pack"]
    assert {"name": "Placement", "type": "string", "jsonPath": ".status.placementStrategy",
            "priority": 1} in version["additionalPrinterColumns"]


def test_a_pooled_model_sets_no_server_field_of_its_own_in_cel() -> None:
    """Every server field has a CEL rule naming it for a pooled model: unset, or at its default (the API server fills
    defaults in before it evaluates the rules, so `has(self.server)` alone would refuse every pooled model)."""
    from triton_operator import LEGACY_TRITON_IMAGE
    from triton_operator.api.v1alpha1 import POOLED_SERVER_DEFAULTS, Server

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    paths = {v.get("fieldPath") for v in spec["x-kubernetes-validations"] if "self.pool" in v["rule"]}
    server_fields = {f".server.{f.alias}" for f in Server.model_fields.values() if f.alias != "fetch"}
    assert server_fields - {".server.fetch"} <= paths | {".server.fetch"}
    assert {".server.fetch.maxBytes", ".server.fetch.maxFiles", ".memory"} <= paths
    assert ".autoscaling" not in paths, "a pooled model autoscales its copies"
    assert POOLED_SERVER_DEFAULTS[".server.image"] == Server().image is None
    image_rule = next(v for v in spec["x-kubernetes-validations"] if v.get("fieldPath") == ".server.image")
    assert image_rule["rule"].endswith(f'!has(self.server.image) || self.server.image == "{LEGACY_TRITON_IMAGE}"'), (
        image_rule)
    assert POOLED_SERVER_DEFAULTS[".server.resources"] is None


def test_bounds_are_openapi_v3s_exclusive_flags_not_json_schema_2020_numbers() -> None:
    """Kubernetes reads exclusiveMinimum as a boolean beside minimum: a number there fails the CRD's install."""
    def walk(node: object, path: str) -> list[str]:
        if isinstance(node, list):
            return [p for i, n in enumerate(node) for p in walk(n, f"{path}[{i}]")]
        if not isinstance(node, dict):
            return []
        bad = [f"{path}.{k}" for k in ("exclusiveMinimum", "exclusiveMaximum") if k in node and node[k] is not True]
        return bad + [p for k, v in node.items() for p in walk(v, f"{path}.{k}")]

    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert walk(schema, "") == []
    target = schema["properties"]["spec"]["properties"]["autoscaling"]["properties"]["target"]["properties"]
    assert (target["queueTimeMilliseconds"]["minimum"], target["queueTimeMilliseconds"]["exclusiveMinimum"]) == (0, True)


def test_every_default_of_the_crd_is_on_a_field_the_previous_release_knows() -> None:
    """The API server fills a CRD's defaults into every object it returns: a default on a field the previous release's
    CRD lacks is in every TritonModel that release's operator reads after `helm rollback` (the CRDs stay, `keep`), and
    it refuses fields it does not know: every model InvalidSpec (e2e/test_upgrade.py saw it). Such a field's default is
    the operator's (`OPERATOR_DEFAULT`), said in its description; the operator still applies it."""
    old = yaml.safe_load(previous_file("crds/tritonmodels.yaml"))["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    new = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    known = {path for path, _ in _walk(old)}
    unknown = sorted(path for path, node in _walk(new) if "default" in node and path not in known)
    assert not unknown, f"defaults in the CRD on fields {PREVIOUS[0]} does not know: {unknown}"
    tmp = new["properties"]["spec"]["properties"]["server"]["properties"]["tmpSizeLimit"]
    assert tmp["description"].endswith('Unset: "4Gi", the operator\'s default (the object keeps no value).')
    model = TritonModel.model_validate(yaml.safe_load((ROOT / "examples" / "add-sub.yaml").read_text()))
    assert (model.spec.server.tmp_size_limit, model.spec.server.automount_service_account_token,
            model.spec.warmup_gate.failed_request_threshold, model.spec.server.fetch.max_files) == ("4Gi", False, 3, 100_000)
