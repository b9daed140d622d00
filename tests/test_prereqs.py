"""tools/prereqs.sh, which `make demo`, `make test` and `.ci/run` run before anything is built (issue 28): on a PATH
without the cluster's tools it names the missing Debian packages and the command that installs them, in one line; as
root it installs them with apt-get first; `make demo` stops there when they cannot be had, before any build.

apt-get here is a stand-in on the test's PATH that records its arguments: the real one would install packages on
this machine, which already has them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "prereqs.sh"
#: What the script checks by a file rather than a command: a PATH cannot hide these.
BY_FILE = {"containernetworking-plugins": "/usr/lib/cni/bridge", "libc6-dev": "/usr/include/stdio.h"}


def _missing(*packages: str) -> list[str]:
    """The packages a PATH without their commands lacks, on this machine (files are where they are)."""
    return [p for p in packages if not (p in BY_FILE and os.path.exists(BY_FILE[p]))]


DEMO = ("iproute2", "make", "gcc", "libc6-dev", "util-linux", "containerd", "runc", "containernetworking-plugins",
        "iptables", "conntrack", "buildah", "mmdebstrap")


def _path_with(tmp_path: Path, *tools: str, apt_get: str | None = None) -> Path:
    """A PATH directory holding only the named tools of this machine (and a recording apt-get, if given)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("bash", *tools):
        found = shutil.which(tool)
        assert found, f"this machine has no {tool}"
        (bin_dir / tool).symlink_to(os.path.realpath(found))
    # The real interpreter, not a version manager's shim (a script that needs more than this PATH has).
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    if apt_get is not None:
        (bin_dir / "apt-get").write_text(apt_get)
        (bin_dir / "apt-get").chmod(0o755)
    return bin_dir


def _run(argv: list[str], bin_dir: Path, *, user: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(bin_dir), "HOME": "/tmp", "LANG": "C.UTF-8"}
    prefix: list[str] = []
    if user is not None:
        setpriv = shutil.which("setpriv")
        assert setpriv, "util-linux's setpriv is needed to run as another user"
        prefix = [setpriv, f"--reuid={user}", f"--regid={user}", "--clear-groups"]
    return subprocess.run([*prefix, *argv], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)


def _package_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "missing Debian packages:" in line]
    assert len(lines) == 1, f"expected one line naming the missing packages:\n{stderr}"
    return lines[0]


def test_check_on_a_path_without_the_tools_names_every_missing_package_and_the_command(tmp_path: Path) -> None:
    bin_dir = _path_with(tmp_path, "go")
    proc = _run([str(bin_dir / "bash"), str(SCRIPT), "--check", "test"], bin_dir)
    assert proc.returncode == 1, proc.stderr
    line = _package_line(proc.stderr)
    packages = _missing(*DEMO, "lua5.4")
    assert line == ("prerequisites: missing Debian packages: " + " ".join(packages)
                    + "; install them with: sudo apt-get install -y " + " ".join(packages)), line
    assert "Traceback" not in proc.stderr and not proc.stdout


def test_demo_needs_no_lua_and_the_check_passes_when_everything_is_there(tmp_path: Path) -> None:
    bin_dir = _path_with(tmp_path, "go")
    demo = _run([str(bin_dir / "bash"), str(SCRIPT), "--check", "demo"], bin_dir)
    assert "lua5.4" not in _package_line(demo.stderr)
    tools = ("ip", "make", "gcc", "unshare", "containerd", "runc", "iptables", "conntrack", "buildah", "mmdebstrap")
    if not all(shutil.which(t) for t in tools) or _missing(*BY_FILE):
        pytest.skip("this machine lacks some of the demo's tools")
    full = _path_with(tmp_path / "full", "go", *tools)
    proc = _run([str(full / "bash"), str(SCRIPT), "--check", "demo"], full)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_as_root_it_installs_exactly_the_missing_packages_with_apt_get(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("installs as root only")
    log = tmp_path / "apt-get.log"
    bin_dir = _path_with(tmp_path, "go", apt_get=f'#!{os.path.realpath(shutil.which("bash") or "")}\necho "$*" >> {log}\n')
    proc = _run([str(bin_dir / "bash"), str(SCRIPT), "demo"], bin_dir)
    calls = log.read_text().splitlines()
    assert calls[0] == "update -qq", calls
    assert calls[1].split() == ["install", "-y", "-qq", *_missing(*DEMO)], calls
    # The recording apt-get installed nothing, and the script says nothing more of packages: they count as installed.
    assert "installing the missing Debian packages" in proc.stderr
    assert "prerequisites: missing Debian packages" not in proc.stderr, proc.stderr


def test_not_root_it_installs_nothing_and_says_what_to_run(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to another user")
    log = tmp_path / "apt-get.log"
    bin_dir = _path_with(tmp_path, "go", apt_get=f'#!{os.path.realpath(shutil.which("bash") or "")}\necho "$*" >> {log}\n')
    tmp_path.chmod(0o755)
    proc = _run([str(bin_dir / "bash"), str(SCRIPT), "demo"], bin_dir, user=65534)
    assert proc.returncode == 1
    assert not log.exists(), "apt-get ran for a user who is not root"
    assert _package_line(proc.stderr).endswith("sudo apt-get install -y " + " ".join(_missing(*DEMO))), proc.stderr
    assert "needs root" in proc.stderr


def test_make_demo_stops_at_the_check_before_any_build(tmp_path: Path) -> None:
    """A failed install stops `make demo` before the venv, the Go binaries or the images: no quarter of an hour of
    builds that then dies on a missing mmdebstrap."""
    if os.geteuid() != 0:
        pytest.skip("installs as root only")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    shutil.copy(SCRIPT, clone / "tools" / "prereqs.sh")  # the working tree's script, committed or not
    shutil.copy(REPO / "Makefile", clone / "Makefile")
    bin_dir = _path_with(tmp_path, "go", "make", "sh", "cat", "sha256sum", "cut",
                         apt_get='#!/bin/sh\necho "E: Unable to locate package" >&2\nexit 100\n')
    proc = subprocess.run(["make", "--no-print-directory", "demo"], cwd=clone, capture_output=True, text=True,
                          timeout=120, env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "prerequisites: apt-get could not install" in out, out
    assert not (clone / ".venv").exists(), f"the venv was built before the check failed:\n{out}"
    assert "[cluster-bin]" not in out and "pip install" not in out, out
