"""A closed-loop load generator, run as its own process: `python -m bench.loadgen --url HOST:PORT --model M -c N`.

N concurrent clients (asyncio tasks over one tritonclient gRPC aio channel) each send one
request, wait for the answer and send the next. Requests are batch 1 of `--dims` FP32 values
into `--input`. The first `--warmup` seconds are discarded; only requests that both start and
finish inside the next `--seconds` count. Prints one JSON object: throughput, latency
percentiles, errors, and the mean of the `BATCHED_WITH` output when the model has one (how many
requests shared an execute()).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import InferInput, InferRequestedOutput


async def run(args: argparse.Namespace) -> dict[str, object]:
    client = grpcaio.InferenceServerClient(args.url)
    latencies: list[float] = []
    batched_with: list[int] = []
    errors: list[str] = []
    t_start = time.perf_counter()
    t_measure = t_start + args.warmup
    t_end = t_measure + args.seconds
    outputs = [InferRequestedOutput(name) for name in args.output]

    async def worker(i: int) -> None:
        x = np.full((1, args.dims), float(i), dtype=np.float32)
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                return
            inp = InferInput(args.input, list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            try:
                res = await client.infer(args.model, [inp], outputs=outputs or None, client_timeout=30)
            except Exception as exc:  # noqa: BLE001 - counted and reported, the load goes on
                errors.append(str(exc)[:200])
                await asyncio.sleep(0.01)
                continue
            t1 = time.perf_counter()
            if t0 >= t_measure and t1 <= t_end:
                latencies.append(t1 - t0)
                if "BATCHED_WITH" in args.output:
                    batched_with.append(int(res.as_numpy("BATCHED_WITH").reshape(-1)[0]))

    await asyncio.gather(*(worker(i) for i in range(args.concurrency)))
    await client.close()
    latencies.sort()

    def pct(q: float) -> float | None:
        if not latencies:
            return None
        k = (len(latencies) - 1) * q / 100
        lo, hi = int(k), min(int(k) + 1, len(latencies) - 1)
        return latencies[lo] + (latencies[hi] - latencies[lo]) * (k - lo)

    return {
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "requests": len(latencies),
        "throughput_rps": len(latencies) / args.seconds,
        "p50_s": pct(50),
        "p90_s": pct(90),
        "p99_s": pct(99),
        "mean_s": sum(latencies) / len(latencies) if latencies else None,
        "errors": len(errors),
        "first_errors": errors[:3],
        "mean_batched_with": sum(batched_with) / len(batched_with) if batched_with else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen")
    p.add_argument("--url", required=True, help="host:port of Triton's gRPC endpoint")
    p.add_argument("--model", required=True)
    p.add_argument("-c", "--concurrency", type=int, default=1)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--input", default="INPUT")
    p.add_argument("--dims", type=int, default=1)
    p.add_argument("--output", action="append", default=[], help="outputs to request (repeatable)")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
