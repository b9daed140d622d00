# The model of custom-batcher.yaml: answers each request with the number of requests in the execute() call it
# came in, i.e. the batch Triton formed, so a client sees the strategy at work. Placed on the claim beside
# max_requests.so (see custom-batcher.yaml).
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.04)  # while one batch runs, the next requests queue up
        n = len(requests)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("BATCHED_WITH", np.full((1, 1), n, dtype=np.int32))])
            for _ in requests
        ]
