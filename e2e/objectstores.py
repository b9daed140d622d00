"""Real object stores on this machine, for the `fetch` tests: an S3 server (versitygw, a POSIX-backed S3
gateway) and a Google Cloud Storage server (fake-gcs-server), each built from its pinned Go module by
tools/objectstores/build.sh and started as a process listening on `host` (127.0.0.1, or a node's address so
that pods reach it). Nothing patches a client: boto3 and google-cloud-storage speak HTTP to them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from e2e.ports import free_port
from tests.timing import scaled

REPO_ROOT = Path(__file__).resolve().parent.parent

BUILD = REPO_ROOT / "tools" / "objectstores" / "build.sh"


@functools.cache
def binary(name: str) -> Path:
    """The built binary (`versitygw` or `fake-gcs-server`); `TROP_<NAME>` (e.g. TROP_VERSITYGW) overrides it."""
    override = os.environ.get("TROP_" + name.upper().replace("-", "_"))
    if override:
        return Path(override)
    proc = subprocess.run(["bash", str(BUILD), name], capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, f"tools/objectstores/build.sh {name} failed:\n{proc.stderr[-4000:]}"
    path = Path(proc.stdout.strip())
    assert path.is_file(), proc.stdout
    return path


class _Server:
    """A server process with its log; `start()` waits until `_answers()` (no fixed sleep), `stop()` reaps it."""

    name = ""

    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root, self.host = root, host
        self.port = free_port()
        self.log_path = root / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def _answers(self) -> bool:
        raise NotImplementedError

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def start(self) -> _Server:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + scaled(60)
        while not self._answers():
            code = self.process.poll()
            assert code is None, f"{self.name} exited with {code}:\n{self.log()}"
            assert time.monotonic() < deadline, f"{self.name} did not answer at {self.endpoint} in {scaled(60):.0f}s:\n{self.log()}"
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.stop()


class S3Server(_Server):
    """versitygw over the directory `root/data` (a bucket is a directory, an object a file), with one root
    user's access and secret key, versioning kept in `root/versions`."""

    name = "versitygw"

    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        super().__init__(root, host)
        self.access_key = "trop" + secrets.token_hex(6)
        self.secret_key = secrets.token_hex(20)
        self.region = "us-east-1"

    def argv(self) -> list[str]:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        (self.root / "versions").mkdir(parents=True, exist_ok=True)
        return [str(binary("versitygw")), "--port", f"{self.host}:{self.port}", "--access", self.access_key,
                "--secret", self.secret_key, "--region", self.region, "--health", "/health", "--quiet",
                "posix", "--versioning-dir", str(self.root / "versions"), str(self.root / "data")]

    def _answers(self) -> bool:
        return _http_ok(f"{self.endpoint}/health")

    def env(self, *, access_key: str | None = None, secret_key: str | None = None) -> dict[str, str]:
        """The AWS_* variables fetch reads (what the Secret's keys become in the init container)."""
        return {"AWS_ACCESS_KEY_ID": access_key or self.access_key,
                "AWS_SECRET_ACCESS_KEY": secret_key or self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": self.region}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region)


class GCSServer(_Server):
    """fake-gcs-server over plain HTTP, objects in memory; clients reach it through google-cloud-storage's own
    endpoint setting, the `STORAGE_EMULATOR_HOST` environment variable."""

    name = "fake-gcs-server"

    def argv(self) -> list[str]:
        return [str(binary("fake-gcs-server")), "-scheme", "http", "-host", self.host, "-port", str(self.port),
                "-public-host", f"{self.host}:{self.port}", "-external-url", self.endpoint, "-backend", "memory",
                "-log-level", "warn"]

    def _answers(self) -> bool:
        return _http_ok(f"{self.endpoint}/storage/v1/b")

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project="test", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.endpoint})


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - our own server's http:// URL
            return bool(resp.status == 200)
    except (TimeoutError, urllib.error.URLError, ConnectionError):
        return False


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Any:
    """os.environ with `values` set, restored after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
