"""e2e/images.py without building anything: the references the nodes need agree with what the operator and the
chart render, and an image's hash moves with its inputs and nothing else."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from e2e import images
from triton_operator.api.v1alpha1 import Server
from triton_operator.render.kubernetes import Options

REPO = Path(__file__).resolve().parent.parent


def test_operator_ref_is_what_the_chart_and_the_renderer_use() -> None:
    assert images.chart_operator_ref() == Options().operator_image


def test_tritonserver_alias_is_the_crd_default_image() -> None:
    assert Server().image == images.TRITON_ALIAS


def test_tritonserver_wheel_is_the_one_pyproject_pins() -> None:
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["server"]
    assert set(pins) <= set(images.triton_requirements())


def test_operator_requirements_cover_the_extras_the_fetch_step_needs() -> None:
    reqs = images.operator_requirements()
    assert any(r.startswith("boto3") for r in reqs)
    assert any(r.startswith("google-cloud-storage") for r in reqs)
    assert any(r.startswith("setuptools") for r in reqs)  # the project itself builds offline


def test_tree_digest_moves_with_content_only(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    before = images._tree_digest(tmp_path, ["Dockerfile", "pkg"])
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    assert images._tree_digest(tmp_path, ["Dockerfile", "pkg"]) == before
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert images._tree_digest(tmp_path, ["Dockerfile", "pkg"]) != before


@pytest.mark.skipif(not Path("/etc/apt").is_dir(), reason="no apt configuration on this host")
def test_debian_sources_are_one_line_entries_for_the_suite() -> None:
    try:
        lines = images.debian_sources()
    except images.BuildError:
        pytest.skip("this host has no apt source for Debian bookworm")
    assert lines
    for line in lines:
        kind, uri, suite, *components = line.split()
        assert kind == "deb" and "://" in uri and suite.startswith("bookworm") and components


def test_gc_keeps_this_builds_archives_and_any_used_within_a_day(tmp_path: Path) -> None:
    """Two checkouts with different operator sources share the cache: neither's build may delete the archive the
    other still uses (it was rebuilt, minutes each time, on every switch); an archive unused for a day goes."""
    import os

    now = 1_000_000_000.0
    mine, theirs, old, older_mine = (tmp_path / f"{n}.oci.tar" for n in ("mine", "theirs", "old", "older-mine"))
    for path, age in ((mine, 3 * 86400), (theirs, 3600), (old, 86400 + 1), (older_mine, 2 * 86400)):
        path.write_bytes(b"")
        os.utime(path, (now - age, now - age))
    assert images.stale_archives([mine, theirs, old, older_mine], [mine], now) == [old, older_mine]
    assert images.stale_archives([mine, theirs], [mine, theirs], now) == []
