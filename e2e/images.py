"""Container images for the local nodes, built on this machine without Docker or a registry.

Owns five OCI images, the cache they live in and their import into a node's containerd:

- **base** (`localhost/triton-operator/base:bookworm-<hash>`): a Debian bookworm root filesystem made by
  `mmdebstrap` from the Debian mirror apt already uses here, with python3 (3.11) and venv; committed with
  `buildah from scratch`. It is the `BASE` build argument of the two images below (their default, the
  official python image, cannot be pulled here).
- **operator** (`ghcr.io/triton-operator/triton-operator:<appVersion>`, the reference the Helm chart renders,
  plus `localhost/triton-operator/triton-operator:dev`): the repository's own `Dockerfile`, installing
  offline the files `requirements.lock` pins, downloaded on the host with their hashes checked (`pip download`),
  and the project built with the wheels of its build requirements (`pip wheel`).

Also owns `requirements.lock` itself: `python -m e2e.images lock` (`make lock`) writes it with uv from pyproject's
dependencies and its s3 and gcs extras, and records a hash of those inputs in it (`lock_digest`), so that a test can
tell a lock that no longer matches pyproject.toml.
- **tritonserver** (`localhost/triton-operator/tritonserver:24.10-py3-cpu`, under that name alone: the test clusters'
  operator runs with it as its `--default-triton-image`, the chart's `tritonImage`): `e2e/images/tritonserver/Dockerfile`,
  the tritonserver 2.51 (NGC 24.10) of the nvidia-pytriton wheel laid out at NGC's paths (/opt/tritonserver/...), CPU
  only.
- **pause** (`PAUSE_IMAGE`): Kubernetes' `build/pause/linux/pause.c` from the k8s.io/kubernetes module that
  e2e/toolchain/kube pins, compiled with `gcc -Os -static`.
- **endless-tritonserver** (`ENDLESS_REF`): `e2e/images/endless-tritonserver/`, a hostile `tritonserver` whose answers
  never end (issue 39), on the base; built by `build_endless` for the one test that runs it
  (e2e/test_hostile_replica.py), which imports it into its nodes itself: not one of `build_all`'s images, so neither
  a cluster's `up` nor `make demo` builds or imports it.

Everything is under `${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-~/.cache}/triton-operator}/images`: buildah's
storage (`--root/--runroot`, vfs driver; its blob-info cache, which containers/image keeps in
/var/lib/containers/cache for root, goes there too through a private mount), the oci-archive files, the
wheels and the base root filesystem. An archive is named by a hash of exactly its inputs (files, build
arguments, package lists, the lock or the wheels' file names, the base's hash), so a changed input rebuilds that image
and the ones built on it, and nothing else does; a warm `build_all` only hashes and takes seconds. Every
result is written to a temporary name and renamed, so an interrupted build leaves nothing half-made.

`buildah bud --layers` keeps the build stages' steps in buildah's storage, so a source change reuses the
dependency install and reruns only the steps after it (and the short final stage); `--squash` makes the image a
single layer: one layer to unpack per node, and where a node falls back to containerd's native snapshotter
(no overlay mounts), one full copy of the file system instead of one per layer. After a build, working
containers, images that are no step of a current build, and stale archives and wheels are removed (vfs also
keeps a full copy per layer).

    python -m e2e.images build                                  # prints REF ARCHIVE per image
    python -m e2e.images import --address /path/containerd.sock # ctr images import (+ aliases), idempotent
    python -m e2e.images lock [--upgrade]                       # rewrites requirements.lock (`make lock`)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TRITON_CONTEXT = REPO_ROOT / "e2e" / "images" / "tritonserver"
ENDLESS_CONTEXT = REPO_ROOT / "e2e" / "images" / "endless-tritonserver"
KUBE_MODULE_DIR = REPO_ROOT / "e2e" / "toolchain" / "kube"

PAUSE_IMAGE = "localhost/triton-operator/pause:3.10"
TRITON_REF = "localhost/triton-operator/tritonserver:24.10-py3-cpu"
OPERATOR_ALIAS = "localhost/triton-operator/triton-operator:dev"
#: The hostile tritonserver of e2e/test_hostile_replica.py (a test image: no alias, never in `build_all`).
ENDLESS_REF = "localhost/triton-operator/endless-tritonserver:test"
BASE_NAME = "localhost/triton-operator/base"

#: mmdebstrap's package selection for the base. libpython3.11: the Python backend stub links it.
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates", "python-is-python3", "libpython3.11")
#: What a slim image leaves out (dpkg never unpacks these paths).
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                 "/usr/share/lintian/*")
#: The base's Python: wheels are built on the host by an interpreter of the same version.
PYTHON_VERSION = (3, 11)

#: What the operator image installs: pinned with hashes by `make lock`, installed with `--no-deps`.
LOCK = REPO_ROOT / "requirements.lock"
#: The extras of pyproject.toml the image installs besides the dependencies: s3:// and gs:// sources for `fetch`.
LOCK_EXTRAS = ("s3", "gcs")
#: The interpreter and platform the lock is resolved for: the base's (Debian bookworm, glibc 2.36, CPython 3.11).
LOCK_PYTHON, LOCK_PLATFORM = "3.11", "x86_64-manylinux_2_28"
#: What locked packages declare and the image leaves out. tritonclient asks for them for its client (tritonclient.grpc,
#: .http, .utils); the operator loads only its generated protobuf modules (api/protos.py), so the image has none.
LOCK_LEFT_OUT = ("numpy", "ml-dtypes", "python-rapidjson")
#: The lock's record of what it was made from (`lock_digest`).
LOCK_DIGEST_PREFIX = "# inputs-sha256: "

#: How every Dockerfile is built (an input of the images' hashes too).
BUD_FLAGS = ("--isolation", "chroot", "--layers", "--squash", "--pull=never", "--format", "oci")

Log = Callable[[str], None]


@dataclass(frozen=True)
class Image:
    ref: str  # primary reference
    aliases: tuple[str, ...]  # extra tags in containerd
    archive: Path  # oci-archive file in the cache


class BuildError(RuntimeError):
    """A build step failed; the message names the step and the tail of its log."""


# -- paths and small helpers ------------------------------------------------------------------------------


def cache_root() -> Path:
    """The same cache root as e2e/toolchain/build.sh."""
    explicit = os.environ.get("TRITON_OPERATOR_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "triton-operator"


def images_dir() -> Path:
    return cache_root() / "images"


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.hexdigest()


def _digest_inputs(inputs: dict) -> str:
    return _sha(json.dumps(inputs, sort_keys=True))[:16]


def _tree_digest(root: Path, rel: Sequence[str]) -> dict[str, str]:
    """sha256 of every file under the given paths (relative to root), skipping bytecode and egg-info,
    as the repository's .dockerignore does."""
    out: dict[str, str] = {}
    for r in rel:
        p = root / r
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            parts = f.relative_to(root).parts
            if "__pycache__" in parts or f.suffix in (".pyc", ".pyo", ".pyd") or any(
                x.endswith(".egg-info") for x in parts
            ):
                continue
            mode = "x" if os.access(f, os.X_OK) else "-"
            out["/".join(parts)] = mode + _sha(f.read_bytes())
    return out


def _replace_dir(tmp: Path, final: Path) -> None:
    """Atomically publish a directory built at `tmp` (another process may have won; theirs is equivalent)."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


class _Runner:
    """Runs build commands with their output in one log file per image; a failure raises with its tail."""

    def __init__(self, logfile: Path, env: dict[str, str] | None = None) -> None:
        self.logfile = logfile
        self.env = env

    def __call__(self, argv: Sequence[str | Path], *, capture: bool = False, cwd: Path | None = None,
                 env_extra: dict[str, str] | None = None) -> str:
        with self.logfile.open("ab") as out:
            out.write(("\n$ " + " ".join(str(a) for a in argv) + "\n").encode())
            out.flush()
            proc = subprocess.run(
                [str(a) for a in argv], cwd=cwd, env={**(self.env or os.environ), **(env_extra or {})},
                stdout=subprocess.PIPE if capture else out, stderr=out, check=False,
            )
        if capture:
            with self.logfile.open("ab") as out:
                out.write(proc.stdout)
        if proc.returncode != 0:
            lines = self.logfile.read_text(errors="replace").splitlines()
            # A captured stdout is logged after stderr: buildah's "Error: ..." may be above the tail.
            errors = [line for line in lines[:-25] if line.startswith("Error:")][-3:]
            raise BuildError(f"{argv[0]} failed (exit {proc.returncode}), log {self.logfile}:\n"
                             + "\n".join([*errors, *lines[-25:]]))
        return proc.stdout.decode() if capture else ""


def private_var_lib_containers(root: Path, argv: Sequence[str | Path]) -> list[str | Path]:
    """`argv` in a mount namespace of its own where /var/lib/containers is `root`/var-lib-containers.

    `--root/--runroot` move buildah's storage, but containers/image still keeps its blob-info cache in
    /var/lib/containers/cache for root; this keeps that in the cache too.
    """
    target = Path("/var/lib/containers")
    target.mkdir(mode=0o700, parents=True, exist_ok=True)  # an empty mount point, if missing
    private = root / "var-lib-containers"
    private.mkdir(exist_ok=True)
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            'mount --bind "$0" /var/lib/containers && exec "$@"', private, *argv]


class Buildah:
    """buildah with its storage under the cache (vfs driver, so it works without overlay or fuse)."""

    def __init__(self, root: Path, run: _Runner) -> None:
        self.root = root
        self.run = run

    def argv(self, *args: str | Path) -> list[str | Path]:
        return ["buildah", "--root", self.root / "storage", "--runroot", self.root / "run", "--storage-driver", "vfs",
                *args]

    def __call__(self, *args: str | Path, capture: bool = False) -> str:
        return self.run(private_var_lib_containers(self.root, self.argv(*args)), capture=capture)

    def script(self, script: str, *args: str | Path) -> str:
        """A shell script (with `$BUILDAH` = this buildah) in the same mount namespace as `__call__` uses."""
        return self.run(private_var_lib_containers(self.root, ["sh", "-euc", script, "sh", *args]),
                        env_extra={"BUILDAH": " ".join(str(a) for a in self.argv())})

    def has_image(self, ref: str) -> bool:
        try:
            self("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref, capture=True)
        except BuildError:
            return False
        return True

    def push(self, ref: str, archive: Path) -> None:
        """`buildah push` into an oci-archive whose index names `ref`, written to .tmp then renamed."""
        tmp = archive.with_name(archive.name + ".tmp")
        tmp.unlink(missing_ok=True)
        self("push", "--quiet", "--format", "oci", ref, f"oci-archive:{tmp}:{ref}")
        os.replace(tmp, archive)

    def ensure(self, image: Image) -> None:
        """Puts an image built earlier back into buildah's storage from its archive, if the storage lost it."""
        if not self.has_image(image.ref):
            image_id = self("pull", "--quiet", f"oci-archive:{image.archive}", capture=True).split()[-1]
            self("tag", image_id, image.ref)


# -- inputs ---------------------------------------------------------------------------------------------


def debian_sources(suite: str = DEBIAN_SUITE) -> list[str]:
    """One-line apt sources for `suite` and its -updates/-security, read from this host's apt configuration
    (deb822 *.sources and one-line *.list), so mmdebstrap uses the mirror apt already reaches."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list")),
             *sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))]
    lines: list[str] = []
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        entries: list[tuple[list[str], list[str], list[str], list[str]]] = []
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                entries.append((fields.get("types", "").split(), fields.get("uris", "").split(),
                                fields.get("suites", "").split(), fields.get("components", "").split()))
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3:
                    entries.append(([words[0]], [words[1]], [words[2]], words[3:]))
        for types, uris, suites, comps in entries:
            if "deb" not in types:
                continue
            for uri in uris:
                for s in suites:
                    if s == suite or s.startswith(suite + "-") or s.startswith(suite + "/"):
                        line = f"deb {uri} {s} {' '.join(comps or ['main'])}"
                        if line not in lines:
                            lines.append(line)
    if not lines:
        raise BuildError(f"no apt source for Debian {suite} in /etc/apt/sources.list*: mmdebstrap needs a mirror")
    return lines


def chart_operator_ref(root: Path = REPO_ROOT) -> str:
    """The operator image the Helm chart renders by default: values.yaml's image.repository and the
    chart's appVersion (image.tag is empty by default); `root`: another tree's chart (an earlier release's)."""
    chart = (root / "charts" / "triton-operator" / "Chart.yaml").read_text()
    values = (root / "charts" / "triton-operator" / "values.yaml").read_text()
    app = re.search(r"^appVersion:\s*['\"]?([^'\"\s]+)", chart, re.M)
    image = re.search(r"^image:\s*\n((?:[ \t]+.*\n|\s*\n)*)", values, re.M)
    repo = re.search(r"^\s+repository:\s*['\"]?([^'\"\s]+)", image.group(1), re.M) if image else None
    tag = re.search(r"^\s+tag:\s*['\"]?([^'\"\s#]*)", image.group(1), re.M) if image else None
    if not (app and repo):
        raise BuildError("cannot read image.repository (values.yaml) or appVersion (Chart.yaml) of the chart")
    return f"{repo.group(1)}:{(tag.group(1) if tag and tag.group(1) else app.group(1))}"


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def operator_requirements() -> list[str]:
    """What the operator image runs with: pyproject's dependencies and its s3 and gcs extras (`requirements.lock`
    pins them)."""
    project = _pyproject()["project"]
    extras = project.get("optional-dependencies", {})
    return [*project["dependencies"], *(r for e in LOCK_EXTRAS for r in extras.get(e, []))]


def build_requirements() -> list[str]:
    """pyproject's build requirements: the image builds the project itself offline with them."""
    return list(_pyproject().get("build-system", {}).get("requires", []))


# -- requirements.lock ------------------------------------------------------------------------------------


def lock_inputs() -> dict:
    """Everything `make lock` resolves from: a change to any of it needs a new lock."""
    project = _pyproject()["project"]
    extras = project.get("optional-dependencies", {})
    return {"dependencies": project["dependencies"], "extras": {e: extras.get(e, []) for e in LOCK_EXTRAS},
            "left_out": list(LOCK_LEFT_OUT), "python": LOCK_PYTHON, "platform": LOCK_PLATFORM}


def lock_digest() -> str:
    return _sha(json.dumps(lock_inputs(), sort_keys=True))


def recorded_lock_digest(text: str) -> str | None:
    """The inputs digest a lock says it was made from."""
    return next((line.removeprefix(LOCK_DIGEST_PREFIX).strip() for line in text.splitlines()
                 if line.startswith(LOCK_DIGEST_PREFIX)), None)


def locked(text: str) -> dict[str, tuple[str, list[str]]]:
    """A lock's pins: normalized name -> (version, its sha256 hashes)."""
    pins: dict[str, tuple[str, list[str]]] = {}
    name = ""
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if m:
            name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            pins[name] = (m.group(2), [])
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            pins[name][1].append(digest)
    return pins


def write_lock(upgrade: bool = False, log: Log = print) -> Path:
    """Resolves `lock_inputs()` with uv (from the dev extra) into requirements.lock, every file's hash included;
    keeps the pins the old lock had where they still fit (`upgrade`: the newest that fit instead)."""
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        raise BuildError(f"{uv} is missing: it comes with the dev extra (pip install -e '.[dev]')")
    header = [
        "# The operator image's Python packages, each pinned with the hashes of its files: pyproject.toml's",
        f"# dependencies and its {' and '.join(LOCK_EXTRAS)} extras, for CPython {LOCK_PYTHON} on {LOCK_PLATFORM}. "
        "Regenerate it with",
        "# `make lock` (`make lock UPGRADE=1` moves every pin to the newest that fits); tests/test_images.py fails",
        "# when pyproject.toml has changed since. The Dockerfile installs it with --no-deps: "
        f"{', '.join(LOCK_LEFT_OUT)},",
        "# which tritonclient declares for its client, stay out (the operator loads only its generated protobuf",
        "# modules, operator/triton_operator/api/protos.py).",
        f"{LOCK_DIGEST_PREFIX}{lock_digest()}",
    ]
    tmp = LOCK.with_name(LOCK.name + ".tmp")
    if LOCK.exists():
        shutil.copy2(LOCK, tmp)  # uv keeps the pins of the file it writes to, where they still fit
    argv: list[str | Path] = [uv, "pip", "compile", "pyproject.toml", *(f"--extra={e}" for e in LOCK_EXTRAS),
                              "--generate-hashes", f"--python-version={LOCK_PYTHON}",
                              f"--python-platform={LOCK_PLATFORM}",
                              *(f"--no-emit-package={p}" for p in LOCK_LEFT_OUT),
                              "--custom-compile-command=make lock", "--quiet", "--output-file", tmp,
                              *(["--upgrade"] if upgrade else [])]
    proc = subprocess.run([str(a) for a in argv], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"uv pip compile failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    body = [line for line in tmp.read_text().splitlines() if line not in header]
    while body and not body[0].startswith("# This file was autogenerated"):
        body.pop(0)  # the previous run's header
    tmp.write_text("\n".join([*header, *body]) + "\n")
    os.replace(tmp, LOCK)
    log(f"[images] Wrote the lock path={LOCK.relative_to(REPO_ROOT)} packages={len(locked(LOCK.read_text()))}")
    return LOCK


def triton_requirements() -> list[str]:
    """e2e/images/tritonserver/requirements.txt: the wheel (--no-deps) and what the test models import."""
    lines = (TRITON_CONTEXT / "requirements.txt").read_text().splitlines()
    return [x.split("#", 1)[0].strip() for x in lines if x.split("#", 1)[0].strip()]


def kube_version() -> str:
    text = (KUBE_MODULE_DIR / "go.mod").read_text()
    m = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", text, re.M)
    if not m:
        raise BuildError(f"cannot read the k8s.io/kubernetes version from {KUBE_MODULE_DIR / 'go.mod'}")
    return m.group(1)


def pause_source() -> Path:
    """build/pause/linux/pause.c of the k8s.io/kubernetes module in the Go module cache."""
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    argv = ["go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"]
    found = subprocess.run(argv, cwd=KUBE_MODULE_DIR, env=env, capture_output=True, text=True, check=False)
    module_dir = found.stdout.strip()
    if found.returncode != 0 or not module_dir or not Path(module_dir, "build/pause/linux/pause.c").is_file():
        subprocess.run(["go", "mod", "download", "k8s.io/kubernetes"], cwd=KUBE_MODULE_DIR, env=env,
                       check=True, capture_output=True)
        module_dir = subprocess.run(argv, cwd=KUBE_MODULE_DIR, env=env, capture_output=True, text=True,
                                    check=True).stdout.strip()
    return Path(module_dir) / "build" / "pause" / "linux" / "pause.c"


def _gcc_version() -> str:
    return subprocess.run(["gcc", "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]


def base_key(epoch: int | None = None, sources: list[str] | None = None) -> str:
    """The base image's cache key: a hash of its inputs (`epoch`: the release's base, see `_Builder.base`)."""
    inputs: dict[str, object] = {"recipe": "mmdebstrap-apt-1", "suite": DEBIAN_SUITE,
                                 "packages": list(DEBIAN_PACKAGES), "excludes": list(DPKG_EXCLUDES),
                                 "sources": debian_sources() if sources is None else sources}
    if epoch is not None:  # only then: the test images' inputs, and so their cache keys, stay as they were
        inputs |= {"source_date_epoch": epoch, "hooks": list(RELEASE_BASE_HOOKS)}
    return _digest_inputs(inputs)


#: How an earlier release's operator image is built (`build_previous`): part of its cache key, with the commit.
PREVIOUS_RECIPE = "pip-wheel-1"


def previous_key(commit: str) -> str:
    """The cache key of the operator image of the release at `commit` (`build_previous`): the commit fixes every file
    of its tree; the rest is how it is built here, the test base included. Cheap and offline: a test computes it to
    find what `make prebuild` built."""
    return _digest_inputs({"commit": commit, "recipe": PREVIOUS_RECIPE, "base": base_key(), "bud": BUD_FLAGS,
                           "python": list(PYTHON_VERSION), "machine": os.uname().machine})


# -- the builder ----------------------------------------------------------------------------------------


class _Builder:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.root = images_dir()
        for sub in ("archives", "wheels", "rootfs", "logs", "contexts", "tmp", "pause", "storage", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # buildah and mmdebstrap keep big temporary files in TMPDIR (/var/tmp by default): keep them here too.
        self.env = {**os.environ, "TMPDIR": str(self.root / "tmp"), "BUILDAH_ISOLATION": "chroot"}
        self.keep: dict[str, list[str]] = {}
        with contextlib.suppress(OSError, ValueError):
            self.keep = json.loads(self.keep_file.read_text())
        self.built_any = False
        self.wheel_dirs: set[Path] = set()

    @property
    def keep_file(self) -> Path:
        return self.root / "layer-cache.json"

    def save_keep(self) -> None:
        tmp = self.keep_file.with_name(self.keep_file.name + ".tmp")
        tmp.write_text(json.dumps(self.keep, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.keep_file)

    def gc(self, current: Sequence[Image]) -> None:
        """Frees buildah's storage (vfs keeps a full copy of the file system per layer): removes the
        working containers bud leaves behind and every image that is neither a current image nor a step
        of the latest build of one (those stay: they are the layer cache)."""
        t0 = time.monotonic()
        buildah = Buildah(self.root, self.runner("gc", "storage"))
        buildah("rm", "--all")
        keep_refs = {i.ref for i in current}
        prefixes = {p for ids in self.keep.values() for p in ids}
        listed = buildah("images", "--all", "--no-trunc", "--format", "{{.ID}} {{.Name}}:{{.Tag}}", capture=True)
        drop: list[str] = []
        for line in listed.splitlines():
            if not line.strip():
                continue
            image_id, name = line.split()[0], line.split()[-1]
            bare = image_id.removeprefix("sha256:")
            if name in keep_refs or any(bare.startswith(p) for p in prefixes):
                continue
            drop.append(bare)
        removed = 0
        while drop:  # children before parents: retry what still had children
            left = []
            for image_id in drop:
                try:
                    buildah("rmi", image_id)
                    removed += 1
                except BuildError:
                    left.append(image_id)
            if len(left) == len(drop):
                break
            drop = left
        # Archives no current image was built from and no build used for a day (another checkout's operator image
        # stays while it is in use there), and wheel directories likewise (another checkout's lock has its own).
        stale = stale_archives((self.root / "archives").glob("*.oci.tar"), [i.archive for i in current], time.time())
        stale += stale_archives([p for p in (self.root / "wheels").iterdir() if p.is_dir()], sorted(self.wheel_dirs),
                                time.time())
        for p in stale:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        self.log(f"[images] Pruned build storage images={removed} kept={len(listed.splitlines()) - removed} "
                 f"stale_files={len(stale)} seconds={time.monotonic() - t0:.1f}")

    def runner(self, name: str, key: str) -> _Runner:
        logfile = self.root / "logs" / f"{name}-{key}.log"
        logfile.unlink(missing_ok=True)
        return _Runner(logfile, self.env)

    def archive(self, name: str, key: str) -> Path:
        return self.root / "archives" / f"{name}-{key}.oci.tar"

    def clean_partial(self) -> None:
        """Leftovers of an interrupted build: *.tmp files and directories, staged contexts."""
        for d in ("archives", "rootfs", "wheels", "pause"):
            for p in (self.root / d).glob("*.tmp*"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        for p in (self.root / "contexts").iterdir():
            shutil.rmtree(p, ignore_errors=True)

    def built(self, name: str, ref: str, t0: float, archive: Path) -> None:
        self.built_any = True
        size = archive.stat().st_size / 1e6
        self.log(f"[images] Built image name={name} ref={ref} seconds={time.monotonic() - t0:.1f} "
                 f"size_mb={size:.0f} archive={archive}")

    # -- wheels -------------------------------------------------------------------------------------

    def wheels(self, name: str, requirements: Sequence[str], no_deps: bool = False) -> Path:
        """`pip wheel` on the host into a directory named by the requirements; built once."""
        key = _digest_inputs({"requirements": list(requirements), "no_deps": no_deps,
                              "python": list(PYTHON_VERSION), "machine": os.uname().machine})
        argv = [sys.executable, "-m", "pip", "wheel", "--quiet", *(["--no-deps"] if no_deps else []), *requirements]
        return self._wheel_dir(name, key, lambda tmp: [*argv, "--wheel-dir", tmp])

    def locked_wheels(self, name: str, lock: Path) -> Path:
        """The very files `lock` pins (`pip download`, every hash checked, wheels only: a wheel built here would not
        have the hash the lock records), for the host's Python and machine, the base's; once per lock."""
        key = _digest_inputs({"lock": _sha(lock.read_bytes()), "python": list(PYTHON_VERSION),
                              "machine": os.uname().machine})
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                "--only-binary=:all:", "--requirement", lock]
        return self._wheel_dir(name, key, lambda tmp: [*argv, "--dest", tmp])

    def _wheel_dir(self, name: str, key: str, argv: Callable[[Path], list[str | Path]]) -> Path:
        if sys.version_info[:2] != PYTHON_VERSION:
            raise BuildError(f"wheels for the images need Python {'.'.join(map(str, PYTHON_VERSION))} on the host "
                             f"(the base's); this is {sys.version.split()[0]}")
        out = self.root / "wheels" / f"{name}-{key}"
        self.wheel_dirs.add(out)
        if out.is_dir():
            os.utime(out)  # in use: gc keeps it a day for this checkout, whatever another one builds meanwhile
            return out
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp", dir=out.parent))
        self.runner(f"wheels-{name}", key)(argv(tmp))
        _replace_dir(tmp, out)
        self.log(f"[images] Built wheels name={name} count={len(list(out.glob('*.whl')))} "
                 f"seconds={time.monotonic() - t0:.1f} dir={out}")
        return out

    def stage(self, key: str, files: dict[str, Path], wheels: Sequence[Path]) -> Path:
        """A build context of exactly the given files (+ wheels/, the files of every `wheels` directory),
        hard-linked where possible."""
        ctx = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=self.root / "contexts"))
        for rel, src in files.items():
            dst = ctx / rel
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]", "*.egg-info"))
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        if wheels:
            (ctx / "wheels").mkdir(exist_ok=True)
        for whl in (w for d in wheels for w in d.glob("*.whl")):
            try:
                os.link(whl, ctx / "wheels" / whl.name)
            except OSError:
                shutil.copy2(whl, ctx / "wheels" / whl.name)
        return ctx

    def bud(self, name: str, key: str, ref: str, ctx: Path, build_args: dict[str, str], archive: Path,
            flags: Sequence[str] = ()) -> None:
        run = self.runner(name, key)
        buildah = Buildah(self.root, run)
        args = [f"--build-arg={k}={v}" for k, v in sorted(build_args.items())]
        try:
            out = buildah("bud", *BUD_FLAGS, *flags, *args, "--file", ctx / "Dockerfile", "--tag", ref, ctx,
                          capture=True)
            buildah.push(ref, archive)
        finally:
            shutil.rmtree(ctx, ignore_errors=True)
        # The images of every step of this build (cached or new): the layer cache the next build can use.
        ids = re.findall(r"^--> (?:Using cache )?([0-9a-f]{11,64})\s*$", out, re.M)
        self.keep[name] = sorted(set(ids))
        self.save_keep()

    # -- the images -----------------------------------------------------------------------------------

    def base(self, epoch: int | None = None) -> Image:
        """The Debian base; with `epoch`, the release's (`build_release`): mmdebstrap's reproducible output for
        SOURCE_DATE_EPOCH=`epoch`, without the build host's /etc/hostname and /etc/resolv.conf."""
        sources = debian_sources()
        hooks = list(RELEASE_BASE_HOOKS) if epoch is not None else []
        key = base_key(epoch, sources)
        ref = f"{BASE_NAME}:{DEBIAN_SUITE}-{key}"
        image = Image(ref, (), self.archive("base", key))
        run = self.runner("base", key)
        buildah = Buildah(self.root, run)
        if image.archive.exists():
            if not buildah.has_image(ref):  # storage wiped: the images built on the base need it back
                buildah.ensure(image)
            return image
        t0 = time.monotonic()
        rootfs = self.root / "rootfs" / f"{key}.tar"
        if not rootfs.exists():
            tmp = rootfs.with_name(rootfs.name + ".tmp")
            run(["mmdebstrap", "--variant=apt", "--mode=root", "--format=tar", "--skip=output/dev",
                 f"--include={','.join(DEBIAN_PACKAGES)}",
                 *(f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES),
                 "--dpkgopt=path-include=/usr/share/doc/*/copyright", *(f"--customize-hook={h}" for h in hooks),
                 DEBIAN_SUITE, tmp, *sources],
                env_extra={} if epoch is None else {"SOURCE_DATE_EPOCH": str(epoch)})
            os.replace(tmp, rootfs)
        container = buildah("from", "--name", f"base-{key}-{os.getpid()}", "scratch", capture=True).strip()
        try:
            buildah.script('mnt=$($BUILDAH mount "$1"); tar -C "$mnt" --numeric-owner --xattrs -xpf "$2"; '
                           '$BUILDAH umount "$1"', container, rootfs)
            buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--env", "LANG=C.UTF-8", "--cmd", '["python3"]', "--os", "linux", "--arch", "amd64",
                    "--label", f"org.opencontainers.image.description=Debian {DEBIAN_SUITE} + python3 (mmdebstrap)",
                    container)
            buildah("commit", "--quiet", "--format", "oci", *_timestamp(epoch), "--rm", container, ref)
        except BaseException:
            with contextlib.suppress(BuildError):
                buildah("rm", container)
            raise
        buildah.push(ref, image.archive)
        rootfs.unlink()  # the image has it now
        self.built("base", ref, t0, image.archive)
        return image

    def operator(self, base: Image, epoch: int | None = None) -> Image:
        """The operator image; with `epoch`, the release's (`build_release`): built with `--timestamp epoch` (every
        file's time and the image's creation time) and SOURCE_DATE_EPOCH=`epoch` in the builder stage (pip then
        writes hash-checked bytecode, not bytecode stamped with the build's clock), under a name of its own."""
        ref = chart_operator_ref()
        files = {"Dockerfile": REPO_ROOT / "Dockerfile", "pyproject.toml": REPO_ROOT / "pyproject.toml",
                 LOCK.name: LOCK, "operator": REPO_ROOT / "operator"}
        build_args = {"BASE": base.ref, "PIP_NO_INDEX": "1"}
        # The lock is one of `files` and names every file installed: no need to list the wheels (so a built image
        # is found without them, offline, in a test's network namespace).
        inputs: dict[str, object] = {"files": _tree_digest(REPO_ROOT, list(files)),
                                     "build_requirements": build_requirements(),
                                     "python": list(PYTHON_VERSION), "machine": os.uname().machine,
                                     "build_args": build_args, "bud": BUD_FLAGS, "ref": ref}
        if epoch is not None:  # only then: the test image's inputs, and so its cache key, stay as they were
            inputs |= {"source_date_epoch": epoch, "release_dockerfile": RELEASE_DOCKERFILE_ARG,
                       "release_bud": RELEASE_BUD_FLAGS, "base_digest_annotation": BASE_DIGEST_ANNOTATION}
        key = _digest_inputs(inputs)
        name = "operator" if epoch is None else "operator-release"
        image = Image(ref, (OPERATOR_ALIAS,), self.archive(name, key))
        if not image.archive.exists():
            t0 = time.monotonic()
            wheels = [self.locked_wheels("operator", LOCK), self.wheels("operator-build", build_requirements())]
            ctx = self.stage(f"{name}-{key}", files, wheels)
            if epoch is not None:
                _declare_source_date_epoch(ctx / "Dockerfile")
                build_args = {**build_args, "SOURCE_DATE_EPOCH": str(epoch)}
            flags = [*RELEASE_BUD_FLAGS, *_timestamp(epoch), "--annotation",
                     f"{BASE_DIGEST_ANNOTATION}={archive_digest(base.archive)}"] if epoch is not None else []
            self.bud(name, key, ref, ctx, build_args, image.archive, flags=flags)
            self.built(name, ref, t0, image.archive)
        return image

    def previous_operator(self, tree: Path, commit: str, base: Image) -> Image:
        """The operator image of an earlier release from its source tree (`build_previous`), as that tree's own
        e2e/images.py built it: its Dockerfile, offline, from `pip wheel`s of its pyproject's dependencies, s3 and
        gcs extras and build requirements (0.1.0 had no requirements.lock), on the test base. Its layers are not
        kept as a layer cache: built once per commit."""
        ref = chart_operator_ref(tree)
        key = previous_key(commit)
        image = Image(ref, (), self.archive("operator-previous", key))
        if image.archive.exists():
            return image
        import tomllib

        t0 = time.monotonic()
        data = tomllib.loads((tree / "pyproject.toml").read_text())
        extras = data["project"].get("optional-dependencies", {})
        requirements = [*data["project"]["dependencies"], *(r for e in LOCK_EXTRAS for r in extras.get(e, [])),
                        *data.get("build-system", {}).get("requires", [])]
        wheels = self.wheels(f"operator-{commit[:12]}", requirements)
        files = {"Dockerfile": tree / "Dockerfile", "pyproject.toml": tree / "pyproject.toml",
                 "operator": tree / "operator"}
        ctx = self.stage(f"operator-previous-{key}", files, [wheels])
        self.bud("operator-previous", key, ref, ctx, {"BASE": base.ref, "PIP_NO_INDEX": "1"}, image.archive)
        self.keep.pop("operator-previous", None)  # its steps are no layer cache: the next gc frees them
        self.save_keep()
        self.built("operator-previous", ref, t0, image.archive)
        return image

    def tritonserver(self, base: Image) -> Image:
        wheels = self.wheels("tritonserver", triton_requirements(), no_deps=True)
        files = {p.name: p for p in sorted(TRITON_CONTEXT.iterdir()) if p.is_file()}
        build_args = {"BASE": base.ref, "PIP_NO_INDEX": "1"}
        inputs = {"files": _tree_digest(TRITON_CONTEXT, list(files)),
                  "wheels": sorted(p.name for p in wheels.glob("*.whl")), "build_args": build_args,
                  "bud": BUD_FLAGS, "ref": TRITON_REF}
        key = _digest_inputs(inputs)
        image = Image(TRITON_REF, (), self.archive("tritonserver", key))
        if not image.archive.exists():
            t0 = time.monotonic()
            ctx = self.stage(f"tritonserver-{key}", files, [wheels])
            self.bud("tritonserver", key, TRITON_REF, ctx, build_args, image.archive)
            self.built("tritonserver", TRITON_REF, t0, image.archive)
        return image

    def endless_tritonserver(self, base: Image) -> Image:
        """The hostile tritonserver: a script on the base, so a cold build is one COPY (seconds)."""
        files = {p.name: p for p in sorted(ENDLESS_CONTEXT.iterdir()) if p.is_file()}
        build_args = {"BASE": base.ref}
        inputs = {"files": _tree_digest(ENDLESS_CONTEXT, list(files)), "build_args": build_args, "bud": BUD_FLAGS,
                  "ref": ENDLESS_REF}
        key = _digest_inputs(inputs)
        image = Image(ENDLESS_REF, (), self.archive("endless-tritonserver", key))
        if not image.archive.exists():
            t0 = time.monotonic()
            ctx = self.stage(f"endless-tritonserver-{key}", files, [])
            self.bud("endless-tritonserver", key, ENDLESS_REF, ctx, build_args, image.archive)
            self.built("endless-tritonserver", ENDLESS_REF, t0, image.archive)
        return image

    def pause(self) -> Image:
        source = pause_source()
        cflags = ["-Os", "-static", "-Wall", "-Werror"]
        inputs = {"source": _sha(source.read_bytes()), "kubernetes": kube_version(), "cflags": cflags,
                  "gcc": _gcc_version(), "ref": PAUSE_IMAGE, "user": "65535:65535"}
        key = _digest_inputs(inputs)
        image = Image(PAUSE_IMAGE, (), self.archive("pause", key))
        if image.archive.exists():
            return image
        t0 = time.monotonic()
        run = self.runner("pause", key)
        binary = self.root / "pause" / f"pause-{key}"
        if not binary.exists():
            tmp = binary.with_name(binary.name + ".tmp")
            # As build/pause/Makefile stamps it (v$(TAG)-$(REV)): the image's tag, then the module's version.
            version = f"v{PAUSE_IMAGE.rsplit(':', 1)[1]}-{inputs['kubernetes']}"
            run(["gcc", *cflags, f"-DVERSION={version}", "-o", tmp, source])
            run(["strip", tmp])
            os.replace(tmp, binary)
        buildah = Buildah(self.root, run)
        container = buildah("from", "--name", f"pause-{key}-{os.getpid()}", "scratch", capture=True).strip()
        try:
            buildah("copy", "--chmod", "0755", container, binary, "/pause")
            buildah("config", "--entrypoint", '["/pause"]', "--user", "65535:65535", "--os", "linux",
                    "--arch", "amd64", "--label", "org.opencontainers.image.description=Kubernetes pause from "
                    f"k8s.io/kubernetes {inputs['kubernetes']} build/pause/linux/pause.c", container)
            buildah("commit", "--quiet", "--format", "oci", "--rm", container, PAUSE_IMAGE)
        except BaseException:
            with contextlib.suppress(BuildError):
                buildah("rm", container)
            raise
        buildah.push(PAUSE_IMAGE, image.archive)
        self.built("pause", PAUSE_IMAGE, t0, image.archive)
        return image


#: The release base's mmdebstrap hooks: the build host's name and resolver stay out of it (mmdebstrap copies them in),
#: and apt's download directories belong to _apt wherever the build ran (apt leaves them root's when _apt cannot
#: reach mmdebstrap's temporary directory, as under a cache in root's home: the one difference two builds showed).
RELEASE_BASE_HOOKS = ('rm -f "$1/etc/hostname" "$1/etc/resolv.conf"',
                      'chroot "$1" chown _apt:root /var/cache/apt/archives/partial /var/lib/apt/lists/partial')
#: What the release build adds to its staged copy of the Dockerfile, after the builder stage's FROM: an ARG is in the
#: environment of that stage's RUN steps, and not in the image's configuration.
RELEASE_DOCKERFILE_ARG = "ARG SOURCE_DATE_EPOCH"


#: How a release's operator image is built besides `BUD_FLAGS`: from no cached step, and with the manifest's
#: org.opencontainers.image.base.digest annotation set to the base archive's digest. Without it, buildah writes there
#: the digest its storage holds for the base, which varied with the storage's history: two builds of one commit gave
#: the same config and layer but manifests differing in that annotation alone.
RELEASE_BUD_FLAGS = ("--no-cache",)
BASE_DIGEST_ANNOTATION = "org.opencontainers.image.base.digest"


def _timestamp(epoch: int | None) -> list[str]:
    """buildah's `--timestamp` flag for a release build; nothing for the test images."""
    return [] if epoch is None else ["--timestamp", str(epoch)]


def _declare_source_date_epoch(dockerfile: Path) -> None:
    """Adds `RELEASE_DOCKERFILE_ARG` after the builder stage's FROM of a staged Dockerfile."""
    text = dockerfile.read_text()
    new, count = re.subn(r"^(FROM\s+\S+\s+AS\s+builder)[ \t]*$", rf"\1\n{RELEASE_DOCKERFILE_ARG}", text,
                         count=1, flags=re.M | re.I)
    if count != 1:
        raise BuildError(f"{dockerfile}: no `FROM ... AS builder` line to declare SOURCE_DATE_EPOCH after")
    dockerfile.write_text(new)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder at a time per cache (two test sessions may start together)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


#: How long an archive no current build names is kept after its last use (by another checkout, or a build since).
KEEP_UNUSED_ARCHIVES_SECONDS = 24 * 3600


def stale_archives(archives: Iterator[Path] | Sequence[Path], current: Sequence[Path], now: float,
                   keep: float = KEEP_UNUSED_ARCHIVES_SECONDS) -> list[Path]:
    """The archives gc removes: neither one of this build's nor used (mtime) within `keep` seconds of `now`."""
    return sorted(p for p in archives if p not in set(current) and now - p.stat().st_mtime > keep)


def build_all(log: Log = print) -> list[Image]:
    """Builds whatever image is missing from the cache; returns base, operator, tritonserver and pause.

    A warm call (nothing changed) runs no build and takes seconds.
    """
    t0 = time.monotonic()
    with _locked(images_dir() / "lock"):
        b = _Builder(log)
        b.clean_partial()
        base = b.base()
        images = [base, b.operator(base), b.tritonserver(base), b.pause()]
        for image in images:  # an archive's mtime is when a build last used it: what gc keeps for a day
            os.utime(image.archive)
        if b.built_any:
            b.gc(images)
    log(f"[images] Images ready count={len(images)} seconds={time.monotonic() - t0:.1f} cache={b.root}")
    return images


def build_release(epoch: int, log: Log = print) -> Image:
    """The release's operator image (tools/release.py), built if the cache lacks it: `operator(base, epoch)` on
    `base(epoch)`, so two builds of one commit, warm or from an empty cache, give the same image digest (as long as
    the Debian mirror serves the same packages). Distinct from the test clusters' operator image, whose build
    inputs this leaves alone."""
    with _locked(images_dir() / "lock"):
        b = _Builder(log)
        b.clean_partial()
        image = b.operator(b.base(epoch), epoch)
        os.utime(image.archive)
    return image


def build_previous(tree: Path, commit: str, log: Log = print) -> Image:
    """The operator image of the release at `commit`, from its tree `tree` (`git archive`), built if the cache lacks
    it (`_Builder.previous_operator`; the base too, the same as the test images'). tools/release.py `previous`."""
    with _locked(images_dir() / "lock"):
        b = _Builder(log)
        b.clean_partial()
        image = b.previous_operator(tree, commit, b.base())
        os.utime(image.archive)
    return image


def build_endless(log: Log = print) -> Image:
    """The hostile tritonserver image (`ENDLESS_REF`), built if the cache lacks it (and the base with it); a warm
    call only hashes its inputs. Its archive is used, so `gc` keeps it a day as any other."""
    with _locked(images_dir() / "lock"):
        b = _Builder(log)
        b.clean_partial()
        image = b.endless_tritonserver(b.base())
        os.utime(image.archive)
    return image


# -- containerd ---------------------------------------------------------------------------------------


def archive_digest(archive: Path) -> str:
    """The manifest digest the archive's index.json names (what `ctr images ls` shows after import)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise BuildError(f"{archive} has no index.json")
        index = json.load(member)
    return index["manifests"][0]["digest"]


def _ctr(address: str, *args: str) -> str:
    proc = subprocess.run(["ctr", "--address", address, "-n", "k8s.io", *args],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"ctr {' '.join(args[:2])} failed: {proc.stderr.strip()}")
    return proc.stdout


def containerd_images(address: str) -> dict[str, str]:
    """Reference -> target digest of every image in the k8s.io namespace."""
    refs: dict[str, str] = {}
    for line in _ctr(address, "images", "ls").splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3 and cols[2].startswith("sha256:"):
            refs[cols[0]] = cols[2]
    return refs


def import_into(images: Sequence[Image], address: str, log: Log = print, snapshotter: str = "native") -> None:
    """`ctr images import` each image into the containerd at `address` (namespace k8s.io, unpacked for
    `snapshotter`) and tag its aliases. Idempotent: an image whose ref already has the archive's digest
    there is skipped, an alias already on that digest is left alone."""
    have = containerd_images(address)
    replaced = False
    for image in images:
        t0 = time.monotonic()
        digest = archive_digest(image.archive)
        if have.get(image.ref) != digest:
            replaced = replaced or image.ref in have
            # --base-name: the archive's ref is a full reference; without it ctr drops the name.
            base_name = image.ref.rsplit(":", 1)[0]
            _ctr(address, "images", "import", "--snapshotter", snapshotter, "--base-name", base_name,
                 str(image.archive))
            if containerd_images(address).get(image.ref) != digest:
                raise BuildError(f"ctr import of {image.archive} did not create {image.ref}@{digest}")
            log(f"[images] Imported image ref={image.ref} digest={digest[:19]} address={address} "
                f"seconds={time.monotonic() - t0:.1f}")
        else:
            log(f"[images] Image already present ref={image.ref} digest={digest[:19]} address={address}")
        for alias in image.aliases:
            if have.get(alias) != digest:
                _ctr(address, "images", "tag", "--force", image.ref, alias)
                log(f"[images] Tagged image ref={image.ref} alias={alias}")
    if replaced or orphaned_ids(have):
        collect_garbage(address, log)


#: A tag `collect_garbage` puts on an image only to delete it again, when there is nothing else to delete.
GC_TAG = "localhost/triton-operator/gc:remove-me"


def orphaned_ids(refs: dict[str, str]) -> list[str]:
    """The image-ID references (`sha256:<config>`, which the CRI plugin adds beside each image's name) of images no
    name points to any more: an import moved the name to a newer build."""
    named = {digest for ref, digest in refs.items() if not ref.startswith("sha256:")}
    return sorted(ref for ref, digest in refs.items() if ref.startswith("sha256:") and digest not in named)


def collect_garbage(address: str, log: Log = print) -> None:
    """Has containerd remove what no image or container uses any more: the layers and unpacked snapshots of a build
    an import moved its name away from. That build keeps the ID reference the CRI plugin gave it, and containerd
    collects garbage only every 100 changes or when an image is deleted with --sync: without this a node kept every
    build it was ever given (a node's store had grown to 2.9 GB beside 1.2 GB fresh). The orphaned ID references are
    deleted with --sync (a throwaway tag when there is none, so that the collection still runs); a running container
    keeps its own snapshots."""
    t0 = time.monotonic()
    refs = containerd_images(address)
    doomed = orphaned_ids(refs)
    if not doomed:
        named = [ref for ref in refs if not ref.startswith("sha256:")]
        if not named:
            return
        _ctr(address, "images", "tag", "--force", named[0], GC_TAG)
        doomed = [GC_TAG]
    _ctr(address, "images", "rm", "--sync", *doomed)
    log(f"[images] Collected unused content address={address} orphaned-builds={len(doomed) - (GC_TAG in doomed)} "
        f"seconds={time.monotonic() - t0:.1f}")


# -- CLI --------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.images", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the missing images; print REF ARCHIVE per image")
    imp = sub.add_parser("import", help="build the missing images and import them into a containerd")
    imp.add_argument("--address", required=True, help="containerd socket")
    imp.add_argument("--snapshotter", default="native")
    lock = sub.add_parser("lock", help="rewrite requirements.lock from pyproject.toml (uv pip compile)")
    lock.add_argument("--upgrade", action="store_true", help="the newest versions that fit, not the lock's own")
    args = parser.parse_args(argv)
    log: Log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.command == "lock":
            write_lock(upgrade=args.upgrade, log=log)
            return 0
        images = build_all(log=log)
        if args.command == "build":
            for image in images:
                print(image.ref, image.archive)
        else:
            import_into(images, args.address, log=log, snapshotter=args.snapshotter)
    except BuildError as e:
        print(f"[images] {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
