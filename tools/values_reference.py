"""The chart's values as a Markdown table for the docs site (docs/reference/helm-values.md), generated so that it
cannot drift: every key, its type and bounds from `charts/triton-operator/values.schema.json` (what `helm install`
validates), its default from `values.yaml`, and what it does from the schema's description or, where it has none,
the comment above the key in `values.yaml`.

`python -m tools.values_reference` prints the table; `--update PAGE` writes it between the page's markers
(`make docs`). tests/test_docs_site.py fails while the page's copy is stale.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent.parent / "charts" / "triton-operator"
BEGIN = "<!-- BEGIN GENERATED VALUES (tools/values_reference.py) -->"
END = "<!-- END GENERATED VALUES -->"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?:\s|$)")


def comments(values_yaml: str) -> dict[str, str]:
    """The comment block right above each key of values.yaml, by dotted path (lists' items are not keys)."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    block: list[str] = []
    for line in values_yaml.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        key = _KEY.match(line)
        if key:
            indent = len(key["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, key["key"]))
            if block:
                out[".".join(k for _, k in stack)] = " ".join(block)
        block = []
    return out


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref:
        return {**schema["definitions"][ref.rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _type(node: dict[str, Any]) -> str:
    kinds = node.get("type", "any")
    text = " \\| ".join(kinds) if isinstance(kinds, list) else str(kinds)
    if kinds == "array":
        text = f"[]{node.get('items', {}).get('type', 'any')}"
    if "enum" in node:
        text = " \\| ".join(f"`{v}`" for v in node["enum"])
    bounds = [f"{word} {node[key]}" for key, word in (("minimum", ">="), ("maximum", "<="), ("maxLength", "length <="))
              if key in node]
    return ", ".join([text, *bounds])


def _default(values: Any, path: list[str]) -> str:
    for key in path:
        if not isinstance(values, dict) or key not in values:
            return ""
        values = values[key]
    if isinstance(values, dict) and values:
        return ""  # an object with keys: its keys have rows of their own
    text = json.dumps(values)
    return f"`{text}`" if len(text) <= 60 else "(see values.yaml)"


def rows(schema: dict[str, Any], values: Any, notes: dict[str, str]) -> list[str]:
    out: list[str] = []

    def walk(node: dict[str, Any], path: list[str]) -> None:
        for key, child in node.get("properties", {}).items():
            child = _resolve(child, schema)
            here = [*path, key]
            dotted = ".".join(here)
            what = (child.get("description") or notes.get(dotted, "")).replace("|", "\\|")
            out.append(f"| `{dotted}` | {_type(child)} | {_default(values, here)} | {what} |")
            walk(child, here)

    walk(schema, [])
    return out


def table(chart: Path = CHART) -> str:
    schema = json.loads((chart / "values.schema.json").read_text())
    text = (chart / "values.yaml").read_text()
    lines = [BEGIN, "| value | type | default | what it does |", "|---|---|---|---|",
             *rows(schema, yaml.safe_load(text), comments(text)), END]
    return "\n".join(lines) + "\n"


def update(page: str, generated: str) -> str:
    """`page` with the table between its markers written again (ValueError: the page has no markers)."""
    if BEGIN not in page or END not in page:
        raise ValueError(f"no {BEGIN} ... {END} markers")
    start, stop = page.index(BEGIN), page.index(END) + len(END) + 1
    return page[:start] + generated + page[stop:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.values_reference", description=__doc__.splitlines()[0])
    parser.add_argument("--update", metavar="PAGE", type=Path, help="write the table between PAGE's markers")
    args = parser.parse_args(argv)
    generated = table()
    if args.update is None:
        sys.stdout.write(generated)
        return 0
    try:
        text = args.update.read_text()
        new = update(text, generated)
    except (ValueError, OSError) as exc:
        print(f"error: {args.update}: {exc}", file=sys.stderr)
        return 1
    if new != text:
        args.update.write_text(new)
    print(f"Updated the chart's values in {args.update}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
