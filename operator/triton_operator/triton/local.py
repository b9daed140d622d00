"""A real tritonserver on this machine, from the `nvidia-pytriton` wheel.

Owns finding the binary, assembling a backend directory the server accepts
(the wheel ships the Python backend's library and its per-Python stubs in
separate places), the process environment, and starting/stopping a server on
free loopback ports. Used by `triton-operator validate`, by the tests and by
the benchmarks; nothing here talks to Kubernetes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The Triton release the wheel ships (tritonserver 2.51.0 == container 24.10).
TRITON_VERSION = "2.51.0"

_log = logging.getLogger("triton_operator.triton")


class TritonNotInstalled(RuntimeError):
    """The nvidia-pytriton wheel (and so tritonserver) is not installed."""


@dataclass(frozen=True)
class TritonInstall:
    """Paths of the tritonserver that the nvidia-pytriton wheel installed."""

    root: Path  # site-packages/pytriton/tritonserver
    libs: Path  # site-packages/nvidia_pytriton.libs

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def cache_directory(self) -> Path:
        return self.root / "caches"

    def backend_directory(self) -> Path:
        """A backend directory with `python/` = backend library + utils + this Python's stub.

        Built once per install and Python version under the user cache; the wheel's own
        `backends/python` lacks the stub, which lives in `python_backend_stubs/<ver>/`.
        """
        ver = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = self.root / "python_backend_stubs" / ver / "triton_python_backend_stub"
        if not stub.exists():
            raise TritonNotInstalled(f"nvidia-pytriton ships no Python backend stub for Python {ver}")
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "triton-operator"
        out = cache / "backends" / f"{_digest(str(self.root))}-py{ver}"
        python_dir = out / "python"
        if not (python_dir / "triton_python_backend_stub").exists():
            tmp = Path(tempfile.mkdtemp(prefix="backends-", dir=cache if cache.exists() else None))
            (tmp / "python").mkdir(parents=True)
            for src in (self.root / "backends" / "python").iterdir():
                if src.is_file():
                    os.symlink(src, tmp / "python" / src.name)
            os.symlink(stub, tmp / "python" / stub.name)
            out.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                os.rename(tmp, out)  # another process may have won the race; theirs is equivalent
            shutil.rmtree(tmp, ignore_errors=True)
        return out

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for tritonserver: bundled libs on LD_LIBRARY_PATH, this venv first on PATH.

        The Python backend stub imports NumPy (and whatever model.py imports) from the
        environment of the server process, so the running interpreter's bin must lead PATH.
        """
        env = dict(os.environ if base is None else base)
        ld = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = f"{self.libs}:{ld}" if ld else str(self.libs)
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}"
        if sys.prefix != sys.base_prefix:
            env["VIRTUAL_ENV"] = sys.prefix
        return env


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:12]


def find_install() -> TritonInstall:
    """Locate tritonserver in the nvidia-pytriton wheel, or raise TritonNotInstalled."""
    try:
        import pytriton
    except ImportError as exc:
        raise TritonNotInstalled(
            "tritonserver not found: install the 'server' extra (pip install 'triton-operator[server]')"
        ) from exc
    root = Path(pytriton.__file__).parent / "tritonserver"
    libs = root.parent.parent / "nvidia_pytriton.libs"
    install = TritonInstall(root=root, libs=libs)
    if not install.binary.exists():
        raise TritonNotInstalled(f"nvidia-pytriton is installed but {install.binary} is missing")
    return install


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the process that started it dies (Linux prctl)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LocalTritonServer:
    """One tritonserver process on loopback, for validation and tests.

    `start()` returns once the gRPC port answers (or raises with the server's log
    tail if the process exits first). With `model_control_mode="explicit"` no model
    is loaded at start, so models can be loaded one by one and each load's error
    is reported separately.
    """

    model_repository: Path
    model_control_mode: str = "explicit"
    cache_size: int | None = None
    extra_args: Sequence[str] = ()
    host: str = "127.0.0.1"
    log_path: Path | None = None
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    def command(self, install: TritonInstall) -> list[str]:
        args = [
            str(install.binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={install.backend_directory()}",
            f"--cache-directory={install.cache_directory}",
            f"--model-control-mode={self.model_control_mode}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
            "--exit-on-error=false",
            "--log-verbose=0",
        ]
        if self.cache_size:
            args.append(f"--cache-config=local,size={self.cache_size}")
        args.extend(self.extra_args)
        return args

    def start(self, timeout: float = 120.0, attempts: int = 2) -> LocalTritonServer:
        """Starts tritonserver and returns once its gRPC port accepts connections.

        A tritonserver that exits before it listens is started again with fresh ports, up to `attempts` starts
        within `timeout` in all: another process can take a port between `free_port` and tritonserver's bind,
        and a CI run once saw tritonserver abort at start inside gRPC's event engine ("epoll_wait error: Bad file
        descriptor"). Each attempt's output is kept in the log. If the last attempt exits too, RuntimeError
        carries the log's tail; TimeoutError if the port never opens.
        """
        install = find_install()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        deadline = time.monotonic() + timeout
        for attempt in range(1, max(1, attempts) + 1):
            if attempt > 1:
                self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
            with open(self.log_path, "wb" if attempt == 1 else "ab") as log:
                if attempt > 1:
                    log.write(f"--- start {attempt} of {attempts}, ports {self.http_port}/{self.grpc_port}/"
                              f"{self.metrics_port} ---\n".encode())
                    log.flush()
                self.process = subprocess.Popen(
                    self.command(install),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=install.environment(),
                    start_new_session=True,
                    # only prctl(PR_SET_PDEATHSIG): a killed run leaves no tritonserver
                    preexec_fn=_die_with_parent,  # noqa: PLW1509
                )
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                with contextlib.suppress(OSError), socket.create_connection((self.host, self.grpc_port), 0.2):
                    return self
                time.sleep(0.05)
            else:
                self.stop()
                raise TimeoutError(f"tritonserver did not open its gRPC port within {timeout}s:\n{self.log_tail()}")
            code = self.process.returncode
            if attempt < attempts:
                _log.warning("tritonserver exited with code %s before it listened (start %d of %d); starting it "
                             "again. Its log:\n%s", code, attempt, attempts, self.log_tail(20))
        raise RuntimeError(f"tritonserver exited with code {code} before it listened"
                           f"{f' ({attempts} starts)' if attempts > 1 else ''}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> LocalTritonServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_server(repo: Path, **kwargs: object) -> Iterator[LocalTritonServer]:
    server = LocalTritonServer(model_repository=repo, **kwargs)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()
