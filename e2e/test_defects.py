"""Defects of issue 12 a user would hit, each reproduced against the API server and the real nodes.

Same session operator (the chart) and per-test namespaces as `test_operator.py`. Tests that need only
the API server (no operator, no node) take `kube`/`kubeconfig`/`namespace` alone, so they also run on
a control-plane-only cluster (`KUBECONFIG=<root>/.cluster/kubeconfig` of a `LocalCluster(root, nodes=())`).
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from e2e.kube import Kube, condition, wait_for
from e2e.operator_fixtures import (
    ANNOTATION_DIGEST,
    CRD,
    LABEL_MODEL,
    WARMED,
    OperatorHandle,
    gate,
    is_model_ready,
    kubectl,
    model_condition,
    wait_model,
)
from e2e.test_operator import add_sub, apply, digest_of, endpoint_ready, infer_add_sub, live_pods
from e2e.testing import consistently, is_ready, ready_endpoints

pytestmark = pytest.mark.cluster


# -- #1: warmupGate.enabled: false ------------------------------------------------------------------


def test_without_the_warmup_gate_the_model_turns_ready_with_its_pods(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    """Nothing writes the warmed condition for pods without the gate: Ready must follow the pods' own readiness."""
    doc = add_sub()
    doc["spec"]["warmupGate"] = {"enabled": False}
    apply(kubeconfig, namespace, doc)
    tm = wait_model(kube, namespace, "add-sub", is_model_ready, "Ready with the warm-up gate disabled", 180)
    ready, progressing = model_condition(tm, "Ready"), model_condition(tm, "Progressing")
    assert ready["reason"] == "AllReplicasReady", ready
    assert (progressing["status"], progressing["reason"]) == ("False", "RolloutComplete"), progressing
    assert model_condition(tm, "Degraded")["status"] == "False"
    assert (tm["status"]["readyReplicas"], tm["status"]["warmedReplicas"]) == (1, 1), tm["status"]
    assert [s["state"] for s in tm["status"]["replicaStates"]] == ["Ready"], tm["status"]["replicaStates"]

    [pod] = live_pods(kube, namespace, "add-sub")
    assert not pod["spec"].get("readinessGates"), pod["spec"].get("readinessGates")
    assert is_ready(pod) and not gate(pod), (condition(pod, "Ready"), gate(pod))  # no warmed condition at all
    assert digest_of(pod) == tm["status"]["configDigest"]
    ip = pod["status"]["podIP"]
    wait_for("the replica ready in the Service's EndpointSlice", lambda: endpoint_ready(kube, namespace, "add-sub", ip),
             30)
    np.testing.assert_allclose(infer_add_sub(ip), [[11, 22, 33, 44]])
