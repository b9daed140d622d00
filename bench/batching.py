"""Benchmark `batching`: throughput and latency of one model with the dynamic batcher vs without it.

The model is examples/dynamic-batching.yaml with a per-execute cost that grows a little with the
batch (`executeSeconds` fixed + `perRowSeconds` per row: a GPU kernel whose time barely grows with
the batch; 20 ms + 2.5 ms/row, so a batch of 8 costs 40 ms). The unbatched variant is the same model
with `batcher` removed (maxBatchSize stays 8, so Triton's default scheduler runs every request on
its own). Both are rendered by the operator and served by one local tritonserver on 127.0.0.1; the
load comes from a separate process (`bench.loadgen`), closed loop, at each concurrency.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient

from triton_operator.triton.client import load_model
from triton_operator.triton.local import LocalTritonServer

from .common import REPO, CpuMeter, Result, Row, log, ms, python, write_result
from .models import checked, example, replace_once, write_repository

CONCURRENCIES = (1, 8, 32, 64)
FIXED_SECONDS = "0.02"
PER_ROW_SECONDS = "0.0025"
BATCHED, UNBATCHED = "dynamic-batching", "dynamic-batching-off"


def bench_models() -> tuple[dict[str, Any], dict[str, Any]]:
    doc = example("dynamic-batching")
    code = doc["spec"]["source"]["inline"]["model.py"]
    code = replace_once(
        code,
        '        self.execute_seconds = float(params["executeSeconds"]["string_value"])\n',
        '        self.execute_seconds = float(params["executeSeconds"]["string_value"])\n'
        '        self.per_row_seconds = float(params["perRowSeconds"]["string_value"])\n',
    )
    code = replace_once(
        code,
        '        time.sleep(self.execute_seconds)  # one "kernel launch" per batch, whatever its size\n',
        '        rows = sum(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().shape[0] for r in requests)\n'
        "        time.sleep(self.execute_seconds + self.per_row_seconds * rows)  # a kernel that grows a little\n",
    )
    doc["spec"]["source"]["inline"]["model.py"] = code
    doc["spec"]["parameters"] = {"executeSeconds": FIXED_SECONDS, "perRowSeconds": PER_ROW_SECONDS}
    off = json.loads(json.dumps(doc))
    off["metadata"]["name"] = UNBATCHED
    del off["spec"]["batcher"]
    return doc, off


def server_counts(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model).model_stats[0]
    return stats.inference_count, stats.execution_count


def load(url: str, model: str, concurrency: int, seconds: float, warmup: float) -> dict[str, Any]:
    argv = [python(), "-m", "bench.loadgen", "--url", url, "--model", model, "-c", str(concurrency),
            "--seconds", str(seconds), "--warmup", str(warmup), "--output", "OUTPUT", "--output", "BATCHED_WITH"]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True, timeout=seconds + warmup + 120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(seconds: float = 8.0, warmup: float = 1.0) -> Path:
    started, meter = time.monotonic(), CpuMeter()
    batched_doc, off_doc = bench_models()
    models = [checked(batched_doc), checked(off_doc)]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
        rendered = write_repository(models, Path(tmp) / "repo")
        server = LocalTritonServer(model_repository=Path(tmp) / "repo", log_path=Path(tmp) / "tritonserver.log")
        with server:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            for name in (BATCHED, UNBATCHED):
                res = load_model(client, name)
                if not res.ready:
                    raise RuntimeError(f"{name} failed to load: {res.reason}\n{server.log_tail()}")
            log(f"Serving {BATCHED} and {UNBATCHED} url={server.grpc_url}")
            for c in CONCURRENCIES:
                for name in (BATCHED, UNBATCHED):
                    inf0, ex0 = server_counts(client, name)
                    r = load(server.grpc_url, name, c, seconds, warmup)
                    inf1, ex1 = server_counts(client, name)
                    r.update(model=name, batching=name == BATCHED,
                             server_mean_batch=(inf1 - inf0) / (ex1 - ex0) if ex1 > ex0 else None)
                    runs.append(r)
                    log(f"model={name} concurrency={c} throughput={r['throughput_rps']:.1f}/s "
                        f"p50={ms(r['p50_s'])} p99={ms(r['p99_s'])} meanBatch={r['server_mean_batch'] or 0:.2f} "
                        f"errors={r['errors']}")
            client.close()
        configs = {n: r.files[f"{r.name}/config.pbtxt"].decode() for n, r in rendered.items()}

    def at(c: int, batching: bool) -> dict[str, Any]:
        return next(r for r in runs if r["concurrency"] == c and r["batching"] == batching)

    def cell(r: dict[str, Any]) -> str:
        return (f"{r['throughput_rps']:.0f} req/s, p50 {ms(r['p50_s'])}, p99 {ms(r['p99_s'])}"
                + (f", batch {r['server_mean_batch']:.1f}" if r["server_mean_batch"] else ""))

    result = Result(
        name="batching",
        title="Dynamic batching: throughput and latency",
        method=(
            f"examples/dynamic-batching.yaml rendered by the operator, with a per-execute cost of "
            f"{float(FIXED_SECONDS) * 1000:.0f} ms + {float(PER_ROW_SECONDS) * 1000:.1f} ms per batch row "
            "(a sleep: a GPU kernel whose time barely grows with the batch; one CPU instance). The usual "
            "approach is the same model with `batcher` removed (maxBatchSize 8, no dynamic batching). One "
            "tritonserver on 127.0.0.1; a separate load process (tritonclient gRPC aio, closed loop, batch-1 "
            f"requests) per run, {warmup:.0f} s discarded then {seconds:.0f} s measured. 'batch' is Triton's "
            "own mean requests per execution (statistics)."
        ),
    )
    for c in CONCURRENCIES:
        b, u = at(c, True), at(c, False)
        row = Row(f"concurrency {c}", cell(b), cell(u))
        if c == 32:
            ratio = b["throughput_rps"] / u["throughput_rps"] if u["throughput_rps"] else float("inf")
            row.target, row.met = "batcher >= 3x unbatched throughput", ratio >= 3
            row.ours += f" (**{ratio:.1f}x**)"
        result.rows.append(row)
    b1, u1 = at(1, True), at(1, False)
    result.notes.append(
        f"At concurrency 1 the batcher costs latency: p50 {ms(b1['p50_s'])} vs {ms(u1['p50_s'])} unbatched, "
        f"because it holds a lone request up to maxQueueDelayMicroseconds "
        f"({batched_doc['spec']['batcher']['maxQueueDelayMicroseconds'] / 1000:.0f} ms) for company."
    )
    result.data = {"runs": runs, "configs": configs, "fixed_seconds": float(FIXED_SECONDS),
                   "per_row_seconds": float(PER_ROW_SECONDS)}
    return write_result(result, started, meter)
