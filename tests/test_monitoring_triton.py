"""The Triton metric names the chart's alerts and dashboard read (tests/monitoring.py, TRITON_METRICS) are those a REAL
tritonserver serves on its metrics port, read after requests to a model with the response cache (whose per-model
cache counters exist only then): a name Triton renames or drops fails here, not on a user's empty panel."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.monitoring import TRITON_METRICS
from tests.triton_helpers import EXAMPLES, load_models, serve, tensor
from triton_operator.api.v1alpha1 import quantity_bytes

pytestmark = pytest.mark.triton


def _sample_names(host: str, port: int) -> dict[str, set[str]]:
    """Sample name -> the `model` labels it has samples for."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).add(sample.labels.get("model", ""))
    return out


def test_every_triton_metric_the_chart_reads_is_served_for_the_model(tmp_path: Path) -> None:
    models = load_models(EXAMPLES / "response-cache.yaml")
    with serve(models, tmp_path / "repo", cache_size=quantity_bytes(models[0].spec.server.cache_size)) as s:
        x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
        for _ in range(3):  # one miss, then hits
            s.client.infer("response-cache", [tensor("INPUT", x)])
        names = s.wait_for("the requests counted in Triton's metrics", lambda: (
            n if "response-cache" in (n := _sample_names(s.server.host, s.server.metrics_port)).get(
                "nv_cache_num_hits_per_model", set()) else None), 30, 0.2)
    missing = {m for m in TRITON_METRICS if "response-cache" not in names.get(m, set())}
    assert not missing, f"tritonserver serves no {sorted(missing)} for the model; it serves {sorted(names)}"
