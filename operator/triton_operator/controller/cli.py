"""`triton-operator run`: the operator process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal


def cmd_run(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server

    from ..render.kubernetes import Options
    from .operator import run_operator

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per handled event is noise
    if not args.namespace and not args.all_namespaces:
        args.all_namespaces = True
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_address)
        logging.getLogger("triton_operator").info("Started metrics endpoint port=%d", args.metrics_port)
    options = Options(operator_image=args.operator_image)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_operator(
            kubeconfig=args.kubeconfig,
            namespaces=args.namespace or [],
            clusterwide=args.all_namespaces,
            liveness=args.liveness,
            options=options,
            drift_interval=args.drift_interval,
            stop_flag=stop,
        )

    asyncio.run(main())
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser("run", help="run the operator (watches TritonModels and gates replicas on warm-up)")
    scope = r.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster (the default)")
    r.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig (default: in-cluster)")
    r.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL to serve")
    r.add_argument("--metrics-port", type=int, default=8081, help="Prometheus metrics port (0 disables)")
    r.add_argument("--metrics-address", default="0.0.0.0")
    r.add_argument(
        "--operator-image",
        default=os.environ.get("TRITON_OPERATOR_IMAGE", "ghcr.io/triton-operator/triton-operator:0.1.0"),
        help="image of the `fetch` init container (this operator's own image)",
    )
    r.add_argument("--drift-interval", type=float, default=60.0, help="seconds between drift-correcting reconciles")
    r.add_argument("--log-level", default="info")
    r.set_defaults(func=cmd_run)
