"""A replica whose tritonserver never stops answering (issue 39), on the real node: the operator installed by the
chart, its pods run by a real kubelet under the chart's memory limit.

Whoever may create a TritonModel chooses the image its replicas run. Here it is `images.ENDLESS_REF`
(e2e/images/endless-tritonserver/): every HTTP request is answered 200 with a chunked body that never ends, and every
gRPC call with a message announced as 2 GiB. The operator reads each answer up to 4 MiB, within a deadline over the
whole call (`triton.rest`), so the gate never opens; it asks again, less and less often (`gate.oversized_delay`).
For `WINDOW` seconds from the moment the operator's first question reached the fake (its own report says so), every
second:

- the working set of each operator pod's container (its memory cgroup, as the kubelet and the OOM killer count it)
  stays under the limit the chart gives it, and the resident memory of its process is printed beside it;
- the hostile model is not Ready, its replica's gate is not True, and its Service has no ready endpoint;

and every `DRY_RUN_EVERY` seconds the webhook answers: a server-side dry run of a valid TritonModel passes, and one of
an ensemble whose steps do not exist is refused by the webhook (its denials count rises), naming the field. A normal
model applied beside the hostile one becomes Ready. At the end no operator pod restarted or was OOMKilled, the
fake's report shows megabytes streamed to the operator's pods (a few answers' worth, not hundreds: the gate backs
off), and the gate's condition says why it stays shut.

The in-process tests of the same bounds: tests/test_bounded_reads.py.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest

from e2e import images
from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import (
    ChartOperator,
    add_sub,
    apply,
    as_stream,
    gate,
    is_model_ready,
    kubectl,
    live_pods,
    load_examples,
    model_condition,
    record,
    wait_model,
)
from e2e.testing import container_status, ready_endpoints, vm_rss, working_set
from triton_operator.api.pod import TRITON_CONTAINER
from triton_operator.api.v1alpha1 import quantity_bytes
from triton_operator.triton.rest import MAX_ANSWER

pytestmark = pytest.mark.cluster

HOSTILE, NORMAL = "endless", "add-sub"
#: How long the fake is left to stream at the operator, from the operator's first question to it.
WINDOW = 60.0
DRY_RUN_EVERY = 10.0
#: Dry-run pairs the window must see (a pair takes a few seconds on a loaded machine: 5 or 6 fit in it).
MIN_DRY_RUNS = 4
MIB = 1 << 20
#: Answers of MAX_ANSWER bytes the operator must have read in the window for the test to have tested anything. The
#: gate backs off from a replica whose answers are over the cap (to `gate.OVERSIZED_MAX_DELAY`, 10 s): a CI run
#: measured 34 MiB in the window (about 8 answers).
MIN_ASKS = 3
#: More than this in the window, and the gate did not back off: before it did, 424-1,282 MiB came in the same window.
MAX_STREAMED = 150 * MIB
#: A line of the fake's report: per port, the requests answered and the bytes sent to each client address.
REPORT = re.compile(r"port=(\d+) requests=(\d+) sent=\{([^}]*)\}")


@pytest.fixture(scope="module")
def endless_image(nodes) -> str:  # type: ignore[no-untyped-def]
    """The hostile image, built (cached by its inputs: a warm run only hashes them) and imported into every node's
    containerd; not one of the images a cluster's `up` builds."""
    image = images.build_endless(log=lambda m: print(m, flush=True))
    for name in nodes.names:
        node = nodes.real(name)
        images.import_into([image], node.containerd_address, log=lambda m: print(m, flush=True),
                           snapshotter=node.snapshotter)
    return image.ref


def sent_to(log: str, addresses: set[str]) -> tuple[int, int]:
    """From the fake's last report: requests answered on every port, and bytes sent to `addresses`."""
    lines = [ln for ln in log.splitlines() if "endless-tritonserver: port=" in ln]
    if not lines:
        return 0, 0
    requests = sent = 0
    for _, n, peers in REPORT.findall(lines[-1]):
        requests += int(n)
        for peer in filter(None, (p.strip() for p in peers.split(","))):
            address, _, count = peer.partition(": ")
            sent += int(count) if address in addresses else 0
    return requests, sent


def operator_limit(pod: dict) -> int:
    spec = next(c for c in pod["spec"]["containers"] if c["name"] == "operator")
    return quantity_bytes(spec["resources"]["limits"]["memory"])


class DryRuns:
    """`kubectl apply --dry-run=server` of a valid TritonModel and of an ensemble whose steps do not exist: each goes
    through the validating webhook, and nothing is stored. Every answer is kept."""

    def __init__(self, kubeconfig: Path, namespace: str, operator: ChartOperator) -> None:
        self.kubeconfig, self.namespace, self.operator = kubeconfig, namespace, operator
        self.valid = add_sub("dry-run")
        self.valid["spec"]["replicas"] = 0
        self.invalid = next(d for d in load_examples("sentiment-ensemble") if d["metadata"]["name"] == "sentiment")
        self.invalid["spec"]["replicas"] = 0
        self.answers: list[tuple[float, str, str]] = []  # (time, valid's error or "", invalid's error)

    def denials(self) -> float:
        return sum(v for k, v in self.operator.samples_of_every_replica("triton_operator_admission_reviews_total")
                   .items() if dict(k)["verdict"] == "denied")

    def __call__(self) -> None:
        def dry_run(doc: dict) -> str:
            proc = kubectl(self.kubeconfig, "apply", "--dry-run=server", "-n", self.namespace, "-f", "-",
                           stdin=as_stream([doc]), check=False)
            return proc.stderr.strip() if proc.returncode else ""

        denied = self.denials()
        good, bad = dry_run(self.valid), dry_run(self.invalid)
        by_webhook = "" if self.denials() > denied else " (not counted as the webhook's denial)"
        self.answers.append((time.monotonic(), good, bad + by_webhook if bad else "(accepted)"))

    def failures(self) -> list[str]:
        out = []
        for _, good, bad in self.answers:
            if good:
                out.append(f"a valid TritonModel refused: {good}")
            if not ("spec.ensemble.steps[0].model" in bad and "TritonModel 'tokenizer' is not defined" in bad
                    and "not counted" not in bad):
                out.append(f"the ensemble without steps was not refused by the webhook naming the field: {bad}")
        return out


def _hostile_pod(kube: Kube, namespace: str) -> dict | None:
    pods = live_pods(kube, namespace, HOSTILE)
    return pods[0] if pods else None


def _attacked(kube: Kube, nodes, namespace: str, operator_ips: set[str]) -> tuple[dict, int]:  # type: ignore[no-untyped-def]
    """The hostile pod once the fake has streamed to an operator pod; (pod, bytes sent to the operator so far)."""
    def probe() -> tuple[dict, int] | None:
        pod = _hostile_pod(kube, namespace)
        if pod is None or not container_status(pod, TRITON_CONTAINER).get("state", {}).get("running"):
            return None
        _, sent = sent_to(nodes.container_log(pod, TRITON_CONTAINER), operator_ips)
        return (pod, sent) if sent > 0 else None

    return wait_for("the fake tritonserver's report of bytes streamed to the operator", probe, 180, 1.0)


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has taken (user and system, all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Memory:
    """The peaks of each operator pod's working set and VmRSS, sampled by `sample()`, and the CPU each took since."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before = {name: working_set(pid) for name, pid in pids.items()}
        self.peak = dict(self.before)
        self.rss_peak = dict.fromkeys(pids, 0)
        self.mark()

    def mark(self) -> None:
        """From now on for `cpu()`."""
        self.started = time.monotonic()
        self.cpu_before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def cpu(self) -> str:
        """Each pod's share of a core since `mark()`."""
        elapsed = time.monotonic() - self.started
        return ", ".join(f"{name}: {(cpu_seconds(pid) - self.cpu_before[name]) / elapsed:.0%}"
                         for name, pid in self.pids.items())

    def sample(self) -> None:
        for name, pid in self.pids.items():
            self.peak[name] = max(self.peak[name], working_set(pid))
            self.rss_peak[name] = max(self.rss_peak[name], vm_rss(pid))

    def growth(self) -> int:
        return max(self.peak[name] - self.before[name] for name in self.pids)

    def __str__(self) -> str:
        return ", ".join(f"{name}: {self.before[name] / MIB:.0f} -> {self.peak[name] / MIB:.0f} MiB (VmRSS max "
                         f"{self.rss_peak[name] / MIB:.0f})" for name in self.pids)


def _opened(kube: Kube, namespace: str) -> list[str]:
    """What of the hostile model serves: Ready, a ready endpoint, its replica's gate True (none should)."""
    tm = kube.get("TritonModel", HOSTILE, namespace)
    out = []
    if is_model_ready(tm) or ready_endpoints(kube, namespace, HOSTILE):
        out.append(f"{model_condition(tm, 'Ready')}, endpoints {ready_endpoints(kube, namespace, HOSTILE)}")
    pod = _hostile_pod(kube, namespace)
    if pod is not None and gate(pod).get("status") == "True":
        out.append(f"its replica's gate {gate(pod)}")
    return out


def _hostile(image: str) -> dict:
    doc = add_sub(HOSTILE)
    # As fast as the operator reads: the fake's CPU is what the client takes, and the harder case for its memory.
    doc["spec"]["server"] = {"image": image, "env": [{"name": "ENDLESS_PAUSE_SECONDS", "value": "0"}]}
    return doc


def test_a_replica_streaming_endless_answers_costs_the_operator_bounded_memory_and_nothing_else(
        operator: ChartOperator, kube: Kube, kubeconfig: Path, namespace: str, nodes, endless_image: str) -> None:  # type: ignore[no-untyped-def]
    operator.start()
    pods = {p["metadata"]["name"]: p for p in operator.pods()}
    restarts = {name: operator._operator_status(p).get("restartCount", 0) for name, p in pods.items()}
    limit = min(operator_limit(p) for p in pods.values())
    memory = Memory({name: operator.pid_of(p) for name, p in pods.items()})
    operator_ips = {p["status"]["podIP"] for p in pods.values()}

    apply(kubeconfig, namespace, _hostile(endless_image))
    pod, sent_before = _attacked(kube, nodes, namespace, operator_ips)
    apply(kubeconfig, namespace, add_sub(NORMAL))

    dry_runs = DryRuns(kubeconfig, namespace, operator)
    opened: list[str] = []
    normal_ready_at: float | None = None
    halt = threading.Event()
    start = time.monotonic()
    memory.mark()
    next_dry_run = start
    samples = 0
    while (now := time.monotonic()) < start + WINDOW:  # a sample a second, not a wait for a condition
        memory.sample()
        opened += [f"{now - start:.0f}s: {o}" for o in _opened(kube, namespace)]
        if normal_ready_at is None and is_model_ready(kube.get("TritonModel", NORMAL, namespace)):
            normal_ready_at = now - start
        if now >= next_dry_run:
            dry_runs()
            next_dry_run = now + DRY_RUN_EVERY
        samples += 1
        halt.wait(1.0)
    window = time.monotonic() - start

    requests, sent = sent_to(nodes.container_log(kube.get("Pod", pod["metadata"]["name"], namespace),
                                                 TRITON_CONTAINER), operator_ips)
    streamed = (sent - sent_before) / MIB
    print(f"hostile replica for {window:.0f}s ({samples} samples): operator working sets {memory}, limit "
          f"{limit / MIB:.0f} MiB; the fake answered {requests} requests and streamed {streamed:.0f} MiB to the "
          f"operator's pods in the window, which took {memory.cpu()} of CPU; {len(dry_runs.answers)} dry-run pairs")
    record("hostile replica: operator working set max, VmRSS max / limit (MiB), window",
           f"{max(memory.peak.values()) / MIB:.0f}, {max(memory.rss_peak.values()) / MIB:.0f} / {limit / MIB:.0f}, "
           f"{window:.0f}s")
    record("hostile replica: streamed to the operator in the window (MiB); the operator pods' CPU meanwhile",
           f"{streamed:.0f}; {memory.cpu()}")
    record("hostile replica: dry-run pairs through the webhook, normal model Ready after (s)",
           f"{len(dry_runs.answers)}, {normal_ready_at if normal_ready_at is None else round(normal_ready_at)}")

    assert max(memory.peak.values()) < limit, f"an operator pod's working set reached its limit: {memory}"
    assert memory.growth() < 160 * MIB, f"the operator's memory grew by more than 160 MiB: {memory}"
    for name, p in pods.items():
        status = operator._operator_status(kube.get("Pod", name, p["metadata"]["namespace"]))
        assert status.get("restartCount", 0) == restarts[name], f"operator pod {name} restarted: {status}"
        assert "OOMKilled" not in str(status.get("lastState")), f"operator pod {name} was OOMKilled: {status}"
    assert streamed >= MIN_ASKS * MAX_ANSWER / MIB, (
        f"the fake streamed only {streamed:.1f} MiB to the operator in {window:.0f}s: the operator hardly asked it, "
        "and nothing was tested")
    assert streamed < MAX_STREAMED / MIB, (
        f"the fake streamed {streamed:.0f} MiB to the operator in {window:.0f}s: the gate did not back off from a "
        f"replica whose every answer is over the cap (`gate.oversized_delay`)")
    assert len(dry_runs.answers) >= MIN_DRY_RUNS, f"only {len(dry_runs.answers)} dry-run pairs were sent"
    assert not dry_runs.failures(), dry_runs.failures()
    assert not opened, f"a hostile replica was admitted: {opened[:3]}"
    _says_why(kube, namespace, operator)

    if normal_ready_at is None:
        wait_model(kube, namespace, NORMAL, is_model_ready, "Ready beside the hostile model", 120)


def _says_why(kube: Kube, namespace: str, operator: ChartOperator) -> None:
    """What the operator says of the hostile replica: the gate's condition on the pod (and its log) names the refused
    answer; the TritonModel calls the replica not warmed yet, Triton unreachable."""
    hostile_pod = _hostile_pod(kube, namespace)
    assert hostile_pod is not None
    shut = gate(hostile_pod)
    tm = kube.get("TritonModel", HOSTILE, namespace)
    ready, states = model_condition(tm, "Ready"), tm["status"].get("replicaStates") or []
    print(f"the hostile replica's gate: {shut}\nthe hostile model's Ready: {ready}; replicas: {states}")
    cap = f"an answer of more than {MAX_ANSWER} bytes; at most {MAX_ANSWER} are read"
    assert shut.get("status") == "False" and shut.get("reason") == "TritonUnreachable", shut
    assert cap in shut.get("message", ""), shut
    said = [ln for ln in operator.log_since().splitlines() if "Set readiness gate" in ln
            and f"pod={namespace}/{hostile_pod['metadata']['name']} " in ln]
    assert said and cap in said[-1] and "reason=TritonUnreachable" in said[-1], said[-3:]
    assert ready.get("status") == "False" and ready.get("reason") == "ReplicasWarming", ready
    assert [(s.get("state"), s.get("reason")) for s in states] == [("Loading", "TritonUnreachable")], states
