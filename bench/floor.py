"""`scale`'s floor: a bare client that does a converged operator's writes and nothing else.

`python -m bench.floor --kubeconfig K --namespace NS --models N --ready-file F` renders, before the clock
starts, what triton-operator would write for the N models `bench.scale.model_docs(N)` creates (their
ConfigMap, Deployment and Service from our renderer, and the status `plan.status.compute_status` gives a
model with `replicas: 0`), then touches F. From then on it watches TritonModels and, for each one
added, sends the four writes (three POSTs and one merge-patch of `status`) at once to a pool of
CONCURRENCY threads, each with its own connection. No controller logic is timed: no cache, no
planning, no reads, no retries, no Events. Only the owner's uid (known once the model exists) is
filled in at send time.

CONCURRENCY is 32: no client-side rate limit at all (client-go's default QPS 5/burst 10 would be
the bottleneck, not the API server), more requests in flight than the two cores of this machine
serve at once, and well under kube-apiserver's default --max-mutating-requests-inflight (200), so
nothing is throttled with a 429.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.kube import ApiError, Kube, wait_for
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.plan.status import Observed, as_dict, compute_status
from triton_operator.render.kubernetes import render_children, selector_string
from triton_operator.render.modelconfig import render_repository

CONCURRENCY = int(os.environ.get("BENCH_FLOOR_CONCURRENCY", "32"))
UID_PLACEHOLDER = "00000000-0000-0000-0000-000000000000"
USER_AGENT = "bench-floor/1"


class FloorKube(Kube):
    """e2e.kube.Kube under a user agent of its own, so that bench.clients counts its requests as the operator's."""

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        return {**super()._headers(content_type), "User-Agent": USER_AGENT}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: dict[str, Any]
    content_type: str = "application/json"


@dataclass(frozen=True)
class FloorModel:
    """What the floor writes for one model: its children (owner uid left to fill in) and its status."""

    name: str
    namespace: str
    children: tuple[dict[str, Any], ...]
    status: dict[str, Any]

    def requests(self, uid: str) -> list[Request]:
        """The model's writes, with its uid in every ownerReference: a POST per child, then its status."""
        out = []
        for child in self.children:
            body = {**child, "metadata": {**child["metadata"], "ownerReferences": [
                {**ref, "uid": uid} for ref in child["metadata"].get("ownerReferences") or ()]}}
            out.append(Request("POST", Kube.path(child["kind"], self.namespace), body))
        out.append(Request("PATCH", Kube.path("TritonModel", self.namespace, self.name, "status"),
                           {"status": self.status}, "application/merge-patch+json"))
        return out


def plan(docs: Sequence[dict[str, Any]], generation: int = 1) -> dict[str, FloorModel]:
    """Renders every model's children and status (the clock has not started yet)."""
    out = {}
    for doc in docs:
        model = TritonModel.model_validate(doc)
        namespace = doc["metadata"]["namespace"]
        rendered = render_repository([model])
        children = tuple(render_children(model, rendered, UID_PLACEHOLDER, namespace))
        observed = Observed(generation=generation, desired_replicas=model.spec.replicas,
                            digest=rendered[model.name].digest, selector=selector_string(model))
        status = as_dict(compute_status(observed, None))
        out[model.name] = FloorModel(model.name, namespace, children, status)
    return out


class Sender:
    """Sends requests from a pool of threads, each thread with its own connection to the API server."""

    def __init__(self, kubeconfig: Path, concurrency: int = CONCURRENCY) -> None:
        self.kubeconfig = kubeconfig
        self.local = threading.local()
        self.pool = ThreadPoolExecutor(concurrency)
        self.lock = threading.Lock()
        self.failures: list[str] = []

    def _send(self, req: Request) -> None:
        kube = getattr(self.local, "kube", None)
        if kube is None:
            kube = self.local.kube = FloorKube(self.kubeconfig)
        try:
            kube.request(req.method, req.path, req.body, content_type=req.content_type)
        except Exception as exc:  # noqa: BLE001 - counted and logged; the bench sees the model never converge
            with self.lock:
                self.failures.append(f"{req.method} {req.path}: {exc}")
            print(f"Request failed method={req.method} path={req.path} error={exc}", file=sys.stderr, flush=True)

    def submit(self, reqs: Sequence[Request]) -> None:
        for r in reqs:
            self.pool.submit(self._send, r)


def main(argv: list[str] | None = None) -> int:
    from bench.kubeenv import watch_forever
    from bench.scale import model_docs

    p = argparse.ArgumentParser(prog="python -m bench.floor")
    p.add_argument("--kubeconfig", required=True, type=Path)
    p.add_argument("--namespace", required=True)
    p.add_argument("--models", required=True, type=int)
    p.add_argument("--ready-file", required=True, type=Path)
    args = p.parse_args(argv)
    t = time.monotonic()
    models = plan([{**d, "metadata": {**d["metadata"], "namespace": args.namespace}} for d in model_docs(args.models)])
    print(f"Rendered models={len(models)} seconds={time.monotonic() - t:.1f} concurrency={CONCURRENCY}", flush=True)
    sender = Sender(args.kubeconfig)
    seen: set[str] = set()

    def on_model(typ: str, obj: dict[str, Any], _t: float) -> None:
        name = obj["metadata"]["name"]
        if typ == "ADDED" and name in models and name not in seen:
            seen.add(name)
            sender.submit(models[name].requests(obj["metadata"]["uid"]))

    kube = FloorKube(args.kubeconfig)

    def listed() -> str | None:  # a CRD just Established may still answer 429 "storage is (re)initializing"
        try:
            return str(kube.list("TritonModel", args.namespace)["metadata"]["resourceVersion"])
        except ApiError as exc:
            if exc.status != 429:
                raise
            return None

    rv = wait_for("TritonModels listed", listed, 60, 0.2)
    args.ready_file.write_text(rv)
    watch_forever(kube, "TritonModel", args.namespace, on_model, lambda: False, resource_version=rv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
