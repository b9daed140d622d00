"""`triton-operator fetch`: the init step that assembles a replica's model repository.

Copies the rendered repository from the mounted ConfigMap (skipping the volume's
`..data` bookkeeping, which Triton would take for models), then places each
uri-sourced model's version files: `https://` (a file or a .tar.gz/.tgz/.zip
archive), `pvc://claim/path` (mounted at /sources/pvc/<claim>), `s3://` (boto3)
and `gs://` (google-cloud-storage). Credentials come from the environment or
mounted Secret files, never from arguments.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

VERSION_DIR = "1"
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
        z.extractall(dst)


def _fetch_https(uri: str, dst: Path) -> None:
    if not uri.startswith("https://"):
        raise FetchError(f"only https:// is allowed, got {uri!r}")
    with urllib.request.urlopen(uri, timeout=60) as resp:  # noqa: S310 - scheme checked above
        data = resp.read()
    name = PurePosixPath(uri.split("?", 1)[0]).name or "model"
    if name.endswith((".tar.gz", ".tgz", ".tar")):
        _safe_extract_tar(data, dst)
    elif name.endswith(".zip"):
        _safe_extract_zip(data, dst)
    else:
        (dst / name).write_bytes(data)


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


def _fetch_s3(uri: str, dst: Path) -> None:
    try:
        import boto3  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise FetchError("s3:// needs boto3 (install triton-operator[s3])") from exc
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = PurePosixPath(obj["Key"]).relative_to(prefix) if prefix else PurePosixPath(obj["Key"])
            if ".." in rel.parts:
                raise FetchError(f"object {obj['Key']!r} escapes the model directory")
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(target))


def _fetch_gs(uri: str, dst: Path) -> None:
    try:
        from google.cloud import storage  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise FetchError("gs:// needs google-cloud-storage (install triton-operator[gcs])") from exc
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    client = storage.Client()
    for blob in client.list_blobs(bucket, prefix=prefix):
        rel = PurePosixPath(blob.name).relative_to(prefix) if prefix else PurePosixPath(blob.name)
        if ".." in rel.parts or blob.name.endswith("/"):
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))


FETCHERS = {"https://": _fetch_https, "pvc://": _fetch_pvc, "s3://": _fetch_s3, "gs://": _fetch_gs}


def fetch_uri(model: str, uri: str, repo: Path) -> None:
    if "/" in model or model.startswith("."):
        raise FetchError(f"invalid model name {model!r}")
    dst = repo / model / VERSION_DIR
    dst.mkdir(parents=True, exist_ok=True)
    for prefix, fn in FETCHERS.items():
        if uri.startswith(prefix):
            fn(uri, dst)
            return
    raise FetchError(f"unsupported uri {uri!r}: use https://, pvc://, s3:// or gs://")


def run(src: Path, dst: Path, uris: list[str]) -> int:
    dst.mkdir(parents=True, exist_ok=True)
    n = copy_repository(src, dst) if src.exists() else 0
    _log(f"Copied rendered repository files={n} from={src} to={dst}")
    for spec in uris:
        model, sep, uri = spec.partition("=")
        if not sep:
            raise FetchError(f"--uri takes MODEL=URI, got {spec!r}")
        _log(f"Fetching model files model={model} uri={uri}")
        fetch_uri(model, uri, dst)
        _log(f"Fetched model files model={model}")
    return 0
