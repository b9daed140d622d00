"""The CRD is generated from the pydantic models; crds/ must match, and the schema must be structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from triton_operator.api.crd import crd, crd_yaml

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


def test_schema_is_structural() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    forbidden = {"anyOf", "oneOf", "allOf", "$ref", "$defs", "title", "patternProperties", "propertyNames", "const"}
    for path, node in _walk(schema):
        assert not forbidden & set(node), f"{path or '<root>'} uses {forbidden & set(node)}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        if node.get("type") == "array":
            assert "items" in node, f"{path} array without items"


def test_every_spec_field_is_described() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
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


def test_subresources_and_printer_columns() -> None:
    version = crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Ready", "Replicas", "Warmed", "Age"} <= columns


def test_readme_reference_is_current() -> None:
    from triton_operator.api.reference import reference_markdown

    readme = (ROOT / "README.md").read_text()
    assert reference_markdown() in readme, "README.md's TritonModel reference is stale: run `make docs`"


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
