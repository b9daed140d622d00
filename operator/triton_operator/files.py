"""Files in and out: TritonModel documents read from disk, and a rendered model repository written to it.

The layers below (`api`, `render`, `validate`, `plan`) never touch a file; the CLI, the tests and the
benchmarks come through here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from .render.modelconfig import RenderedModel
from .validate import Document
from .validate.yaml_input import load_all


class InputError(Exception):
    """A file that cannot be read as UTF-8 text. `str()` is one line naming the file."""


def read_text(path: Path) -> str:
    """The UTF-8 text of `path`, or an InputError saying in one line why not."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return decode(path, data)


def decode(path: Path, data: bytes) -> str:
    """`data`, read from `path`, as UTF-8 text, or an InputError saying in one line why not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}, offset {exc.start}); "
            "save it as UTF-8"
        ) from exc


def _yaml_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    return [path]


def load_paths(paths: Iterable[str | Path]) -> list[Document]:
    """Every YAML document in the given files and directories (recursively), in a stable order.

    A file that cannot be read as UTF-8 raises InputError; one that is not YAML becomes a Document
    holding the error, reported with the others."""
    docs: list[Document] = []
    for p in paths:
        for f in _yaml_files(Path(p)):
            text = read_text(f)
            try:
                items = load_all(text)
            except yaml.YAMLError as exc:
                docs.append(Document(f"{f}", exc))
                continue
            for i, body in enumerate(items):
                if body is not None:
                    docs.append(Document(f"{f}#{i}", body))
    return docs


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
