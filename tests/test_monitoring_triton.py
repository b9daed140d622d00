"""The Triton metric names the chart's alerts and dashboard read (tests/monitoring.py, TRITON_METRICS) are those a REAL
tritonserver serves on its metrics port, read after requests to a model with the response cache (whose per-model
cache counters exist only then): a name Triton renames or drops fails here, not on a user's empty panel."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.monitoring import TRITON_METRICS
from tests.triton_helpers import EXAMPLES, load_models, serve, tensor
from triton_operator.api.v1alpha1 import quantity_bytes

pytestmark = pytest.mark.triton

#: A sample line: its name, then its labels (the `model` one captured), then its value.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s")
_MODEL = re.compile(r'[{,]model="([^"]*)"')


def _sample_names(host: str, port: int) -> dict[str, set[str]]:
    """Sample name -> the `model` labels it has samples for, read from the text as Prometheus stores it (a counter's
    name as written: prometheus-client's parser would add `_total` to Triton's counters)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            model = _MODEL.search(m.group(2) or "")
            out.setdefault(m.group(1), set()).add(model.group(1) if model else "")
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
