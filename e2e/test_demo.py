"""`make demo`, without interaction: the demo script against the session's cluster and operator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.timing import scaled

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.cluster
def test_demo_runs_end_to_end(operator, kubeconfig: Path, namespace: str) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [sys.executable, "-m", "e2e.demo", "--kubeconfig", str(kubeconfig), "--namespace", namespace,
         "--timeout", f"{scaled(240):.0f}"],  # the demo's own waits, and the whole run's below: scaled, as every wait
        cwd=REPO, capture_output=True, text=True, timeout=scaled(300), stdin=subprocess.DEVNULL,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"demo failed:\n{out}\n--- operator log ---\n{operator.log_tail(namespace)}"
    # what the user sees: progress to Ready, a real inference through each Service's ready endpoints
    assert "AllReplicasWarmed" in out
    assert "= [11.0, 22.0, 33.0, 44.0]" in out, out
    assert "-> positive" in out and "-> negative" in out, out
    # the pool: each pooled model's placement (pod names of the pool's replicas), then an answer through its Service
    assert "Pooled models placed on the replicas of TritonPool shared" in out, out
    assert "pool-add-sub   Ready=True reason=AllCopiesWarmed" in out and "copies=2/2 on shared-pool-" in out, out
    assert "pool-pipeline via Service pool-pipeline" in out and "-> [3.0, 5.0, 7.0, 9.0]" in out, out
    assert "make cluster-down" in out
