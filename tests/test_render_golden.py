"""Every example's Kubernetes children, byte for byte: `render_children` for each TritonModel in examples/, with
the warm-up gate as the example sets it and the other way round (its Deployment), and with a repository master key
(its Deployment), equal to tests/golden/children.json. A change that means to alter the objects regenerates the file
(`.venv/bin/python -m tests.test_render_golden`) and the diff shows what changed; a restructure leaves it alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.files import load_paths
from triton_operator.render.kubernetes import Options, render_children
from triton_operator.render.modelconfig import render_repository
from triton_operator.render.repository_key import RepositoryKeys
from triton_operator.validate import check_documents

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "children.json"
UID = "00000000-0000-0000-0000-0000000000c1"
KEYS = RepositoryKeys(b"golden-master-key-of-32-bytes-ok")


def _examples() -> list[TritonModel]:
    """Every example model with a Deployment of its own (pooled ones: tests/test_render_pool.py)."""
    loaded = check_documents(load_paths([ROOT / "examples"]))
    assert not loaded.errors, [str(e) for e in loaded.errors]
    return [m for _, m in loaded.models if m.spec.pool is None]


def _gate_flipped(model: TritonModel) -> TritonModel:
    gate = model.spec.warmup_gate.model_copy(update={"enabled": not model.spec.warmup_gate.enabled})
    return model.model_copy(update={"spec": model.spec.model_copy(update={"warmup_gate": gate})})


def rendered_examples() -> dict[str, list[dict[str, Any]]]:
    """`<variant>/<model>` -> the model's children, for every example model and variant."""
    out: dict[str, list[dict[str, Any]]] = {}
    for variant, flip, options in (("as-written", False, Options()), ("gate-flipped", True, Options()),
                                   ("keys", False, Options(repository_keys=KEYS))):
        models = [_gate_flipped(m) if flip else m for m in _examples()]
        rendered = render_repository(models)
        for m in sorted(models, key=lambda m: m.name):
            children = render_children(m, rendered, UID, "golden", options)
            # The gate and the key change only the Deployment: the other variants keep just that.
            out[f"{variant}/{m.name}"] = children if variant == "as-written" else \
                [c for c in children if c["kind"] == "Deployment"]
    return out


def _text(children: dict[str, list[dict[str, Any]]]) -> str:
    return json.dumps(children, indent=1, sort_keys=False) + "\n"


def test_every_example_renders_as_before() -> None:
    children = rendered_examples()
    assert len(children) >= 3 * 10, "every example model, in every variant"
    golden = json.loads(GOLDEN.read_text())
    assert sorted(children) == sorted(golden), "the same example models as the golden file"
    for key, objects in children.items():
        assert objects == golden[key], f"{key}: the rendered children differ from tests/golden/children.json"
    assert _text(children) == GOLDEN.read_text(), "byte for byte, key order included"


if __name__ == "__main__":
    GOLDEN.write_text(_text(rendered_examples()))
    print(f"wrote {GOLDEN}")
