"""`helm template` and `helm lint` of the chart (helm from `e2e/toolchain/build.sh`, built once and cached), and the
rendered documents picked by kind: shared by the chart's tests (tests/test_chart.py, tests/test_chart_monitoring.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "triton-operator"
RELEASE, RELEASE_NS = "tro", "triton-system"


@lru_cache(maxsize=1)
def helm_or_reason() -> tuple[str | None, str]:
    proc = subprocess.run(["bash", str(ROOT / "e2e" / "toolchain" / "build.sh"), "helm"],
                          capture_output=True, text=True, cwd=ROOT, timeout=3600)
    helm = Path(proc.stdout.strip().splitlines()[-1]) / "helm" if proc.returncode == 0 and proc.stdout.strip() else None
    if helm is not None and helm.is_file():
        return str(helm), ""
    if shutil.which("go") is None:
        return None, "helm is not built and Go is missing: e2e/toolchain/build.sh builds helm from its Go module"
    raise AssertionError(f"e2e/toolchain/build.sh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


#: libyaml's safe loader where PyYAML has it (ten times faster on the chart's 200 kB render: about 0.03 s, not 0.35 s,
#: and the tests render it some hundred times), the pure-Python one otherwise: the same documents either way.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)


def sets(values: dict[str, Any]) -> list[str]:
    """`--set-json` flags: exact types, no helm --set string parsing surprises."""
    out: list[str] = []
    for key, value in values.items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


@cache
def _template(helm: str, sets: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart with `sets`, run once per set of values in a session: a dozen tests read the
    default render, and each parses the text anew, so none sees another's objects."""
    return run([helm, "template", RELEASE, str(CHART), "--namespace", RELEASE_NS, *sets])


def render(helm: str, **values: Any) -> list[dict[str, Any]]:
    proc = _template(helm, tuple(sets(values)))
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.load_all(proc.stdout, Loader=LOADER) if d]


def render_error(helm: str, **values: Any) -> str:
    proc = _template(helm, tuple(sets(values)))
    assert proc.returncode != 0, f"values {values} were accepted"
    return proc.stderr


def kinds(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = kinds(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
