"""The TritonModels the benchmarks run: the examples, with the edits each benchmark needs.

Every model passes the operator's own checks before use, and is rendered by the operator's own
renderer (`render_repository`), so a benchmark runs exactly the config.pbtxt the operator would.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from triton_operator import files
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.render.modelconfig import RenderedModel, render_repository
from triton_operator.validate.rules import check_models

from .common import REPO

EXAMPLES = REPO / "examples"
#: The pool benchmarks' small Python model: OUTPUT = INPUT * 2, inline (`source.inline`).
DOUBLE_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT", (pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() * 2).astype(np.float32))])
            for r in requests]
"""


def example(name: str) -> dict[str, Any]:
    """The first TritonModel document of examples/<name>.yaml, as a dict."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()) if d]
    return copy.deepcopy(docs[0])


def checked(doc: Mapping[str, Any]) -> TritonModel:
    """The TritonModel after the operator's checks; raises with every problem if it fails them."""
    model = TritonModel.model_validate(dict(doc))
    errors = list(check_models([(f"TritonModel/{model.name}", model)]))
    if errors:
        raise ValueError(f"{model.name} fails the operator's checks: " + "; ".join(str(e) for e in errors))
    return model


def write_repository(models: list[TritonModel], repo: Path) -> dict[str, RenderedModel]:
    rendered = render_repository(models)
    files.write_repository(rendered, repo)
    return rendered


def replace_once(text: str, old: str, new: str) -> str:
    """`text` with `old` replaced by `new`; fails loudly if the example changed under us."""
    if text.count(old) != 1:
        raise ValueError(f"expected exactly one {old!r} in the example's model.py")
    return text.replace(old, new)
