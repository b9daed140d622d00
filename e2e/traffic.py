"""Single requests to one replica's tritonserver, as tests and benches ask them: an add-sub inference
(`infer_add_sub`), Triton's own readiness answer over HTTP (`model_ready_over_http`), the config digest a replica
has loaded (`loaded_digest`), and how many requests the replicas answered by their own statistics
(`added_answers`). Continuous load through a Service is `e2e.load.ServiceLoad`'s.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from e2e.kube import Kube
from e2e.operator_fixtures import live_pods
from triton_operator.api.pod import DIGEST_PARAMETER


def infer_add_sub(address: str, model: str = "add-sub") -> np.ndarray:
    """One request at `address`:8001; returns OUTPUT0 (a+b)."""
    client = grpcclient.InferenceServerClient(f"{address}:8001")
    try:
        a = np.array([[1, 2, 3, 4]], dtype=np.float32)
        b = np.array([[10, 20, 30, 40]], dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32"), grpcclient.InferInput("INPUT1", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        return client.infer(model, inputs, client_timeout=30).as_numpy("OUTPUT0")
    finally:
        client.close()


def model_ready_over_http(ip: str, model: str) -> bool | None:
    """Triton's own answer, on a fresh connection each time (a gRPC channel would back off after refusals).

    True on 200; False when Triton says no (400) or nothing listens yet (Triton opens its ports only once
    load and warm-up are done); None when the question went unanswered (a timeout on a loaded machine),
    which proves nothing either way.
    """
    try:
        with urllib.request.urlopen(f"http://{ip}:8000/v2/models/{model}/ready", timeout=5) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False
    except urllib.error.URLError as e:
        return False if isinstance(e.reason, ConnectionRefusedError) else None
    except ConnectionRefusedError:
        return False
    except OSError:
        return None


def added_answers(kube: Kube, namespace: str, first: str, model: str) -> dict[str, int]:
    """Requests each replica of `model` other than `first` has answered, by Triton's own statistics (the load goes through
    the ClusterIP: only the replicas know who answered); only those that answered some."""
    out = {}
    for pod in live_pods(kube, namespace, model):
        if pod["metadata"]["name"] == first or not pod["status"].get("podIP"):
            continue
        client = grpcclient.InferenceServerClient(f"{pod['status']['podIP']}:8001")
        try:
            stats = client.get_inference_statistics(model, client_timeout=2)
            done = sum(s.inference_stats.success.count for s in stats.model_stats)
        except InferenceServerException:
            done = 0
        finally:
            client.close()
        if done:
            out[pod["metadata"]["name"]] = done
    return out


def loaded_digest(ip: str, model: str = "add-sub") -> str | None:
    """The digest parameter of the config the replica's Triton has loaded (None: it has no READY copy)."""
    client = grpcclient.InferenceServerClient(f"{ip}:8001")
    try:
        if not client.is_model_ready(model, client_timeout=2):
            return None
        param = client.get_model_config(model, client_timeout=2).config.parameters.get(DIGEST_PARAMETER)
        return param.string_value if param is not None else None
    finally:
        client.close()
