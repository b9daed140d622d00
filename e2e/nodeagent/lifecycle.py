"""Container lifecycle hooks the way the kubelet runs them: the preStop handler (sleep, exec, httpGet).

Owns running one container's preStop handler, bounded by the time the pod has left to stop
(`run_pre_stop`), as the kubelet's `executePreStopHook` does: the handler runs in the background,
the caller waits for it at most the grace period, and learns how long it took in whole seconds
(the kubelet subtracts exactly that from the grace period it then gives SIGTERM, and never less
than `MIN_GRACE` seconds). `sleep` waits on the node agent's side, `exec` runs inside the container
(nsenter, like exec probes), `httpGet` is sent from the host to the pod's address. A failed handler
is reported (the kubelet's `FailedPreStopHook` event) and the container is stopped all the same.
postStart is not implemented.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from e2e.nodeagent.probes import ProbeResult, exec_in_container, http_get

#: The kubelet's minimumGracePeriodInSeconds: SIGTERM always gets at least this long before SIGKILL.
MIN_GRACE = 2.0


@dataclass
class HookOutcome:
    seconds: int  # whole seconds spent waiting for the handler, as the kubelet counts them
    completed: bool  # False: still running when the grace period ran out
    error: str = ""  # the handler's failure, if it completed and failed


def pre_stop_handler(container: dict) -> dict | None:
    return ((container.get("lifecycle") or {}).get("preStop")) or None


def run_handler(handler: dict, container: dict, pod_ip: str | None, pid: int | None, env: dict[str, str],
                timeout: float, halt: threading.Event) -> ProbeResult:
    """One lifecycle handler; `halt` cuts a sleep short (the container is gone or the pod's time is up)."""
    if "sleep" in handler:
        seconds = float(handler["sleep"].get("seconds") or 0)
        if halt.wait(min(seconds, timeout)):
            return ProbeResult(False, "container terminated before sleep hook finished")
        return ProbeResult(True)
    if "exec" in handler:
        return exec_in_container(handler["exec"]["command"], pid, env, timeout)
    if "httpGet" in handler:
        if pod_ip is None:
            return ProbeResult(False, "pod has no IP")
        return http_get(handler["httpGet"], container, pod_ip, timeout)
    # tcpSocket is accepted by the API for compatibility and ignored by the kubelet.
    return ProbeResult(True)


def run_pre_stop(container: dict, pod_ip: str | None, pid: int | None, env: dict[str, Any], grace: float,
                 halt: threading.Event | None = None) -> HookOutcome:
    """Runs the container's preStop handler and waits at most `grace` seconds for it."""
    handler = pre_stop_handler(container)
    if handler is None or grace <= 0:
        return HookOutcome(0, True)
    halt = halt or threading.Event()
    result: list[ProbeResult] = []
    started = time.monotonic()
    t = threading.Thread(target=lambda: result.append(run_handler(handler, container, pod_ip, pid, env, grace, halt)),
                         name=f"prestop-{container['name']}", daemon=True)
    t.start()
    t.join(grace)
    if t.is_alive():
        halt.set()
        return HookOutcome(int(time.monotonic() - started), False)
    res = result[0] if result else ProbeResult(False, "handler crashed")
    return HookOutcome(int(time.monotonic() - started), True, "" if res.ok else res.message)


def describe(handler: dict) -> str:
    if "sleep" in handler:
        return f"sleep {handler['sleep'].get('seconds')}s"
    if "exec" in handler:
        return f"exec {handler['exec'].get('command')}"
    if "httpGet" in handler:
        return f"httpGet {handler['httpGet'].get('path', '/')}"
    return "no-op"
