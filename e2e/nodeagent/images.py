"""Which container images the node agent can run, and as what local program.

Owns the mapping from an image reference to a local executable plus the image's own
environment and filesystem pieces:

- `*tritonserver*` (e.g. nvcr.io/nvidia/tritonserver:24.10-py3): the real tritonserver from the
  nvidia-pytriton wheel. Inside the container's mount namespace the wheel's server tree is
  bind-mounted at /opt/tritonserver, the assembled backend directory at
  /opt/tritonserver/backends and the caches at /opt/tritonserver/caches - the paths the image
  uses - so `tritonserver`, `/opt/tritonserver/bin/tritonserver` and explicit
  `--backend-directory=/opt/tritonserver/backends` all work unchanged.
- `*triton-operator*`: this repository's `triton-operator` console script from the virtualenv.

Anything else cannot run here: `ImageNotRunnable` carries the waiting reason and message.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

TRITON_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"
TRITON_HOME = "/opt/tritonserver"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageNotRunnable(Exception):
    reason = "ErrImagePull"


@dataclass
class Runnable:
    argv: list[str]
    env: dict[str, str]
    mounts: list[dict] = field(default_factory=list)
    working_dir: str = "/"
    kind: str = ""


def venv_bin() -> Path:
    return Path(sys.executable).parent


def resolve(image: str, command: list[str], args: list[str]) -> Runnable:
    """The local program for a container; `command`/`args` are already $(VAR)-expanded."""
    name = image.rsplit("/", 1)[-1]
    if "tritonserver" in name:
        return _tritonserver(image, command, args)
    if "triton-operator" in name:
        return _operator(command, args)
    raise ImageNotRunnable(f"node agent cannot run image {image}")


def _tritonserver(image: str, command: list[str], args: list[str]) -> Runnable:
    from triton_operator.triton.local import TritonNotInstalled, find_install  # noqa: PLC0415

    try:
        install = find_install()
        backends = install.backend_directory()
    except TritonNotInstalled as e:
        raise ImageNotRunnable(f"node agent cannot run image {image}: {e}") from e
    argv = [*command, *args]
    if argv and argv[0] == TRITON_ENTRYPOINT:  # the image's ENTRYPOINT execs its arguments
        argv = argv[1:]
    if not argv:
        raise ImageNotRunnable(
            f"node agent cannot run image {image} without a command: set command: [tritonserver] and args"
        )
    if os.path.basename(argv[0]) == "tritonserver":
        argv[0] = f"{TRITON_HOME}/bin/tritonserver"
    base = {
        "PATH": f"{TRITON_HOME}/bin:{SYSTEM_PATH}",
        "TRITON_SERVER_VERSION": "2.51.0",
        "NVIDIA_TRITON_SERVER_VERSION": "24.10",
        "HOME": "/root",
    }
    env = install.environment(base)  # wheel libs on LD_LIBRARY_PATH, venv first on PATH (NumPy for stubs)
    mounts = [
        {"source": str(install.root), "target": TRITON_HOME, "readOnly": True},
        {"source": str(backends), "target": f"{TRITON_HOME}/backends", "readOnly": True},
        {"source": str(install.cache_directory), "target": f"{TRITON_HOME}/caches", "readOnly": True},
    ]
    return Runnable(argv=argv, env=env, mounts=mounts, working_dir=TRITON_HOME, kind="tritonserver")


def _operator(command: list[str], args: list[str]) -> Runnable:
    exe = venv_bin() / "triton-operator"
    argv = [*command, *args]
    if not command:
        argv = [str(exe), *args]  # the image's ENTRYPOINT is the console script
    elif os.path.basename(argv[0]) == "triton-operator":
        argv[0] = str(exe)
    env = {
        "PATH": f"{venv_bin()}:{SYSTEM_PATH}",
        "HOME": "/root",
        "PYTHONUNBUFFERED": "1",
    }
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    return Runnable(argv=argv, env=env, working_dir="/", kind="triton-operator")
