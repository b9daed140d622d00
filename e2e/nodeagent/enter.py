"""Container entry helper: bind-mounts a container's volumes at their mountPaths, then execs it.

Runs as `python enter.py SPEC.json` inside a private mount namespace (created by `ip netns exec`
or `unshare --mount`), so the bind mounts are visible to this container's processes only. Then
it replaces itself with the container's command: the pid the node agent started is the
container's main process, and signals reach it directly. Standalone on purpose (no imports from
the e2e package): it runs in every container start and must not depend on the working directory.

SPEC: {"mounts": [{"source", "target", "readOnly"}], "argv": [...], "env": {...},
       "workingDir": "/", "errorFile": "..."}
"""

import json
import os
import subprocess
import sys


def fail(spec: dict, message: str) -> None:
    sys.stderr.write(f"container start failed: {message}\n")
    try:
        with open(spec["errorFile"], "w") as f:
            f.write(message)
    except (OSError, KeyError):
        pass
    os._exit(128)


def mount(spec: dict, m: dict) -> None:
    source, target = m["source"], m["target"]
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()
    argv = ["mount", "--rbind", source, target]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        fail(spec, f"mount {source} at {target}: {proc.stderr.strip()}")
    if m.get("readOnly"):
        proc = subprocess.run(["mount", "-o", "remount,bind,ro", target], capture_output=True, text=True)
        if proc.returncode != 0:
            fail(spec, f"remount {target} read-only: {proc.stderr.strip()}")


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    for m in sorted(spec.get("mounts", []), key=lambda m: m["target"].rstrip("/").count("/")):
        mount(spec, m)
    workdir = spec.get("workingDir") or "/"
    try:
        os.makedirs(workdir, exist_ok=True)
        os.chdir(workdir)
    except OSError as e:
        fail(spec, f"working directory {workdir}: {e}")
    argv = spec["argv"]
    env = spec.get("env", {})
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        fail(spec, f'exec: "{argv[0]}": {e.strerror} (PATH={env.get("PATH", "")})')


if __name__ == "__main__":
    main()
