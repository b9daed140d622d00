"""Helpers for tests that run TritonModels in a real tritonserver (from the nvidia-pytriton wheel).

Imported as `from tests.triton_helpers import ...` (tests/ is a package); the shared tritonserver fixture
is `triton`, in tests/conftest.py. Nothing here mocks Triton: a YAML file is checked with the operator's validator, rendered
with its renderer, written to a model repository, and served by `LocalTritonServer`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import tritonclient.grpc as grpcclient
import yaml
from tritonclient.utils import np_to_triton_dtype

from tests.timing import scaled
from triton_operator.api.pod import REPOSITORY_KEY_ENV
from triton_operator.api.v1alpha1 import TritonModel, quantity_bytes
from triton_operator.files import load_paths, write_repository
from triton_operator.render.modelconfig import RenderedModel, render_repository
from triton_operator.render.repository_key import GRPC_KEY_HEADER, restriction_args
from triton_operator.triton.client import LoadResult, load_model
from triton_operator.triton.local import LocalTritonServer
from triton_operator.validate import check_documents, load_documents

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples"

T = TypeVar("T")


# ---------------------------------------------------------------- spec -> repository


def load_models(path: Path | str) -> list[TritonModel]:
    """Every TritonModel in a YAML file or directory, after the operator's own checks (must be clean)."""
    loaded = check_documents(load_paths([path]))
    assert not loaded.errors, f"{path} does not pass `triton-operator validate`'s checks:\n" + "\n".join(
        f"  {e}" for e in loaded.errors
    )
    assert loaded.models, f"{path} holds no TritonModel documents"
    return [m for _, m in loaded.models]


def models_from_yaml(text: str, ident: str = "<test>") -> list[TritonModel]:
    loaded = check_documents(load_documents(text, ident))
    assert not loaded.errors, f"{ident} fails the operator's checks:\n" + "\n".join(f"  {e}" for e in loaded.errors)
    return [m for _, m in loaded.models]


def variant(path: Path | str, edit: Callable[[dict[str, Any]], None]) -> list[TritonModel]:
    """The models of a YAML file after `edit` changed each document's dict (e.g. renamed, warm-up removed)."""
    docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
    for d in docs:
        edit(d)
    return models_from_yaml(yaml.safe_dump_all(docs, sort_keys=False), f"{path} (modified)")


def fetch_uris(deployment: dict[str, Any]) -> list[str]:
    """The `--uri` values (`MODEL[/VERSION]=URI`) a rendered Deployment gives its fetch init container, in order
    (none without one: every file is in the ConfigMap)."""
    inits = deployment["spec"]["template"]["spec"].get("initContainers") or []
    if not inits:
        return []
    [init] = inits
    return [init["args"][i + 1] for i, a in enumerate(init["args"]) if a == "--uri"]


def cache_size_for(models: Iterable[TritonModel]) -> int | None:
    """Server response-cache size: the largest spec.server.cacheSize among models that use the cache."""
    sizes = [quantity_bytes(m.spec.server.cache_size) for m in models if m.spec.response_cache]
    return max(sizes) if sizes else None


# ---------------------------------------------------------------- a served repository


def restricted_args(key: str, opened: Iterable[str] = ()) -> list[str]:
    """The flags replicas run with (`render.repository_key.restriction_args`), with the key the kubelet would put in
    for `$(TRITON_OPERATOR_REPOSITORY_KEY)`: the repository and admin APIs (but those `opened`, as
    `spec.server.unrestrictedApis` does) answer only requests that carry `key`."""
    return [a.replace(f"$({REPOSITORY_KEY_ENV})", key) for a in restriction_args(opened)]


@dataclass
class Served:
    """A running tritonserver with a rendered repository, and a gRPC client to it."""

    server: LocalTritonServer
    client: grpcclient.InferenceServerClient
    rendered: dict[str, RenderedModel]  # by TritonModel name
    loads: dict[str, LoadResult] = field(default_factory=dict)  # by Triton model name
    key: str | None = None  # the repository key the server requires (`restricted_args`), if any

    @property
    def headers(self) -> dict[str, str] | None:
        """gRPC metadata for repository calls (load, unload, index) to a server started with a key."""
        return {GRPC_KEY_HEADER: self.key} if self.key else None

    def why(self, message: str, lines: int = 40) -> str:
        """An assertion message with the server's log tail, so a failure says what Triton said."""
        return f"{message}\n--- tritonserver log (last {lines} lines) ---\n{self.server.log_tail(lines)}"

    def stats(self, model: str) -> Any:
        """The model's (single-version) ModelStatistics message."""
        resp = self.client.get_inference_statistics(model)
        assert len(resp.model_stats) == 1, self.why(f"expected statistics for one version of {model}, got {resp}")
        return resp.model_stats[0]

    def batch_sizes(self, model: str) -> dict[int, int]:
        """Executions by batch size, from Triton's batch statistics."""
        return {b.batch_size: b.compute_infer.count for b in self.stats(model).batch_stats}

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.05) -> T:
        """Poll `probe` until it returns something truthy; fail with `what` and the log tail on timeout. `timeout` is
        nominal: scaled by the machine's time scale (tests/timing.py)."""
        limit = scaled(timeout)
        deadline = time.monotonic() + limit
        last: T | None = None
        while True:
            last = probe()
            if last:
                return last
            if time.monotonic() >= deadline:
                raise AssertionError(self.why(f"timed out after {limit:.1f}s ({timeout:g}s scaled) waiting for {what} "
                                              f"(last probe: {last!r})"))
            time.sleep(interval)

    def load(self, names: Iterable[str], parallel: int = 4) -> dict[str, LoadResult]:
        """Load (and so warm up) models in explicit mode, several at a time; assert each is READY."""
        names = list(names)
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(names)))) as pool:
            results = dict(zip(names, pool.map(lambda n: load_model(self.client, n, headers=self.headers), names),
                               strict=True))
        self.loads.update(results)
        failed = {n: r.reason for n, r in results.items() if not r.ready}
        assert not failed, self.why(f"models failed to load: {failed}", lines=80)
        return results



def start_served(
    models: list[TritonModel],
    repo: Path,
    *,
    load: Iterable[str] | None = None,
    cache_size: int | None = None,
    on_start: Callable[[LocalTritonServer], None] | None = None,
    key: str | None = None,
    opened: Iterable[str] = (),
    extra_args: Sequence[str] = (),
) -> Served:
    """Render `models` into `repo`, start tritonserver (explicit mode) and load models; the caller stops it.

    `load` is the Triton model names to load (default: every model, steps before ensembles).
    `cache_size` defaults to what the models' spec.server.cacheSize asks for (see `cache_size_for`).
    `on_start` gets the server as soon as it runs, so the caller can stop it even if a load fails.
    `key`: the server restricts its repository and admin APIs to this key, as replicas do (`restricted_args`), but
    for the categories `opened`. `extra_args`: more tritonserver flags.
    """
    rendered = render_repository(models)
    write_repository(rendered, repo)
    server = LocalTritonServer(
        model_repository=repo,
        model_control_mode="explicit",
        cache_size=cache_size if cache_size is not None else cache_size_for(models),
        log_path=repo.parent / f"{repo.name}-tritonserver.log",
        extra_args=(*(restricted_args(key, opened) if key else ()), *extra_args),
    )
    server.start(scaled(120))
    if on_start is not None:
        on_start(server)
    served = Served(server=server, client=grpcclient.InferenceServerClient(server.grpc_url), rendered=rendered, key=key)
    by_triton = {r.name: r for r in rendered.values()}
    names = sorted(by_triton) if load is None else list(load)
    missing = [n for n in names if n not in by_triton]
    assert not missing, f"asked to load {missing}, rendered only {sorted(by_triton)}"
    steps = [n for n in names if not by_triton[n].model.spec.is_ensemble]
    ensembles = [n for n in names if by_triton[n].model.spec.is_ensemble]
    for batch in (steps, ensembles):
        if batch:
            served.load(batch)
    return served


@contextlib.contextmanager
def serve(models: list[TritonModel], repo: Path, **kwargs: Any) -> Iterator[Served]:
    """`start_served` as a context manager: the server stops on exit, also when a load fails."""
    started: list[LocalTritonServer] = []
    try:
        served = start_served(models, repo, on_start=started.append, **kwargs)
        try:
            yield served
        finally:
            served.client.close()
    finally:
        for server in started:
            server.stop()


class ServerPool:
    """The servers of one test module, stopped together at the end.

    A tritonserver takes ~2.5 s to exit (it re-checks its unloading models once a second), so
    stopping a module's servers concurrently instead of one after another saves most of that.
    """

    def __init__(self) -> None:
        self._servers: list[LocalTritonServer] = []
        self._clients: list[grpcclient.InferenceServerClient] = []

    def serve(self, models: list[TritonModel], repo: Path, **kwargs: Any) -> Served:
        served = start_served(models, repo, on_start=self._servers.append, **kwargs)
        self._clients.append(served.client)
        return served

    def serve_example(self, example: str, tmp_dir: Path, **kwargs: Any) -> Served:
        """The models of examples/<example>, rendered into tmp_dir/<stem> and loaded."""
        return self.serve(load_models(EXAMPLES / example), tmp_dir / Path(example).stem, **kwargs)

    def close(self) -> None:
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        if self._servers:
            with ThreadPoolExecutor(max_workers=len(self._servers)) as pool:
                list(pool.map(lambda server: server.stop(), self._servers))
        self._servers.clear()
        self._clients.clear()


# ---------------------------------------------------------------- tensors


def tensor(name: str, array: Any) -> grpcclient.InferInput:
    """A tritonclient input from a NumPy array (object arrays of bytes are BYTES)."""
    inp = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    inp.set_data_from_numpy(array)
    return inp


SLOW = """
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata: {name: slow}
spec:
  backend: python
  batching: false
  inputs: [{name: SECONDS, dataType: FP32, dims: [1]}]
  outputs: [{name: SLEPT, dataType: FP32, dims: [1]}]
  instanceGroups: [{kind: CPU, count: 1}]
  source:
    inline:
      model.py: |
        import pathlib
        import time
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def execute(self, requests):
                responses = []
                for request in requests:
                    seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
                    if seconds[0] > 0:  # tells the test a slow request is executing
                        with open(pathlib.Path(__file__).with_name("executing"), "a") as f:
                            f.write("1")
                    time.sleep(float(seconds[0]))
                    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SLEPT", seconds)]))
                return responses
"""


#: A Python model that takes a while to load and can be told to fail: its `initialize` sleeps `initSeconds` and raises
#: when `failInitialize` is "yes"; it answers INPUT + `generation`, so each answer says which config's copy served it;
#: `delay` is its batcher's. `{name}`, `{delay}`, `{init}`, `{fail}`, `{generation}` to format (tests/test_reload_live,
#: tests/test_repository_grpc).
RELOADABLE_SPEC = """
apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata: {{name: {name}}}
spec:
  backend: python
  maxBatchSize: 8
  batcher: {{maxQueueDelayMicroseconds: {delay}}}
  inputs: [{{name: INPUT, dataType: FP32, dims: [4]}}]
  outputs: [{{name: OUTPUT, dataType: FP32, dims: [4]}}]
  instanceGroups: [{{kind: CPU, count: 1}}]
  parameters: {{initSeconds: "{init}", failInitialize: "{fail}", generation: "{generation}"}}
  source:
    inline:
      model.py: |
        import json
        import time

        import numpy as np
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def initialize(self, args):
                params = {{k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}}
                time.sleep(float(params["initSeconds"]))  # stands in for loading weights
                if params["failInitialize"] == "yes":
                    raise RuntimeError("failInitialize is yes: this config cannot load")
                self.generation = np.float32(params["generation"])

            def execute(self, requests):
                return [
                    pb_utils.InferenceResponse([pb_utils.Tensor(
                        "OUTPUT", (pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() + self.generation)
                        .astype(np.float32))])
                    for r in requests
                ]
"""
