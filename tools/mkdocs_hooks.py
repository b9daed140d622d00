"""MkDocs hooks of the docs site (mkdocs.yml): the benchmark pictures are served from where `bench/plots.py` draws
them, `bench/results/<name>.png`, at the same path in the site, so docs/benchmarks.md shows
`bench/results/<name>.png` and no copy of a picture is committed twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def on_files(files: Files, config: Any, **_: Any) -> Files:
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"bench/results/{png.name}", abs_src_path=str(png)))
    return files
