"""tritonclient's generated modules without tritonclient's client (`api.protos`), and the operator's own HTTP
client for Triton (`triton.rest`): what the operator's memory figure (issue 17) rests on, and that nothing else
changes. `tests/test_versions.py`, `test_reload_live.py` and `test_autoscaling.py` ask a real tritonserver with it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from triton_operator.triton.local import free_port
from triton_operator.triton.rest import TritonClient, TritonError


def _run(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_the_operator_process_loads_none_of_the_libraries_it_does_not_use() -> None:
    """What `triton-operator run` imports (its memory, issue 17): not numpy or tritonclient's client (the renderer
    and the gate use only the generated modules), not grpc at start (it asks Triton over HTTP, with the aiohttp kopf
    loads anyway; grpcio comes with its first load or unload, `triton.repository`), not the kubernetes client (blocked
    before kopf, which would import it), not cryptography's x509 (only a webhook without a mounted certificate issues
    one). After the block, `import kubernetes` fails."""
    loaded = _run(
        "import json, sys\n"
        "from triton_operator.cli.run import block_unused_clients\n"
        "block_unused_clients()\n"
        "import kopf, triton_operator.controller.operator, triton_operator.cli.main, triton_operator.importer\n"
        "from triton_operator.render.modelconfig import pb\n"
        "try:\n"
        "    import kubernetes\n"
        "    refused = False\n"
        "except ImportError:\n"
        "    refused = True\n"
        "print(json.dumps({m: sys.modules.get(m) is not None for m in ('numpy', 'tritonclient.grpc',"
        " 'tritonclient.utils', 'tritonclient.grpc.aio', 'grpc', 'kubernetes', 'cryptography.x509')}"
        " | {'kubernetes submodules': sorted(m for m in sys.modules if m.startswith('kubernetes.')),"
        " 'import kubernetes refused': refused, 'schema': pb.ModelConfig.DESCRIPTOR.full_name}))"
    )
    assert loaded == {"numpy": False, "tritonclient.grpc": False, "tritonclient.utils": False,
                      "tritonclient.grpc.aio": False, "grpc": False, "kubernetes": False, "cryptography.x509": False,
                      "kubernetes submodules": [], "import kubernetes refused": True,
                      "schema": "inference.ModelConfig"}


def test_tritonclient_imported_afterwards_is_whole_and_shares_the_generated_modules() -> None:
    """A process that loads the renderer first and tritonclient's client after (a test, `triton-operator
    validate`) gets the real package, whose modules are the very ones the renderer uses: one ModelConfig class."""
    seen = _run(
        "import json\n"
        "from triton_operator.render.modelconfig import pb\n"
        "from triton_operator.api import protos\n"
        "service = protos.generated('service_pb2')\n"
        "import tritonclient.grpc as g\n"
        "import tritonclient.grpc.aio as aio\n"
        "print(json.dumps({'same_schema': g.model_config_pb2 is pb, 'same_service': g.service_pb2 is service,"
        " 'client': g.InferenceServerClient.__name__, 'aio': aio.InferenceServerClient.__name__,"
        " 'config_type': type(g.model_config_pb2.ModelConfig()) is type(pb.ModelConfig())}))"
    )
    assert seen == {"same_schema": True, "same_service": True, "client": "InferenceServerClient",
                    "aio": "InferenceServerClient", "config_type": True}


def test_the_generated_modules_come_from_the_package_once_it_is_imported() -> None:
    seen = _run(
        "import json\n"
        "import tritonclient.grpc as g\n"
        "from triton_operator.api import protos\n"
        "print(json.dumps({'same': protos.generated('model_config_pb2') is g.model_config_pb2}))"
    )
    assert seen == {"same": True}


def test_a_call_to_a_closed_port_is_a_triton_error_without_a_status() -> None:
    async def ask() -> TritonError:
        async with TritonClient(f"127.0.0.1:{free_port()}") as client:
            with pytest.raises(TritonError) as caught:
                await client.is_model_ready("add_sub", timeout=2.0)
            return caught.value

    error = asyncio.run(ask())
    assert error.status is None  # no answer at all: nothing listens
    assert "/v2/models/add_sub/ready" in error.message(), error.message()
