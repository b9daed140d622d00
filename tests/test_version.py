"""One version: `triton_operator.__version__` and everything that must say the same.

pyproject.toml, the operator's default image and its user agent read `__version__`; the chart's Chart.yaml cannot
(Helm reads no Python), so it is written beside it by `make set-version` (tools/set_version.py) and checked here,
with the image the chart renders by default (the helper defaults `image.tag` to appVersion; tests/test_chart.py
renders it with helm) and the installed wheel's metadata.
"""

from __future__ import annotations

import ast
import re
import shutil
import tomllib
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
import yaml

from tools.previous import PREVIOUS, previous_file
from tools.set_version import VERSION, set_version
from triton_operator import DEFAULT_OPERATOR_IMAGE, OPERATOR_IMAGE_REPOSITORY, __version__
from triton_operator.cli.main import main
from triton_operator.platform.kube import USER_AGENT
from triton_operator.render.kubernetes import Options

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "triton-operator"
INIT = ROOT / "operator" / "triton_operator" / "__init__.py"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_chart_says_the_version_and_renders_its_image() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__), (
        "Chart.yaml's version or appVersion differs from triton_operator.__version__: run `make set-version V=...`")
    image = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    assert image["repository"] == OPERATOR_IMAGE_REPOSITORY
    assert image["tag"] == "", "image.tag must stay empty: the chart's default image is tagged with appVersion"
    helper = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag)' in helper
    # So the chart renders the operator's own default image (e2e/images.py tags the image it builds with the chart's
    # reference: e2e/test_images.py checks that one against Options).
    assert f"{image['repository']}:{chart['appVersion']}" == DEFAULT_OPERATOR_IMAGE


def test_the_previous_release_is_the_commit_the_changelog_names_and_this_tree_comes_after_it() -> None:
    """tools/previous.py's PREVIOUS (what e2e/test_upgrade.py upgrades from, built from its commit by `make prebuild`) is
    the tree CHANGELOG.md's section of that version names, whose package says that version; this tree's version is a
    later one (a registry upgrade needs a version of its own to go to)."""
    version, commit = PREVIOUS
    section = (ROOT / "CHANGELOG.md").read_text().split(f"## [{version}]", 1)[1].split("\n## ", 1)[0]
    assert f"the tree at {commit[:7]}" in section, f"CHANGELOG.md's [{version}] does not name {commit[:7]}"
    init = previous_file("operator/triton_operator/__init__.py")
    assert f'__version__ = "{version}"' in init
    ours, theirs = (tuple(int(n) for n in VERSION.fullmatch(v).groups()) for v in (__version__, version))  # type: ignore[union-attr]
    assert ours > theirs, (
        f"this tree says {__version__}, not later than the previous release {version}: `make set-version`")


def test_the_operator_runs_and_names_its_own_release() -> None:
    assert Options().operator_image == DEFAULT_OPERATOR_IMAGE  # `fetch` init containers and `probe` sidecars
    assert USER_AGENT.split("/") == ["triton-operator", __version__]  # what bench/clients.py counts as the operator's


def test_the_wheel_takes_its_version_from_the_package() -> None:
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    setuptools = _pyproject()["tool"]["setuptools"]
    assert setuptools["dynamic"]["version"] == {"attr": "triton_operator.__version__"}
    assert setuptools["packages"]["find"]["where"] == ["operator"]
    # A literal: setuptools reads it from the source without importing the package (and its dependencies).
    (assigned,) = [n.value for n in ast.parse(INIT.read_text()).body
                   if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__version__"]]
    assert isinstance(assigned, ast.Constant) and assigned.value == __version__
    assert installed_version(project["name"]) == __version__, (
        "the installed triton-operator's metadata is another version: reinstall it (`make venv`)")


def test_version_flag_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"triton-operator {__version__}\n"


def _copy_of_the_versioned_files(root: Path) -> Path:
    for path in (INIT, CHART / "Chart.yaml"):
        target = root / path.relative_to(ROOT)
        target.parent.mkdir(parents=True)
        shutil.copy(path, target)
    return root


def test_set_version_rewrites_the_package_and_the_chart_only(tmp_path: Path) -> None:
    root = _copy_of_the_versioned_files(tmp_path)
    init, chart = root / INIT.relative_to(ROOT), root / "charts" / "triton-operator" / "Chart.yaml"
    before = {init: init.read_text(), chart: chart.read_text()}
    assert set_version(__version__, root) == []  # already everywhere: nothing written
    assert set_version("12.3.40", root) == [init, chart]
    assert '__version__ = "12.3.40"\n' in init.read_text()
    loaded = yaml.safe_load(chart.read_text())
    assert (loaded["version"], loaded["appVersion"]) == ("12.3.40", "12.3.40")
    for path, text in before.items():  # every other line as it was
        changed = [(a, b) for a, b in zip(text.splitlines(), path.read_text().splitlines(), strict=True) if a != b]
        assert len(changed) == (1 if path == init else 2), changed
        assert all(re.sub(re.escape(__version__), "12.3.40", a) == b for a, b in changed)


@pytest.mark.parametrize("bad", ["1.2", "1.2.3rc1", "1.2.3-rc.1", "v1.2.3", "01.2.3", "1.2.3\n"])
def test_set_version_refuses_what_is_not_both_pep440_and_semver(tmp_path: Path, bad: str) -> None:
    root = _copy_of_the_versioned_files(tmp_path)
    with pytest.raises(ValueError, match=r"is not X\.Y\.Z"):
        set_version(bad, root)


def test_set_version_writes_nothing_when_a_file_lacks_its_line(tmp_path: Path) -> None:
    root = _copy_of_the_versioned_files(tmp_path)
    chart = root / "charts" / "triton-operator" / "Chart.yaml"
    chart.write_text(re.sub(r"^appVersion: .*\n", "", chart.read_text(), flags=re.M))
    init_before = (root / INIT.relative_to(ROOT)).read_text()
    with pytest.raises(ValueError, match="appVersion"):
        set_version("2.0.0", root)
    assert (root / INIT.relative_to(ROOT)).read_text() == init_before
