"""Validation of TritonModels: schema (pydantic) plus semantic rules, pure, collecting every error."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..api.v1alpha1 import API_VERSION, KIND, TritonModel
from .errors import FieldError, from_pydantic
from .rules import RULES, check_models

__all__ = [
    "RULES", "Document", "FieldError", "InputError", "Loaded", "check_documents", "load_documents", "load_paths",
    "read_text",
]


class InputError(Exception):
    """A file that cannot be read as UTF-8 text. `str()` is one line naming the file."""


def read_text(path: Path) -> str:
    """The UTF-8 text of `path`, or an InputError saying in one line why not."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}, offset {exc.start}); "
            "save it as UTF-8"
        ) from exc


def yaml_problem(exc: Exception) -> str:
    """One line for a YAML error: where, and what (PyYAML's own text spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    what = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    text = f"{context}: {what}" if context else what
    return f"not valid YAML{where}: {' '.join(text.split())}"


@dataclass(frozen=True)
class Document:
    ident: str  # "file.yaml#2"
    body: Any


@dataclass
class Loaded:
    models: list[tuple[str, TritonModel]] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)


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
                items = list(yaml.safe_load_all(text))
            except yaml.YAMLError as exc:
                docs.append(Document(f"{f}", exc))
                continue
            for i, body in enumerate(items):
                if body is not None:
                    docs.append(Document(f"{f}#{i}", body))
    return docs


def load_documents(text: str, ident: str = "<stdin>") -> list[Document]:
    return [Document(f"{ident}#{i}", b) for i, b in enumerate(yaml.safe_load_all(text)) if b is not None]


def _is_triton_model(body: Any) -> bool:
    return isinstance(body, dict) and body.get("kind") == KIND


def check_documents(docs: Sequence[Document]) -> Loaded:
    """Parse every TritonModel document and check all rules across the set; other kinds are skipped."""
    out = Loaded()
    for doc in docs:
        if isinstance(doc.body, Exception):
            out.errors.append(FieldError(doc.ident, "(yaml)", yaml_problem(doc.body), "schema"))
            continue
        if not _is_triton_model(doc.body):
            continue
        name = (doc.body.get("metadata") or {}).get("name") if isinstance(doc.body.get("metadata"), dict) else None
        ident = f"TritonModel/{name}" if name else doc.ident
        if doc.body.get("apiVersion") != API_VERSION:
            out.errors.append(FieldError(ident, "apiVersion", f"must be {API_VERSION}, got {doc.body.get('apiVersion')!r}"))
            continue
        try:
            model = TritonModel.model_validate(doc.body)
        except ValidationError as exc:
            out.errors.extend(from_pydantic(ident, exc))
            continue
        out.models.append((ident, model))
    out.errors.extend(check_models(out.models))
    return out
