"""The pages of the project's documentation, in one list: README.md and every page of the docs site (docs/**/*.md).

What reads it: `bench.readme` (benchmark figures marked on a page), `tests.corpus_counts` (counts marked on a page),
tests/test_docs_site.py and tests/test_readme.py (checks over every page). A page added under docs/ is in it.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pages(root: Path = ROOT) -> list[Path]:
    """README.md, then the docs site's pages in path order."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
