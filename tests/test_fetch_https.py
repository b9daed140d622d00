"""`fetch` from https:// against a REAL HTTPS server on 127.0.0.1 (tests/https_server.py, a test CA trusted through
SSL_CERT_FILE): archives and single files, redirects, errors, truncated downloads; and archives that try to
write outside the model directory. A failed fetch leaves no half-written version behind, and says why in one
line (also in the container's termination message, which the operator reads into the TritonModel's status)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.https_server import HttpsServer, Page, serve
from triton_operator.agent.fetch import Budget, FetchError, fetch_uri
from triton_operator.cli.main import main


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
    with pytest.raises(FetchError, match=r"CERTIFICATE_VERIFY_FAILED.*only the operator image's CAs are trusted"):
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
    with pytest.raises(FetchError, match=r"archive member '[^']+' (escapes the model directory|is a symbolic link|"
                                         r"is a hard link)"):
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



# --- Bounds (issue 32): a download streams to disk, what a run may write is capped, and a run has a deadline.

CLI = Path(sys.executable).parent / "triton-operator"


#: Runs argv[1:] as a child and prints its peak RSS (KiB) as its last line: measured from a small process, since Linux
#: keeps a process's peak across exec, and a child forked from pytest (which holds the served files) would start high.
_PEAK_RSS = ("import os, sys\n"
             "pid = os.fork()\n"
             "if pid == 0:\n"
             "    os.execv(sys.argv[1], sys.argv[1:])\n"
             "_, status, usage = os.wait4(pid, 0)\n"
             "print(usage.ru_maxrss, flush=True)\n"
             "sys.exit(os.waitstatus_to_exitcode(status))\n")


def _run_fetch(tmp_path: Path, *args: str) -> tuple[int, str, float]:
    """`triton-operator fetch` in a process of its own, as the init container runs it: (exit code, stderr, peak
    RSS in MiB, from the kernel's accounting of that one process)."""
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS, str(CLI), "fetch", "--from", str(tmp_path / "cm"),
                           "--to", str(tmp_path / "repo"), *args], capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stderr, int(proc.stdout.split()[-1]) / 1024


def _left(repo: Path) -> list[str]:
    """Whatever a failed fetch left in the repository (nothing, when it cleans up)."""
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*")) if repo.exists() else []


def test_a_download_streams_to_disk_and_is_hashed_on_the_way(https: HttpsServer, tmp_path: Path) -> None:
    """160 MiB behind a sha256 pin: the process never holds the file (before issue 32 it peaked above the file's
    size: 423 MiB of RSS for a 400 MiB file)."""
    body = os.urandom(1 << 20) * 160
    https["/weights.bin"] = body
    rc, err, rss = _run_fetch(tmp_path, "--uri", f"m={https.url('/weights.bin')}",
                              "--sha256", f"m={hashlib.sha256(body).hexdigest()}")
    assert rc == 0, err
    got = tmp_path / "repo" / "m" / "1" / "weights.bin"
    assert got.stat().st_size == len(body) and hashlib.sha256(got.read_bytes()).digest() == hashlib.sha256(body).digest()
    assert rss < 96, f"fetch peaked at {rss:.0f} MiB of RSS for a {len(body) >> 20} MiB download"


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "no-length"])
def test_a_download_over_the_cap_is_refused_and_leaves_nothing(https: HttpsServer, tmp_path: Path, announced: bool) -> None:
    https["/big.bin"] = Page(b"\0" * (4 << 20), length=announced)
    rc, err, _ = _run_fetch(tmp_path, "--uri", f"m={https.url('/big.bin')}", "--max-bytes", str(1 << 20))
    assert rc == 1, err
    assert re.search(r"error: fetch failed: https://127\.0\.0\.1:\d+/big\.bin: more than 1\.0 MiB to write into the "
                     r"model repository \(the cap: spec\.server\.fetch\.maxBytes\)", err), err
    assert _left(tmp_path / "repo") == []


def _bomb(kind: str, size: int) -> bytes:
    """An archive of a few KiB that unpacks to `size` bytes of zeros (one member, then a second one)."""
    if kind == "zip":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("model.py", b"ok\n")
            z.writestr("zeros.bin", b"\0" * size)
        return buf.getvalue()
    return _tar([("model.py", b"ok\n"), ("zeros.bin", b"\0" * size)])


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_an_archive_that_unpacks_past_the_cap_is_refused(https: HttpsServer, tmp_path: Path, kind: str) -> None:
    archive = _bomb(kind, 64 << 20)
    assert len(archive) < 1 << 20
    https[f"/m.{kind}"] = archive
    rc, err, _ = _run_fetch(tmp_path, "--uri", f"m={https.url(f'/m.{kind}')}", "--max-bytes", str(8 << 20))
    assert rc == 1, err
    assert f"/m.{kind}: more than 8.0 MiB to write into the model repository (the cap: spec.server.fetch.maxBytes)" in err
    assert _left(tmp_path / "repo") == []


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_an_archive_with_more_members_than_the_cap_is_refused(https: HttpsServer, tmp_path: Path, kind: str) -> None:
    files = {f"f{i}.txt": b"x" for i in range(30)}
    https[f"/m.{kind}"] = _zip(files) if kind == "zip" else _tar(list(files.items()))
    rc, err, _ = _run_fetch(tmp_path, "--uri", f"m={https.url(f'/m.{kind}')}", "--max-files", "10")
    assert rc == 1, err
    assert f"/m.{kind}: more than 10 files and directories (the cap: spec.server.fetch.maxFiles)" in err
    assert _left(tmp_path / "repo") == []
    rc, err, _ = _run_fetch(tmp_path, "--uri", f"m={https.url(f'/m.{kind}')}", "--max-files", "40")
    assert rc == 0, err
    assert len(list((tmp_path / "repo" / "m" / "1").iterdir())) == 30


@pytest.mark.parametrize("pace", [0.2, 30.0], ids=["a-byte-every-200ms", "stalls-after-one-byte"])
def test_a_slow_source_is_cut_off_at_the_deadline_of_the_whole_fetch(https: HttpsServer, tmp_path: Path, pace: float) -> None:
    """Each read returns (or waits less than the per-read timeout), so only a deadline over the whole run stops it:
    before issue 32, a source sending one byte every 4 s was accepted after 96 s."""
    https["/slow.bin"] = Page(b"x" * 200, drip=pace)
    rc, err, _ = _run_fetch(tmp_path, "--uri", f"m={https.url('/slow.bin')}", "--timeout", "2")
    assert rc == 1, err
    assert re.search(r"error: fetch failed: https://127\.0\.0\.1:\d+/slow\.bin: not done within 2 s, the deadline "
                     r"of the whole fetch \(spec\.server\.fetch\.timeoutSeconds\)", err), err
    assert _left(tmp_path / "repo") == []


# --- Archive members (issue 32): our own checks are the defence; the interpreter's `data` filter is used besides,
# where it exists (it arrived in 3.11.4; on 3.11.7 the symlink chain below still wrote outside the directory).

def _symlink_chain(levels_up: int) -> bytes:
    """CVE-2025-4517's shape: directories with names so long that os.path.realpath gives up on the path (past
    PATH_MAX) and compares the rest lexically, while the kernel follows every link: `escape` points
    `levels_up` levels above the extraction directory, and `escape/pwned` is written there."""
    long_dir, steps = "d" * 247, "abcdefghijklmnop"
    members: list[tarfile.TarInfo | tuple[str, bytes]] = []
    path = ""
    for step in steps:
        directory = tarfile.TarInfo(os.path.join(path, long_dir))
        directory.type = tarfile.DIRTYPE
        members += [directory, _link(os.path.join(path, step), long_dir)]
        path = os.path.join(path, long_dir)
    deep = os.path.join(*steps, "l" * 254)
    members += [_link(deep, os.path.join(*[".."] * len(steps))), _link("escape", deep + "/.." * levels_up),
                ("escape/pwned", b"written outside\n")]
    return _tar(members)


def _special(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = kind, 1, 3
    return info


MEMBERS = {
    "symlink chain (CVE-2025-4517)": (_symlink_chain(2), "is a symbolic link"),
    "symlink inside": (_tar([("model.py", b"ok"), _link("again.py", "model.py")]), "is a symbolic link"),
    "hard link inside": (_tar([("model.py", b"ok"), _link("again.py", "model.py", tarfile.LNKTYPE)]), "is a hard link"),
    "hard link outside": (_tar([_link("passwd", "/etc/passwd", tarfile.LNKTYPE)]), "is a hard link"),
    "absolute name": (_tar([("/tmp/evil.py", b"x")]), "escapes the model directory"),
    "dot-dot name": (_tar([("model.py", b"ok"), ("sub/../../evil.py", b"x")]), "escapes the model directory"),
    "character device": (_tar([_special("null", tarfile.CHRTYPE)]), "is a device or a fifo"),
    "block device": (_tar([_special("disk", tarfile.BLKTYPE)]), "is a device or a fifo"),
    "fifo": (_tar([_special("pipe", tarfile.FIFOTYPE)]), "is a device or a fifo"),
}


def _without_data_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python as Debian bookworm ships it (3.11.2): no tarfile.data_filter, FilterError or `filter=` argument."""
    for name in ("data_filter", "tar_filter", "fully_trusted_filter", "FilterError"):
        monkeypatch.delattr(tarfile, name, raising=False)
    for method in ("extractall", "extract"):
        original = getattr(tarfile.TarFile, method)

        def without_filter(self: tarfile.TarFile, *args: object, _original: object = original, **kwargs: object) -> object:
            if "filter" in kwargs:
                raise TypeError("extractall() got an unexpected keyword argument 'filter'")
            return _original(self, *args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(tarfile.TarFile, method, without_filter)


@pytest.mark.parametrize("data_filter", [True, False], ids=["with-data-filter", "without-data-filter"])
@pytest.mark.parametrize("case", sorted(MEMBERS))
def test_an_archive_member_that_is_not_a_plain_file_or_directory_inside_is_refused(
        case: str, data_filter: bool, https: HttpsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not data_filter:
        _without_data_filter(monkeypatch)
    archive, says = MEMBERS[case]
    https["/a.tar.gz"] = archive
    repo = tmp_path / "repo"
    repo.mkdir()
    with pytest.raises(FetchError, match=rf"archive member '[^']+' {says}"):
        fetch_uri("m", https.url("/a.tar.gz"), repo)
    assert _left(repo) == []
    assert not list(tmp_path.rglob("pwned")) and not (tmp_path / "evil.py").exists()


def test_without_the_data_filter_a_tar_source_still_unpacks(https: HttpsServer, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Before issue 32, every tar source crashed there with an AttributeError."""
    _without_data_filter(monkeypatch)
    https["/m.tar.gz"] = _tar([("model.py", b"# tar\n"), ("sub/w.bin", b"\x01")])
    fetch_uri("t", https.url("/m.tar.gz"), tmp_path)
    assert _tree(tmp_path) == {"t/1/model.py": b"# tar\n", "t/1/sub/w.bin": b"\x01"}


# --- Credentials in URIs (issue 32): the query, the fragment and userinfo are never printed.

def test_a_presigned_query_never_reaches_the_logs_or_the_termination_message(
        https: HttpsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    termination = tmp_path / "termination-log"
    termination.write_text("")
    monkeypatch.setenv("TERMINATION_MESSAGE_PATH", str(termination))
    https["/moved.tar.gz"] = Page(location=f"http://127.0.0.1:{https.port}/m.tar.gz?X-Amz-Signature=SECRET2")
    https["/m.py"] = b"pass\n"
    cases = {
        https.url("/missing.tar.gz?X-Amz-Signature=SECRET1#SECRET4"): "/missing.tar.gz?<redacted>: HTTP 404 Not Found",
        https.url("/moved.tar.gz?sig=SECRET3"): "/m.tar.gz?<redacted>'; only https:// is followed",
        https.url("/m.py?token=SECRET5"): "/m.py?<redacted>: expected " + "0" * 64,
    }
    for url, says in cases.items():
        termination.write_text("")
        pin = ["--sha256", f"m={'0' * 64}"] if "m.py" in url else []
        assert main(["fetch", "--from", str(tmp_path / "cm"), "--to", str(tmp_path / "repo"), "--uri", f"m={url}", *pin]) == 1
        err = capsys.readouterr().err
        assert says in err.strip().splitlines()[-1], err
        assert "SECRET" not in err + termination.read_text(), err


def test_a_uri_with_userinfo_is_refused_without_printing_it(https: HttpsServer, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    url = f"https://user:SECRET@127.0.0.1:{https.port}/m.py"
    https["/m.py"] = b"pass\n"
    assert main(["fetch", "--from", str(tmp_path / "cm"), "--to", str(tmp_path / "repo"), "--uri", f"m={url}"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"error: fetch failed: https://<redacted>@127.0.0.1:{https.port}/m.py carries credentials (user:password@): "
        "give them through the environment (spec.server.env, credentialsSecret), never in the uri"), err
    assert "SECRET" not in err
    assert not (tmp_path / "repo" / "m").exists()


def _zip_of_empty_files(path: Path, count: int) -> None:
    """A zip64 archive of `count` empty stored files, written header by header (Python's zipfile would hold every
    entry in this process while writing)."""
    import struct
    import zlib

    crc = zlib.crc32(b"")
    with path.open("wb") as f, (path.parent / "directory").open("w+b") as cd:
        for i in range(count):
            name = f"d/{i:07d}".encode()
            offset = f.tell()
            f.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, 0, 0, len(name), 0) + name)
            cd.write(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, crc, 0, 0, len(name), 0, 0, 0,
                                 0, 0o100644 << 16, offset) + name)
        start, size = f.tell(), cd.tell()
        cd.seek(0)
        shutil.copyfileobj(cd, f)
        record = f.tell()
        f.write(struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size, start))
        f.write(struct.pack("<4sLQL", b"PK\x06\x07", 0, record, 1))
        f.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))


def test_a_zip_with_more_entries_than_max_files_is_refused_before_its_directory_is_read(
        tmp_path: Path, https: HttpsServer) -> None:
    """300,000 entries: zipfile's reading of the directory alone took 166 MiB (issue 39, the 256 MiB sidecar was
    OOM-killed) before maxFiles was checked; the count is now checked first, header by header."""
    from tests.hostile_servers import peak_growth

    archive = tmp_path / "many.zip"
    _zip_of_empty_files(archive, 300_000)
    listed = subprocess.run([sys.executable, "-c", "import sys, zipfile; print(len(zipfile.ZipFile(sys.argv[1]).namelist()))",
                             str(archive)], capture_output=True, text=True, check=True, timeout=120)
    assert listed.stdout.strip() == "300000", listed  # a zip zipfile reads (in a process of its own: 166 MiB)
    https["/many.zip"] = archive.read_bytes()
    with peak_growth() as grew, pytest.raises(FetchError, match="maxFiles"):
        fetch_uri("m", https.url("/many.zip"), tmp_path / "repo", budget=Budget(max_files=1000))
    assert grew[0] < 32 << 20, f"refusing the zip raised the peak RSS by {grew[0] >> 20} MiB"


def test_a_zip_within_max_files_still_unpacks(tmp_path: Path, https: HttpsServer) -> None:
    _zip_of_empty_files(tmp_path / "some.zip", 500)
    https["/some.zip"] = (tmp_path / "some.zip").read_bytes()
    fetch_uri("m", https.url("/some.zip"), tmp_path / "repo", budget=Budget(max_files=1000))
    assert len(list((tmp_path / "repo" / "m" / "1" / "d").iterdir())) == 500
