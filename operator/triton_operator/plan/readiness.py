"""The warm-up gate's decision, pure: which readiness-gate condition a replica's pod should carry for what its
Triton answered (`triton.replica.ReplicaVerdict`), and whether that differs from what it carries.

The loop that asks and writes is `controller.gate`; where every part of the gate lives: `api.pod`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api.pod import ANNOTATION_DIGEST, ANNOTATION_LOADED, WARMED_CONDITION
from ..api.timestamps import parse_rfc3339, rfc3339
from .status import pod_condition, triton_container_status

#: A False gate whose reason stays while its message changes is written again at most this often (seconds): the pod
#: says the latest cause (Triton refused connections, then answered over the read cap) without a write every round.
MESSAGE_REFRESH_SECONDS = 10.0


def message_refresh_due(ok: bool, since_write: float) -> bool:
    """Whether a False gate's new message under the same reason may be written now (`gate_condition`'s `changed`),
    `since_write` seconds after this process last wrote the pod's gate (no write yet: infinity). A True gate's
    message changes only with its reason."""
    return not ok and since_write >= MESSAGE_REFRESH_SECONDS


@dataclass(frozen=True)
class GateWrite:
    condition: dict[str, Any]  # the pod condition to patch (strategic merge on `type`)
    warmup_seconds: float | None  # container start -> warm, when the gate turns True


def gate_condition(pod: Mapping[str, Any], ok: bool, reason: str, message: str, now: dt.datetime,
                   changed: bool = False) -> GateWrite | None:
    """The condition to write, or None when the pod already carries this status and reason (no write) and the
    caller says nothing else `changed` (a heal's next step: the same reason, a new message)."""
    status = "True" if ok else "False"
    current = pod_condition(pod, WARMED_CONDITION)
    if (current is not None and current.get("status") == status and current.get("reason") == reason
            and (not changed or current.get("message") == message[:1024])):
        return None
    warm: float | None = None
    if ok:
        started = parse_rfc3339(
            (((triton_container_status(pod) or {}).get("state") or {}).get("running") or {}).get("startedAt"))
        if started is not None:
            warm = max((now - started).total_seconds(), 0.0)
            message += f"; warmed {warm:.1f}s after tritonserver started"
    condition: dict[str, Any] = {
        "type": WARMED_CONDITION,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastProbeTime": None,
    }
    if current is None or current.get("status") != status:
        condition["lastTransitionTime"] = rfc3339(now)
    return GateWrite(condition, warm)


def with_condition(pod: Mapping[str, Any], written: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's conditions once `written` is stored: what the next round compares against."""
    previous = pod_condition(pod, WARMED_CONDITION) or {}
    others = [dict(c) for c in (pod.get("status") or {}).get("conditions") or () if c.get("type") != WARMED_CONDITION]
    since = written.get("lastTransitionTime") or previous.get("lastTransitionTime")
    return [*others, {**written, "lastTransitionTime": since}]


def loaded_to_record(annotations: Mapping[str, str], loaded: str | None) -> str | None:
    """The loaded-config digest to write on the pod (`ANNOTATION_LOADED`), or None for no write.

    Only what the pod's annotations cannot already say: a replica that loaded the config it was created for
    (`ANNOTATION_DIGEST`) says so through its gate, and writing it would be a pod UPDATE at the very moment the
    replica turns Ready. The kubelet syncs each UPDATE's pod object, and every sync first waits for a PLEG relist
    newer than the last one (up to 1 s): that write held Ready back by a relist (kubelet 1.35, issue 17).
    """
    if not loaded:
        return None
    return None if annotations.get(ANNOTATION_LOADED, annotations.get(ANNOTATION_DIGEST)) == loaded else loaded
