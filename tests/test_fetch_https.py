"""`fetch` from https:// against a REAL HTTPS server on 127.0.0.1 (tests/https_server.py, a test CA trusted through
SSL_CERT_FILE): archives and single files, redirects, errors, truncated downloads; and archives that try to
write outside the model directory. A failed fetch leaves no half-written version behind, and says why in one
line (also in the container's termination message, which the operator reads into the TritonModel's status)."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.https_server import HttpsServer, Page, serve
from triton_operator.cli.main import main
from triton_operator.fetch import FetchError, fetch_uri


@pytest.fixture
def https(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpsServer]:
    gen = serve(tmp_path_factory.mktemp("https"))
    server = next(gen)
    monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
    yield server
    gen.close()


def _tar(members: list[tarfile.TarInfo | tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
    return buf.getvalue()


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _zip(members: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, target)
    return buf.getvalue()


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_archives_and_a_single_file_are_placed_in_the_version_directory(https: HttpsServer, tmp_path: Path) -> None:
    https["/m.tar.gz"] = _tar([("model.py", b"# tar\n"), ("sub/w.bin", b"\x01")])
    https["/m.zip"] = _zip({"model.py": b"# zip\n", "sub/w.bin": b"\x02"})
    https["/model.py"] = b"# single\n"
    fetch_uri("t", https.url("/m.tar.gz"), tmp_path)
    fetch_uri("z", https.url("/m.zip"), tmp_path)
    fetch_uri("f", https.url("/model.py?token=abc"), tmp_path)  # the query is not part of the file name
    assert _tree(tmp_path) == {"t/1/model.py": b"# tar\n", "t/1/sub/w.bin": b"\x01", "z/1/model.py": b"# zip\n",
                               "z/1/sub/w.bin": b"\x02", "f/1/model.py": b"# single\n"}


def test_a_redirect_to_https_is_followed_and_one_to_plain_http_is_refused(https: HttpsServer, tmp_path: Path) -> None:
    https["/model.py"] = b"# moved\n"
    https["/old/model.py"] = Page(location=https.url("/model.py"))
    fetch_uri("m", https.url("/old/model.py"), tmp_path)
    assert _tree(tmp_path) == {"m/1/model.py": b"# moved\n"}
    assert https.requests == ["/old/model.py", "/model.py"]
    https["/downgrade/model.py"] = Page(location=f"http://127.0.0.1:{https.port}/model.py")
    with pytest.raises(FetchError, match=r"redirects to 'http://127\.0\.0\.1:\d+/model\.py'; only https:// is followed"):
        fetch_uri("d", https.url("/downgrade/model.py"), tmp_path)
    assert not (tmp_path / "d").exists()


def test_a_404_a_server_error_and_a_truncated_download_fail_clearly(https: HttpsServer, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"/missing\.tar\.gz: HTTP 404 Not Found"):
        fetch_uri("m", https.url("/missing.tar.gz"), tmp_path)
    https["/broken"] = Page(status=503)
    with pytest.raises(FetchError, match="HTTP 503"):
        fetch_uri("m", https.url("/broken"), tmp_path)
    archive = _tar([("model.py", b"x" * 50_000)])
    https["/cut.tar.gz"] = Page(archive, truncate=len(archive) // 2)
    with pytest.raises(FetchError, match=r"the download was cut short: \d+ bytes received, \d+ more expected"):
        fetch_uri("m", https.url("/cut.tar.gz"), tmp_path)
    assert list(tmp_path.iterdir()) == [], "a failed fetch left files behind"


def test_a_server_whose_certificate_is_not_trusted_is_refused(https: HttpsServer, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    https["/model.py"] = b"# fine\n"
    monkeypatch.delenv("SSL_CERT_FILE")
    with pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch_uri("m", https.url("/model.py"), tmp_path)
    assert list(tmp_path.iterdir()) == []


ESCAPES = {
    "tar member ../": _tar([("model.py", b"ok"), ("../evil.py", b"x")]),
    "tar member absolute": _tar([("/tmp/evil.py", b"x")]),
    "tar symlink ../": _tar([("model.py", b"ok"), _link("link", "../../outside")]),
    "tar symlink absolute": _tar([_link("passwd", "/etc/passwd")]),
    "tar hardlink outside": _tar([_link("hard", "/etc/passwd", tarfile.LNKTYPE)]),
    "zip member ../": _zip({"model.py": b"ok", "../evil.py": b"x"}),
    "zip member absolute": _zip({"/tmp/evil.py": b"x"}),
    "zip symlink": _zip({"model.py": b"ok"}, symlinks={"link": "/etc/passwd"}),
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_an_archive_that_would_write_outside_the_model_directory_is_refused(
        case: str, https: HttpsServer, tmp_path: Path) -> None:
    suffix = ".zip" if case.startswith("zip") else ".tar.gz"
    https[f"/a{suffix}"] = ESCAPES[case]
    repo = tmp_path / "repo"
    repo.mkdir()
    with pytest.raises(FetchError, match=r"archive member '[^']+' (escapes the model directory|is a symbolic link)"):
        fetch_uri("m", https.url(f"/a{suffix}"), repo)
    assert list(repo.iterdir()) == [], f"{case}: the failed fetch left {_tree(repo)} behind"
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "outside").exists()


def test_a_failed_fetch_leaves_the_rendered_files_and_nothing_of_its_own(https: HttpsServer, tmp_path: Path) -> None:
    """The rendered config stays; the version the fetch was filling does not appear half-written."""
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text('name: "m"\n')
    https["/m.tar.gz"] = _tar([("model.py", b"ok"), ("../evil.py", b"x")])
    with pytest.raises(FetchError):
        fetch_uri("m", https.url("/m.tar.gz"), repo)
    assert _tree(repo) == {"m/config.pbtxt": b'name: "m"\n'}
    assert sorted(p.name for p in repo.iterdir()) == ["m"], "the staging directory was left behind"


def test_the_command_says_why_in_one_line_and_in_the_termination_message(
        https: HttpsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    termination = tmp_path / "termination-log"
    termination.write_text("")  # the kubelet mounts it (empty) into every container
    monkeypatch.setenv("TERMINATION_MESSAGE_PATH", str(termination))
    url = https.url("/nope.tar.gz")
    rc = main(["fetch", "--from", str(tmp_path / "cm"), "--to", str(tmp_path / "repo"), "--uri", f"m={url}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.strip().splitlines()[-1] == f"error: fetch failed: {url}: HTTP 404 Not Found"
    assert termination.read_text() == f"error: fetch failed: {url}: HTTP 404 Not Found\n"
    # Outside a pod there is no such file, and none is created.
    monkeypatch.setenv("TERMINATION_MESSAGE_PATH", str(tmp_path / "absent"))
    assert main(["fetch", "--from", str(tmp_path / "cm"), "--to", str(tmp_path / "repo"), "--uri", f"m={url}"]) == 1
    assert not (tmp_path / "absent").exists()
