"""What every benchmark shares: machine facts, percentiles, the result files and the Markdown table.

A result is `bench/results/<name>.json`: the machine it ran on, when and at which commit (and whether the tree
differed from it), how busy the machine was meanwhile (other people's work on a 2-core box moves timings), a summary
table (`rows`: one figure each, ours next to the usual approach and the target) and the raw data. `RESULTS.md` is rebuilt from
every JSON present, so one benchmark can be re-run on its own (`make bench BENCH=gate`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
ORDER = ("gate", "first_request", "stale", "scale", "batching", "rollout", "autoscale", "faults", "pool", "pool_speed",
         "pool_routing", "placement", "upgrade")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- the machine ---------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return float("nan")


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    return out.stdout.strip()


def uncommitted() -> list[str]:
    """The paths `git status` lists as changed or new, but for bench/results/."""
    out = _git("status", "--porcelain", "--", ".", ":(exclude)bench/results")
    return [line[3:] for line in out.splitlines() if line.strip()]


def tree() -> dict[str, Any]:
    """What the checkout holds: its commit, and what differs from it (outside bench/results)."""
    return {
        "commit": _git("rev-parse", "--short", "HEAD"),
        "uncommitted": uncommitted(),
        "operator_diff_sha": hashlib.sha256(_git("diff", "HEAD", "--", "operator").encode()).hexdigest()[:12],
    }


def machine(at_start: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The machine, and the commit that ran: the one checked out when the benchmark started (`at_start`, from its
    CpuMeter). A checkout that moved or changed during the run is recorded as dirty, with both commits: the operator
    is installed editable, so what ran may be either."""
    from triton_operator.api.timestamps import rfc3339
    from triton_operator.triton.local import TRITON_VERSION

    out: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "memory_gib": _mem_total_gib(),
        "cpu_model": _cpu_model(),
        "date": rfc3339(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "tritonserver": TRITON_VERSION,
        "commit": _git("rev-parse", "--short", "HEAD"),
        # Whether what ran differs from that commit: tracked files changed or new files, outside bench/results (which
        # the run itself writes). The docs say so beside the commit (bench/readme.py).
        "dirty": bool(uncommitted()),
        "uncommitted": uncommitted(),
        # The operator is installed editable: what ran is HEAD plus any uncommitted change under operator/.
        "operator_uncommitted": _git("diff", "--name-only", "HEAD", "--", "operator").split(),
        "operator_diff_sha": hashlib.sha256(_git("diff", "HEAD", "--", "operator").encode()).hexdigest()[:12],
    }
    if at_start is not None and dict(at_start) != tree():
        out.update(commit=at_start["commit"], dirty=True, changed_during_run={"start": dict(at_start), "end": tree()})
    return out


class CpuMeter:
    """Whole-machine CPU use between start and stop (from /proc/stat), and the load average at both ends."""

    def __init__(self) -> None:
        self._start = self._read()
        self._load0 = os.getloadavg()
        #: The checkout when the benchmark started: the result records this commit, not the one at its end.
        self.tree = tree()

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle

    def stop(self) -> dict[str, Any]:
        total, idle = self._read()
        dt_total, dt_idle = total - self._start[0], idle - self._start[1]
        busy = 1 - dt_idle / dt_total if dt_total else float("nan")
        return {
            "cpu_busy_fraction": round(busy, 3),
            "loadavg_start": [round(x, 2) for x in self._load0],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "other_pytest_running": other_pytest(),
        }


def other_pytest() -> list[str]:
    """Running pytest sessions (other people's tests share this machine's two cores)."""
    out = subprocess.run(["pgrep", "-af", "pytest"], capture_output=True, text=True, check=False)
    return [ln for ln in out.stdout.splitlines()
            if "pgrep" not in ln and ("-m pytest" in ln or "bin/pytest" in ln or "py.test" in ln)]


def other_e2e() -> list[str]:
    """Running `pytest ... e2e` sessions: they run tritonserver pods on their nodes, as most benchmarks do."""
    return [ln for ln in other_pytest() if " e2e" in ln]


# -- statistics ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks (NumPy's default)."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(values: Iterable[float], digits: int = 4) -> dict[str, Any]:
    xs = [float(v) for v in values]
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "min": round(min(xs), digits),
        "p50": round(percentile(xs, 50), digits),
        "p95": round(percentile(xs, 95), digits),
        "p99": round(percentile(xs, 99), digits),
        "max": round(max(xs), digits),
        "mean": round(sum(xs) / len(xs), digits),
    }


def ms(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    x = seconds * 1000
    return f"{x:.2f} ms" if abs(x) < 10 else f"{x:.1f} ms" if abs(x) < 100 else f"{x:.0f} ms"


# -- result files --------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the summary table: our figure, the usual approach's, the target and whether it was met."""

    figure: str
    ours: str
    usual: str = "-"
    target: str = "-"
    met: bool | None = None  # None: no target for this line


@dataclass
class Result:
    name: str
    title: str
    method: str  # one paragraph: what was measured and how
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


def write_result(result: Result, started: float, meter: CpuMeter) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": result.name,
        "title": result.title,
        "machine": machine(meter.tree),
        "seconds": round(time.monotonic() - started, 1),
        "contention": meter.stop(),
        "method": result.method,
        "rows": [asdict(r) for r in result.rows],
        "notes": result.notes,
        "data": result.data,
    }
    path = RESULTS / f"{result.name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    tmp.rename(path)
    write_markdown()
    return path


def write_markdown() -> Path:
    docs = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    names = [n for n in ORDER if n in docs] + sorted(n for n in docs if n not in ORDER)
    out = ["# Benchmark results", "",
           "Written by `make bench` (`python -m bench.run`); each section comes from `<name>.json` next to this",
           "file. Benchmarks are not tests: a missed target is reported, never failed. Targets come from the",
           "issue and were not tuned for.", ""]
    for name in names:
        d = docs[name]
        m, c = d["machine"], d.get("contention", {})
        out += [f"## {d['title']} (`{name}`)", ""]
        out += [f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, kernel {m['kernel']}, "
                f"Python {m['python']}, tritonserver {m['tritonserver']}, commit {m['commit']}"
                + (f" + uncommitted operator changes (diff {m['operator_diff_sha']})" if m.get("operator_uncommitted") else "")
                + (f" + {len(m['uncommitted'])} uncommitted or new files" if m.get("dirty") else "")
                + f"; run {m['date']}, "
                f"{d['seconds']:.0f} s; whole-machine CPU busy {c.get('cpu_busy_fraction', float('nan')):.0%} "
                f"(load avg {c.get('loadavg_start', ['?'])[0]} -> {c.get('loadavg_end', ['?'])[0]})"
                + ("; other pytest sessions were running" if c.get("other_pytest_running") else "") + ".", ""]
        out += [d["method"], ""]
        out += ["| figure | ours | usual approach | target | met |", "|---|---|---|---|---|"]
        for r in d["rows"]:
            met = "-" if r["met"] is None else ("yes" if r["met"] else "**no**")
            out.append(f"| {r['figure']} | {r['ours']} | {r['usual']} | {r['target']} | {met} |")
        out.append("")
        for note in d.get("notes") or ():
            out.append(f"- {note}")
        out.append("")
    path = RESULTS / "RESULTS.md"
    path.write_text("\n".join(out).rstrip() + "\n")
    return path


def python() -> str:
    return sys.executable
