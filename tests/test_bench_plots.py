"""bench/plots.py draws each benchmark's picture from its JSON alone: every committed result draws, at the fixed size,
and the committed PNG is what its JSON draws (so a picture cannot drift from its figures); a result that lacks a
series its picture needs still draws, and its title says what is missing; the Benchmarks page (docs/benchmarks.md) shows each picture once.
(e2e/load.py's per-second series, which the pictures of autoscale and rollout read, is tested beside it:
e2e/test_load_series.py.)"""

from __future__ import annotations

import copy
import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from bench import plots
from bench.common import RESULTS

COMMITTED = sorted(RESULTS.glob("*.json"))


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def draw(tmp_path: Path, name: str, doc: dict[str, Any]) -> tuple[Path, str]:
    """Writes `doc` as <name>.json under tmp_path, draws it; returns the PNG and the picture's title."""
    src = tmp_path / f"{name}.json"
    src.write_text(json.dumps(doc))
    out = plots.write_plot(src)
    assert out == src.with_suffix(".png"), f"no picture for {name}"
    assert out.stat().st_size > 10_000, f"{out} is nearly empty ({out.stat().st_size} bytes)"
    assert png_size(out) == plots.PIXELS
    fig = plots.render(doc, name)
    assert fig is not None
    return out, fig.get_suptitle()


def test_every_benchmark_has_a_committed_result() -> None:
    assert {p.stem for p in COMMITTED} >= set(plots.DRAWERS), "a benchmark without a committed JSON"


@pytest.mark.parametrize("src", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_each_committed_result_draws_the_committed_picture(src: Path, tmp_path: Path) -> None:
    shutil.copy(src, tmp_path / src.name)
    out = plots.write_plot(tmp_path / src.name)
    assert out is not None, f"no drawer for {src.name}"
    assert out.stat().st_size > 10_000 and png_size(out) == plots.PIXELS == (1200, 675)
    committed = src.with_suffix(".png")
    assert committed.exists(), f"{committed.name} is not committed: run `python -m bench.run --plots-only`"
    assert out.read_bytes() == committed.read_bytes(), (
        f"{committed.name} is not what {src.name} draws: run `python -m bench.run --plots-only` and commit it")


def test_the_same_json_draws_the_same_bytes(tmp_path: Path) -> None:
    doc = json.loads((RESULTS / "gate.json").read_text())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, _ = draw(tmp_path / "a", "gate", doc)
    second, _ = draw(tmp_path / "b", "gate", doc)
    assert first.read_bytes() == second.read_bytes()
    assert b"tEXt" not in first.read_bytes(), "the PNG carries metadata (a date or a version)"


def _phases(doc: dict) -> list[dict]:
    """The approaches' results among autoscale.json's data (beside them: labels, setup, field descriptions)."""
    return [v for v in doc["data"].values() if isinstance(v, dict) and "p50_ms" in v]


def test_autoscale_without_time_series_draws_its_summary_and_says_so(tmp_path: Path) -> None:
    doc = json.loads((RESULTS / "autoscale.json").read_text())
    for phase in _phases(doc):
        phase.pop("timeline", None)
        phase.pop("load_series", None)
    _, title = draw(tmp_path, "autoscale", doc)
    assert "Not in this result" in title and "time series" in title


def test_autoscale_with_time_series_draws_them(tmp_path: Path) -> None:
    doc = json.loads((RESULTS / "autoscale.json").read_text())
    for key, phase in doc["data"].items():
        if not (isinstance(phase, dict) and "p50_ms" in phase):
            continue  # the run's labels, setup and field descriptions
        grow = key == "queue"
        phase["timeline"] = [{"t": t / 2, "replicas": 1 + (grow and t > 12) + (grow and t > 30), "warmed": 1,
                              "queued": 50, "queue_ms": 100.0 if t < 20 or not grow else 5.0} for t in range(60)]
        phase["load_series"] = [{"t": float(t), "answered": 100, "failed": int(t == 3), "p50_ms": 40.0,
                                 "p95_ms": None if t == 5 else 120.0} for t in range(30)]
    # a third approach, as the KEDA phase will be, and one with no series at all
    doc["data"]["keda"] = copy.deepcopy(doc["data"]["queue"])
    doc["data"]["bare"] = {"p50_ms": 10.0}
    _, title = draw(tmp_path, "autoscale", doc)
    assert "summary figures only" not in title
    assert "bare: queue time" in title and "bare: latency per second" in title


def test_rollout_with_and_without_the_per_second_series(tmp_path: Path) -> None:
    doc = json.loads((RESULTS / "rollout.json").read_text())
    phases = doc["data"]["phases"]
    _, title = draw(tmp_path, "rollout", doc)
    if not any("series" in ph["load"] for ph in phases.values()):
        assert "requests per second" in title
    for ph in phases.values():
        ph["load"]["series"] = [{"t": float(t), "answered": 160, "failed": 2 if t == 4 else 0, "p50_ms": 1.0,
                                 "p95_ms": 2.0} for t in range(int(ph["endpoints_seconds"]) + 1)]
    _, title = draw(tmp_path, "rollout", doc)
    assert "Not in this result" not in title
    # failures counted but not when: the picture says so rather than drawing a zero line
    phases["drain"]["load"].pop("series")
    phases["drain"]["load"]["failed"] = 3
    phases["swap"].pop("endpoint_changes")
    _, title = draw(tmp_path, "rollout", doc)
    assert "drain: when its requests failed" in title


def test_gate_without_per_replica_samples_and_with_a_floor(tmp_path: Path) -> None:
    doc = json.loads((RESULTS / "gate.json").read_text())
    with_floor = copy.deepcopy(doc)
    with_floor["data"]["timelines"]["kubelet_floor"] = with_floor["data"]["timelines"]["gated"][:5]
    _, title = draw(tmp_path, "gate", with_floor)
    assert "Not in this result" not in title
    doc["data"].pop("timelines")
    _, title = draw(tmp_path, "gate", doc)
    assert "per-replica READY and Ready times" in title


def test_scale_draws_a_floor_row_when_there_is_one(tmp_path: Path) -> None:
    doc = json.loads((RESULTS / "scale.json").read_text())
    has_floor = any("floor" in p["impl"] for p in doc["data"]["phases"])
    _, title = draw(tmp_path, "scale", doc)
    assert ("the floor" in title) != has_floor
    doc["data"]["phases"] += [{"impl": "floor", "models": n, "converge_seconds": n / 40} for n in (100, 1000, 3000)]
    _, title = draw(tmp_path, "scale", doc)
    assert "floor" not in title


@pytest.mark.parametrize("name", sorted(plots.DRAWERS))
def test_a_result_with_no_data_still_draws(name: str, tmp_path: Path) -> None:
    _, title = draw(tmp_path, name, {"name": name, "title": f"empty {name}", "rows": [], "data": {}})
    assert title.startswith(f"empty {name}")


def test_a_variant_run_uses_its_benchmarks_drawer_and_an_unknown_one_none(tmp_path: Path) -> None:
    assert plots.drawer_for("pool-latency") is plots.pool
    src = tmp_path / "nothing.json"
    src.write_text(json.dumps({"name": "nothing", "data": {}}))
    assert plots.write_plot(src) is None and not src.with_suffix(".png").exists()


def test_the_benchmarks_page_shows_each_benchmarks_picture_once() -> None:
    """docs/benchmarks.md shows `bench/results/<name>.png`, which the site's hook (tools/mkdocs_hooks.py) serves
    from bench/results itself."""
    page = (RESULTS.parent.parent / "docs" / "benchmarks.md").read_text()
    shown = re.findall(r"^!\[[^\]]*\]\((bench/results/[^)]+\.png)\)$", page, re.MULTILINE)
    for path in shown:
        assert (RESULTS.parent.parent / path).exists(), f"docs/benchmarks.md shows {path}, which is not committed"
    assert sorted(shown) == sorted(f"bench/results/{name}.png" for name in plots.DRAWERS), (
        "docs/benchmarks.md should show each benchmark's picture once, as an image line of its own")
