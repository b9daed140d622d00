"""The usual way a kopf operator is written, as `scale`'s side-by-side: `python -m bench.naive_operator`.

The same renderer and the same children as triton-operator, but the control loop most kopf operators
ship (and STYLE.md's counter-example): `on.create` / `on.update` / `on.resume` handlers plus a
`kopf.timer` for drift, each child fetched and then created or merge-patched every time, status
written by every handler run, and kopf's defaults left on (progress annotations, the finalizer a
timer needs). It posts no Events (in the audit log kopf posted none for handler successes here),
which our operator does: one per new model (its first status, Ready: `create events` in scale.json's audit
counts). Nothing here is used by the operator itself.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

import kopf

from triton_operator.api.v1alpha1 import GROUP, PLURAL, VERSION, TritonModel
from triton_operator.platform.errors import ApiError
from triton_operator.platform.kube import Kube
from triton_operator.render.kubernetes import render_children
from triton_operator.render.modelconfig import render_repository

KUBE: Kube | None = None


def _create_or_patch(child: dict[str, Any]) -> None:
    assert KUBE is not None
    meta = child["metadata"]
    path = KUBE.path(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
    try:
        KUBE._call("GET", path)
    except ApiError as exc:
        if exc.status != 404:
            raise
        try:
            KUBE._call("POST", KUBE.path(child["apiVersion"], child["kind"], meta["namespace"]), body=child)
            return
        except ApiError as exc2:
            if exc2.status != 409:  # created meanwhile (the timer's first run races the create handler): patch
                raise
    KUBE._call("PATCH", path, body=child, content_type="application/merge-patch+json")


def _apply_children(body: kopf.Body, uid: str, namespace: str) -> str:
    model = TritonModel.model_validate(dict(body))
    rendered = render_repository([model])
    for child in render_children(model, rendered, uid, namespace):
        _create_or_patch(child)
    return rendered[model.name].digest


@kopf.on.startup()
def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.peering.standalone = True


@kopf.on.login()
def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_via_client(**kwargs)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def reconcile(body: kopf.Body, uid: str, namespace: str, patch: kopf.Patch, **_: Any) -> None:
    digest = _apply_children(body, uid, namespace)
    patch.status["observedGeneration"] = body["metadata"].get("generation", 1)
    patch.status["configDigest"] = digest
    patch.status["replicas"] = body["spec"].get("replicas", 1)


@kopf.timer(GROUP, VERSION, PLURAL, interval=float(os.environ.get("NAIVE_DRIFT_INTERVAL", "60")))
def drift(body: kopf.Body, uid: str, namespace: str, **_: Any) -> None:
    _apply_children(body, uid, namespace)


def main(argv: list[str] | None = None) -> int:
    global KUBE
    p = argparse.ArgumentParser(prog="python -m bench.naive_operator")
    p.add_argument("--kubeconfig", required=True, help="also export KUBECONFIG: kopf's login reads it")
    p.add_argument("--liveness", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    KUBE = Kube.from_environment(args.kubeconfig)
    asyncio.run(kopf.operator(clusterwide=True, standalone=True, liveness_endpoint=args.liveness))
    return 0


if __name__ == "__main__":
    sys.exit(main())
