"""Markdown reference of the TritonModel and TritonPool specs, generated from the pydantic field descriptions.

`triton-operator docs` prints it; the docs site's reference pages (docs/reference/tritonmodel.md and
tritonpool.md) embed it between markers, `make docs` writes it there (`docs --update PAGE`), and a test fails when
an embedded copy is stale.
"""

from __future__ import annotations

import json
from typing import Any

from .crd import openapi_schema, pool_openapi_schema

BEGIN = "<!-- BEGIN GENERATED REFERENCE (triton-operator docs) -->"
END = "<!-- END GENERATED REFERENCE -->"
POOL_BEGIN = "<!-- BEGIN GENERATED POOL REFERENCE (triton-operator docs) -->"
POOL_END = "<!-- END GENERATED POOL REFERENCE -->"


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


def _table(spec: dict[str, Any], begin: str, end: str) -> str:
    lines = [
        begin,
        "| field | type | default | description |",
        "|---|---|---|---|",
    ]
    for path, typ, default, desc in _rows(spec, "spec"):
        lines.append(f"| `{path}` | {typ} | {f'`{default}`' if default else ''} | {desc} |")
    lines.append(end)
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    """The TritonModel reference, between BEGIN and END."""
    return _table(openapi_schema()["properties"]["spec"], BEGIN, END)


def pool_reference_markdown() -> str:
    """The TritonPool reference, between POOL_BEGIN and POOL_END."""
    return _table(pool_openapi_schema()["properties"]["spec"], POOL_BEGIN, POOL_END)


def update(text: str) -> str:
    """`text` with each generated reference it marks replaced between its markers (ValueError: it marks none, or a
    BEGIN marker has no END)."""
    found = False
    for begin, end, ref in ((BEGIN, END, reference_markdown()), (POOL_BEGIN, POOL_END, pool_reference_markdown())):
        if begin not in text and end not in text:
            continue
        if begin not in text or end not in text:
            raise ValueError(f"{begin} ... {end}: one marker without the other")
        found = True
        start, stop = text.index(begin), text.index(end) + len(end) + 1
        text = text[:start] + ref + text[stop:]
    if not found:
        raise ValueError(f"no {BEGIN} or {POOL_BEGIN} marker")
    return text
