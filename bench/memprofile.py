"""`python -m bench.memprofile ARGS...`: the operator (`triton-operator ARGS...`) under tracemalloc.

On SIGUSR1 it writes where its live Python memory was allocated to `$BENCH_TRACEMALLOC_OUT`: the total
traced, then the top allocation sites grouped by file and by call stack (BENCH_TRACEMALLOC_FRAMES deep,
4 by default: 25 made the operator ten times slower). The scale benchmark uses it with BENCH_TRACEMALLOC=1
(issue 17: measure what the memory per model is before changing anything). tracemalloc itself slows
the operator and adds its own memory, so a profiled run's time and RSS are not the benchmark's figures.
"""

from __future__ import annotations

import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

TOP = 40


def report(snapshot: tracemalloc.Snapshot) -> str:
    snapshot = snapshot.filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
    stats = snapshot.statistics("filename")
    total = sum(s.size for s in stats)
    lines = [f"traced Python memory: {total / 2**20:.1f} MiB in {sum(s.count for s in stats)} blocks", "",
             "by file:"]
    lines += [f"  {s.size / 2**20:8.2f} MiB {s.count:8d} blocks  {s.traceback[0].filename}" for s in stats[:TOP]]
    lines += ["", "by call stack (its frames in triton_operator, kopf or the kubernetes client, caller -> callee; "
              "else the allocating frame):"]
    for s in snapshot.statistics("traceback")[:TOP]:
        # A traceback runs from the oldest frame to the allocating one.
        frames = [f for f in s.traceback if "/triton_operator/" in f.filename or "/kopf/" in f.filename
                  or "/kubernetes/" in f.filename][-4:] or list(s.traceback)[-1:]
        where = " -> ".join(f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno}" for f in frames)
        lines.append(f"  {s.size / 2**20:8.2f} MiB {s.count:8d} blocks  {where}")
    return "\n".join(lines) + "\n"


def main() -> int:
    out = Path(os.environ.get("BENCH_TRACEMALLOC_OUT", "tracemalloc.txt"))
    tracemalloc.start(int(os.environ.get("BENCH_TRACEMALLOC_FRAMES", "4")))

    def dump(_sig: int, _frame: FrameType | None) -> None:
        out.write_text(report(tracemalloc.take_snapshot()))

    signal.signal(signal.SIGUSR1, dump)
    from triton_operator.cli.main import main as operator_main

    sys.argv = ["triton-operator", *sys.argv[1:]]
    return operator_main()


if __name__ == "__main__":
    sys.exit(main())
