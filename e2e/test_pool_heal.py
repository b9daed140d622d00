"""A pooled model whose Python stub dies on one pool replica is healed there, as the same model on its own Deployment
is (issue 29 with issue 33), on the real node.

Triton keeps calling the model READY while every request to it fails. The replica's probe (`--every-model`) sees the
dead stub in the pod's shared process namespace and says so on `GET /status`; the operator, which long-polls it,
takes that replica out of that model's EndpointSlice at once (not the pod: its other models keep their endpoints),
unloads and loads the model again there, lists it again once READY, and says so in the model's status (Degraded
ModelFailing while it heals) and Events (Healed). Load runs through the model's Service throughout; the times and
failed requests are recorded, not asserted (behaviour is).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.healing import answers, stubs_of
from e2e.kube import Kube, wait_for
from e2e.load import ServiceLoad
from e2e.operator_fixtures import OperatorHandle, apply, model_condition, record
from e2e.pool import PoolAudit, placement, pool_doc, pooled_add_sub, replica_pods, wait_placed_everywhere
from e2e.testing import endpoint_ready, is_ready

pytestmark = pytest.mark.cluster

POOL = "healing"


def test_a_dead_stub_on_a_pool_replica_takes_that_copy_alone_out_and_a_reload_there_heals_it(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle, nodes: Any) -> None:
    apply(kubeconfig, namespace, pool_doc(POOL, 2, "256Mi"))
    def replicas_ready() -> list[dict] | None:
        pods = replica_pods(kube, namespace, POOL)
        return pods if len(pods) == 2 and all(is_ready(p) for p in pods) else None

    def healed() -> bool:
        tm = kube.get("TritonModel", "hurt", namespace)
        return bool(model_condition(tm, "Ready").get("status") == "True"
                    and model_condition(tm, "Degraded").get("status") == "False")

    pods = wait_for("2 pool replicas Ready", replicas_ready, 180, 0.5)
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    apply(kubeconfig, namespace, pooled_add_sub("hurt", POOL, 2), pooled_add_sub("fine", POOL, 1))
    with PoolAudit(kube, namespace, min_samples=5) as audit:
        models = wait_placed_everywhere(kube, namespace, ["hurt", "fine"], 240)
        (victim,) = placement(models["fine"])  # the replica carrying both: its other model must keep serving
        other = next(r for r in ips if r != victim)
        assert sorted(placement(models["hurt"])) == sorted(ips), models["hurt"]["status"]
        ip = ips[victim]
        wait_for("both copies of hurt and fine's copy listed", lambda: all(
            endpoint_ready(kube, namespace, "hurt", a) for a in ips.values()) and endpoint_ready(
            kube, namespace, "fine", ip), 60, 0.2)
        pod = next(p for p in pods if p["metadata"]["name"] == victim)
        events_before = {e["metadata"]["name"] for e in kube.items("Event", namespace)}
        with ServiceLoad(kubeconfig, namespace, "hurt", model="hurt", threads=2, rate=10) as load:
            wait_for("the load answered", lambda: load.tally().sent - load.tally().failed > 10, 60)
            stubs = stubs_of(nodes, pod, "hurt")
            assert stubs, "no Python stub of hurt in the victim replica's tritonserver"
            before = load.tally()
            t0 = time.monotonic()
            for pid in stubs:
                os.kill(pid, signal.SIGKILL)
            fine_out: list[float] = []
            degraded: list[str] = []
            left = back = None
            while back is None:
                now = time.monotonic() - t0
                assert now < 180, (f"hurt's copy on {victim} never came back: left {left}; degraded {degraded}; "
                                   f"{operator.log_since()[-4000:]}")
                if not endpoint_ready(kube, namespace, "fine", ip):
                    fine_out.append(now)
                assert endpoint_ready(kube, namespace, "hurt", ips[other]), "the healthy copy of hurt left its slice"
                reason = model_condition(kube.get("TritonModel", "hurt", namespace), "Degraded")
                r = f"{reason.get('status')}/{reason.get('reason')}"
                if not degraded or degraded[-1] != r:
                    degraded.append(r)
                ready_here = endpoint_ready(kube, namespace, "hurt", ip)
                if left is None and not ready_here:
                    left = time.monotonic() - t0
                elif left is not None and ready_here and answers(ip, "hurt"):
                    back = time.monotonic() - t0
                time.sleep(0.05)
            phase = load.tally() - before
        assert not fine_out, f"fine's endpoint on {victim} left its slice: at {fine_out[:5]}"
        assert "True/ModelFailing" in degraded, f"the status never said it was healing: {degraded}"
        events = [f"{e.get('reason')}: {e.get('message')}" for e in kube.items("Event", namespace)
                  if e["metadata"]["name"] not in events_before
                  and (e.get("involvedObject") or {}).get("name") == "hurt"
                  and e.get("reason") in ("Healed", "HealFailed")]
        assert any(e.startswith("Healed: ") and victim in e and "stub of model hurt" in e for e in events), events
        wait_for("hurt Ready and not Degraded", healed, 60, 0.5)
        assert placement(kube.get("TritonModel", "hurt", namespace)) == placement(models["hurt"]), "a copy moved"
    record("pool heal: stub SIGKILL", f"out of hurt's slice on {victim} {left:.2f}s after the kill, listed and "
           f"answering again {back:.2f}s after; {phase.failed} of {phase.sent} requests failed; fine's endpoint on "
           f"the replica never left; degraded {degraded}; {events}; {audit.summary()}")
