"""The programs that run in a replica pod (`triton_operator.agent`) and their contract with the operator (`api.pod`):
every argument the renderer writes for the `fetch`, `probe` and `fetch-server` containers is one the command takes,
their ports and the probe's path are the contract's, and the probe and the fetch step start without pydantic (the
probe container has 64 MiB; pydantic and the API models are some 12 MiB more)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from triton_operator.api.pod import FETCH_SERVER_PORT, HTTP_PORT, PROBE_PORT, READY_PATH
from triton_operator.cli.main import build_parser, cmd_fetch, cmd_fetch_server, cmd_probe
from triton_operator.files import load_paths
from triton_operator.render.kubernetes import Options, render_children
from triton_operator.render.modelconfig import render_repository
from triton_operator.render.pool import render_pool_deployment
from triton_operator.render.repository_key import RepositoryKeys
from triton_operator.validate import check_documents

ROOT = Path(__file__).resolve().parent.parent
KEYS = RepositoryKeys(b"agent-test-master-key-of-32-byte")
COMMANDS = {"fetch": cmd_fetch, "probe": cmd_probe, "fetch-server": cmd_fetch_server}


def _pod_specs() -> Iterator[dict[str, Any]]:
    """The pod spec of every example model's Deployment (gate as written and flipped) and of the example pool's."""
    loaded = check_documents(load_paths([ROOT / "examples"]))
    assert not loaded.errors, [str(e) for e in loaded.errors]
    models = [m for _, m in loaded.models if m.spec.pool is None]
    flipped = [m.model_copy(update={"spec": m.spec.model_copy(update={"warmup_gate": m.spec.warmup_gate.model_copy(
        update={"enabled": not m.spec.warmup_gate.enabled})})}) for m in models]
    for variant in (models, flipped):
        rendered = render_repository(variant)
        for m in variant:
            for child in render_children(m, rendered, "uid", "test", Options(repository_keys=KEYS)):
                if child["kind"] == "Deployment":
                    yield child["spec"]["template"]["spec"]
    for _, pool in loaded.pools:
        yield render_pool_deployment(pool, "uid", "test", Options(repository_keys=KEYS))["spec"]["template"]["spec"]


def test_every_rendered_argument_of_the_pods_programs_is_one_the_command_takes_on_the_contracts_ports() -> None:
    parser = build_parser()
    seen: dict[str, int] = {}
    for spec in _pod_specs():
        for c in [*spec.get("initContainers", ()), *spec["containers"]]:
            if not c.get("args") or c["args"][0] not in COMMANDS:
                continue
            command = c["args"][0]
            args = parser.parse_args(c["args"])  # exits (SystemExit) on a flag the command does not take
            assert args.func is COMMANDS[command], (c["name"], c["args"])
            seen[command] = seen.get(command, 0) + 1
            ports = [p["containerPort"] for p in c.get("ports", ())]
            if command == "probe":
                assert (args.listen, args.target, ports) == (f":{PROBE_PORT}", f"127.0.0.1:{HTTP_PORT}", [PROBE_PORT])
            elif command == "fetch-server":
                assert (args.listen, ports) == (f":{FETCH_SERVER_PORT}", [FETCH_SERVER_PORT])
        for c in spec["containers"]:
            probe = (c.get("readinessProbe") or {}).get("httpGet")
            if probe and probe["port"] == PROBE_PORT:
                assert probe["path"] == READY_PATH, c["name"]
    assert set(seen) == set(COMMANDS), f"the examples render no container running {set(COMMANDS) - set(seen)}"


def test_the_pods_programs_start_without_pydantic_or_grpc() -> None:
    """As the containers start them: the command's parser (every subcommand's defaults) and each program's module."""
    code = (
        "import json, sys\n"
        "from triton_operator.cli.main import build_parser\n"
        "build_parser().parse_args(['probe'])\n"
        "import triton_operator.agent.probe, triton_operator.agent.fetch\n"
        "probe = sorted(m for m in ('pydantic', 'grpc', 'aiohttp') if m in sys.modules)\n"
        "import triton_operator.agent.fetch_server\n"
        "print(json.dumps([probe, sorted(m for m in ('pydantic', 'grpc') if m in sys.modules)]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT / "operator")})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[], []], "the probe and the fetch step load pydantic, grpc or aiohttp"
