"""A Python-backend model that serves any config: zeros of each output's type and shape.

Used where a test needs a model whose config, not its maths, is under test (the
invalid corpus and the property test). Handles batching, decoupled and
sequence-batched configs, so every config our validator accepts can load and
warm up with it.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.batching = int(self.config.get("max_batch_size", 0)) > 0
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.config)

    def _outputs(self, request):
        batch = 1
        if self.batching:
            for inp in request.inputs():
                shape = inp.as_numpy().shape
                if len(shape) > 0:
                    batch = shape[0]
                    break
        tensors = []
        for out in self.config.get("output", []):
            dims = [d if d > 0 else 1 for d in out["dims"]]
            shape = ([batch] if self.batching else []) + dims
            dtype = pb_utils.triton_string_to_numpy(out["data_type"])
            if dtype == np.object_:
                data = np.full(shape, b"", dtype=np.object_)
            else:
                data = np.zeros(shape, dtype=dtype)
            tensors.append(pb_utils.Tensor(out["name"], data))
        return pb_utils.InferenceResponse(tensors)

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                sender = request.get_response_sender()
                sender.send(self._outputs(request))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        return [self._outputs(r) for r in requests]
