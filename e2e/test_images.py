"""e2e/images.py without building anything: the references the nodes need agree with what the operator and the
chart render, and an image's hash moves with its inputs and nothing else.

Beside the harness it tests; no marker, so `make unit` runs it (the unit tier, tests/, imports no harness
module)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from e2e import images
from e2e.operator_fixtures import session_values
from triton_operator import DEFAULT_TRITON_IMAGE
from triton_operator.api.v1alpha1 import Server
from triton_operator.render.kubernetes import Options
from triton_operator.triton.local import TRITON_VERSION

REPO = Path(__file__).resolve().parent.parent


def test_operator_ref_is_what_the_chart_and_the_renderer_use() -> None:
    assert images.chart_operator_ref() == Options().operator_image


def test_the_tritonserver_image_is_named_for_what_it_is() -> None:
    """issue 39 item 3: the tests run the local CPU build of Triton 2.51 (NGC 24.10) under its own name, never as an
    alias of NVIDIA's image or of the API's default (a later release); the test clusters' operator names it as its
    default instead (e2e/operator_fixtures.py, the chart's tritonImage)."""
    assert TRITON_VERSION == "2.51.0" and images.TRITON_REF == "localhost/triton-operator/tritonserver:24.10-py3-cpu"
    assert Server().image is None and DEFAULT_TRITON_IMAGE != images.TRITON_REF
    assert not [v for v in vars(images).values() if isinstance(v, str) and v.startswith("nvcr.io/")]
    assert f"tritonImage={images.TRITON_REF}" in session_values()


def test_tritonserver_wheel_is_the_one_pyproject_pins() -> None:
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["server"]
    wheel = [p for p in pins if p.startswith("nvidia-pytriton")]  # the extra's client stays on the host
    assert wheel and set(wheel) <= set(images.triton_requirements())


def test_operator_requirements_cover_the_extras_the_fetch_step_needs() -> None:
    reqs = images.operator_requirements()
    assert any(r.startswith("boto3") for r in reqs)
    assert any(r.startswith("google-cloud-storage") for r in reqs)
    assert any(r.startswith("setuptools") for r in images.build_requirements())  # the project builds offline too


# -- requirements.lock: what the operator image installs --------------------------------------------------------

#: Never in the operator image: what tritonclient's client computes with (issue 28). grpcio is there, for the
#: operator's loads and unloads alone (`triton/repository.py`: over HTTP a load holds one of Triton's HTTP threads).
NOT_IN_THE_IMAGE = {"numpy"}


def _lock() -> str:
    assert images.LOCK.is_file(), "requirements.lock is missing: run `make lock` and commit it"
    return images.LOCK.read_text()


def test_the_lock_is_made_from_pyproject_as_it_is() -> None:
    assert images.recorded_lock_digest(_lock()) == images.lock_digest(), (
        "requirements.lock was made from other requirements than pyproject.toml's (its dependencies, or the s3 or "
        "gcs extras, changed since): run `make lock` and commit requirements.lock")


def test_the_recorded_digest_moves_with_the_requirements(monkeypatch: pytest.MonkeyPatch) -> None:
    data = images._pyproject()
    before = images.lock_digest()
    changed = {**data, "project": {**data["project"], "dependencies": [*data["project"]["dependencies"], "rich"]}}
    monkeypatch.setattr(images, "_pyproject", lambda: changed)
    assert images.lock_digest() != before
    unrelated = {**data, "project": {**data["project"], "optional-dependencies": {
        **data["project"]["optional-dependencies"], "dev": ["pytest"]}}}
    monkeypatch.setattr(images, "_pyproject", lambda: unrelated)
    assert images.lock_digest() == before, "the dev extra is not in the image: it must not ask for a new lock"


def test_every_requirement_of_the_image_is_pinned_with_hashes_at_a_version_it_allows() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = images.locked(_lock())
    env = {"python_version": images.LOCK_PYTHON, "python_full_version": f"{images.LOCK_PYTHON}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
           "extra": ""}
    checked = 0
    for line in images.operator_requirements():
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} (pyproject.toml) is not in requirements.lock: run `make lock`"
        version, _ = pins[name]
        assert req.specifier.contains(version, prereleases=True), (
            f"requirements.lock pins {name}=={version}, which {line!r} does not allow: run `make lock`")
        checked += 1
    assert checked >= 8
    unhashed = sorted(name for name, (_, hashes) in pins.items() if not hashes)
    assert not unhashed, f"pinned without a hash: {unhashed}"


def test_the_lock_has_no_numpy_and_grpcio_for_the_repository_calls() -> None:
    pins = images.locked(_lock())
    assert len(pins) > 20, "the lock parsed to almost nothing"
    assert not NOT_IN_THE_IMAGE & set(pins), f"requirements.lock pins {sorted(NOT_IN_THE_IMAGE & set(pins))}"
    assert not set(images.LOCK_LEFT_OUT) & set(pins)
    assert "tritonclient" in pins  # its generated protobuf modules: api/protos.py
    assert "grpcio" in pins  # triton/repository.py


def test_the_dockerfile_installs_exactly_the_lock() -> None:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    (install,) = [ln for ln in text.splitlines() if ln.startswith("RUN") and "requirements.lock" in ln]
    assert "--no-deps" in install and "--require-hashes" in install and "-r /wheels/requirements.lock" in install
    assert "pyproject" not in install, "the dependencies come from the lock alone"


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


def test_an_id_reference_is_orphaned_only_when_no_name_points_at_its_image() -> None:
    """The CRI plugin gives every image an ID reference (`sha256:<config>`) beside its names; once an import moves
    the names to a new build, the old build's ID reference is all that keeps it on the node."""
    refs = {
        "localhost/triton-operator/triton-operator:dev": "sha256:new",
        "ghcr.io/triton-operator/triton-operator:0.2.0": "sha256:new",
        "sha256:config-of-new": "sha256:new",
        "sha256:config-of-old": "sha256:old",
        "localhost/triton-operator/pause:3.10": "sha256:pause",
        "sha256:config-of-pause": "sha256:pause",
    }
    assert images.orphaned_ids(refs) == ["sha256:config-of-old"]
    assert images.orphaned_ids({"sha256:a": "sha256:x"}) == ["sha256:a"]
    assert images.orphaned_ids({"localhost/x:1": "sha256:x"}) == []
