"""Validation of TritonModels and TritonPools: schema (pydantic) plus semantic rules, pure, collecting every error.

Documents come in as parsed YAML (`load_documents`, read strictly by `yaml_input`); reading files is
`triton_operator.files`. A document is checked as the JSON it stands for, strictly: a string or a boolean is not
taken for a number (`maxBatchSize: "8"`, `count: true`), as the API server takes none. Objects read from the API
server (the webhook, the planner) are checked with the models' own, lax, validation: the API server has already
held them to the CRD's types."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..api.pool import POOL_KIND, TritonPool
from ..api.v1alpha1 import API_VERSION, KIND, TritonModel
from .errors import FieldError, from_pydantic
from .pool import POOL_IDENT, check_pool, check_pool_fit, pool_name_clashes, triton_name_clashes
from .rules import RULES, check_models
from .yaml_input import load_all

__all__ = ["RULES", "Document", "FieldError", "Loaded", "check_documents", "load_documents", "parse_strictly"]


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
    pools: list[tuple[str, TritonPool]] = field(default_factory=list)


def load_documents(text: str, ident: str = "<stdin>") -> list[Document]:
    """The documents of `text`, read strictly (`yaml_input`); a `yaml.YAMLError` says where the first problem is."""
    return [Document(f"{ident}#{i}", b) for i, b in enumerate(load_all(text)) if b is not None]


def parse_strictly(body: Any) -> TritonModel:
    """A TritonModel from a document as written: as JSON, in pydantic's strict mode (an enum still takes its
    value's string, as JSON gives it). Raises ValidationError, or ValueError for a value that makes no JSON."""
    return TritonModel.model_validate_json(json.dumps(body, allow_nan=True), strict=True)


def _kind(body: Any) -> str | None:
    return body.get("kind") if isinstance(body, dict) and body.get("kind") in (KIND, POOL_KIND) else None


def _parse(doc: Document, kind: str, out: Loaded) -> TritonModel | TritonPool | None:
    """The document as its kind, or None with its errors added to `out`."""
    meta = doc.body.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    ident = f"{kind}/{name}" if name else doc.ident
    if doc.body.get("apiVersion") != API_VERSION:
        out.errors.append(FieldError(ident, "apiVersion", f"must be {API_VERSION}, got {doc.body.get('apiVersion')!r}"))
        return None
    try:
        if kind == KIND:
            return parse_strictly(doc.body)
        return TritonPool.model_validate_json(json.dumps(doc.body, allow_nan=True), strict=True)
    except ValidationError as exc:
        out.errors.extend(from_pydantic(ident, exc))
    except (TypeError, ValueError) as exc:  # json.dumps: a value that is no JSON (a Python-built document)
        out.errors.append(FieldError(ident, "(document)", f"not a JSON document: {exc}"))
    return None


def check_documents(docs: Sequence[Document]) -> Loaded:
    """Parse every TritonModel and TritonPool document and check all rules across the set; other kinds are
    skipped. A pooled model whose pool is not among the documents is checked without it (it may be in the
    cluster)."""
    out = Loaded()
    for doc in docs:
        if isinstance(doc.body, Exception):
            out.errors.append(FieldError(doc.ident, "(yaml)", yaml_problem(doc.body), "schema"))
            continue
        kind = _kind(doc.body)
        if kind is None:
            continue
        parsed = _parse(doc, kind, out)
        if isinstance(parsed, TritonModel):
            out.models.append((f"TritonModel/{parsed.name}", parsed))
        elif isinstance(parsed, TritonPool):
            out.pools.append((POOL_IDENT.format(parsed.name), parsed))
    out.errors.extend(check_models(out.models))
    out.errors.extend(triton_name_clashes(out.models))
    seen: set[str] = set()
    for ident, pool in out.pools:
        if pool.name in seen:
            out.errors.append(FieldError(ident, "metadata.name", f"TritonPool {pool.name!r} is defined twice", "schema"))
        seen.add(pool.name)
        out.errors.extend(check_pool(pool, ident))
        out.errors.extend(check_pool_fit(pool, out.models))
    out.errors.extend(pool_name_clashes(out.models, out.pools))
    return out
