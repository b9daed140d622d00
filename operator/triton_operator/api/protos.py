"""Triton's generated protobuf modules, as tritonclient ships them, without tritonclient's client.

`tritonclient.grpc.model_config_pb2` (the config schema the renderer builds `config.pbtxt` from) and
`service_pb2`/`service_pb2_grpc` (the GRPCInferenceService the operator asks replicas over) live in the package
`tritonclient.grpc`, whose `__init__` imports the whole client: numpy, ml_dtypes and the inference helpers. None of
that is used by the operator, and numpy alone is 21 MB of its resident memory (issue 17: RSS ≤ 150 MB at 1000
models). So the three generated modules are imported here under their own names while the package's `__init__`
is held back; they need only protobuf and grpc.

They are the very modules tritonclient uses: each is registered in `sys.modules` under its usual name, and the
package entry is removed again afterwards, so a later `import tritonclient.grpc` (a test, the CLI's local
tritonserver) runs the package's `__init__` as usual, which finds and reuses them (one descriptor pool entry, one
`ModelConfig` class).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType

PACKAGE = "tritonclient.grpc"
_lock = threading.Lock()


def generated(leaf: str) -> ModuleType:
    """`tritonclient.grpc.<leaf>`, imported without running `tritonclient/grpc/__init__.py` when it has not run."""
    name = f"{PACKAGE}.{leaf}"
    with _lock:
        if name in sys.modules:
            return sys.modules[name]
        if PACKAGE in sys.modules:  # the package is (being) imported the usual way: its submodules come with it
            return importlib.import_module(name)
        parent = importlib.util.find_spec("tritonclient")
        if parent is None or not parent.submodule_search_locations:
            raise ModuleNotFoundError("tritonclient is not installed", name="tritonclient")
        importlib.import_module("tritonclient")  # tritonclient/__init__.py itself imports nothing heavy
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or spec.submodule_search_locations is None:
            raise ModuleNotFoundError(f"{PACKAGE} is not installed", name=PACKAGE)
        # An uninitialised package module with the real search path: the generated modules' own
        # `from tritonclient.grpc import model_config_pb2` resolve against it.
        stand_in = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = stand_in
        try:
            return importlib.import_module(name)
        finally:
            if sys.modules.get(PACKAGE) is stand_in:
                del sys.modules[PACKAGE]
            tritonclient = sys.modules.get("tritonclient")
            if tritonclient is not None and getattr(tritonclient, "grpc", None) is stand_in:
                delattr(tritonclient, "grpc")
