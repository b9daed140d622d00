"""Fixtures shared by tests/: `triton`, the one explicit-mode tritonserver the corpus and property tests load
models into (a real one, from the nvidia-pytriton wheel; skipped with the reason when the wheel is missing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.timing import scaled


class SharedTriton:
    """One explicit-mode tritonserver with a 16 MiB response cache, started on first use; `discard()` stops it
    (a load stuck LOADING, a server that died), and the next `get()` starts a fresh one on an empty repository."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.server: Any = None
        self.client: Any = None
        self.starts = 0

    def get(self) -> tuple[Any, Any]:
        """The running server (a `LocalTritonServer`, its repository in `server.model_repository`) and a gRPC
        client to it."""
        import tritonclient.grpc as grpcclient

        from triton_operator.triton.local import LocalTritonServer

        if self.server is None or self.server.process.poll() is not None:
            self.discard()
            self.starts += 1
            repo = self.root / f"repo{self.starts}"
            repo.mkdir()
            self.server = LocalTritonServer(
                model_repository=repo,
                model_control_mode="explicit",
                cache_size=16 << 20,
                log_path=self.root / f"tritonserver{self.starts}.log",
                extra_args=["--exit-timeout-secs=2"],
            ).start(scaled(120))
            self.client = grpcclient.InferenceServerClient(self.server.grpc_url)
        return self.server, self.client

    def discard(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.server is not None:
            self.server.stop(grace=3)
            self.server = None


def _servers_in(value: Any, depth: int = 0) -> Iterator[Any]:
    """The LocalTritonServers a fixture value holds: itself, its `.server`, or in a tuple/list (a level or two)."""
    from triton_operator.triton.local import LocalTritonServer

    if isinstance(value, LocalTritonServer):
        yield value
    elif isinstance(getattr(value, "server", None), LocalTritonServer):
        yield value.server
    elif isinstance(value, tuple | list) and depth < 2:
        for v in value:
            yield from _servers_in(v, depth + 1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that holds a tritonserver (a fixture's) reports whether it still runs and its log's tail, so a
    failure says what Triton said and whether it was alive."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or call.when == "teardown":
        return
    seen = set()
    for name, value in getattr(item, "funcargs", {}).items():
        for server in _servers_in(value):
            if id(server) in seen:
                continue
            seen.add(id(server))
            proc = server.process
            state = ("not started" if proc is None else "running" if proc.poll() is None
                     else f"exited with code {proc.returncode}")
            report.sections.append((f"tritonserver of fixture {name} (HTTP {server.http_url}): {state}",
                                    server.log_tail(40)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `triton` are skipped, with the reason, when no real tritonserver is installed (the
    nvidia-pytriton wheel): skipped by their marker, never by a check inside each test."""
    from triton_operator.triton.local import TritonNotInstalled, find_install

    try:
        find_install()
    except TritonNotInstalled as exc:
        skip = pytest.mark.skip(reason=f"no real tritonserver: {exc}")
        for item in items:
            if item.get_closest_marker("triton"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedTriton]:
    shared = SharedTriton(tmp_path_factory.mktemp("triton"))
    yield shared
    shared.discard()


@pytest.fixture(scope="module")
def helm() -> str:
    """The helm binary built from its Go module (tests.chart_render), or the test skipped saying why."""
    from tests.chart_render import helm_or_reason

    path, reason = helm_or_reason()
    if path is None:
        pytest.skip(reason)
    return path
