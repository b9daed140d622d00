"""Heals a replica that stopped serving while its tritonserver runs (issue 33): the models its probe found broken
(a dead Python stub, a model unloaded or failed) are unloaded and loaded again, with the config the pod is to serve.

How. Each broken model is unloaded, then loaded with the desired config at once. A load alone does not do: with
the config Triton holds it is a no-op (measured in the pods here, 2.51: "loading" and "successfully loaded" 1 ms
apart, the dead stub still in place). Nothing waits for the unload to finish: Triton never finishes unloading a
Python model whose stub is dead (UNLOADING for over 5 minutes, measured), and the load makes a new copy beside it
(its stub starts, the model serves again). The stuck copy stays in memory until tritonserver exits: one per heal,
which is one reason a replica that keeps breaking is restarted instead (`controller.gate`).

Which models. Those broken, in the order the gate checks them (the model, then each ensemble step). When a step is
broken the ensemble fails too (Triton counts the step's failures on both), but only the step is reloaded: loading
a step loads the ensembles that use it again (measured, 2.51). The ensemble itself is reloaded only when no step is
broken.

Which config. Never another than the desired one: the config Triton is to serve for the pod's digest
(`config-digest`), read from the repository ConfigMap that carries that digest: the pod's own, the one an in-place
reload took its config from, or another of the model's (a pod reloaded in place serves a ConfigMap newer than the
one it mounts). Without one, nothing is loaded: the caller deletes the pod instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.kinds import LABEL_MODEL
from ..api.pod import ANNOTATION_DIGEST, ANNOTATION_RELOAD_FROM, ANNOTATION_TRITON_NAME, repository_of, steps_of
from ..platform.kube import Kube
from ..render.kubernetes import configmap_key
from ..render.modelconfig import config_json, pbtxt_digest
from ..triton import reload as triton

log = logging.getLogger("triton_operator.heal")

#: What the probe calls a tritonserver that does not answer (not a model: nothing to reload).
TRITONSERVER = "tritonserver"


@dataclass(frozen=True)
class Healed:
    ok: bool
    models: tuple[str, ...]
    message: str
    seconds: float


def to_reload(pod: Mapping[str, Any], broken: Mapping[str, str]) -> tuple[str, ...]:
    """The models to unload and load again, in the gate's order: the broken steps, else the model itself."""
    ann = pod["metadata"].get("annotations") or {}
    model = ann.get(ANNOTATION_TRITON_NAME, "")
    steps = steps_of(ann)
    broken_steps = tuple(s for s in steps if s in broken)
    if broken_steps:
        return broken_steps
    return (model,) if model in broken else ()


async def desired_configs(kube: Kube, pod: Mapping[str, Any], names: Sequence[str]) -> dict[str, str] | None:
    """The config (JSON, as a load takes it) of each of `names` for the pod's desired digest, or None when no
    repository ConfigMap of the model carries that digest."""
    meta = pod["metadata"]
    ann = meta.get("annotations") or {}
    namespace, digest, model = meta["namespace"], ann.get(ANNOTATION_DIGEST, ""), ann.get(ANNOTATION_TRITON_NAME, "")
    if not digest or not model:
        return None
    key = configmap_key(f"{model}/config.pbtxt")
    tried: set[str] = set()
    for name in (repository_of(pod), ann.get(ANNOTATION_RELOAD_FROM)):
        if name and name not in tried:
            tried.add(name)
            cm = await asyncio.to_thread(kube.get, "v1", "ConfigMap", namespace, name)
            data = (cm or {}).get("data") or {}
            if pbtxt_digest(data.get(key)) == digest:
                return _configs(data, names)
    label = (meta.get("labels") or {}).get(LABEL_MODEL)
    if label:
        for cm in await asyncio.to_thread(kube.list, "v1", "ConfigMap", namespace, f"{LABEL_MODEL}={label}"):
            data = cm.get("data") or {}
            if cm["metadata"]["name"] not in tried and pbtxt_digest(data.get(key)) == digest:
                return _configs(data, names)
    return None


def _configs(data: Mapping[str, str], names: Sequence[str]) -> dict[str, str] | None:
    texts = {n: data.get(configmap_key(f"{n}/config.pbtxt")) for n in names}
    if any(t is None for t in texts.values()):
        return None
    return {n: config_json(t) for n, t in texts.items() if t is not None}


async def reload_models(kube: Kube, pod: Mapping[str, Any], address: str, grpc_address: str, names: Sequence[str],
                        key: str | None, timeout: float = 120.0) -> Healed:
    """Unloads and loads each of `names` in the replica at `address` (HTTP; `grpc_address` for the loads and unloads,
    `triton.repository`), with the desired config; stops at the first
    load that fails (Triton's reason in the message)."""
    start = time.monotonic()
    meta = pod["metadata"]
    configs = await desired_configs(kube, pod, names)
    if configs is None:
        return Healed(False, tuple(names), "no repository ConfigMap of the model carries the replica's config digest "
                      f"{(meta.get('annotations') or {}).get(ANNOTATION_DIGEST)}", time.monotonic() - start)
    for name in names:
        await triton.unload(grpc_address, name, timeout=timeout, key=key)
        loaded = await triton.load(address, grpc_address, name, configs[name], timeout=timeout, key=key)
        if not loaded.ok:
            return Healed(False, tuple(names), f"loading {name} again failed: {loaded.message}",
                          time.monotonic() - start)
    return Healed(True, tuple(names), f"unloaded and loaded {', '.join(names)} again", time.monotonic() - start)
