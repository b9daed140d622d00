"""NVIDIA's `perf_analyzer`, the load generator Triton users measure with, made runnable on this machine: the binary
from the tritonclient wheel and the two shared libraries it needs that neither Python nor the base system installs,
unpacked once into a cache keyed by the hash of their pins (`ensure()`; `python -m bench.perf_analyzer ARGS` runs it).

Where each piece comes from (checked 2026-11-29 on Debian 12, x86-64):
- `perf_analyzer` itself: `tritonclient-2.51.0.data/data/bin/perf_analyzer` in the tritonclient 2.51.0 wheel
  (`tritonclient-2.51.0-py3-none-manylinux1_x86_64.whl`, fetched with `pip download`, its hash checked; the same
  wheel also carries `bin/perf_client`, an identical copy). 2.51 is the release of the tritonserver the tests and
  the benchmarks run (nvidia-pytriton 0.7.0). The venv's own tritonclient (2.73.0, requirements.lock) is a
  py3-none-any wheel with no binary in it: perf_analyzer left that wheel for a package of its own, so the binary
  is pinned here, apart from the client library the operator imports.
- What the binary needs (`readelf -d`: NEEDED entries, no RPATH or RUNPATH; `ldd` on this machine):
  - `libb64.so.0d`: Debian's `libb64-0d` (1.2-5+b1 in bookworm), not installed here: `apt-get download` (with
    `apt-get update` first when the package lists lack it and we are root) and `dpkg-deb -x`, its hash checked;
    only the library is kept.
  - `libcudart.so.12`: `nvidia/cuda_runtime/lib/libcudart.so.12` of the `nvidia-cuda-runtime-cu12` wheel 12.6.77
    (CUDA 12.6, the runtime Triton 24.10 = 2.51 is built with). It is loaded at start only: with no GPU and no
    driver perf_analyzer runs, and it calls CUDA only for `--shared-memory cuda`, which nothing here asks for.
  - from the base system, as every Debian 12 has them (`libc6`, `libstdc++6`, `libgcc-s1`, `zlib1g`, `libssl3`):
    `libz.so.1`, `libssl.so.3`, `libcrypto.so.3`, `libstdc++.so.6`, `libm.so.6`, `libgcc_s.so.1`, `libc.so.6`,
    `ld-linux-x86-64.so.2`. `ensure()` runs the binary and, when it does not start, says which library `ldd`
    cannot find.
  The first two go in the cache's `lib/`, which `env()` puts first on `LD_LIBRARY_PATH`.
- `perf_analyzer --help` prints its usage and exits 99 (it has no such option: "unrecognized option '--help'",
  then the usage); `--version` prints "Perf Analyzer Version 2.51.0 (commit unknown)" and exits 0: the check
  `ensure()` makes on every call (a few milliseconds).

The cache is `${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-~/.cache}/triton-operator}/perf_analyzer/<key>`, the root
that e2e/toolchain/build.sh and e2e/images.py use; `<key>` hashes PINS and this file's unpacking steps' version
(`LAYOUT`), so a changed pin unpacks anew beside the old. A directory there is complete or absent: it is filled
under a temporary name and renamed.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from e2e.images import cache_root

#: What goes into the cache, each with the sha256 of the file fetched (a wheel, or Debian's .deb).
PINS: dict[str, dict[str, str]] = {
    "tritonclient": {
        "version": "2.51.0", "file": "tritonclient-2.51.0-py3-none-manylinux1_x86_64.whl",
        "sha256": "c485bb0123bdf310f90bc8b03d3489b28df2ffed55b30c7eee0b795b48113d52",
        "member": "tritonclient-2.51.0.data/data/bin/perf_analyzer"},
    "nvidia-cuda-runtime-cu12": {
        "version": "12.6.77", "file": "nvidia_cuda_runtime_cu12-12.6.77-py3-none-manylinux2014_x86_64.whl",
        "sha256": "a84d15d5e1da416dd4774cb42edf5e954a3e60cc945698dc1d5be02321c44dc8",
        "member": "nvidia/cuda_runtime/lib/libcudart.so.12"},
    "libb64-0d": {
        "version": "1.2-5+b1", "file": "libb64-0d_1.2-5+b1_amd64.deb",
        "sha256": "b0e1d6fde8bdccc18c3884144aede064dc82464dd4777275fa80e74c05583e82",
        "member": "usr/lib/x86_64-linux-gnu/libb64.so.0d"},
}
#: Bumped when the cache directory's layout or the unpacking changes.
LAYOUT = 1
VERSION_LINE = "Perf Analyzer Version 2.51.0"


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer could not be fetched, unpacked or started."""


@dataclass(frozen=True)
class PerfAnalyzer:
    """The unpacked perf_analyzer: `command(args)` and `env()` run it."""

    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "perf_analyzer"

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"

    def command(self, args: Sequence[str] = ()) -> list[str]:
        return [str(self.binary), *args]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) with the cache's lib/ first on LD_LIBRARY_PATH."""
        env = dict(os.environ if base is None else base)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(self.lib_dir), env.get("LD_LIBRARY_PATH")) if p)
        return env

    def version(self) -> str:
        """`perf_analyzer --version`'s line; raises PerfAnalyzerError (with what `ldd` misses) if it does not run."""
        try:
            out = subprocess.run(self.command(["--version"]), env=self.env(), capture_output=True, text=True,
                                 timeout=60, check=False)
        except OSError as exc:
            raise PerfAnalyzerError(f"{self.binary} does not start: {exc}") from exc
        line = (out.stdout + out.stderr).strip()
        if out.returncode != 0 or VERSION_LINE not in line:
            ldd = subprocess.run(["ldd", str(self.binary)], env=self.env(), capture_output=True, text=True,
                                 check=False).stdout
            missing = [ln.strip() for ln in ldd.splitlines() if "not found" in ln]
            raise PerfAnalyzerError(f"{self.binary} --version exited {out.returncode}: {line[-500:]!r}; "
                                    f"libraries not found: {missing or 'none'}")
        return line


def cache_key() -> str:
    return hashlib.sha256(json.dumps({"pins": PINS, "layout": LAYOUT}, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return cache_root() / "perf_analyzer" / cache_key()


def ensure(log: bool = True) -> PerfAnalyzer:
    """perf_analyzer from the cache, fetched and unpacked first if it is not there; checked to start."""
    if platform.machine() != "x86_64" or not sys.platform.startswith("linux"):
        raise PerfAnalyzerError(f"the pinned perf_analyzer is a Linux x86-64 binary; this is {sys.platform} "
                                f"{platform.machine()}")
    out = cache_dir()
    if not (out / "bin" / "perf_analyzer").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp", dir=out.parent))
        tmp.chmod(0o755)
        try:
            _fill(tmp)
            try:
                tmp.rename(out)
            except OSError:  # another process filled it meanwhile: theirs is as good
                if not (out / "bin" / "perf_analyzer").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if log:
            print(f"[perf_analyzer] unpacked into {out}", file=sys.stderr, flush=True)
    pa = PerfAnalyzer(out)
    pa.version()
    return pa


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fill(root: Path) -> None:
    """Fetches the three pinned files into root/download and unpacks what is needed into root/bin and root/lib."""
    dl, bin_dir, lib_dir = root / "download", root / "bin", root / "lib"
    for d in (dl, bin_dir, lib_dir):
        d.mkdir()
    for name in ("tritonclient", "nvidia-cuda-runtime-cu12"):
        wheel = _pip_download(name, dl)
        dest = bin_dir / "perf_analyzer" if name == "tritonclient" else lib_dir / "libcudart.so.12"
        with zipfile.ZipFile(wheel) as z, z.open(PINS[name]["member"]) as src, open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst)
    (bin_dir / "perf_analyzer").chmod(0o755)
    deb = _apt_download("libb64-0d", dl)
    unpacked = root / "deb"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True, capture_output=True)
    shutil.copyfile(unpacked / PINS["libb64-0d"]["member"], lib_dir / "libb64.so.0d")
    shutil.rmtree(unpacked)
    shutil.rmtree(dl)
    (root / "PINS.json").write_text(json.dumps(PINS, indent=2, sort_keys=True) + "\n")


def _pip_download(name: str, dest: Path) -> Path:
    pin = PINS[name]
    req = dest / f"{name}.txt"
    req.write_text(f"{name}=={pin['version']} --hash=sha256:{pin['sha256']}\n")
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes", "--only-binary=:all:",
            "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64", "--python-version", "3.11",
            "--requirement", str(req), "--dest", str(dest)]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    wheel = dest / pin["file"]
    if out.returncode != 0 or not wheel.exists():
        raise PerfAnalyzerError(f"pip download {name}=={pin['version']} failed (exit {out.returncode}): "
                                f"{(out.stderr or out.stdout)[-1500:]}")
    return wheel


def _apt_download(name: str, dest: Path) -> Path:
    """Debian's .deb of `name` at its pinned version, hash checked: `apt-get download` (not installed)."""
    pin = PINS[name]

    def attempt() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["apt-get", "download", f"{name}={pin['version']}"], cwd=dest, capture_output=True,
                              text=True, check=False)

    out = attempt()
    if out.returncode != 0 and os.geteuid() == 0:  # the package lists may be missing or old: fetch them once
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True, check=False)
        out = attempt()
    deb = dest / pin["file"]
    if out.returncode != 0 or not deb.exists():
        raise PerfAnalyzerError(f"apt-get download {name}={pin['version']} failed (exit {out.returncode}): "
                                f"{(out.stderr or out.stdout)[-1500:]} (the pin is Debian 12 bookworm's; "
                                f"run `apt-get update` as root, or change PINS in bench/perf_analyzer.py)")
    got = _sha256(deb)
    if got != pin["sha256"]:
        raise PerfAnalyzerError(f"{deb.name}: sha256 {got}, pinned {pin['sha256']}")
    return deb


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.perf_analyzer [ARGS]`: runs perf_analyzer with ARGS (none: prints where it is, and its
    version)."""
    args = sys.argv[1:] if argv is None else argv
    pa = ensure()
    if not args:
        print(f"{pa.binary}\n{pa.version()}\nLD_LIBRARY_PATH={pa.env()['LD_LIBRARY_PATH']}")
        return 0
    return subprocess.run(pa.command(args), env=pa.env(), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
