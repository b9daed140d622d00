"""A Python-backend model that serves any config: zeros of each output's type and shape (BF16 too).

Used where a test needs a model whose config, not its maths, is under test (the
invalid corpus and the property test). Handles batching, decoupled and
sequence-batched configs, so every config our validator accepts can load and
warm up with it.
"""

import ctypes
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_KDL_CPU, _KDL_BFLOAT = 1, 4
_NO_OP_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _managed: None)


def _bf16_zeros(name, shape, keep):
    """A BF16 tensor of zeros. NumPy has no bfloat16 (and NumPy's own DLPack capsules clash with the
    backend's), so hand the backend a DLPack tensor of 2-byte zeros labelled bfloat whose deleter does
    nothing: `keep` owns the buffers until the response has been sent."""
    data = np.zeros(shape, dtype=np.uint16)
    dims = (ctypes.c_int64 * len(shape))(*shape)
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(data.ctypes.data, _KDL_CPU, 0, len(shape), _KDL_BFLOAT, 16, 1, dims, None, 0)
    managed.deleter = ctypes.cast(_NO_OP_DELETER, ctypes.c_void_p)
    keep.extend((data, dims, managed))
    return pb_utils.Tensor.from_dlpack(name, _capsule_new(ctypes.addressof(managed), b"dltensor", None))


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.batching = int(self.config.get("max_batch_size", 0)) > 0
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.config)

    def _outputs(self, request, keep):
        batch = 1
        if self.batching:
            for inp in request.inputs():
                shape = inp.shape()  # not as_numpy(): a BF16 input has no NumPy view
                if len(shape) > 0:
                    batch = shape[0]
                    break
        tensors = []
        for out in self.config.get("output", []):
            dims = [d if d > 0 else 1 for d in out["dims"]]
            shape = ([batch] if self.batching else []) + dims
            if out["data_type"] == "TYPE_BF16":
                tensors.append(_bf16_zeros(out["name"], shape, keep))
                continue
            dtype = pb_utils.triton_string_to_numpy(out["data_type"])
            if dtype == np.object_:
                data = np.full(shape, b"", dtype=np.object_)
            else:
                data = np.zeros(shape, dtype=dtype)
            tensors.append(pb_utils.Tensor(out["name"], data))
        return pb_utils.InferenceResponse(tensors)

    def execute(self, requests):
        # BF16 buffers of the previous call are free now: its responses were sent when it returned
        self.keep = keep = []
        if self.decoupled:
            for request in requests:
                sender = request.get_response_sender()
                sender.send(self._outputs(request, keep))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        return [self._outputs(r, keep) for r in requests]
