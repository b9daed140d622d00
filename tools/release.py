"""`make release` and `make release-push`: a release's artifacts under dist/, and their push to an OCI registry.

`build` writes, for the version `triton_operator.__version__` (the chart's `version` and `appVersion` must equal it:
`make set-version`):

- `triton-operator-<v>.oci.tar`: the operator image as an OCI archive, built as the test clusters' image is
  (e2e/images.py: buildah, vfs, the cache) but with SOURCE_DATE_EPOCH = the commit's time (`build_release`), so two
  builds of one commit give the same image digest, from a warm cache or an empty one;
- `triton-operator-<v>.tgz`: the chart (`helm package`);
- the wheel and the sdist (`python -m build`);
- `triton-operator-<v>.spdx.json`: the image's SBOM (SPDX JSON) written by syft (e2e/toolchain/syft) from the archive;
- `SHA256SUMS` over all of them (`sha256sum -c SHA256SUMS` checks them).

`previous` builds the release before this tree's (tools/previous.py's `PREVIOUS`: CHANGELOG.md's [0.1.0], the tree at its commit) from
that commit (`git archive`): its operator image as its own tree built it (`e2e.images.build_previous`) and its chart
package (`helm package`), cached under `<cache>/releases/<version>-<key>/` (`previous_release`; the key hashes the
commit and the build's inputs). `make prebuild` runs it, in the host's network namespace (the image's wheels come from
the package index); e2e/test_upgrade.py only reads the cache.

`push` pushes the image by digest, tagged with the version, to `<registry>/triton-operator` (crane, from an OCI image
layout: the registry gets the archive's very manifest), and the chart to `oci://<registry>/charts` (`helm push`),
then reads both back from the registry. With no `--registry` it starts the local registry (e2e/toolchain/registry:
go-containerregistry's, on a free 127.0.0.1 port, in memory) for the push and the check, and stops it after.

Every step logs what it does; a step that fails ends the run with one line naming it (`ReleaseError`).

    python tools/release.py build [--dist DIR]
    python tools/release.py push [--dist DIR] [--registry HOST:PORT]
    python tools/release.py registry [--port N]        # the local registry, in the foreground
    python tools/release.py previous                   # the previous release, built into the cache once
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from e2e import images  # noqa: E402
from tools.previous import PREVIOUS  # noqa: E402
from tools.registry_layout import CHART_REPOSITORY, IMAGE_REPOSITORY  # noqa: E402

CHART_DIR = ROOT / "charts" / "triton-operator"
INIT = ROOT / "operator" / "triton_operator" / "__init__.py"
TOOLCHAIN = ROOT / "e2e" / "toolchain"


class ReleaseError(RuntimeError):
    """An expected failure: the message says which step failed and why (no traceback)."""


def log(message: str) -> None:
    print(f"[release] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Release:
    """The artifacts of one version in one dist directory."""

    version: str
    dist: Path

    @property
    def image(self) -> Path:
        return self.dist / f"triton-operator-{self.version}.oci.tar"

    @property
    def chart(self) -> Path:
        return self.dist / f"triton-operator-{self.version}.tgz"

    @property
    def sbom(self) -> Path:
        return self.dist / f"triton-operator-{self.version}.spdx.json"

    @property
    def sums(self) -> Path:
        return self.dist / "SHA256SUMS"


# -- small helpers -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    """Logs a step's start and duration; turns any failure inside it into a ReleaseError naming the step."""
    t0 = time.monotonic()
    log(f"Step started step={name}")
    try:
        yield
    except ReleaseError:
        raise
    except (images.BuildError, subprocess.CalledProcessError, OSError, ValueError) as e:
        if isinstance(e, subprocess.CalledProcessError):  # the command and the end of what it said
            detail = f"{' '.join(e.cmd[:3])}... exit {e.returncode}: {str(e.stderr).strip()[-2000:]}"
        else:
            detail = str(e)
        raise ReleaseError(f"step {name} failed: {detail}") from e
    log(f"Step done step={name} seconds={time.monotonic() - t0:.1f}")


def run(argv: Sequence[str | Path], env: dict[str, str] | None = None, cwd: Path | None = None,
        stderr_too: bool = False) -> str:
    """Runs a command, returns its stdout (`stderr_too`: and its stderr); CalledProcessError (with stderr) when it
    fails."""
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False, cwd=cwd,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, [str(a) for a in argv], proc.stdout,
                                            proc.stderr or proc.stdout)
    return proc.stdout + proc.stderr if stderr_too else proc.stdout


def toolchain(script: str, *args: str) -> Path:
    """A directory of Go binaries built (once, cached by their pins) by one of e2e/toolchain's build scripts."""
    return Path(run(["bash", TOOLCHAIN / script, *args]).strip())


def helm() -> Path:
    return toolchain("build.sh", "helm") / "helm"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def version() -> str:
    """`__version__`, checked against the chart's `version` and `appVersion` (one version, one release)."""
    found = re.search(r'^__version__ = "([^"]+)"$', INIT.read_text(), re.M)
    chart = (CHART_DIR / "Chart.yaml").read_text()
    chart_version = re.search(r"^version:\s*['\"]?([^'\"\s]+)", chart, re.M)
    app_version = re.search(r"^appVersion:\s*['\"]?([^'\"\s]+)", chart, re.M)
    if not found:
        raise ReleaseError(f"step version failed: no __version__ in {INIT}")
    v = found.group(1)
    seen = (chart_version.group(1) if chart_version else None, app_version.group(1) if app_version else None)
    if seen != (v, v):
        raise ReleaseError(f"step version failed: Chart.yaml says version={seen[0]} appVersion={seen[1]}, "
                           f"__version__ is {v}: run `make set-version V={v}`")
    return v


def source_date_epoch() -> int:
    """SOURCE_DATE_EPOCH when set, else the time of the commit checked out (the same for every build of it)."""
    explicit = os.environ.get("SOURCE_DATE_EPOCH")
    if explicit:
        return int(explicit)
    if run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT).strip():
        log("Working tree has uncommitted changes: the artifacts are not those of the commit")
    return int(run(["git", "log", "-1", "--format=%ct"], cwd=ROOT).strip())


def place(src: Path, dst: Path) -> None:
    """`src` at `dst` (a hard link where the file system allows, else a copy), replacing what was there."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


# -- build ----------------------------------------------------------------------------------------------


def build_image(release: Release, epoch: int) -> str:
    """The release's operator image into dist/ as an OCI archive; returns its manifest digest."""
    image = images.build_release(epoch, log=lambda m: log(m.removeprefix("[images] ")))
    place(image.archive, release.image)
    digest = images.archive_digest(release.image)
    log(f"Wrote image archive path={release.image} digest={digest} "
        f"size_mb={release.image.stat().st_size / 1e6:.0f} source_date_epoch={epoch}")
    return digest


def build_chart(release: Release, chart_dir: Path = CHART_DIR) -> Path:
    """`helm package` of the chart into dist/ (its version and appVersion are the release's)."""
    out = run([helm(), "package", chart_dir, "--destination", release.dist])
    if not release.chart.is_file():
        raise ReleaseError(f"step chart failed: helm package wrote no {release.chart.name}: {out.strip()}")
    log(f"Wrote chart path={release.chart} size_kb={release.chart.stat().st_size / 1e3:.0f}")
    return release.chart


def build_python(release: Release, epoch: int) -> list[Path]:
    """The sdist, then the wheel built from it (`python -m build`, isolated build environments: no build/ left in
    the checkout), their files' times at `epoch`."""
    before = set(release.dist.glob("triton_operator-*"))
    for old in before:
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="release-build-") as tmp:
        out = Path(tmp)
        run([sys.executable, "-m", "build", "--outdir", out, ROOT],
            env={"SOURCE_DATE_EPOCH": str(epoch)})
        made = sorted(out.glob(f"triton_operator-{release.version}*"))
        if len(made) != 2:
            raise ReleaseError(f"step python failed: expected a wheel and an sdist, found {[p.name for p in made]}")
        for p in made:
            shutil.move(p, release.dist / p.name)
    written = sorted(release.dist / p.name for p in made)
    for p in written:
        log(f"Wrote Python package path={p} size_kb={p.stat().st_size / 1e3:.0f}")
    return written


def build_sbom(release: Release) -> Path:
    """The image's SBOM, SPDX JSON, by syft from the OCI archive (no registry, no daemon)."""
    syft = toolchain("syft/build.sh") / "syft"
    tmp = release.sbom.with_name(release.sbom.name + ".tmp")
    run([syft, "scan", f"oci-archive:{release.image}", "--quiet", "--output", f"spdx-json={tmp}",
         "--source-name", "triton-operator", "--source-version", release.version],
        env={"SYFT_CHECK_FOR_APP_UPDATE": "false"})
    os.replace(tmp, release.sbom)
    log(f"Wrote SBOM path={release.sbom} format=spdx-json size_kb={release.sbom.stat().st_size / 1e3:.0f}")
    return release.sbom


def write_sums(release: Release, artifacts: Sequence[Path]) -> Path:
    """SHA256SUMS in sha256sum's format over `artifacts` (names relative to dist/)."""
    lines = [f"{sha256(p)}  {p.name}\n" for p in sorted(artifacts)]
    release.sums.write_text("".join(lines))
    log(f"Wrote checksums path={release.sums} files={len(lines)}")
    return release.sums


def build(dist: Path) -> Release:
    """Every artifact of the current version into `dist`."""
    with step("version"):
        release = Release(version(), dist)
        epoch = source_date_epoch()
        dist.mkdir(parents=True, exist_ok=True)
        log(f"Building release version={release.version} dist={dist} source_date_epoch={epoch}")
    with step("image"):
        build_image(release, epoch)
    with step("chart"):
        build_chart(release)
    with step("python"):
        wheels = build_python(release, epoch)
    with step("sbom"):
        build_sbom(release)
    with step("checksums"):
        write_sums(release, [release.image, release.chart, *wheels, release.sbom])
    return release


# -- the previous release ---------------------------------------------------------------------------------


def previous_release(previous: tuple[str, str] = PREVIOUS) -> Release:
    """Where `build_previous` keeps the previous release's image archive and chart package (they may not be there
    yet: `make prebuild`)."""
    version, commit = previous
    return Release(version, images.cache_root() / "releases" / f"{version}-{images.previous_key(commit)}")


def build_previous(previous: tuple[str, str] = PREVIOUS) -> Release:
    """The previous release's operator image and chart from its commit, unless the cache has them; returns where."""
    version, commit = previous
    release = previous_release(previous)
    if release.image.is_file() and release.chart.is_file():
        log(f"Previous release cached version={version} commit={commit[:12]} dir={release.dist}")
        return release
    t0 = time.monotonic()
    with step("previous"), tempfile.TemporaryDirectory(prefix="release-previous-") as tmp:
        tree, dist = Path(tmp) / "tree", Path(tmp) / "dist"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        image = images.build_previous(tree, commit, log=lambda m: log(m.removeprefix("[images] ")))
        staged = Release(version, dist)
        dist.mkdir()
        place(image.archive, staged.image)
        build_chart(staged, tree / "charts" / "triton-operator")
        release.dist.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(release.dist, ignore_errors=True)
        os.rename(dist, release.dist)
    log(f"Built previous release version={version} commit={commit[:12]} dir={release.dist} "
        f"digest={images.archive_digest(release.image)} seconds={time.monotonic() - t0:.1f}")
    return release


# -- the registry and the push -----------------------------------------------------------------------------


def registry_bin() -> Path:
    return toolchain("registry/build.sh")


def is_loopback(registry: str) -> bool:
    host = registry.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@contextlib.contextmanager
def local_registry(port: int = 0, blobs: Path | None = None) -> Iterator[str]:
    """go-containerregistry's registry on 127.0.0.1 (`port` 0: a free one) while the block runs; yields HOST:PORT."""
    argv: list[str | Path] = [registry_bin() / "local-registry", "-addr", f"127.0.0.1:{port}", "-quiet"]
    if blobs is not None:
        argv += ["-blobs", blobs]
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed once the socket listens; empty if it exited
        found = re.match(r"listening on (127\.0\.0\.1:\d+)", first)
        if not found:
            proc.kill()
            err = proc.stderr.read() if proc.stderr else ""
            raise ReleaseError(f"step registry failed: local-registry did not start: {first}{err}".strip())
        yield found.group(1)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def push_image(archive: Path, registry: str, tag: str) -> str:
    """Pushes the archive's image to `<registry>/triton-operator:<tag>` with crane from its OCI image layout (so the
    registry holds the archive's own manifest); returns the digest the registry reports for the tag."""
    crane = registry_bin() / "crane"
    ref = f"{registry}/{IMAGE_REPOSITORY}:{tag}"
    insecure = ["--insecure"] if is_loopback(registry) else []
    with tempfile.TemporaryDirectory(prefix="release-layout-") as layout:
        with tarfile.open(archive) as tar:
            tar.extractall(layout, filter="data")
        run([crane, "push", *insecure, layout, ref])
    pushed = run([crane, "digest", *insecure, ref]).strip()
    want = images.archive_digest(archive)
    if pushed != want:
        raise ReleaseError(f"step push-image failed: {ref} has digest {pushed}, the archive {want}")
    log(f"Pushed image ref={registry}/{IMAGE_REPOSITORY}@{pushed} tag={tag}")
    return pushed


def push_chart(chart: Path, registry: str) -> str:
    """`helm push` of the packaged chart to oci://<registry>/charts; returns the chart's reference there."""
    plain = ["--plain-http"] if is_loopback(registry) else []
    out = run([helm(), "push", chart, f"oci://{registry}/{CHART_REPOSITORY}", *plain], stderr_too=True)
    found = re.search(r"Digest:\s*(sha256:[0-9a-f]{64})", out)
    ref = f"oci://{registry}/{CHART_REPOSITORY}/triton-operator"
    log(f"Pushed chart ref={ref} digest={found.group(1) if found else '?'}")
    return ref


def pull_chart(registry: str, chart_version: str, dest: Path) -> Path:
    """`helm pull` of the chart back from the registry into `dest`; returns the file."""
    plain = ["--plain-http"] if is_loopback(registry) else []
    run([helm(), "pull", f"oci://{registry}/{CHART_REPOSITORY}/triton-operator", "--version", chart_version,
         "--destination", dest, *plain])
    return dest / f"triton-operator-{chart_version}.tgz"


def push(release: Release, registry: str) -> str:
    """The release's image and chart to `registry`, each read back and compared; returns the image digest."""
    for p in (release.image, release.chart):
        if not p.is_file():
            raise ReleaseError(f"step push failed: {p} is missing: run `make release` first")
    with step("push-image"):
        digest = push_image(release.image, registry, release.version)
    with step("push-chart"):
        push_chart(release.chart, registry)
    with step("check-chart"), tempfile.TemporaryDirectory(prefix="release-pull-") as tmp:
        pulled = pull_chart(registry, release.version, Path(tmp))
        if sha256(pulled) != sha256(release.chart):
            raise ReleaseError(f"step check-chart failed: the chart pulled from {registry} differs from "
                               f"{release.chart}")
        log(f"Pulled chart back, identical path={release.chart.name}")
    log(f"Release pushed registry={registry} image={registry}/{IMAGE_REPOSITORY}:{release.version}@{digest} "
        f"chart=oci://{registry}/{CHART_REPOSITORY}/triton-operator:{release.version}")
    return digest


def serve(port: int) -> None:
    """The local registry in the foreground until interrupted."""
    with local_registry(port) as address:
        log(f"Registry listening address={address} (in memory; Ctrl-C stops it)")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


# -- CLI --------------------------------------------------------------------------------------------------


def _dispatch(args: argparse.Namespace) -> None:
    if args.command == "build":
        build(args.dist)
    elif args.command == "registry":
        serve(args.port)
    elif args.command == "previous":
        print(build_previous().dist)
    elif args.registry:
        push(Release(version(), args.dist), args.registry)
    else:
        with local_registry() as address:
            log(f"Started the local registry for this push address={address}; it stops after the push "
                "(`make registry` keeps one running)")
            push(Release(version(), args.dist), address)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/release.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "push"):
        p = sub.add_parser(name)
        p.add_argument("--dist", type=Path, default=ROOT / "dist")
    sub.choices["push"].add_argument("--registry", default="", help="HOST:PORT (default: a local one, for the push)")
    sub.add_parser("registry").add_argument("--port", type=int, default=5000)
    sub.add_parser("previous", help="build the previous release (PREVIOUS) into the cache, once; print its dir")
    args = parser.parse_args(argv)
    try:
        _dispatch(args)
    except ReleaseError as e:
        log(f"Failed: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
