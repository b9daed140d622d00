"""Markdown reference of the TritonModel spec, generated from the pydantic field descriptions.

`triton-operator docs` prints it; the README embeds it between markers and a
test fails when the embedded copy is stale.
"""

from __future__ import annotations

import json
from typing import Any

from .crd import openapi_schema

BEGIN = "<!-- BEGIN GENERATED REFERENCE (triton-operator docs) -->"
END = "<!-- END GENERATED REFERENCE -->"


def _type(node: dict[str, Any]) -> str:
    t = node.get("type", "object")
    if t == "array":
        return f"[]{_type(node.get('items', {}))}"
    if t == "object" and "additionalProperties" in node:
        return f"map[string]{_type(node['additionalProperties'])}"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    return str(t)


def _rows(node: dict[str, Any], path: str) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, child in node.get("properties", {}).items():
        p = f"{path}.{name}"
        default = json.dumps(child["default"]) if "default" in child else ""
        desc = (child.get("description") or "").replace("\n", " ").replace("|", "\\|")
        rows.append((p, _type(child), default, desc))
        inner = child
        while inner.get("type") == "array":
            inner = inner.get("items", {})
            p += "[]"
        if inner.get("type") == "object" and "additionalProperties" in inner:
            inner = inner["additionalProperties"]
            p += "{}"
        if inner.get("properties"):
            rows.extend(_rows(inner, p))
    return rows


def reference_markdown() -> str:
    spec = openapi_schema()["properties"]["spec"]
    lines = [
        BEGIN,
        "| field | type | default | description |",
        "|---|---|---|---|",
    ]
    for path, typ, default, desc in _rows(spec, "spec"):
        lines.append(f"| `{path}` | {typ} | {f'`{default}`' if default else ''} | {desc} |")
    lines.append(END)
    return "\n".join(lines) + "\n"
