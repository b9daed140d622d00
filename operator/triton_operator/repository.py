"""The one writer of a rendered model repository to disk: `triton-operator render`, the tests and the
benchmarks all lay out `<model>/config.pbtxt`, `<model>/1/...` through it. Rendering itself stays pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from .render.modelconfig import RenderedModel


def write_repository(rendered: Mapping[str, RenderedModel] | Iterable[RenderedModel], root: Path) -> Path:
    """Writes every file of every rendered model under `root` (created as needed); returns `root`.

    An OSError (a read-only or full disk) propagates with the path it concerns in `filename`."""
    models = rendered.values() if isinstance(rendered, Mapping) else rendered
    for r in models:
        for rel, data in r.files.items():
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
    return root
