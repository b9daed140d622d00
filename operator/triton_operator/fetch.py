"""`triton-operator fetch`: the init step that assembles a replica's model repository.

Copies the rendered repository from the mounted ConfigMap (skipping the volume's
`..data` bookkeeping, which Triton would take for models), then places each
uri-sourced model's version files (`MODEL=URI` into `MODEL/1/`, `MODEL/N=URI` into
`MODEL/N/`, for the versions of `spec.versions`, and `MODEL/.=URI` into `MODEL/` itself, for
`spec.modelFiles.uri`): `https://` (a file or a .tar.gz/.tgz/.zip
archive), `pvc://claim/path` (mounted at /sources/pvc/<claim>), `s3://` (boto3)
and `gs://` (google-cloud-storage). Credentials come from the environment or
mounted Secret files, never from arguments.

Pins: an https:// download is checked against its `sha256` before anything is
unpacked; with an object version, `s3://` and `gs://` fetch exactly that version
(S3 VersionId, GCS generation) of the one object the uri names.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

VERSION_DIR = "1"
#: The `--uri MODEL/<key>` key of a model's own directory (spec.modelFiles.uri), beside its version directories.
MODEL_DIR = "."
PVC_ROOT = Path("/sources/pvc")


class FetchError(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def copy_repository(src: Path, dst: Path) -> int:
    """Copy the ConfigMap volume's visible tree into dst; returns the number of files copied."""
    n = 0
    for entry in sorted(src.iterdir()):
        if entry.name.startswith(".."):
            continue
        target = dst / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, symlinks=False, dirs_exist_ok=True)
            n += sum(1 for p in target.rglob("*") if p.is_file())
        else:
            shutil.copy2(entry, target)
            n += 1
    return n


def _safe_extract_tar(data: bytes, dst: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dst, filter="data")


def _safe_extract_zip(data: bytes, dst: Path) -> None:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for member in z.namelist():
            p = PurePosixPath(member)
            if p.is_absolute() or ".." in p.parts:
                raise FetchError(f"archive member {member!r} escapes the model directory")
        z.extractall(dst)  # noqa: S202 - every member was checked above: none is absolute or climbs out


def _place(name: str, data: bytes, dst: Path) -> None:
    """One downloaded object into the version directory: an archive unpacked, any other file as `name`."""
    if name.endswith((".tar.gz", ".tgz", ".tar")):
        _safe_extract_tar(data, dst)
    elif name.endswith(".zip"):
        _safe_extract_zip(data, dst)
    else:
        (dst / name).write_bytes(data)


def _fetch_https(uri: str, dst: Path, sha256: str | None = None) -> None:
    if not uri.startswith("https://"):
        raise FetchError(f"only https:// is allowed, got {uri!r}")
    with urllib.request.urlopen(uri, timeout=60) as resp:  # noqa: S310 - scheme checked above
        data = resp.read()
    if sha256 is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != sha256.lower():
            raise FetchError(
                f"sha256 mismatch for {uri}: expected {sha256}, got {got} ({len(data)} bytes); the content behind "
                "the URL is not the pinned one: restore it, or change spec.source.sha256 to accept it"
            )
    _place(PurePosixPath(uri.split("?", 1)[0]).name or "model", data, dst)


def _object(uri: str) -> tuple[str, str]:
    """(bucket, key) of an s3:// or gs:// uri that names one object."""
    bucket, _, key = uri.split("://", 1)[1].partition("/")
    if not key or key.endswith("/"):
        raise FetchError(f"{uri!r} names a prefix; an object version pins one object (a file or an archive)")
    return bucket, key


def _fetch_pvc(uri: str, dst: Path) -> None:
    claim, _, sub = uri.removeprefix("pvc://").partition("/")
    src = (PVC_ROOT / claim / sub).resolve()
    base = (PVC_ROOT / claim).resolve()
    if src != base and base not in src.parents:
        raise FetchError(f"{uri!r} escapes the claim's mount")
    if not src.exists():
        raise FetchError(f"{uri!r}: {src} does not exist in the mounted claim")
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst / src.name)


def _fetch_s3(uri: str, dst: Path, version: str | None = None) -> None:
    try:
        import boto3
    except ImportError as exc:
        raise FetchError("s3:// needs boto3 (install triton-operator[s3])") from exc
    s3 = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)
    if version is not None:
        bucket, key = _object(uri)
        body = s3.get_object(Bucket=bucket, Key=key, VersionId=version)["Body"]
        _place(PurePosixPath(key).name, body.read(), dst)
        return
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = PurePosixPath(obj["Key"]).relative_to(prefix) if prefix else PurePosixPath(obj["Key"])
            if ".." in rel.parts:
                raise FetchError(f"object {obj['Key']!r} escapes the model directory")
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(target))


def _fetch_gs(uri: str, dst: Path, version: str | None = None) -> None:
    try:
        from google.cloud import storage
    except ImportError as exc:
        raise FetchError("gs:// needs google-cloud-storage (install triton-operator[gcs])") from exc
    client = storage.Client()
    if version is not None:
        if not version.isdigit():
            raise FetchError(f"a GCS object version is its generation, a number; got {version!r}")
        bucket_name, key = _object(uri)
        blob = client.bucket(bucket_name).blob(key, generation=int(version))
        _place(PurePosixPath(key).name, blob.download_as_bytes(), dst)
        return
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    for blob in client.list_blobs(bucket, prefix=prefix):
        rel = PurePosixPath(blob.name).relative_to(prefix) if prefix else PurePosixPath(blob.name)
        if ".." in rel.parts or blob.name.endswith("/"):
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))


SCHEMES = ("https://", "pvc://", "s3://", "gs://")


def fetch_uri(
    model: str,
    uri: str,
    repo: Path,
    *,
    sha256: str | None = None,
    object_version: str | None = None,
    version: str = VERSION_DIR,
) -> None:
    """Place the files of `model`'s version `version` from `uri`, checked against its pins."""
    if "/" in model or model.startswith("."):
        raise FetchError(f"invalid model name {model!r}")
    if version == MODEL_DIR:
        _fetch_model_files(model, uri, repo, sha256=sha256, object_version=object_version)
        return
    if not version.isdigit():
        raise FetchError(f"invalid version {version!r} of model {model!r}: a version is a number")
    if not uri.startswith(SCHEMES):
        raise FetchError(f"unsupported uri {uri!r}: use https://, pvc://, s3:// or gs://")
    if sha256 is not None and not uri.startswith("https://"):
        raise FetchError(f"a sha256 pin applies to an https:// uri, not {uri!r}")
    if object_version is not None and not uri.startswith(("s3://", "gs://")):
        raise FetchError(f"an object version applies to an s3:// or gs:// uri, not {uri!r}")
    dst = repo / model / version
    dst.mkdir(parents=True, exist_ok=True)
    if uri.startswith("https://"):
        _fetch_https(uri, dst, sha256)
    elif uri.startswith("pvc://"):
        _fetch_pvc(uri, dst)
    elif uri.startswith("s3://"):
        _fetch_s3(uri, dst, object_version)
    else:
        _fetch_gs(uri, dst, object_version)


def _fetch_model_files(model: str, uri: str, repo: Path, *, sha256: str | None, object_version: str | None) -> None:
    """spec.modelFiles.uri: fetched aside, then moved into `model/`; a tree that would replace what the operator
    renders there (config.pbtxt, warmup/, a version directory) is refused before anything is moved."""
    staging = repo / f".{model}.model-files"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        fetch_uri(model, uri, staging, sha256=sha256, object_version=object_version, version=VERSION_DIR)
        fetched = staging / model / VERSION_DIR
        clash = sorted(p.name for p in fetched.iterdir() if p.name in ("config.pbtxt", "warmup") or p.name.isdigit())
        if clash:
            raise FetchError(
                f"{uri!r} holds {', '.join(clash)}: spec.modelFiles may not replace the rendered config.pbtxt, "
                "warmup/ or a version directory"
            )
        dst = repo / model
        dst.mkdir(parents=True, exist_ok=True)
        for entry in sorted(fetched.iterdir()):
            target = dst / entry.name
            if entry.is_dir():
                shutil.copytree(entry, target, dirs_exist_ok=True)
            else:
                shutil.copy2(entry, target)
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
) -> int:
    sha256, object_versions = sha256 or {}, object_versions or {}
    by_model = pairs(uris, "--uri")
    stray = sorted((set(sha256) | set(object_versions)) - set(by_model))
    if stray:
        raise FetchError(f"a pin names model(s) with no --uri: {', '.join(stray)}")
    dst.mkdir(parents=True, exist_ok=True)
    n = copy_repository(src, dst) if src.exists() else 0
    _log(f"Copied rendered repository files={n} from={src} to={dst}")
    for key, uri in by_model.items():
        model, _, version = key.partition("/")
        pin = {"sha256": sha256.get(key), "objectVersion": object_versions.get(key)}
        said = "".join(f" {k}={v}" for k, v in pin.items() if v)
        _log(f"Fetching model files model={model} version={version or VERSION_DIR} uri={uri}{said}")
        fetch_uri(model, uri, dst, sha256=pin["sha256"], object_version=pin["objectVersion"], version=version or VERSION_DIR)
        _log(f"Fetched model files model={model} version={version or VERSION_DIR}")
    return 0
