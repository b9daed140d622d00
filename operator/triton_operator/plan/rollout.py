"""In-place rollouts, pure: which replicas load a new config through Triton's repository API, and when.

A change that leaves a replica's pod digest (`render.kubernetes.pod_digest`: everything but the model's own
config) as it is can be loaded into the running tritonservers. The Deployment then keeps its pod template
(`in_place_deployment`): no pod is created, no spare GPU is needed. Each replica is told what to load by
annotations on its pod (`plan_replicas`): the digest its gate approves, the repository ConfigMap that holds the
config, the mode, and in Swap mode the digest it served before (approved too while the new copy loads beside it).
The operator's reloader (`controller.reload`) carries that out on the replica and clears the instruction, or
records the failure on the pod. Everything is read back from the pods and their replicas: an operator killed
mid-rollout, or a new leader, takes the rollout up where it stands.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.pod import (
    ANNOTATION_DIGEST,
    ANNOTATION_DRAIN_SECONDS,
    ANNOTATION_LOADED,
    ANNOTATION_POD_DIGEST,
    ANNOTATION_PREVIOUS,
    ANNOTATION_RELOAD,
    ANNOTATION_RELOAD_FAILED,
    ANNOTATION_RELOAD_FROM,
    ANNOTATION_RELOAD_MESSAGE,
    repository_of,
)
from ..api.v1alpha1 import Rollout
from .status import Problem, pod_ready

#: The instruction annotations a finished (or superseded) reload leaves behind, removed together.
INSTRUCTION = (ANNOTATION_RELOAD, ANNOTATION_RELOAD_FROM, ANNOTATION_PREVIOUS, ANNOTATION_DRAIN_SECONDS)


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _template(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    return (deployment.get("spec") or {}).get("template") or {}


def in_place_deployment(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Deployment to apply under the InPlace strategy: `desired`, but with the live pod template's config digest
    and repository ConfigMap when the two templates have the same pod digest (the change is the model's config
    alone, which the replicas load in place). Otherwise `desired` as it is: the Deployment rolls new pods."""
    out = copy.deepcopy(dict(desired))
    if live is None:
        return out
    live_t, want_t = _template(live), out["spec"]["template"]
    live_ann = _annotations(live_t)
    pod_digest = live_ann.get(ANNOTATION_POD_DIGEST)
    repository = repository_of(live_t)
    if not pod_digest or pod_digest != _annotations(want_t).get(ANNOTATION_POD_DIGEST) or not repository:
        return out
    want_t["metadata"]["annotations"][ANNOTATION_DIGEST] = live_ann[ANNOTATION_DIGEST]
    for v in want_t["spec"]["volumes"]:
        if v.get("name") == "repository":
            v["configMap"]["name"] = repository
    return out


@dataclass(frozen=True)
class PodPatch:
    """Annotations to set on one pod (None removes one), as a JSON merge patch's metadata.annotations."""

    name: str
    annotations: Mapping[str, str | None]
    why: str


@dataclass(frozen=True)
class ReplicaRollout:
    patches: tuple[PodPatch, ...] = ()
    problem: Problem | None = None  # a replica failed to load the desired config: the rollout stops
    reloading: int = 0  # replicas told to reload that have not finished


def at_config(pod: Mapping[str, Any], digest: str | None) -> bool:
    """Whether the pod's gate approves `digest` alone: it is the replica's config, not one still loading."""
    ann = _annotations(pod)
    return digest is not None and ann.get(ANNOTATION_DIGEST) == digest and ANNOTATION_PREVIOUS not in ann


def plan_replicas(pods: Sequence[Mapping[str, Any]], digest: str, repository: str, pod_digest: str,
                  policy: Rollout, sequences: bool, streams: bool = False) -> ReplicaRollout:
    """Which replicas to tell to load `digest` (whose config is in the ConfigMap `repository`) now.

    Only pods made from a template with `pod_digest` take part: others belong to a Deployment rollout and go
    away with it. A replica that failed to load `digest` stops the rollout (no other is told). A replica out of
    the Service (not Ready: starting, restarted, not yet warm, or just reloaded and not yet back) is told at once
    in Drain mode: nothing to drain, one copy in memory. Serving replicas are told in name order while fewer
    than `policy.max_unavailable` replicas are unavailable (reloading, or out of the Service for any reason, as
    a Deployment's maxUnavailable counts them), in `policy.mode`: Drain for a sequence model, whose live
    sequences do not survive a swap, and for a decoupled one (`streams`), whose replica leaves the Service and
    reloads once its open streams end."""
    live = sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")
                   and _annotations(p).get(ANNOTATION_POD_DIGEST) == pod_digest), key=lambda p: p["metadata"]["name"])
    failed = [p for p in live if _annotations(p).get(ANNOTATION_RELOAD_FAILED) == digest]
    if failed:
        ann = _annotations(failed[0])
        return ReplicaRollout(problem=Problem(
            "ReloadFailed", f"{failed[0]['metadata']['name']} could not load config {digest} and serves "
            f"{ann.get(ANNOTATION_DIGEST)} again; the rollout stopped there: {ann.get(ANNOTATION_RELOAD_MESSAGE, '')}"
            .strip()[:2000]))
    patches: list[PodPatch] = []
    unavailable = [p for p in live if ANNOTATION_RELOAD in _annotations(p) or not pod_ready(p)]
    reloading = sum(ANNOTATION_RELOAD in _annotations(p) for p in unavailable)
    budget = policy.max_unavailable - len(unavailable)
    mode = "Drain" if sequences or streams else policy.mode
    for p in live:
        ann, name = _annotations(p), p["metadata"]["name"]
        if ann.get(ANNOTATION_DIGEST) == digest:
            if ANNOTATION_RELOAD_FAILED in ann:  # an older failure, of a config no longer wanted
                patches.append(PodPatch(name, {ANNOTATION_RELOAD_FAILED: None, ANNOTATION_RELOAD_MESSAGE: None},
                                        "its failed reload is of a config no longer wanted"))
            continue
        serving = pod_ready(p)
        told = ANNOTATION_RELOAD in ann  # told to load an older config: re-told, in the budget already
        if serving and not told and budget <= 0:
            continue
        how = mode if serving else "Drain"
        patch: dict[str, str | None] = {
            ANNOTATION_DIGEST: digest, ANNOTATION_RELOAD: how, ANNOTATION_RELOAD_FROM: repository,
            ANNOTATION_PREVIOUS: None, ANNOTATION_DRAIN_SECONDS: None,
            ANNOTATION_RELOAD_FAILED: None, ANNOTATION_RELOAD_MESSAGE: None,
        }
        if how == "Swap":
            patch[ANNOTATION_PREVIOUS] = ann.get(ANNOTATION_LOADED) or ann.get(ANNOTATION_DIGEST)
        else:
            patch[ANNOTATION_DRAIN_SECONDS] = str(policy.drain_timeout_seconds if serving else 0)
        patches.append(PodPatch(name, patch, f"reload config {digest} in place ({how}"
                                + ("" if serving else ", out of the Service") + ")"))
        if serving and not told:
            budget -= 1
            reloading += 1
    return ReplicaRollout(patches=tuple(patches), reloading=reloading)


def patched(pod: Mapping[str, Any], patch: PodPatch) -> dict[str, Any]:
    """The pod once `patch` is stored (a JSON merge patch of its annotations)."""
    ann = dict(_annotations(pod))
    for k, v in patch.annotations.items():
        if v is None:
            ann.pop(k, None)
        else:
            ann[k] = v
    return {**pod, "metadata": {**pod["metadata"], "annotations": ann}}
