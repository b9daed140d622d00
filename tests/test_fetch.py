"""The `fetch` init step (`triton_operator.fetch`): the repository ConfigMap copied out, pvc:// sources."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from triton_operator.fetch import FetchError, copy_repository, fetch_uri

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
    from triton_operator import fetch

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
