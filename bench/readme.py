"""The docs' benchmark figures, generated from `bench/results/*.json` (`make docs` runs `python -m bench.readme
--update`), so that no figure drifts from its run. They live on the docs site's Benchmarks page (docs/benchmarks.md),
and wherever else a page (README.md, one under docs/) cites one.

Two kinds of marker, on any page:
- a table, `<!-- BEGIN GENERATED BENCHMARKS KEY (bench/readme.py) -->` … `<!-- END GENERATED BENCHMARKS -->`:
  KEY `summary` is every row with a target, of every result; KEY a result's name (`rollout`) is all of that result's
  rows. Each table ends with the commit and date of the run its figures come from. A row's columns are `ours`,
  `usual` and any other key it has (a third approach), headed by the result's `columns` object (`{"keda": "KEDA
  on queue time"}`) where the JSON has one, else by COLUMNS below.
- a figure in prose or in a table cell, `<!-- bench:EXPR -->value<!-- /bench -->` (the comment renders as nothing).
  EXPR is `NAME::step::step…|filter|filter`: NAME a result (`bench/results/NAME.json`); each step a key of an
  object, an index of a list, `key=value,key=value` (the element of a list with those values), or, in a list of
  rows, a row's `figure` (the whole figure or a prefix only one row has; `figure >> part` the indented row under
  it whose figure starts with `part`); each filter narrows the text found: `part=LABEL` the `; `-separated part
  that starts with LABEL (`part=1000` of `100: 5.0; 1000: 17.2` is `17.2`), `field=LABEL` the value after LABEL
  (`field=p95` of `p50 79 ms, p95 96 ms` is `96 ms`), `head` the text before its first ` (`, `fmt=SPEC` a number
  formatted (`fmt=.1f`).

tests/test_readme_bench.py regenerates every page and fails on the first line that differs, and fails on any figure
written by hand on the Benchmarks page (a digit outside a marker or a code span). Nothing here measures.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.pages import pages as doc_pages

from .common import ORDER, REPO, RESULTS

README = REPO / "README.md"
#: The Benchmarks page: its generated tables, its pictures, and no figure by hand.
BENCHMARKS = REPO / "docs" / "benchmarks.md"


def pages() -> list[Path]:
    """Every page a benchmark figure may be marked on: README.md and the docs site's pages (`tools.pages`)."""
    return doc_pages(REPO)

BLOCK = re.compile(r"(?P<begin><!-- BEGIN GENERATED BENCHMARKS (?P<key>[a-z_-]+) \(bench/readme\.py\) -->\n)"
                   r"(?P<body>.*?)(?P<end><!-- END GENERATED BENCHMARKS -->)", re.S)
SPAN = re.compile(r"<!-- bench:(?P<expr>.+?) -->(?P<value>.*?)<!-- /bench -->")
#: The column headings of a result's own table where they are not "triton-operator" and "usual approach".
COLUMNS = {
    "autoscale": ("HPA on queue time (`spec.autoscaling`)", "HPA on CPU utilisation"),
    "rollout": ("in place (Swap, the default; Drain)", "new pods"),
    "pool": ("TritonPool", "a Deployment per model"),
    "pool-latency": ("TritonPool", "a Deployment per model"),
    "stale": ("TritonModel in place (Swap), done per its status", "Triton poll mode on a ConfigMap, done per `kubectl rollout status`"),
    "placement": ("`Spread`", "`Pack`"),
    "pool_routing": ("the model's Service (the operator's EndpointSlices)", "a Service selecting the pool's pods by readiness"),
    "upgrade": ("the chart's bound (`upgrade.maxModelsRolling`, its default)",
                "no bound (`upgrade.maxModelsRolling=0`): a plain `helm upgrade`"),
}
#: The size a `scale`-like row (`100: …; 1000: …`) shows in the summary when its target names none.
SUMMARY_SIZE = "1000"


class ReadmeError(ValueError):
    """A marker that names no result, no row or no figure."""


@dataclass(frozen=True)
class Results:
    docs: dict[str, dict[str, Any]]

    @classmethod
    def load(cls, directory: Path = RESULTS) -> Results:
        return cls({p.stem: pivot_usual(json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))})

    def names(self) -> list[str]:
        return [n for n in ORDER if n in self.docs] + sorted(n for n in self.docs if n not in ORDER)

    def doc(self, name: str) -> dict[str, Any]:
        if name not in self.docs:
            raise ReadmeError(f"no result {name!r} in bench/results (have: {', '.join(self.names())})")
        return self.docs[name]


USUAL_SUFFIX = re.compile(r"^(?P<figure>.*) \(usual: (?P<usual>[^)]+)\)$")


def pivot_usual(doc: dict[str, Any]) -> dict[str, Any]:
    """A result that compares ours with several usual approaches writes one row per pair, each figure suffixed
    `(usual: NAME)` (`autoscale`: Prometheus + KEDA, a CPU HPA): shown as one row per figure, a column per approach
    (`usual` for the first, then `usual:NAME`), headed by the approach's name. Other results are returned as they are."""
    rows = doc.get("rows") or []
    found = [USUAL_SUFFIX.match(str(r.get("figure", ""))) for r in rows]
    if not rows or not all(found):
        return doc
    approaches = list(dict.fromkeys(m.group("usual") for m in found if m))
    keys = {a: "usual" if i == 0 else f"usual:{a}" for i, a in enumerate(approaches)}
    merged: dict[str, dict[str, Any]] = {}
    for r, m in zip(rows, found, strict=True):
        assert m is not None
        row = merged.setdefault(m.group("figure"), {"figure": m.group("figure"), "ours": r.get("ours", "-")})
        row[keys[m.group("usual")]] = r.get("usual", "-")
        for k in ("target", "met"):
            if k in r and r[k] not in ("-", "", None):
                row[k] = r[k]
    columns = {**{k: a for a, k in keys.items()}, **(doc.get("columns") or {})}
    return {**doc, "rows": list(merged.values()), "columns": columns}


# -- where a result's figures come from ---------------------------------------------------------------


def provenance(name: str, doc: dict[str, Any]) -> str:
    """`commit e5c1465, run 2026-11-25`, or, for a result that recorded no commit, the last commit of its file."""
    m = doc.get("machine", {})
    date = str(m.get("date", "?"))[:10]
    if m.get("commit"):
        dirty = m.get("dirty", bool(m.get("operator_uncommitted")))
        return f"commit {m['commit']}{' with uncommitted changes' if dirty else ''}, run {date}"
    out = subprocess.run(["git", "log", "-1", "--format=%h", "--", f"bench/results/{name}.json"], cwd=REPO,
                         capture_output=True, text=True, check=False).stdout.strip()
    return f"run {date}, before commits were recorded (file last changed at {out or 'an uncommitted state'})"


def source_line(names: list[str], results: Results) -> str:
    parts = []
    for name in names:
        doc = results.doc(name)
        busy = doc.get("contention", {}).get("cpu_busy_fraction")
        load = f", the machine {busy:.0%} busy" if isinstance(busy, (int, float)) else ""
        parts.append(f"`{name}` at {provenance(name, doc)}{load}")
    return "Generated from bench/results (`make docs`): " + "; ".join(parts) + "."


# -- tables ------------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    text = str(value)
    indent = len(text) - len(text.lstrip(" "))
    return "&emsp;" * (indent // 2) + text.strip().replace("|", "\\|").replace("\n", " ")


def _met(row: dict[str, Any]) -> str:
    return "-" if row.get("met") is None else ("yes" if row["met"] else "**no**")


def split_top(text: str, sep: str = "; ") -> list[str]:
    """`text` split at `sep` outside parentheses."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def part(text: str, label: str) -> str | None:
    """The part of `text` (`; `-separated) that starts with `label` (then `:` or a space), without the label."""
    for piece in split_top(text):
        for lead in (f"{label}: ", f"{label} "):
            if piece.startswith(lead):
                return piece[len(lead):]
    return None


def summary_table(results: Results) -> list[str]:
    out = ["| benchmark | figure | triton-operator | usual approach | target | met |", "|---|---|---|---|---|---|"]
    names = []
    for name in results.names():
        rows, parent = [], ""
        for r in results.doc(name)["rows"]:
            if not str(r["figure"]).startswith(" "):
                parent = str(r["figure"])
            if r.get("target", "-") not in ("-", ""):
                rows.append((r, parent))
        for r, parent in rows:
            figure, ours, usual = str(r["figure"]), str(r["ours"]), str(r.get("usual", "-"))
            others = [(h, str(r[k])) for k, h in value_columns(name, results.doc(name))[2:] if k in r]
            if figure.startswith(" "):  # a part of the row above it: named with it
                figure = f"{parent}: {figure.strip()}"
            if part(ours, SUMMARY_SIZE) is not None:  # a row per model count: both sides at the same count
                size = re.search(r"\b(\d+)( models)?\b", str(r["target"]))
                n = size.group(1) if size and part(ours, size.group(1)) is not None else SUMMARY_SIZE
                figure, ours, usual = f"{figure}, {n} models", part(ours, n) or "-", part(usual, n) or usual
                others = [(h, part(v, n) or v) for h, v in others]
            usual = "; ".join([usual, *(f"{h}: {v}" for h, v in others)])
            out.append(f"| `{name}` | {_cell(figure)} | {_cell(ours)} | {_cell(usual)} | {_cell(r['target'])} "
                       f"| {_met(r)} |")
        if rows:
            names.append(name)
    return [*out, "", source_line(names, results)]


def value_columns(name: str, doc: dict[str, Any]) -> list[tuple[str, str]]:
    """A result's value columns, (row key, heading): `ours`, `usual`, then any other key its rows have (a third
    approach), headed by the result's own `columns` object where it has one, else by COLUMNS, else by the key."""
    keys = ["ours", "usual"] + [k for r in doc["rows"] for k in r if k not in ("figure", "ours", "usual", "target", "met")]
    keys = list(dict.fromkeys(keys))
    defaults = dict(zip(("ours", "usual"), COLUMNS.get(name, ("triton-operator", "usual approach")), strict=True))
    own = doc.get("columns") or {}
    return [(k, str(own.get(k) or defaults.get(k) or k)) for k in keys]


def result_table(name: str, results: Results) -> list[str]:
    doc = results.doc(name)
    rows = doc["rows"]
    cols = value_columns(name, doc)
    heads = " | ".join(h for _, h in cols)
    rule = "|---" * (len(cols) + 3) + "|"
    sizes = [p.split(": ", 1)[0] for p in split_top(str(rows[0]["ours"]))] if rows else []
    if len(sizes) > 1 and all(re.fullmatch(r"\d+", s) for s in sizes) and all(
            part(str(r.get(k, "-")), s) is not None for s in sizes for r in rows for k, _ in cols):
        # A row per model count (`scale`): a line per figure and count.
        out = [f"| figure | models | {heads} | target | met |", rule + "---|"]
        for r in rows:
            for s in sizes:
                values = " | ".join(_cell(part(str(r.get(k, "-")), s)) for k, _ in cols)
                out.append(f"| {_cell(r['figure'])} | {s} | {values} | {_cell(r.get('target', '-'))} | {_met(r)} |")
    else:
        out = [f"| figure | {heads} | target | met |", rule]
        for r in rows:
            values = " | ".join(_cell(r.get(k, "-")) for k, _ in cols)
            out.append(f"| {_cell(r['figure'])} | {values} | {_cell(r.get('target', '-'))} | {_met(r)} |")
    return [*out, "", source_line([name], results)]


def table(key: str, results: Results) -> str:
    lines = summary_table(results) if key == "summary" else result_table(key, results)
    return "\n".join(lines) + "\n"


# -- figures in prose ----------------------------------------------------------------------------------------


def _rows_named(rows: list[Any], name: str) -> list[Any]:
    """The rows whose figure is `name`, else those whose figure starts with it (leading spaces ignored)."""
    figures = [r for r in rows if isinstance(r, dict) and "figure" in r]
    exact = [r for r in figures if str(r["figure"]).strip() == name]
    return exact or [r for r in figures if str(r["figure"]).strip().startswith(name)]


def _step(node: Any, step: str, expr: str) -> Any:
    if isinstance(node, dict):
        if step in node:
            return node[step]
        raise ReadmeError(f"{expr}: no key {step!r} (have: {', '.join(map(str, node))})")
    if not isinstance(node, list):
        raise ReadmeError(f"{expr}: cannot take {step!r} of {node!r}")
    if re.fullmatch(r"-?\d+", step):
        return node[int(step)]
    if re.fullmatch(r"[\w-]+=[^,]*(,[\w-]+=[^,]*)*", step):  # `impl=ours,models=1000`: the element with those values
        want = dict(kv.split("=", 1) for kv in step.split(","))
        found = [e for e in node if isinstance(e, dict) and all(str(e.get(k)) == v for k, v in want.items())]
    else:
        parent, _, child = step.partition(" >> ")  # `figure >> sub-figure`: an indented row under that figure
        found = _rows_named(node, parent)
        if child and len(found) == 1:
            start = node.index(found[0]) + 1
            end = next((i for i in range(start, len(node)) if not str(node[i].get("figure", "")).startswith(" ")),
                       len(node))
            found = _rows_named(node[start:end], child)[:1]
    if len(found) == 1:
        return found[0]
    figures = "; ".join(str(r.get("figure", r)).strip() for r in node if isinstance(r, dict))
    raise ReadmeError(f"{expr}: {len(found)} elements match {step!r}" + ("" if found else f" (have: {figures})"))


def _filter(value: Any, flt: str, expr: str) -> Any:
    name, _, arg = flt.partition("=")
    if name == "part":
        got = part(str(value), arg)
    elif name == "field":
        m = re.search(rf"(?:^|[\s(,;]){re.escape(arg)}:? ([^,;()]+?)(?=,|;| \(|\)|$)", str(value))
        got = m.group(1) if m else None
    elif name == "head":
        got = str(value).split(" (", 1)[0]
    elif name == "fmt":
        got = format(float(value), arg)
    else:
        raise ReadmeError(f"{expr}: unknown filter {flt!r} (part=, field=, head, fmt=)")
    if got is None:
        raise ReadmeError(f"{expr}: {flt!r} found nothing in {value!r}")
    return got


def figure(expr: str, results: Results) -> str:
    """The text EXPR (see the module's docstring) names."""
    path, *filters = expr.split("|")
    name, *steps = path.split("::")
    node: Any = results.doc(name)
    for step in steps:
        node = _step(node, step, expr)
    for flt in filters:
        node = _filter(node, flt, expr)
    if isinstance(node, (dict, list)):
        raise ReadmeError(f"{expr}: names an object, not a figure")
    return str(node)


# -- the pages -------------------------------------------------------------------------------------------------


def update(text: str, results: Results) -> str:
    """`text` with every generated table and marked figure written again from `results`."""
    text = BLOCK.sub(lambda m: m["begin"] + table(m["key"], results) + m["end"], text)
    return SPAN.sub(lambda m: f"<!-- bench:{m['expr']} -->{figure(m['expr'], results)}<!-- /bench -->", text)


def section(text: str, title: str = "## Benchmarks") -> str:
    """A page's section `title`, up to the next `## ` heading."""
    start = text.index(f"\n{title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def hand_written_figures(text: str) -> list[str]:
    """The lines of `text` that hold a digit outside the generated markers and code spans: a figure by hand."""
    text = BLOCK.sub("", text)
    text = SPAN.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # a link's target
    text = re.sub(r"\bp\d\d\b", "", text)  # a percentile's name (p50), not a figure
    return [line for line in text.splitlines() if re.search(r"\d", line)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.readme", description=__doc__.splitlines()[0])
    parser.add_argument("--update", metavar="PAGE", type=Path, nargs="*",
                        help="write the figures into each PAGE's markers (none named: README.md and every docs page)")
    args = parser.parse_args(argv)
    try:
        results = Results.load()
        if args.update is None:
            sys.stdout.write(update(BENCHMARKS.read_text(), results))
            return 0
        for path in args.update or pages():
            text = path.read_text()
            new = update(text, results)
            if new != text:
                path.write_text(new)
                print(f"Updated the benchmark figures in {path}", file=sys.stderr)
    except (ReadmeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
