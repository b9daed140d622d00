"""The docs site (mkdocs.yml, docs/): it builds with `mkdocs build --strict`, as `make docs` builds it, so a broken
link, a missing anchor, a page left out of the nav or a missing include fails here, in the unit tier of CI; no two
pages, README.md included, carry the same table (each fact is written once, and the others link to it); and the
generated pages are current."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import values_reference
from tools.pages import pages as doc_pages

ROOT = Path(__file__).resolve().parent.parent
PAGES = doc_pages(ROOT)


def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    """What `make docs` runs, into a temporary directory: every warning (a link to no page or no anchor, a page
    outside the nav, an include that names no file) is an error."""
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    install = (site / "install" / "index.html").read_text()
    assert "make release-push" in install, "docs/install.md should include README.md's install commands"
    for png in (ROOT / "bench" / "results").glob("*.png"):
        assert (site / "bench" / "results" / png.name).read_bytes() == png.read_bytes()


def tables(text: str) -> list[list[str]]:
    """The Markdown tables of a page, each as its lines (header, rule, rows), code blocks skipped."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    found: list[list[str]] = []
    current: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line.strip())
        else:
            if len(current) >= 2 and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", current[1]):
                found.append(current)
            current = []
    return found


def _first_cells(table: list[str]) -> list[str]:
    return [row.split("|")[1].strip() for row in table[2:]]


def duplicate_tables(pages: dict[str, str]) -> list[str]:
    """Pairs of tables that say one thing twice: the same lines, or the same header and the same first column (a
    copy that has drifted since)."""
    seen: dict[tuple[str, tuple[str, ...]], str] = {}
    problems = []
    for name, text in pages.items():
        for table in tables(text):
            key = (table[0], tuple(_first_cells(table)))
            where = f"{name} (table '{table[0][:60]}')"
            if key in seen:
                problems.append(f"{seen[key]} and {where}")
            else:
                seen[key] = where
    return problems


def test_no_two_pages_carry_the_same_table() -> None:
    pages = {str(p.relative_to(ROOT)): p.read_text() for p in PAGES}
    assert sum(len(tables(t)) for t in pages.values()) > 10, "the pages' tables should be found"
    problems = duplicate_tables(pages)
    assert not problems, "a table is written twice: keep it on one page and link to it there:\n" + "\n".join(problems)


def test_a_copied_table_is_found_even_once_it_has_drifted() -> None:
    table = "| | own | pool |\n|---|---|---|\n| GPUs | one per replica | shared |\n| updates | in place | {} |\n"
    assert duplicate_tables({"a.md": table.format("in place only"), "b.md": "text\n\n" + table.format("Swap")})
    assert not duplicate_tables({"a.md": table.format("x"), "b.md": "```\n" + table.format("x") + "```\n"})
    other = "| | own | pool |\n|---|---|---|\n| isolation | alone | shared |\n"
    assert not duplicate_tables({"a.md": table.format("x"), "b.md": other})


def test_the_helm_values_page_is_generated_from_the_schema() -> None:
    page = (ROOT / "docs" / "reference" / "helm-values.md").read_text()
    assert values_reference.update(page, values_reference.table()) == page, (
        "docs/reference/helm-values.md is stale: run `make docs`")
    assert "| `upgrade.maxModelsRolling` | integer, >= 0 | `2` |" in page


def test_a_values_comment_is_read_from_above_its_key() -> None:
    text = "# top\na:\n  # what b does,\n  # on two lines\n  b: 1\n\n  c: 2\n# d's\nd: {}\n"
    assert values_reference.comments(text) == {"a": "top", "a.b": "what b does, on two lines", "d": "d's"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_links_to_the_readme_sections_that_moved(page: Path) -> None:
    """The README's sections moved to the docs site: a link into one (`README.md#security`, `#production-checklist`
    on the README) names a place that is gone."""
    text = page.read_text()
    moved = re.findall(r"\]\((?:\.\./)*README\.md#[^)]*\)", text)
    assert not moved, f"{page.name} links into README sections that moved to docs/: {moved}"
