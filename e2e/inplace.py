"""In-place reloads as tests and benches see them: the reloadable add-sub (`reloadable`: its initialize takes
`initSeconds` and refuses to load on `refuse: "yes"`), `serving` (every replica told one digest, warmed, and its Triton
saying it loaded it), what a pod's gate approves (`gate_approved`), and `GateAudit`, which samples, while a test
changes a model, that every ready endpoint serves a config its gate approved.
"""

from __future__ import annotations

import re
import threading
import time
import traceback

import urllib3
from tritonclient.utils import InferenceServerException

from e2e.kube import ApiError, Kube, wait_for
from e2e.operator_fixtures import add_sub, gate, live_pods
from e2e.testing import is_ready, ready_endpoints
from e2e.traffic import loaded_digest
from triton_operator.api.pod import ANNOTATION_DIGEST, ANNOTATION_PREVIOUS, ANNOTATION_RELOAD

#: add-sub's model.py, plus an initialize that takes `initSeconds` and refuses to load with `refuse: "yes"`: a
#: slow reload to watch, and a config-only change that cannot load.
ADD_SUB_PY = '''import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        if params.get("refuse", {}).get("string_value") == "yes":
            raise RuntimeError("refusing to load: parameters.refuse is yes")
        time.sleep(float(params.get("initSeconds", {}).get("string_value", "0")))

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32)),
            ]))
        return responses
'''


def reloadable(replicas: int, init_seconds: float = 1.0, **rollout: object) -> dict:
    doc = add_sub()
    doc["spec"]["replicas"] = replicas
    doc["spec"]["source"]["inline"]["model.py"] = ADD_SUB_PY
    doc["spec"]["parameters"] = {"initSeconds": str(init_seconds)}
    if rollout:
        doc["spec"]["rollout"] = dict(rollout)
    return doc


def annotations(pod: dict) -> dict:
    return pod["metadata"].get("annotations") or {}


def serving(kube: Kube, namespace: str, digest: str, replicas: int, model: str = "add-sub") -> bool:
    """`replicas` live pods, each told `digest` alone (no reload pending, no previous digest), gate True, and its
    Triton saying it has loaded `digest`."""
    pods = live_pods(kube, namespace, model)
    return len(pods) == replicas and all(
        annotations(p).get(ANNOTATION_DIGEST) == digest and ANNOTATION_RELOAD not in annotations(p)
        and ANNOTATION_PREVIOUS not in annotations(p) and gate(p).get("status") == "True"
        and loaded_digest(p["status"]["podIP"], model) == digest for p in pods)


def gate_approved(pod: dict) -> set[str]:
    """The digests the pod's gate approves: those the pod names (its config-digest, and during a swap its previous
    one), and the one its gate condition named when it last turned True (until the gate has seen an instruction,
    e.g. while the operator is down, the replica serves what was approved then)."""
    ann = annotations(pod)
    approved = {ann.get(ANNOTATION_DIGEST), ann.get(ANNOTATION_PREVIOUS)} - {None}
    said = re.search(r"config digest ([0-9a-f]+)", gate(pod).get("message") or "")
    if gate(pod).get("status") == "True" and said:
        approved.add(said.group(1))
    return approved


class GateAudit:
    """Samples, until stopped: every ready endpoint of the model's Service must be a pod whose Triton serves a
    digest its gate approves (`gate_approved`), now or within the last `LAG` seconds: an EndpointSlice follows a
    pod's readiness a moment later (the kubelet's status update, then the EndpointSlice controller), and until
    it does the replica serves what its gate approved before (Drain unloads only once the pod is NotReady and
    has had no request for a second). Both steps took over 2 s in CI, on a loaded machine (a pod still Ready with
    its gate False; an endpoint still ready with its pod NotReady), so an endpoint is also judged against what
    the gate approved at any time during the pod's last Ready spell: a Drain replica keeps serving that until
    it is out of the endpoints. A replica serving a config its gate never approved while it was Ready, or no
    READY copy at all, is a violation.

    A sample that meets a `TRANSIENT` error is dropped and the error counted; any other exception stops the audit,
    and leaving the `with` block fails with its traceback. Leaving it also fails unless at least `min_samples`
    samples judged a ready endpoint, so that "no violations" cannot be said of no data."""

    LAG = 2.0
    #: What a sample may meet and go on from: the API server answering with an error or out of reach for a moment,
    #: a replica's Triton not answering (its pod going away, a 2 s timeout on a loaded machine).
    TRANSIENT = (ApiError, urllib3.exceptions.HTTPError, OSError, InferenceServerException)

    def __init__(self, kube: Kube, namespace: str, model: str = "add-sub", *, min_samples: int) -> None:
        self.kube, self.namespace, self.model = kube, namespace, model
        self.min_samples = min_samples
        self.samples = 0
        self.judged = 0  # samples that judged at least one ready endpoint
        self.violations: list[str] = []
        self.errors: list[str] = []
        self.failure: str | None = None  # the traceback of an exception no sample should meet
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gate-audit", daemon=True)
        self._approvals: dict[str, list[tuple[float, set[str]]]] = {}  # pod -> (when, what its gate approved)
        self._when_ready: dict[str, set[str]] = {}  # pod -> what its gate approved in its last Ready spell
        self._was_ready: set[str] = set()  # pods Ready at the last sample

    def __enter__(self) -> GateAudit:
        self._start = time.monotonic()
        self._thread.start()
        # what each gate approves before the change: the history a lagging EndpointSlice is judged against
        wait_for("the gate audit's first samples", lambda: self.samples >= 3 or self.errors or self.failure, 30)
        assert self.failure is None, f"the gate audit stopped on an exception it cannot classify:\n{self.failure}"
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._halt.set()
        self._thread.join(10)
        if exc_type is not None:
            return  # the test's own failure is the one to read
        assert self.failure is None, f"the gate audit stopped on an exception it cannot classify:\n{self.failure}"
        assert self.judged >= self.min_samples, (
            f"the gate audit judged ready endpoints in {self.judged} samples, fewer than the {self.min_samples} this "
            f"scenario produces ({self.samples} samples in all; errors: {self.errors[:5]})")

    def _run(self) -> None:
        while not self._halt.wait(0.2):
            try:
                ready = {ep["targetRef"]["name"] for ep in ready_endpoints(self.kube, self.namespace, self.model)
                         if ep.get("targetRef")}
                pods = {p["metadata"]["name"]: p for p in live_pods(self.kube, self.namespace, self.model)}
                now = time.monotonic()
                for name, pod in pods.items():
                    seen = [(t, a) for t, a in self._approvals.get(name, []) if now - t <= self.LAG]
                    self._approvals[name] = [*seen, (now, gate_approved(pod))]
                    if is_ready(pod):  # what the gate approved over the pod's whole Ready spell (a pod's Ready
                        # lags its gate too: the kubelet recomputes it after the operator turns the gate False)
                        spell = self._when_ready.get(name, set()) if name in self._was_ready else set()
                        self._when_ready[name] = spell | gate_approved(pod)
                        self._was_ready.add(name)
                    else:
                        self._was_ready.discard(name)
                judged = sorted(ready & set(pods))
                for name in judged:
                    # The pod's Ready (and then the EndpointSlice) lags its gate: a replica that was Ready serves
                    # what its gate approved during that Ready spell until it is out of the endpoints.
                    approved = set().union(*(a for _, a in self._approvals[name]), self._when_ready.get(name, set()))
                    loaded = loaded_digest(pods[name]["status"]["podIP"], self.model)
                    if loaded not in approved:
                        g = gate(pods[name])
                        self.violations.append(
                            f"+{now - self._start:.1f}s {name}: a ready endpoint serving {loaded}, its gate approves "
                            f"{sorted(approved)} (gate {g.get('status')} {g.get('reason')}; pod Ready "
                            f"{is_ready(pods[name])})")
                self.samples += 1
                self.judged += bool(judged)
            except self.TRANSIENT as e:  # a pod going away mid-sample, an API server busy for a moment
                self.errors.append(repr(e))
            except Exception:  # noqa: BLE001 - not the audit's to judge: stop, and fail the test that runs it
                self.failure = traceback.format_exc()
                return
