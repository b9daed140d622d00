"""`python -m bench.run [NAME ...]` (`make bench [BENCH=NAME]`): run benchmarks, write bench/results/.

NAME is one of batching, scale, gate, first_request, rollout, autoscale, faults, pool, pool_speed, stale,
pool_routing, placement, upgrade (default: all, in that order: the two that run no pods first); `pool` runs `pool_speed` and
`placement` (Spread against Pack) after it too (ALSO): issue 41's figures in one command. Each benchmark writes its
own JSON as soon as it finishes, so an interrupted run keeps what it measured and `make bench BENCH=gate` redoes just
one. Next to each JSON it draws `<name>.png` from that JSON (bench/plots.py); `--plots-only` redraws every picture
from the JSON files and runs nothing.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

from .common import log, other_e2e, write_markdown

BENCHMARKS = ("batching", "scale", "gate", "first_request", "rollout", "autoscale", "faults", "pool", "pool_speed",
              "stale", "pool_routing", "placement", "upgrade")
RUNS_PODS = ("gate", "first_request", "rollout", "autoscale", "faults", "pool", "pool_speed", "stale", "pool_routing",
             "placement", "upgrade")
#: Benchmarks that run after another when it is named (`make bench BENCH=pool` reports item 6 of issue 41 too).
ALSO = {"pool": ("pool_speed", "placement")}
#: A benchmark's module under bench/ where it is not its name (`gate.py` would be the third gate.py in the tree).
MODULES = {"gate": "gate_latency"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {', '.join(BENCHMARKS)})")
    p.add_argument("--markdown-only", action="store_true", help="only rebuild RESULTS.md from the JSON files")
    p.add_argument("--plots-only", action="store_true", help="only redraw every <name>.png from the JSON files")
    args = p.parse_args(argv)
    names = [n for arg in args.names for n in arg.replace(",", " ").split()] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    names = list(dict.fromkeys(x for n in names for x in (n, *ALSO.get(n, ()))))
    if args.markdown_only:
        print(write_markdown())
        return 0
    if args.plots_only:
        from .plots import write_all

        for png in write_all():
            print(png)
        return 0
    failed = []
    for name in names:
        if name in RUNS_PODS and not os.environ.get("BENCH_IGNORE_E2E"):
            # Someone's `pytest e2e` runs tritonserver pods on these two cores too: their load would be in our
            # numbers and ours in their timeouts. Wait for them (up to BENCH_WAIT_E2E seconds), else skip.
            deadline = time.monotonic() + float(os.environ.get("BENCH_WAIT_E2E", "1800"))
            if other_e2e():
                log(f"Waiting for other pytest e2e sessions to finish before {name}: {other_e2e()}")
            while other_e2e() and time.monotonic() < deadline:
                time.sleep(10)
            if other_e2e():
                log(f"Skipped benchmark {name}: pytest e2e sessions still running (BENCH_IGNORE_E2E=1 runs anyway)")
                failed.append(name)
                continue
        t0 = time.monotonic()
        log(f"Running benchmark {name}")
        try:
            path = importlib.import_module(f"bench.{MODULES.get(name, name)}").run()
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not hide the others' results
            log(f"Benchmark {name} failed: {type(exc).__name__}: {exc}")
            failed.append(name)
            import traceback

            traceback.print_exc()
            continue
        log(f"Finished benchmark {name} seconds={time.monotonic() - t0:.0f} result={path}")
        try:
            from .plots import write_plot

            log(f"Drew benchmark {name} picture={write_plot(Path(path))}")
        except Exception as exc:  # noqa: BLE001 - the JSON is written; a picture can be redrawn with --plots-only
            log(f"Picture of benchmark {name} failed: {type(exc).__name__}: {exc}")
            failed.append(name)
    print(Path(write_markdown()).read_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
