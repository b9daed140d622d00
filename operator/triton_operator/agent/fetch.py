"""`triton-operator fetch`: the init step that assembles a replica's model repository.

Copies the rendered repository from the mounted ConfigMap (skipping the volume's
`..data` bookkeeping, which Triton would take for models), then places each
uri-sourced model's version files (`MODEL=URI` into `MODEL/1/`, `MODEL/N=URI` into
`MODEL/N/`, for the versions of `spec.versions`, and `MODEL/.=URI` into `MODEL/` itself, for
`spec.modelFiles.uri`): `https://` (a file or a .tar.gz/.tgz/.zip
archive), `pvc://claim/path` (mounted at /sources/pvc/<claim>; a symbolic link in it is copied as
its target, which must lie inside `path`), `s3://` (boto3) and `gs://` (google-cloud-storage).
Credentials come from the environment or mounted files, never from arguments: boto3's and google-auth's default
chains find a credentialsSecret's variables or key file, variables from spec.server.env, and the workload
identities a ServiceAccount carries (IRSA's web identity token, EKS Pod Identity, GKE and Azure Workload
Identity). With none found, requests go anonymous, which public buckets allow.

Pins: an https:// download is checked against its `sha256` before anything is
unpacked; with an object version, `s3://` and `gs://` fetch exactly that version
(S3 VersionId, GCS generation) of the one object the uri names.

Bounds (issue 32): every download is streamed to disk in chunks, hashed on the way, and kept aside until it is
complete and checked (a partial or unverified download never lands in the repository). A `Budget` caps what one run
writes (bytes, counting a block per file and directory, archives unpacked included; files and directories) and
gives it a deadline, kept per chunk and, in the main thread, by SIGALRM, which interrupts a blocked read (off the main
thread, in a pool's fetch-server, a watchdog gives up a fetch blocked past it: `agent.fetch_server.Store._expire`).

Archives: tar and zip members are unpacked by our own code, one at a time: regular files and directories only
(no links, devices or fifos), no absolute name or `..`, each path resolved inside the directory, each file created
anew (never through an existing entry). tarfile's `data` filter is asked besides where the interpreter has it;
the defence does not rest on it (it arrived in 3.11.4, and on 3.11.7 a CVE-2025-4517 symlink chain got past it).
A tar is read as a stream, a member at a time; a zip's central directory, which zipfile reads whole, is first checked
against the files left to the run and `ZIP_ENTRY_BYTES` per entry, from the counts its end record declares.

Credentials in a uri: one with `user:password@` is refused; a query or a fragment (a presigned URL's signature)
is never printed (`triton_operator.uris`).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import shutil
import signal
import ssl
import stat
import struct
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from ..uris import has_userinfo, redact, shown

VERSION_DIR = "1"
#: The `--uri MODEL/<key>` key of a model's own directory (spec.modelFiles.uri), beside its version directories.
MODEL_DIR = "."
PVC_ROOT = Path("/sources/pvc")

#: What one run may write into the repository, when the command is not told (the operator always tells it, from
#: spec.server.fetch and spec.server.repositorySizeLimit).
DEFAULT_MAX_BYTES = 10 << 30
DEFAULT_MAX_FILES = 100_000
DEFAULT_TIMEOUT_SECONDS = 3600
#: A file or directory takes at least a block on disk: each is charged this much besides its bytes, so the count
#: stays above what the kubelet measures of the emptyDir (`du`), and a million empty files cannot pass as 0 bytes.
BLOCK = 4096
#: How much of a download is read, hashed and written at a time: what the process holds of it.
CHUNK = 1 << 20
#: The longest a single read may wait for the source (besides the deadline of the whole run).
READ_TIMEOUT_SECONDS = 60.0


class FetchError(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(redact(msg), file=sys.stderr, flush=True)


def human_size(n: int) -> str:
    """1048576 -> `1.0 MiB`."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


class Budget:
    """What one run of fetch may write into the repository (bytes, counted with a block per file and directory;
    files and directories) and until when. Every byte fetch writes is charged here as it is written; a download
    removed once unpacked is given back."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_files: int = DEFAULT_MAX_FILES,
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.max_bytes, self.max_files, self.timeout_seconds = max_bytes, max_files, timeout_seconds
        self.bytes = 0
        self.files = 0
        self.deadline = time.monotonic() + timeout_seconds
        self.source = ""  # the uri being fetched (shown), for the messages

    def expired(self) -> FetchError:
        return FetchError(f"{self.source}: not done within {self.timeout_seconds:g} s, the deadline of the whole "
                          "fetch (spec.server.fetch.timeoutSeconds)")

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def check_time(self) -> None:
        if self.remaining() <= 0:
            raise self.expired()

    def over_bytes(self) -> FetchError:
        return FetchError(f"{self.source}: more than {human_size(self.max_bytes)} to write into the model repository "
                          "(the cap: spec.server.fetch.maxBytes)")

    def charge(self, n: int) -> None:
        """`n` more bytes on disk (refused past the cap), and the clock."""
        if self.bytes + n > self.max_bytes:
            raise self.over_bytes()
        self.bytes += n
        self.check_time()

    def expect(self, n: int) -> None:
        """Refuse at once what is announced larger than the room left (a Content-Length, an object's size)."""
        if self.bytes + n > self.max_bytes:
            raise self.over_bytes()

    def entry(self) -> None:
        """One more file or directory."""
        if self.files + 1 > self.max_files:
            raise FetchError(f"{self.source}: more than {self.max_files} files and directories (the cap: "
                             "spec.server.fetch.maxFiles)")
        self.files += 1
        self.charge(BLOCK)

    def give_back(self, n: int) -> None:
        self.bytes -= n
        self.files -= 1


class _Expired(FetchError):
    """Raised by the deadline's alarm, wherever the run is blocked (a read, a library's retry)."""


@contextlib.contextmanager
def _deadline(budget: Budget) -> Iterator[None]:
    """The run's deadline as SIGALRM: it interrupts a blocked read (a source that stalls below the per-read
    timeout, a library that reads in large chunks). Only in the main thread, where signals arrive; elsewhere the
    per-chunk checks alone keep it. A timer set before (pytest-timeout's) is put back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: FrameType | None) -> None:
        raise _Expired(str(budget.expired()))

    previous = signal.signal(signal.SIGALRM, fire)
    started = time.monotonic()
    outer, interval = signal.setitimer(signal.ITIMER_REAL, max(budget.remaining(), 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001), interval)


def _mkdir(path: Path, budget: Budget) -> None:
    """`path` and its missing parents as real directories (never through a link), each charged."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    if not stat.S_ISDIR(os.lstat(p).st_mode):
        raise FetchError(f"{budget.source}: {p.name!r} is both a file and a directory")
    for d in reversed(missing):
        budget.entry()
        d.mkdir(mode=0o755)


def write_file(target: Path, read: Callable[[int], bytes], budget: Budget, *, executable: bool = False,
           sha: Any = None) -> int:
    """Stream `read`'s chunks into a new file `target` (never through an existing file or link), charging each
    chunk as it comes and feeding `sha`; returns the bytes written."""
    _mkdir(target.parent, budget)
    budget.entry()
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if executable else 0o644)
    except FileExistsError as exc:
        raise FetchError(f"{budget.source}: {target.name!r} is there twice") from exc
    n = 0
    with os.fdopen(fd, "wb") as out:
        while chunk := read(CHUNK):
            budget.charge(len(chunk))
            if sha is not None:
                sha.update(chunk)
            out.write(chunk)
            n += len(chunk)
    return n


def copy_repository(src: Path, dst: Path, budget: Budget | None = None) -> int:
    """Copy the ConfigMap volume's visible tree into dst; returns the number of files copied."""
    budget = budget or Budget()
    budget.source = str(src)
    n = 0
    for entry in sorted(src.iterdir()):
        if entry.name.startswith(".."):
            continue
        target = dst / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, symlinks=False, dirs_exist_ok=True)
            written = [target, *target.rglob("*")]
        else:
            shutil.copy2(entry, target)
            written = [target]
        for path in written:  # (a ConfigMap holds at most 1 MiB: charged once copied)
            budget.entry()
            if path.is_file():
                budget.charge(path.stat().st_size)
                n += 1
    return n


def _member_target(dst: Path, name: str, budget: Budget) -> Path | None:
    """Where archive member `name` goes below `dst`, or None for the archive's root (`.`, `./`). Refused: an
    absolute name, a `..` part, and a path that does not resolve inside `dst`."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise FetchError(f"{budget.source}: archive member {name!r} escapes the model directory")
    if not path.parts:
        return None
    target = dst.joinpath(*path.parts)
    root = os.path.realpath(dst)
    if os.path.commonpath([root, os.path.realpath(target)]) != root:
        raise FetchError(f"{budget.source}: archive member {name!r} escapes the model directory")
    return target


def _forget_members(tar: tarfile.TarFile) -> None:
    """Drop tarfile's index of the members read so far (a stream needs none): memory stays flat over many members."""
    tar.members = []  # type: ignore[attr-defined]  # an attribute of TarFile that typeshed does not declare


def _unpack_tar(archive: Path, dst: Path, budget: Budget) -> None:
    """Regular files and directories, one member at a time (the archive is read as a stream, never whole). Our own
    checks refuse links, devices, fifos, absolute names and `..`; tarfile's `data` filter (Python 3.11.4 and later)
    is asked besides, where it exists."""
    data_filter: Callable[[tarfile.TarInfo, str], tarfile.TarInfo | None] | None = getattr(tarfile, "data_filter", None)
    filter_error: type[Exception] = getattr(tarfile, "FilterError", tarfile.TarError)
    try:
        with tarfile.open(archive, mode="r|*") as tar:
            for member in tar:
                name = member.name
                if member.issym():
                    raise FetchError(f"{budget.source}: archive member {name!r} is a symbolic link; a model "
                                     "archive holds files and directories")
                if member.islnk():
                    raise FetchError(f"{budget.source}: archive member {name!r} is a hard link; a model archive "
                                     "holds files and directories")
                if not (member.isreg() or member.isdir()) or member.issparse():
                    raise FetchError(f"{budget.source}: archive member {name!r} is a device or a fifo; a model "
                                     "archive holds files and directories")
                target = _member_target(dst, name, budget)
                if data_filter is not None:
                    try:
                        data_filter(member, str(dst))
                    except filter_error as exc:
                        raise FetchError(f"{budget.source}: archive member {name!r} escapes the model directory "
                                         f"({exc})") from exc
                if target is None:
                    continue
                if member.isdir():
                    _mkdir(target, budget)
                    _forget_members(tar)
                    continue
                budget.expect(member.size)
                data = tar.extractfile(member)
                assert data is not None  # a regular file's
                write_file(target, data.read, budget, executable=bool(member.mode & 0o100))
                _forget_members(tar)
    except (tarfile.TarError, EOFError, zlib.error) as exc:  # a short or corrupt .gz raises EOFError or zlib.error
        raise FetchError(f"{budget.source}: not a readable tar archive: {exc}") from exc


#: What one entry of a zip's central directory may take on average (46 bytes and its name, extra field and comment):
#: zipfile keeps each entry in memory (about 550 bytes of objects besides these), so with the entries' count, this
#: bounds what reading the directory costs.
ZIP_ENTRY_BYTES = 1024
_EOCD = struct.Struct("<4s4H2LH")  # end of central directory: signature, disks, entries here, entries, size, offset
_EOCD64_LOCATOR = struct.Struct("<4sLQL")  # signature, disk, offset of the zip64 record, disks
_EOCD64 = struct.Struct("<4sQ2H2L4Q")  # signature, size, versions, disks, entries here, entries, size, offset
_CENTRAL = struct.Struct("<4s6H3L5H2L")  # one central directory header, before its name, extra field and comment


def _zip_directory(f: Any, size: int) -> tuple[int, int] | None:
    """(offset, bytes) of a zip's central directory, as zipfile finds it: its size from the end record (zip64's, when
    the classic one says so), and its start that many bytes before that record. None without an end record."""
    tail_at = max(size - _EOCD.size - 0xFFFF, 0)  # the record, and a comment of at most 64 KiB after it
    f.seek(tail_at)
    tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _EOCD.size:
        return None
    _, _, _, _, entries, directory, offset, _ = _EOCD.unpack_from(tail, at)
    if entries != 0xFFFF and directory != 0xFFFFFFFF and offset != 0xFFFFFFFF:
        return tail_at + at - directory, directory
    locator_at = tail_at + at - _EOCD64_LOCATOR.size
    if locator_at < _EOCD64.size:
        return None
    f.seek(locator_at)
    sig, _, _, _ = _EOCD64_LOCATOR.unpack(f.read(_EOCD64_LOCATOR.size))
    f.seek(locator_at - _EOCD64.size)  # zipfile reads the zip64 record right before its locator
    record = f.read(_EOCD64.size)
    if sig != b"PK\x06\x07" or record[:4] != b"PK\x06\x06":
        return None
    directory = _EOCD64.unpack(record)[8]
    return locator_at - _EOCD64.size - directory, directory


def _check_zip_directory(archive: Path, budget: Budget) -> None:
    """Counts the entries of a zip's central directory header by header, holding none, and refuses it when they are
    more than the files and directories left to the run, or take more than `ZIP_ENTRY_BYTES` each on average: before
    zipfile reads the directory whole (300,000 entries took 166 MiB, issue 39). A directory that is not one is left to
    zipfile to refuse."""
    room = budget.max_files - budget.files
    with archive.open("rb") as f:
        found = _zip_directory(f, archive.stat().st_size)
        if found is None or found[0] < 0:
            return
        at, directory = found
        end, entries = at + directory, 0
        f.seek(at)
        while at + _CENTRAL.size <= end:
            header = f.read(_CENTRAL.size)
            if header[:4] != b"PK\x01\x02":
                break
            fields = _CENTRAL.unpack(header)
            entries += 1
            if entries > room:
                raise FetchError(f"{budget.source}: more than {budget.max_files} files and directories (the cap: "
                                 f"spec.server.fetch.maxFiles): the zip archive lists more than the {room} left")
            at += _CENTRAL.size + fields[10] + fields[11] + fields[12]  # name, extra field, comment
            f.seek(at)
    if directory > max(entries, 1) * ZIP_ENTRY_BYTES:
        raise FetchError(f"{budget.source}: the zip archive's directory is {human_size(directory)} for {entries} entries; "
                         f"at most {ZIP_ENTRY_BYTES} bytes per entry are read")


def _unpack_zip(archive: Path, dst: Path, budget: Budget) -> None:
    _check_zip_directory(archive, budget)
    try:
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                name = info.filename
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise FetchError(f"{budget.source}: archive member {name!r} is a symbolic link; a model archive "
                                     "holds files and directories")
                if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise FetchError(f"{budget.source}: archive member {name!r} is a device or a fifo; a model "
                                     "archive holds files and directories")
                target = _member_target(dst, name, budget)
                if target is None:
                    continue
                if info.is_dir():
                    _mkdir(target, budget)
                    continue
                budget.expect(info.file_size)
                with z.open(info) as data:
                    write_file(target, data.read, budget, executable=bool(mode & 0o100))
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise FetchError(f"{budget.source}: not a readable zip archive: {exc}") from exc


ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")


def _is_archive(name: str) -> bool:
    return name.endswith(ARCHIVES)


def _place(name: str, read: Callable[[int], bytes], staging: Path, budget: Budget, *, size: int | None = None,
           check: Callable[[Any], None] | None = None) -> None:
    """One object, streamed from `read`, into `staging/files`: an archive (kept aside as `staging/download`,
    checked, then unpacked and removed), any other file as `name` (checked once written; a file that fails the
    check goes with the staging directory). `check` gets the download's sha256 object."""
    if size is not None:
        budget.expect(size)
    sha = hashlib.sha256()
    if not _is_archive(name):
        write_file(staging / "files" / name, read, budget, sha=sha)
        if check is not None:
            check(sha)
        return
    n = write_file(staging / "download", read, budget, sha=sha)
    if check is not None:
        check(sha)
    _unpack(name, staging, budget, n)


def _unpack(name: str, staging: Path, budget: Budget, size: int) -> None:
    """The archive downloaded as `staging/download` (`size` bytes) unpacked into `staging/files`, then removed and
    its room given back."""
    download = staging / "download"
    try:
        if name.endswith(".zip"):
            _unpack_zip(download, staging / "files", budget)
        else:
            _unpack_tar(download, staging / "files", budget)
    finally:
        download.unlink(missing_ok=True)
        budget.give_back(size + BLOCK)


class _HttpsOnly(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but only to another https:// URL: a source never downgrades to plain http."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        if not newurl.startswith("https://"):
            raise FetchError(f"{shown(req.full_url)} redirects to {shown(newurl)!r}; only https:// is followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _fetch_https(uri: str, staging: Path, budget: Budget, sha256: str | None = None) -> None:
    """The body behind an https:// URL, verified against the image's CAs (OpenSSL's default paths, which also honour
    `SSL_CERT_FILE`/`SSL_CERT_DIR`: the tests point them at their own CA; a replica has no volume to mount a private
    CA's bundle from), streamed to disk and hashed on the way; checked against its sha256 before anything is unpacked
    or kept."""
    if not uri.startswith("https://"):
        raise FetchError(f"only https:// is allowed, got {shown(uri)!r}")
    name = PurePosixPath(urlsplit(uri).path).name
    name = name if name not in ("", ".", "..") else "model"

    def check(sha: Any) -> None:
        if sha256 is not None and sha.hexdigest() != sha256.lower():
            raise FetchError(
                f"sha256 mismatch for {shown(uri)}: expected {sha256}, got {sha.hexdigest()}; the content behind "
                "the URL is not the pinned one: restore it, or change spec.source.sha256 to accept it"
            )

    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ssl.create_default_context()), _HttpsOnly)
    try:
        with opener.open(uri, timeout=max(min(READ_TIMEOUT_SECONDS, budget.remaining()), 0.001)) as resp:
            received = 0

            def read(n: int) -> bytes:
                """What has arrived (up to n bytes): a slow source is charged and timed chunk by chunk. A connection
                closed before Content-Length's bytes ends the download as cut short, before anything is kept."""
                nonlocal received
                chunk = bytes(resp.read1(n))
                if not chunk and resp.length:
                    raise FetchError(f"{shown(uri)}: the download was cut short: {received} bytes received, "
                                     f"{resp.length} more expected")
                received += len(chunk)
                return chunk

            length = resp.getheader("Content-Length")
            _place(name, read, staging, budget, size=int(length) if (length or "").isdigit() else None, check=check)
    except urllib.error.HTTPError as exc:
        raise FetchError(f"{shown(uri)}: HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError) and budget.remaining() <= 0:
            raise budget.expired() from exc
        hint = ("; only the operator image's CAs are trusted (a replica cannot mount a private CA's bundle): serve it "
                "with a publicly trusted certificate, or from s3://, gs:// or pvc://"
                if isinstance(exc.reason, ssl.SSLCertVerificationError) else "")
        raise FetchError(f"{shown(uri)}: {exc.reason}{hint}") from exc
    except http.client.IncompleteRead as exc:  # a chunked body cut short
        raise FetchError(f"{shown(uri)}: the download was cut short: {len(exc.partial)} bytes received in the last "
                         "chunk, more expected") from exc
    except (http.client.HTTPException, TimeoutError, ConnectionError) as exc:
        if isinstance(exc, TimeoutError) and budget.remaining() <= 0:  # the read's timeout, clipped to the deadline
            raise budget.expired() from exc
        raise FetchError(f"{shown(uri)}: {type(exc).__name__}: {exc}") from exc


def _object(uri: str) -> tuple[str, str]:
    """(bucket, key) of an s3:// or gs:// uri that names one object."""
    bucket, _, key = uri.split("://", 1)[1].partition("/")
    if not key or key.endswith("/"):
        raise FetchError(f"{uri!r} names a prefix; an object version pins one object (a file or an archive)")
    return bucket, key


def _fetch_pvc(uri: str, staging: Path, budget: Budget) -> None:
    dst = staging / "files"
    claim, _, sub = uri.removeprefix("pvc://").partition("/")
    src = (PVC_ROOT / claim / sub).resolve()
    base = (PVC_ROOT / claim).resolve()
    if src != base and base not in src.parents:
        raise FetchError(f"{uri!r} escapes the claim's mount")
    if not src.exists():
        raise FetchError(f"{uri!r}: {src} does not exist in the mounted claim")
    if src.is_dir():
        _copy_claim_tree(uri, src, src, dst, PurePosixPath(), (src,), budget)
    else:
        _copy_file(src, dst / src.name, budget)


def _copy_file(src: Path, target: Path, budget: Budget) -> None:
    with src.open("rb") as f:
        write_file(target, f.read, budget, executable=bool(os.stat(f.fileno()).st_mode & 0o100))


def _copy_claim_tree(uri: str, root: Path, src: Path, dst: Path, rel: PurePosixPath, above: tuple[Path, ...],
                     budget: Budget) -> None:
    """Copy directory `src` (`rel` below the uri's directory `root`, both resolved) into `dst`. A symbolic link is
    copied as what it points to, if that lies inside `root`; one that leads out of it (to the fetch container's own
    files, or elsewhere in the claim) is refused, as are a dangling link, a link to a directory being copied (a
    loop), and anything but regular files and directories."""
    _mkdir(dst, budget)
    for entry in sorted(src.iterdir()):
        name = rel / entry.name
        if entry.is_symlink():
            try:
                real = entry.resolve(strict=True)
            except (OSError, RuntimeError) as exc:  # RuntimeError: a link loop, before Python 3.13
                raise FetchError(f"{uri!r}: symbolic link {str(name)!r} -> {os.readlink(entry)!r} leads nowhere "
                                 f"({exc})") from exc
            if real != root and root not in real.parents:
                raise FetchError(f"{uri!r}: symbolic link {str(name)!r} -> {os.readlink(entry)!r} escapes the "
                                 f"model directory (it resolves to {real}); links in a claim must stay inside it")
        else:
            real = entry
        if real.is_dir():
            if real in above:
                raise FetchError(f"{uri!r}: symbolic link {str(name)!r} -> {os.readlink(entry)!r} loops back to a "
                                 "directory it is in")
            _copy_claim_tree(uri, root, real, dst / entry.name, name, (*above, real), budget)
        elif real.is_file():
            _copy_file(real, dst / entry.name, budget)
        else:
            raise FetchError(f"{uri!r}: {str(name)!r} is neither a regular file nor a directory")


def _under(uri: str) -> tuple[str, str, str]:
    """(bucket, prefix as written, listing root) of an s3:// or gs:// uri: a prefix names a directory, so
    `models/m` lists `models/m/` (never the sibling `models/m-old/`)."""
    bucket, _, prefix = uri.split("://", 1)[1].partition("/")
    return bucket, prefix, (prefix.rstrip("/") + "/" if prefix.strip("/") else "")


def _relative(key: str, root: str, uri: str) -> PurePosixPath | None:
    """Where object `key` goes below the version directory; None for a folder marker (a key ending in `/`)."""
    rel = key[len(root):]
    if not rel or rel.endswith("/"):
        return None
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or "." in path.parts:
        raise FetchError(f"{uri}: object {key!r} would land outside the model directory")
    return path


def _nothing_under(uri: str, root: str) -> FetchError:
    return FetchError(f"{uri}: no objects under it (listed {root or 'the whole bucket'!r}) and no object of that name")


#: S3 error codes that mean the credentials are wrong or lack the right to read.
_S3_DENIED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken",
              "AllAccessDisabled", "403")


#: botocore's name for credentials from a web identity token (IRSA: AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE).
_WEB_IDENTITY = "assume-role-with-web-identity"


def _s3_client() -> tuple[Any, str | None]:
    """An S3 client whose credentials come from boto3's default chain: the environment (a credentialsSecret's keys,
    or spec.server.env's), a shared credentials file, a web identity token (IRSA), EKS Pod Identity or ECS
    container credentials, the instance's role. When it finds none, requests go unsigned, which a public bucket
    answers. Returns the client and where its credentials came from (botocore's name for it; None: anonymous)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    session = boto3.session.Session()
    credentials = session.get_credentials()  # a web identity token is exchanged later, at the first request
    source = credentials.method if credentials is not None else None
    config = Config(signature_version=UNSIGNED) if credentials is None else None
    if source is None:
        _log("Found no S3 credentials: requests go anonymous, which public buckets allow")
    else:
        _log(f"Found S3 credentials source={source}")
    return session.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None, config=config), source


def _s3_failure(uri: str, exc: Exception, source: str | None = "env", endpoint: str | None = None) -> FetchError:
    """One line for a failed S3 fetch: what failed, and where to look given where the credentials came from."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return FetchError(f"{uri}: no S3 credentials: name a Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                          "in credentialsSecret, or give the fetch step credentials through spec.server.env or its "
                          "ServiceAccount (IRSA)")
    if isinstance(exc, EndpointConnectionError):
        url = str(exc.kwargs.get("endpoint_url") or "")
        if source == _WEB_IDENTITY and endpoint and not url.startswith(endpoint):
            return FetchError(f"{uri}: cannot reach the STS endpoint {url} to exchange the web identity token "
                              "(AWS_WEB_IDENTITY_TOKEN_FILE) for credentials")
        return FetchError(f"{uri}: cannot reach the S3 endpoint: {exc}")
    if isinstance(exc, ClientError):
        err = exc.response.get("Error") or {}
        code, message = str(err.get("Code", "")), str(err.get("Message", ""))
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if exc.operation_name == "AssumeRoleWithWebIdentity":
            return FetchError(f"{uri}: STS refused the web identity token ({code}: {message}): check the role "
                              "(AWS_ROLE_ARN, the ServiceAccount's eks.amazonaws.com/role-arn annotation) and its "
                              "trust policy")
        # Servers say it differently: AWS InvalidAccessKeyId (403), versitygw XAdminUserNotFound (404, "No user exists
        # with the provided access key ID"), and so on.
        if code in _S3_DENIED or status in (401, 403) or any(w in message.lower() for w in ("access key", "credential")):
            if source is None:
                return FetchError(f"{uri}: access denied to an anonymous request ({code}: {message}): the fetch step "
                                  "found no S3 credentials (a credentialsSecret, AWS_* variables from "
                                  "spec.server.env, a web identity token or a role from its ServiceAccount, the "
                                  "node's role), and the bucket is not public")
            if source == "env":
                return FetchError(f"{uri}: access denied ({code}: {message}): check the Secret named in "
                                  "credentialsSecret (keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or the AWS_* "
                                  "variables spec.server.env gives the fetch step")
            return FetchError(f"{uri}: access denied ({code}: {message}) to the credentials from {source}: check "
                              "what that identity may read in the bucket")
        if code == "NoSuchBucket":
            return FetchError(f"{uri}: no such bucket")
        return FetchError(f"{uri}: {code or 'error'}: {message or exc}")
    return FetchError(f"{uri}: {type(exc).__name__}: {exc}")


def _s3_read(response: dict[str, Any]) -> tuple[Callable[[int], bytes], int | None]:
    """A GetObject answer's body as chunks, and its announced size."""
    body = response["Body"]
    length = response.get("ContentLength")
    return body.read, int(length) if isinstance(length, int) else None


def _fetch_s3(uri: str, staging: Path, budget: Budget, version: str | None = None) -> None:
    try:
        import boto3  # noqa: F401 - the extra's presence, checked before anything is fetched
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError as exc:
        raise FetchError("s3:// needs boto3 (install triton-operator[s3])") from exc
    source: str | None = None
    endpoint: str | None = None
    try:
        s3, source = _s3_client()
        endpoint = s3.meta.endpoint_url
        if version is not None:
            bucket, key = _object(uri)
            read, size = _s3_read(s3.get_object(Bucket=bucket, Key=key, VersionId=version))
            _place(PurePosixPath(key).name, read, staging, budget, size=size)
            return
        bucket, prefix, root = _under(uri)
        placed = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
            for obj in page.get("Contents", []):
                rel = _relative(obj["Key"], root, uri)
                if rel is None:
                    continue
                budget.expect(int(obj.get("Size") or 0))
                read, _ = _s3_read(s3.get_object(Bucket=bucket, Key=obj["Key"]))
                write_file(staging / "files" / rel, read, budget)
                placed += 1
        if placed:
            return
        if not root or prefix.endswith("/"):
            raise _nothing_under(uri, root)
        try:  # no directory of that name: the uri names one object (a file, or an archive to unpack)
            response = s3.get_object(Bucket=bucket, Key=prefix)
        except ClientError as exc:
            if str((exc.response.get("Error") or {}).get("Code")) in ("NoSuchKey", "404"):
                raise _nothing_under(uri, root) from exc
            raise
        read, size = _s3_read(response)
        _place(PurePosixPath(prefix).name, read, staging, budget, size=size)
    except (BotoCoreError, ClientError) as exc:
        raise _s3_failure(uri, exc, source, endpoint) from exc


def _gcs_failure(uri: str, exc: Exception, anonymous: bool = False) -> FetchError:
    from google.api_core import exceptions as api

    if isinstance(exc, (api.Unauthorized, api.Forbidden)) and anonymous:
        return FetchError(f"{uri}: access denied to an anonymous request ({exc.code}: {exc.message}): the fetch step "
                          "found no Google credentials (a credentialsSecret's key.json, GOOGLE_APPLICATION_CREDENTIALS "
                          "from spec.server.env, GKE Workload Identity through its ServiceAccount), and the bucket is "
                          "not public")
    if isinstance(exc, (api.Unauthorized, api.Forbidden)):
        return FetchError(f"{uri}: access denied ({exc.code}: {exc.message}): check the Secret named in "
                          "credentialsSecret (key key.json, a service account key with read access), or the identity "
                          "the fetch step's credentials belong to")
    if isinstance(exc, api.NotFound):
        return FetchError(f"{uri}: not found: {exc.message}")
    return FetchError(f"{uri}: {type(exc).__name__}: {exc}")


class _Sink:
    """A file-like `write` for google-cloud-storage's download_to_file: what it writes goes to a new file, charged
    chunk by chunk."""

    def __init__(self, target: Path, budget: Budget) -> None:
        self.budget, self.written = budget, 0
        _mkdir(target.parent, budget)
        budget.entry()
        try:
            self.file = target.open("xb")
        except FileExistsError as exc:
            raise FetchError(f"{budget.source}: {target.name!r} is there twice") from exc

    def write(self, data: bytes) -> int:
        self.budget.charge(len(data))
        self.written += len(data)
        return self.file.write(data)

    def __enter__(self) -> _Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


def _gcs_place(blob: Any, name: str, staging: Path, budget: Budget) -> None:
    """One GCS object: a file as `name`, or an archive kept aside and unpacked."""
    if blob.size is not None:
        budget.expect(int(blob.size))
    archive = _is_archive(name)
    with _Sink(staging / "download" if archive else staging / "files" / name, budget) as sink:
        blob.download_to_file(sink)
    if archive:
        _unpack(name, staging, budget, sink.written)


def _fetch_gs(uri: str, staging: Path, budget: Budget, version: str | None = None) -> None:
    try:
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth
        from google.cloud import storage
        from requests import RequestException
    except ImportError as exc:
        raise FetchError("gs:// needs google-cloud-storage (install triton-operator[gcs])") from exc
    anonymous = False
    try:
        try:
            client = storage.Client()  # google-auth's default chain (or anonymous, with STORAGE_EMULATOR_HOST)
        except auth.DefaultCredentialsError:  # nothing found: a public bucket still reads anonymously
            _log("Found no GCS credentials: requests go anonymous, which public buckets allow")
            client, anonymous = storage.Client.create_anonymous_client(), True
        if version is not None:
            if not version.isdigit():
                raise FetchError(f"a GCS object version is its generation, a number; got {version!r}")
            bucket_name, key = _object(uri)
            blob = client.bucket(bucket_name).blob(key, generation=int(version))  # a missing one: NotFound
            _gcs_place(blob, PurePosixPath(key).name, staging, budget)
            return
        bucket, prefix, root = _under(uri)
        placed = 0
        for blob in client.list_blobs(bucket, prefix=root):
            rel = _relative(blob.name, root, uri)
            if rel is None:
                continue
            budget.expect(int(blob.size or 0))
            with _Sink(staging / "files" / rel, budget) as sink:
                blob.download_to_file(sink)
            placed += 1
        if placed:
            return
        single = client.bucket(bucket).get_blob(prefix) if root and not prefix.endswith("/") else None
        if single is None:
            raise _nothing_under(uri, root)
        _gcs_place(single, PurePosixPath(prefix).name, staging, budget)
    except (api.GoogleAPIError, auth.GoogleAuthError, RequestException) as exc:
        raise _gcs_failure(uri, exc, anonymous) from exc


SCHEMES = ("https://", "pvc://", "s3://", "gs://")


def _move_into(src: Path, dst: Path) -> None:
    """Move the tree `src` to `dst`: renamed whole when `dst` is not there, else entry by entry, a fetched file
    replacing a rendered one of the same name (moved, not copied: no second copy takes room)."""
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.rename(dst)
        return
    for entry in sorted(src.iterdir()):
        target = dst / entry.name
        if entry.is_dir() and target.is_dir() and not target.is_symlink():
            _move_into(entry, target)
            continue
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(entry, target)


def fetch_uri(
    model: str,
    uri: str,
    repo: Path,
    *,
    sha256: str | None = None,
    object_version: str | None = None,
    version: str = VERSION_DIR,
    budget: Budget | None = None,
) -> None:
    """Place the files of `model`'s version `version` from `uri`, checked against its pins, within `budget`
    (what the run may still write, and until when)."""
    budget = budget or Budget()
    if "/" in model or model.startswith("."):
        raise FetchError(f"invalid model name {model!r}")
    if has_userinfo(uri):
        raise FetchError(f"{shown(uri)} carries credentials (user:password@): give them through the environment "
                         "(spec.server.env, credentialsSecret), never in the uri")
    if version == MODEL_DIR:
        _fetch_model_files(model, uri, repo, sha256=sha256, object_version=object_version, budget=budget)
        return
    if not version.isdigit():
        raise FetchError(f"invalid version {version!r} of model {model!r}: a version is a number")
    if not uri.startswith(SCHEMES):
        raise FetchError(f"unsupported uri {shown(uri)!r}: use https://, pvc://, s3:// or gs://")
    if sha256 is not None and not uri.startswith("https://"):
        raise FetchError(f"a sha256 pin applies to an https:// uri, not {shown(uri)!r}")
    if object_version is not None and not uri.startswith(("s3://", "gs://")):
        raise FetchError(f"an object version applies to an s3:// or gs:// uri, not {shown(uri)!r}")
    budget.source = shown(uri)
    # Fetched aside (staging/files, and an archive in staging until unpacked) and moved in only once complete and
    # checked: a fetch that fails (a cap, the deadline, a pin, a cut) leaves no half-written version behind.
    staging = repo / f".{model}.{version}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "files").mkdir(parents=True)
    try:
        if uri.startswith("https://"):
            _fetch_https(uri, staging, budget, sha256)
        elif uri.startswith("pvc://"):
            _fetch_pvc(uri, staging, budget)
        elif uri.startswith("s3://"):
            _fetch_s3(uri, staging, budget, object_version)
        else:
            _fetch_gs(uri, staging, budget, object_version)
        _move_into(staging / "files", repo / model / version)  # what the rendered repository put there stays
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fetch_model_files(model: str, uri: str, repo: Path, *, sha256: str | None, object_version: str | None,
                       budget: Budget) -> None:
    """spec.modelFiles.uri: fetched aside, then moved into `model/`; a tree that would replace what the operator
    renders there (config.pbtxt, warmup/, a version directory) is refused before anything is moved."""
    staging = repo / f".{model}.model-files"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        fetch_uri(model, uri, staging, sha256=sha256, object_version=object_version, version=VERSION_DIR, budget=budget)
        fetched = staging / model / VERSION_DIR
        clash = sorted(p.name for p in fetched.iterdir() if p.name in ("config.pbtxt", "warmup") or p.name.isdigit())
        if clash:
            raise FetchError(
                f"{shown(uri)!r} holds {', '.join(clash)}: spec.modelFiles may not replace the rendered config.pbtxt, "
                "warmup/ or a version directory"
            )
        _move_into(fetched, repo / model)
    finally:  # also when the fetch itself failed: nothing of it stays in the repository
        shutil.rmtree(staging, ignore_errors=True)


def pairs(values: list[str], flag: str) -> dict[str, str]:
    """`MODEL=VALUE` (or `MODEL/VERSION=VALUE`) arguments by model (or model/version)."""
    out: dict[str, str] = {}
    for v in values:
        model, sep, value = v.partition("=")
        if not sep or not model or not value:
            raise FetchError(f"{flag} takes MODEL=VALUE, got {v!r}")
        out[model] = value
    return out


def run(
    src: Path,
    dst: Path,
    uris: list[str],
    sha256: dict[str, str] | None = None,
    object_versions: dict[str, str] | None = None,
    budget: Budget | None = None,
) -> int:
    """Assemble the repository in `dst`: the ConfigMap's files, then each uri's. `budget` bounds the whole run:
    bytes and files written (each download streamed to disk, each archive member as it is unpacked) and time."""
    budget = budget or Budget()
    sha256, object_versions = sha256 or {}, object_versions or {}
    by_model = pairs(uris, "--uri")
    stray = sorted((set(sha256) | set(object_versions)) - set(by_model))
    if stray:
        raise FetchError(f"a pin names model(s) with no --uri: {', '.join(stray)}")
    dst.mkdir(parents=True, exist_ok=True)
    with _deadline(budget):
        n = copy_repository(src, dst, budget) if src.exists() else 0
        _log(f"Copied rendered repository files={n} from={src} to={dst} maxBytes={budget.max_bytes} "
             f"maxFiles={budget.max_files} timeoutSeconds={budget.timeout_seconds:g}")
        for key, uri in by_model.items():
            model, _, version = key.partition("/")
            pin = {"sha256": sha256.get(key), "objectVersion": object_versions.get(key)}
            said = "".join(f" {k}={v}" for k, v in pin.items() if v)
            _log(f"Fetching model files model={model} version={version or VERSION_DIR} uri={shown(uri)}{said}")
            fetch_uri(model, uri, dst, sha256=pin["sha256"], object_version=pin["objectVersion"],
                      version=version or VERSION_DIR, budget=budget)
            _log(f"Fetched model files model={model} version={version or VERSION_DIR} repositoryBytes={budget.bytes} "
                 f"repositoryFiles={budget.files}")
    return 0
