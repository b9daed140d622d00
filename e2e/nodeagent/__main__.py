"""Command line for the node agent: `python -m e2e.nodeagent --kubeconfig K --node gpu-node-1 --gpus 2`.

Owns argument parsing, Kubernetes-style log formatting and signal handling (SIGTERM/SIGINT stop
every container and remove every pod network namespace before exiting).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from e2e.nodeagent.agent import NodeAgent, NodeConfig

REPO_ROOT = Path(__file__).resolve().parents[2]


class KlogFormatter(logging.Formatter):
    """`I1121 12:00:00.123456  4242 nodeagent] Started container pod=ns/name ...` like klog."""

    def format(self, record: logging.LogRecord) -> str:
        t = time.localtime(record.created)
        stamp = time.strftime("%m%d %H:%M:%S", t) + f".{int(record.msecs * 1000):06d}"
        line = f"{record.levelname[0]}{stamp} {record.process:>6} {record.name}] {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def parse_taint(text: str) -> dict:
    kv, _, effect = text.rpartition(":")
    key, _, value = kv.partition("=")
    if not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise argparse.ArgumentTypeError(f"taint {text!r} is not key[=value]:Effect")
    return {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.nodeagent", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or str(REPO_ROOT / ".cluster" / "kubeconfig"))
    p.add_argument("--node", action="append", default=[], help="node name (repeatable; default gpu-node-1)")
    p.add_argument("--gpus", type=int, default=4, help="nvidia.com/gpu capacity per node")
    p.add_argument("--cpu", default="8")
    p.add_argument("--memory", default="32Gi")
    p.add_argument("--pods", type=int, default=110)
    p.add_argument("--label", action="append", default=[], help="extra node label key=value")
    p.add_argument("--taint", action="append", default=[], type=parse_taint, help="node taint key[=value]:Effect")
    p.add_argument("--state-dir", default=str(REPO_ROOT / ".cluster" / "nodeagent"))
    p.add_argument("--crash-backoff", type=float, default=10.0, help="first crash-loop back-off in seconds")
    p.add_argument("--no-netns", action="store_true", help="run pods in the host network (podIP 127.0.0.1)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KlogFormatter())
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    logging.getLogger("urllib3").setLevel(logging.WARNING)

    labels = dict(label.split("=", 1) for label in args.label)
    nodes = [
        NodeConfig(name=n, gpus=args.gpus, cpu=args.cpu, memory=args.memory, pods=args.pods, labels=labels,
                   taints=args.taint)
        for n in (args.node or ["gpu-node-1"])
    ]
    agent = NodeAgent(args.kubeconfig, nodes, args.state_dir, use_netns=False if args.no_netns else None,
                      crash_backoff=args.crash_backoff)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    agent.start()
    while not stop.wait(1.0):
        pass
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
