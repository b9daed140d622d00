"""The health checks GitOps tools compute for a TritonModel, run for real on an object: Flux's (`kstatus`, through
tools/kstatus, a small Go program on sigs.k8s.io/cli-utils' kstatus) and Argo CD's (`argocd_health`, the chart's
argocd-health.lua run by a real Lua interpreter). Starts no cluster: the unit tests (tests/test_kstatus.py,
tests/test_argocd_health.py) run them on statuses the planner computes, the e2e tests on live objects."""

from __future__ import annotations

import functools
import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any


@functools.cache
def kstatus_binary() -> Path:
    """tools/kstatus, a small Go program running sigs.k8s.io/cli-utils' kstatus (`status.Compute`, the library
    behind Flux's health checks): built on the first call (module download and compile, under a minute on 2 cores),
    then taken from the cache its build.sh keeps, keyed by the hash of tools/kstatus's files."""
    build = Path(__file__).resolve().parent.parent / "tools" / "kstatus" / "build.sh"
    proc = subprocess.run(["bash", str(build)], capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, f"tools/kstatus/build.sh failed:\n{proc.stderr}"
    path = Path(proc.stdout.strip())
    assert path.is_file(), proc.stdout
    return path


def kstatus_results(stdin: str) -> list[dict[str, Any]]:
    """kstatus on objects (JSON or YAML, one or many): one result per object, with its `status`, `message`,
    `conditions` and identity."""
    proc = subprocess.run([str(kstatus_binary())], input=stdin, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return [json.loads(line) for line in proc.stdout.splitlines()]


def kstatus(obj: dict) -> tuple[str, str]:
    """What Flux's health checks compute for a live object: (status, message)."""
    [result] = kstatus_results(json.dumps(obj))
    return result["status"], result["message"]


# Argo CD's health check for TritonModels, the chart's Lua, run by a real Lua interpreter.
ARGOCD_HEALTH_SCRIPT = Path(__file__).resolve().parent.parent / "charts" / "triton-operator" / "argocd-health.lua"
LUA = shutil.which("lua5.4") or shutil.which("lua")


def _lua_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\{ord(ch):03d}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def lua_literal(value: Any) -> str:
    """A Lua expression for a JSON value: objects and arrays become tables (arrays 1-based), null becomes nil
    (a nil in a table is no entry, as when Argo CD hands Lua a decoded object)."""
    if value is None:
        return "nil"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        assert math.isfinite(value), value
        return repr(value)
    if isinstance(value, str):
        return _lua_string(value)
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value if v is not None) + "}"
    if isinstance(value, dict):
        items = [f"[{_lua_string(str(k))}] = {lua_literal(v)}" for k, v in value.items() if v is not None]
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"not a JSON value: {value!r}")


HARNESS = """
obj = {obj}
local check = assert(loadfile({script}))
local hs = check()
io.write(tostring(hs.status), "\\0", tostring(hs.message))
"""


def argocd_health(obj: dict[str, Any], script: Path = ARGOCD_HEALTH_SCRIPT) -> tuple[str, str]:
    """(status, message) of the chart's Argo CD health check on `obj`, as Argo CD computes it (`lua5.4` runs the
    script with the object as the global `obj`, and the returned table's status and message are read)."""
    assert LUA, "no Lua interpreter"
    code = HARNESS.format(obj=lua_literal(obj), script=_lua_string(str(script)))
    proc = subprocess.run([LUA, "-"], input=code, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    status, _, message = proc.stdout.partition("\0")
    return status, message
