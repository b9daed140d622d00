"""The pages' benchmark figures (README.md, docs/benchmarks.md and the other docs pages that cite one) are
bench/results' own: regenerated from the JSON files and compared (`make docs` writes them: bench/readme.py), and no
figure on the Benchmarks page is written by hand. RESULTS.md, too, is what its JSON files make of it, byte for byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import common, readme
from bench.readme import BENCHMARKS, REPO, ReadmeError, Results, pages


def first_difference(got: str, want: str, page: str) -> str | None:
    a, b = got.splitlines(), want.splitlines()
    for i, (x, y) in enumerate(zip(a, b, strict=False), start=1):
        if x != y:
            return f"line {i}:\n  {page}:  {x}\n  generated:  {y}"
    if len(a) != len(b):
        i = min(len(a), len(b)) + 1
        return f"line {i}: {page} has {len(a)} lines, the generated text {len(b)}"
    return None


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_each_pages_benchmark_figures_are_generated_from_bench_results(page: Path) -> None:
    text, name = page.read_text(), str(page.relative_to(REPO))
    new = readme.update(text, Results.load())
    diff = first_difference(text, new, name)
    assert diff is None, f"{name}'s benchmark figures differ from bench/results (run `make docs`), first at {diff}"
    assert readme.update(new, Results.load()) == new, "`make docs` should change nothing the second time"


def test_the_benchmarks_page_marks_its_tables_and_figures() -> None:
    text = BENCHMARKS.read_text()
    assert readme.BLOCK.search(text) and readme.SPAN.search(text), "docs/benchmarks.md should mark its figures"


def test_no_figure_on_the_benchmarks_page_is_written_by_hand() -> None:
    lines = readme.hand_written_figures(BENCHMARKS.read_text())
    assert not lines, ("a figure on docs/benchmarks.md is not generated from bench/results: mark it "
                       "`<!-- bench:NAME::… -->…<!-- /bench -->` (bench/readme.py) or write it without digits:\n"
                       + "\n".join(lines))


@pytest.mark.parametrize("page", [p for p in pages() if p != BENCHMARKS], ids=lambda p: str(p.relative_to(REPO)))
def test_a_benchmark_figure_on_any_other_page_is_marked_too(page: Path) -> None:
    unmarked = [line for line in page.read_text().splitlines() if "make bench" in line and "<!-- bench:" not in line]
    assert not unmarked, f"a line of {page.name} cites `make bench` with no generated figure:\n" + "\n".join(unmarked)


def test_the_summary_names_the_commit_of_every_result_it_shows() -> None:
    results = Results.load()
    summary = readme.table("summary", results)
    for name in results.names():
        doc = results.doc(name)
        assert f"`{name}` at commit {doc['machine']['commit']}" in summary or not any(
            r.get("target", "-") != "-" for r in doc["rows"]), f"the summary should name {name}'s commit"
    assert "before commits were recorded" not in summary


RESULT: dict[str, Any] = {
    "name": "demo", "title": "Demo", "method": "m", "notes": [], "data": {"phases": [{"impl": "ours", "n": 3}]},
    "machine": {"nproc": 2, "memory_gib": 1.0, "cpu_model": "x", "date": "2026-01-02T03:04:05Z", "kernel": "k",
                "python": "3", "tritonserver": "t", "commit": "abc1234", "dirty": False},
    "seconds": 1, "contention": {"cpu_busy_fraction": 0.5},
    "rows": [
        {"figure": "latency", "ours": "p50 10 ms, p95 20 ms, max 30 ms (n=5)", "usual": "p50 5 ms, p95 90 ms",
         "target": "p95 <= 25 ms", "met": True},
        {"figure": "size", "ours": "100: 5.0 (5 writes); 1000: 6.0 (6 writes)", "usual": "100: 15.0; 1000: 17.2",
         "target": "<= 5 at 1000", "met": False},
        {"figure": "apply", "ours": "1 s", "usual": "-", "target": "-", "met": None},
        {"figure": "  the rest", "ours": "p50 7 ms", "usual": "-", "target": "<= 1 s", "met": True},
    ],
}


def test_figures_are_found_by_row_part_field_and_element() -> None:
    results = Results({"demo": RESULT})
    assert readme.figure("demo::rows::latency::ours|field=p95", results) == "20 ms"
    assert readme.figure("demo::rows::latency::usual|field=p50", results) == "5 ms"
    assert readme.figure("demo::rows::size::usual|part=1000", results) == "17.2"
    assert readme.figure("demo::rows::size::ours|part=1000|head", results) == "6.0"
    assert readme.figure("demo::rows::apply >> the rest::ours|field=p50", results) == "7 ms"
    assert readme.figure("demo::data::phases::impl=ours::n|fmt=.1f", results) == "3.0"
    text = "a <!-- bench:demo::rows::latency::ours|field=p95 -->99 ms<!-- /bench --> b"
    assert readme.update(text, results) == "a <!-- bench:demo::rows::latency::ours|field=p95 -->20 ms<!-- /bench --> b"


def test_the_summary_shows_both_sides_at_the_same_size_and_the_commit() -> None:
    summary = readme.table("summary", Results({"demo": RESULT}))
    assert "| `demo` | size, 1000 models | 6.0 (6 writes) | 17.2 | <= 5 at 1000 | **no** |" in summary
    assert "| `demo` | latency | p50 10 ms, p95 20 ms, max 30 ms (n=5) | p50 5 ms, p95 90 ms |" in summary
    assert "| `demo` | apply: the rest | p50 7 ms |" in summary
    assert "`demo` at commit abc1234, run 2026-01-02, the machine 50% busy" in summary
    dirty = {**RESULT, "machine": {**RESULT["machine"], "dirty": True}}
    assert "commit abc1234 with uncommitted changes" in readme.table("summary", Results({"demo": dirty}))


def test_a_result_without_a_commit_is_said_to_be_so_never_given_one() -> None:
    old = {**RESULT, "machine": {k: v for k, v in RESULT["machine"].items() if k not in ("commit", "dirty")}}
    assert "before commits were recorded (file last changed at" in readme.table("demo", Results({"demo": old}))


@pytest.mark.parametrize(("expr", "error"), [
    ("nope::rows", "no result 'nope'"),
    ("demo::rows::latent::ours", "0 elements match 'latent'"),
    ("demo::rows::latency::ours|field=p99", "'field=p99' found nothing"),
    ("demo::rows::latency", "names an object"),
])
def test_a_marker_that_names_nothing_is_refused_by_name(expr: str, error: str) -> None:
    with pytest.raises(ReadmeError, match=error.replace("(", r"\(")):
        readme.figure(expr, Results({"demo": RESULT}))


def test_a_figure_by_hand_is_found_and_code_links_and_percentile_names_are_not() -> None:
    text = ("## Benchmarks\n\n`BENCH=100` p50 [notes](bench/NOTES2.md) <!-- bench:x -->5<!-- /bench -->\n"
            "it took 3 s\n")
    assert readme.hand_written_figures(text) == ["it took 3 s"]


def test_results_md_regenerates_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for p in common.RESULTS.glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    assert common.write_markdown().read_text() == (Path(readme.__file__).parent / "results" / "RESULTS.md").read_text(), (
        "bench/results/RESULTS.md differs from what its JSON files make: run `python -m bench.run --markdown-only`")


def test_a_result_records_its_commit_whether_the_tree_was_dirty_and_the_date() -> None:
    m = common.machine()
    assert m["commit"] and isinstance(m["dirty"], bool) and m["date"].endswith("Z")
    json.dumps(m)


def test_a_third_approach_in_the_rows_gets_a_column_of_its_own_and_a_place_in_the_summary() -> None:
    three = {**RESULT, "columns": {"keda": "KEDA on queue time"},
             "rows": [{**RESULT["rows"][0], "keda": "p50 8 ms, p95 40 ms"}, RESULT["rows"][2]]}
    table = readme.table("demo", Results({"demo": three}))
    assert "| figure | triton-operator | usual approach | KEDA on queue time | target | met |" in table
    assert "| latency | p50 10 ms, p95 20 ms, max 30 ms (n=5) | p50 5 ms, p95 90 ms | p50 8 ms, p95 40 ms |" in table
    assert "| apply | 1 s | - | - | - | - |" in table
    summary = readme.table("summary", Results({"demo": three}))
    assert "| p50 5 ms, p95 90 ms; KEDA on queue time: p50 8 ms, p95 40 ms |" in summary


def test_rows_pairing_ours_with_several_usual_approaches_are_shown_one_row_per_figure() -> None:
    from bench.readme import pivot_usual

    doc = {"rows": [{"figure": "asked (usual: KEDA)", "ours": "4 s", "usual": "6 s"},
                    {"figure": "asked (usual: CPU HPA)", "ours": "4 s", "usual": "never", "target": "-"},
                    {"figure": "failed (usual: KEDA)", "ours": "0", "usual": "0", "target": "0", "met": True},
                    {"figure": "failed (usual: CPU HPA)", "ours": "0", "usual": "1"}]}
    out = pivot_usual(doc)
    assert out["rows"] == [{"figure": "asked", "ours": "4 s", "usual": "6 s", "usual:CPU HPA": "never"},
                           {"figure": "failed", "ours": "0", "usual": "0", "target": "0", "met": True,
                            "usual:CPU HPA": "1"}]
    assert out["columns"] == {"usual": "KEDA", "usual:CPU HPA": "CPU HPA"}
    plain = {"rows": [{"figure": "a", "ours": "1", "usual": "2"}]}
    assert pivot_usual(plain) is plain, "a result with one usual approach is left as it is"


def test_a_result_records_the_commit_its_run_started_at_and_says_when_the_checkout_changed_during_it() -> None:
    from bench import common

    meter = common.CpuMeter()
    assert common.machine(meter.tree)["commit"] == meter.tree["commit"]
    assert "changed_during_run" not in common.machine(meter.tree)
    moved = {**meter.tree, "commit": "0000000"}  # as if HEAD had moved (a checkout, a commit) while it ran
    m = common.machine(moved)
    assert m["commit"] == "0000000" and m["dirty"] is True
    assert m["changed_during_run"]["start"]["commit"] == "0000000"
    assert m["changed_during_run"]["end"]["commit"] == meter.tree["commit"]
