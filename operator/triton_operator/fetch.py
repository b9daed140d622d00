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
"""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import shutil
import ssl
import stat
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any

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
    """tarfile's "data" filter refuses absolute paths, `..`, links that point outside `dst`, device files."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():  # the filter would quietly make `/x` relative: refuse it instead
                path = PurePosixPath(member.name)
                if path.is_absolute() or ".." in path.parts:
                    raise FetchError(f"archive member {member.name!r} escapes the model directory")
            tar.extractall(dst, filter="data")
    except tarfile.FilterError as exc:  # e.g. OutsideDestinationError, AbsoluteLinkError, LinkOutsideDestinationError
        name = exc.tarinfo.name if exc.tarinfo is not None else "?"
        raise FetchError(f"archive member {name!r} escapes the model directory ({exc})") from exc
    except (tarfile.TarError, EOFError, zlib.error) as exc:  # a short or corrupt .gz raises EOFError or zlib.error
        raise FetchError(f"not a readable tar archive: {exc}") from exc


def _safe_extract_zip(data: bytes, dst: Path) -> None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for info in z.infolist():
                p = PurePosixPath(info.filename)
                if p.is_absolute() or ".." in p.parts:
                    raise FetchError(f"archive member {info.filename!r} escapes the model directory")
                if stat.S_ISLNK(info.external_attr >> 16):
                    raise FetchError(f"archive member {info.filename!r} is a symbolic link; a model archive holds files")
            z.extractall(dst)  # noqa: S202 - every member was checked above: none is absolute, climbs out or links
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise FetchError(f"not a readable zip archive: {exc}") from exc


def _place(name: str, data: bytes, dst: Path) -> None:
    """One downloaded object into the version directory: an archive unpacked, any other file as `name`."""
    if name.endswith((".tar.gz", ".tgz", ".tar")):
        _safe_extract_tar(data, dst)
    elif name.endswith(".zip"):
        _safe_extract_zip(data, dst)
    else:
        (dst / name).write_bytes(data)


class _HttpsOnly(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but only to another https:// URL: a source never downgrades to plain http."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        if not newurl.startswith("https://"):
            raise FetchError(f"{req.full_url} redirects to {newurl!r}; only https:// is followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _download(uri: str) -> bytes:
    """The body behind an https:// URL, verified against the system's CAs (or `SSL_CERT_FILE`/`SSL_CERT_DIR`, which
    OpenSSL's default paths honour: mount a private CA's bundle and point SSL_CERT_FILE at it)."""
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ssl.create_default_context()), _HttpsOnly)
    try:
        with opener.open(uri, timeout=60) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as exc:
        raise FetchError(f"{uri}: HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        hint = ("; a private CA is trusted through SSL_CERT_FILE (its certificate's path)"
                if isinstance(exc.reason, ssl.SSLCertVerificationError) else "")
        raise FetchError(f"{uri}: {exc.reason}{hint}") from exc
    except http.client.IncompleteRead as exc:
        raise FetchError(f"{uri}: the download was cut short: {len(exc.partial)} bytes received, "
                         f"{exc.expected} more expected") from exc
    except (http.client.HTTPException, TimeoutError, ConnectionError) as exc:
        raise FetchError(f"{uri}: {type(exc).__name__}: {exc}") from exc


def _fetch_https(uri: str, dst: Path, sha256: str | None = None) -> None:
    if not uri.startswith("https://"):
        raise FetchError(f"only https:// is allowed, got {uri!r}")
    data = _download(uri)
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
        _copy_claim_tree(uri, src, src, dst, PurePosixPath(), (src,))
    else:
        shutil.copy2(src, dst / src.name)


def _copy_claim_tree(uri: str, root: Path, src: Path, dst: Path, rel: PurePosixPath, above: tuple[Path, ...]) -> None:
    """Copy directory `src` (`rel` below the uri's directory `root`, both resolved) into `dst`. A symbolic link is
    copied as what it points to, if that lies inside `root`; one that leads out of it (to the fetch container's own
    files, or elsewhere in the claim) is refused, as are a dangling link, a link to a directory being copied (a
    loop), and anything but regular files and directories."""
    dst.mkdir(parents=True, exist_ok=True)
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
            _copy_claim_tree(uri, root, real, dst / entry.name, name, (*above, real))
        elif real.is_file():
            shutil.copy2(real, dst / entry.name)
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


def _fetch_s3(uri: str, dst: Path, version: str | None = None) -> None:
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
            body = s3.get_object(Bucket=bucket, Key=key, VersionId=version)["Body"]
            _place(PurePosixPath(key).name, body.read(), dst)
            return
        bucket, prefix, root = _under(uri)
        placed = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
            for obj in page.get("Contents", []):
                rel = _relative(obj["Key"], root, uri)
                if rel is None:
                    continue
                target = dst / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, obj["Key"], str(target))
                placed += 1
        if placed:
            return
        if not root or prefix.endswith("/"):
            raise _nothing_under(uri, root)
        try:  # no directory of that name: the uri names one object (a file, or an archive to unpack)
            body = s3.get_object(Bucket=bucket, Key=prefix)["Body"]
        except ClientError as exc:
            if str((exc.response.get("Error") or {}).get("Code")) in ("NoSuchKey", "404"):
                raise _nothing_under(uri, root) from exc
            raise
        _place(PurePosixPath(prefix).name, body.read(), dst)
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


def _fetch_gs(uri: str, dst: Path, version: str | None = None) -> None:
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
            blob = client.bucket(bucket_name).blob(key, generation=int(version))
            _place(PurePosixPath(key).name, blob.download_as_bytes(), dst)
            return
        bucket, prefix, root = _under(uri)
        placed = 0
        for blob in client.list_blobs(bucket, prefix=root):
            rel = _relative(blob.name, root, uri)
            if rel is None:
                continue
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(str(target))
            placed += 1
        if placed:
            return
        single = client.bucket(bucket).get_blob(prefix) if root and not prefix.endswith("/") else None
        if single is None:
            raise _nothing_under(uri, root)
        _place(PurePosixPath(prefix).name, single.download_as_bytes(), dst)
    except (api.GoogleAPIError, auth.GoogleAuthError, RequestException) as exc:
        raise _gcs_failure(uri, exc, anonymous) from exc


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
    # Fetched aside and moved in only once complete: a fetch that fails leaves no half-written version behind.
    staging = repo / f".{model}.{version}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if uri.startswith("https://"):
            _fetch_https(uri, staging, sha256)
        elif uri.startswith("pvc://"):
            _fetch_pvc(uri, staging)
        elif uri.startswith("s3://"):
            _fetch_s3(uri, staging, object_version)
        else:
            _fetch_gs(uri, staging, object_version)
        dst = repo / model / version
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists():  # what the rendered repository already put there stays, unless fetched over
            shutil.copytree(staging, dst, dirs_exist_ok=True)
        else:
            staging.rename(dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
