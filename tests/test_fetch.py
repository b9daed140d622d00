"""The `fetch` init step (`triton_operator.agent.fetch`): the repository ConfigMap copied out, pvc:// sources."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from triton_operator.agent.fetch import FetchError, copy_repository, fetch_uri

ROOT = Path(__file__).resolve().parent.parent


def test_fetch_copies_the_configmap_tree_without_its_bookkeeping(tmp_path: Path) -> None:
    # the kubelet's atomic-writer layout: ..<timestamp>/ holds the files, ..data links to it, entries link into ..data
    src = tmp_path / "config"
    stamp = src / "..2026_01_01_00_00_00.1"
    (stamp / "m" / "1").mkdir(parents=True)
    (stamp / "m" / "config.pbtxt").write_text('name: "m"\n')
    (stamp / "m" / "1" / "model.py").write_text("pass\n")
    os.symlink(stamp.name, src / "..data")
    os.symlink("..data/m", src / "m")
    dst = tmp_path / "models"
    dst.mkdir()
    assert copy_repository(src, dst) == 2
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()) == ["m/1/model.py", "m/config.pbtxt"]
    assert not any(p.name.startswith("..") for p in dst.iterdir())


def test_fetch_pvc_source_and_path_escape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton_operator.agent import fetch

    root = tmp_path / "pvc"
    (root / "claim" / "models" / "m").mkdir(parents=True)
    (root / "claim" / "models" / "m" / "model.py").write_text("pass\n")
    monkeypatch.setattr(fetch, "PVC_ROOT", root)
    repo = tmp_path / "repo"
    fetch_uri("m", "pvc://claim/models/m", repo)
    assert (repo / "m" / "1" / "model.py").read_text() == "pass\n"
    with pytest.raises(FetchError, match="escapes"):
        fetch_uri("m", "pvc://claim/../../etc", repo)
    with pytest.raises(FetchError, match="unsupported uri"):
        fetch_uri("m", "ftp://example/x", repo)


def _claim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A claim mounted where fetch finds it (PVC_ROOT patched); returns the uri's directory, models/m."""
    from triton_operator.agent import fetch

    root = tmp_path / "pvc"
    model = root / "claim" / "models" / "m"
    (model / "weights").mkdir(parents=True)
    (model / "model.py").write_text("pass\n")
    (model / "weights" / "w.bin").write_bytes(b"\x00\x01")
    monkeypatch.setattr(fetch, "PVC_ROOT", root)
    return model


def test_fetch_pvc_copies_links_that_stay_inside_as_their_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _claim(tmp_path, monkeypatch)
    os.symlink("model.py", model / "alias.py")  # relative, to a file
    os.symlink("weights", model / "current")  # to a directory
    os.symlink(model / "weights" / "w.bin", model / "weights" / "abs.bin")  # absolute, inside the uri's directory
    repo = tmp_path / "repo"
    fetch_uri("m", "pvc://claim/models/m", repo)
    got = repo / "m" / "1"
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*") if p.is_file()) == [
        "alias.py", "current/abs.bin", "current/w.bin", "model.py", "weights/abs.bin", "weights/w.bin"]
    assert not any(p.is_symlink() for p in got.rglob("*"))  # the claim is not mounted in tritonserver: no links
    assert (got / "alias.py").read_text() == "pass\n"
    assert (got / "current" / "abs.bin").read_bytes() == b"\x00\x01"


@pytest.mark.parametrize("link, target", [
    ("leak", "/etc/passwd"),  # a file of the fetch container
    ("weights/etc", "/etc"),  # a directory of it, deeper down
    ("sibling", "../other/secret.txt"),  # elsewhere in the claim, outside the uri's directory
    ("up", ".."),  # the directory holding the uri's
])
def test_fetch_pvc_refuses_a_link_out_of_the_uris_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            link: str, target: str) -> None:
    model = _claim(tmp_path, monkeypatch)
    (model.parent / "other").mkdir()
    (model.parent / "other" / "secret.txt").write_text("not m's\n")
    os.symlink(target, model / link)
    repo = tmp_path / "repo"
    with pytest.raises(FetchError) as err:
        fetch_uri("m", "pvc://claim/models/m", repo)
    assert str(err.value).startswith(f"'pvc://claim/models/m': symbolic link '{link}' -> '{target}' escapes the model "
                                     "directory (it resolves to ")
    assert not (repo / "m").exists()  # nothing placed, not even the files copied before the link


@pytest.mark.parametrize("link, target, says", [
    ("gone", "missing.py", "leads nowhere"),
    ("self", "self", "leads nowhere"),  # a link to itself
    ("weights/again", "..", "loops back to a directory it is in"),  # copying would never end
])
def test_fetch_pvc_refuses_a_dangling_or_looping_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link: str,
                                                      target: str, says: str) -> None:
    model = _claim(tmp_path, monkeypatch)
    os.symlink(target, model / link)
    with pytest.raises(FetchError, match=f"symbolic link '{link}' -> '{target}' {says}"):
        fetch_uri("m", "pvc://claim/models/m", tmp_path / "repo")
