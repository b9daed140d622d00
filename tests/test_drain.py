"""A REAL tritonserver, started with the exit timeout the operator renders, drains on SIGTERM inside the grace period.

What the Deployment's graceful termination relies on (the preStop sleep keeps the replica serving
while clients learn it left the Service; then SIGTERM): on SIGTERM tritonserver refuses new
connections, keeps answering the connections already open, finishes requests in flight, and exits
once those connections are closed - before the kubelet's SIGKILL (grace period minus preStop).
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.timing import scaled
from tests.triton_helpers import SLOW, models_from_yaml
from triton_operator.files import write_repository
from triton_operator.render.kubernetes import render_children
from triton_operator.render.modelconfig import render_repository
from triton_operator.render.pod import exit_timeout
from triton_operator.triton.client import load_model
from triton_operator.triton.local import LocalTritonServer

pytestmark = pytest.mark.triton

def _http_infer(conn: http.client.HTTPConnection, seconds: float) -> list[float]:
    body = json.dumps({"inputs": [{"name": "SECONDS", "shape": [1], "datatype": "FP32", "data": [seconds]}]})
    conn.request("POST", "/v2/models/slow/infer", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    assert resp.status == 200, data
    return json.loads(data)["outputs"][0]["data"]


def _pending(server: LocalTritonServer) -> int:
    """Requests Triton has received and queued, not yet executing (`nv_inference_pending_request_count`)."""
    with urllib.request.urlopen(f"http://{server.host}:{server.metrics_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "nv_inference_pending_request_count" and sample.labels.get("model") == "slow":
                return int(sample.value)
    return 0


def test_sigterm_drains_in_flight_requests_and_open_connections_within_the_grace_period(tmp_path: Path) -> None:
    [model] = models_from_yaml(SLOW)
    rendered = render_repository([model])
    pod = next(c for c in render_children(model, rendered, "uid", "ns") if c["kind"] == "Deployment")[
        "spec"]["template"]["spec"]
    triton = next(c for c in pod["containers"] if c["name"] == "tritonserver")
    drain_arg = next(a for a in triton["args"] if a.startswith("--exit-timeout-secs"))
    pre_stop = triton["lifecycle"]["preStop"]["sleep"]["seconds"]
    budget = pod["terminationGracePeriodSeconds"] - pre_stop  # SIGTERM -> SIGKILL
    assert exit_timeout(triton["args"], 0) < budget

    server = LocalTritonServer(write_repository(rendered, tmp_path / "repo"), extra_args=[drain_arg],
                               log_path=tmp_path / "tritonserver.log")
    server.start(scaled(120))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert load_model(client, "slow").ready, server.log_tail()
        pooled = http.client.HTTPConnection(server.host, server.http_port, timeout=30)  # a client's kept-alive one
        assert _http_infer(pooled, 0.0) == [0.0]

        # Three 1 s requests for the model's one instance: one executes, two wait in its queue.
        results: dict[str, object] = {}

        def over_http(key: str) -> None:
            try:
                results[key] = _http_infer(http.client.HTTPConnection(server.host, server.http_port, timeout=30), 1.0)
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                results[key] = e

        def over_grpc() -> None:
            x = grpcclient.InferInput("SECONDS", [1], "FP32")
            x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
            try:
                results["grpc"] = client.infer("slow", [x], client_timeout=30).as_numpy("SLEPT").tolist()
            except Exception as e:  # noqa: BLE001
                results["grpc"] = e

        threads = [threading.Thread(target=over_http, args=("http-1",)), threading.Thread(target=over_grpc),
                   threading.Thread(target=over_http, args=("http-2",))]
        for t in threads:
            t.start()
        # All three reached Triton: one executes (its marker is written) and two wait. Two waiting alone could be
        # the first two, before the instance took one, with the third still on its way (a loaded CI run: its
        # connection, made after SIGTERM, was reset).
        executing = next((tmp_path / "repo" / "slow").glob("*/model.py")).with_name("executing")
        deadline = time.monotonic() + scaled(10)
        while not (executing.exists() and _pending(server) >= 2):
            assert time.monotonic() < deadline, "the three requests never reached Triton"
            time.sleep(0.02)
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)  # the kubelet's SIGTERM, after the preStop sleep
        terminated = time.monotonic()

        # New connections are refused once tritonserver's main thread has handled the signal. The
        # handler only wakes that thread, so a connection made in the first milliseconds may still be
        # accepted (and is answered); CI saw one. Each attempt is a new connection. An accepted request
        # queues behind the three slow ones, so it is judged by when its connection was made, not answered.
        accepted = 0
        while True:
            attempted = time.monotonic()
            try:
                _http_infer(http.client.HTTPConnection(server.host, server.http_port, timeout=10), 0.0)
            except (ConnectionError, http.client.HTTPException):
                break
            accepted += 1
            if attempted - terminated > 3:
                pytest.fail(f"tritonserver still accepted a new connection made {attempted - terminated:.1f} s after "
                            f"SIGTERM ({accepted} answered):\n{server.log_tail()}")
            time.sleep(0.05)
        # ... a connection already open is still answered, and every request in flight or queued completes.
        assert _http_infer(pooled, 0.0) == [0.0]
        for t in threads:
            t.join(30)
        assert results == {"http-1": [1.0], "http-2": [1.0], "grpc": [1.0]}, (results, server.log_tail())
        assert server.process.poll() is None, "exited while a client connection was still open"
        pooled.close()  # the client goes away: nothing is left to drain
        client.close()
        try:
            code = server.process.wait(budget)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tritonserver still running {budget}s after SIGTERM (the kubelet would SIGKILL it):\n"
                        f"{server.log_tail()}")
        took = time.monotonic() - terminated
        assert code == 0, f"exit code {code} {took:.1f}s after SIGTERM:\n{server.log_tail()}"
    finally:
        client.close()
        server.stop()
