"""e2e/node.py's garbage collection of node state (`gc_state_roots`), on directories of a test's own: what a
cluster whose directory is gone leaves in `/var/lib/trop` goes, anything else stays.

Beside the harness it tests; no marker, so `make unit` runs it (the unit tier, tests/, imports no harness
module)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e import node
from tests.timing import scaled


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(node, "STATE_BASE", tmp_path / "trop")
    (tmp_path / "trop").mkdir()
    return tmp_path / "trop"


def _root(base: Path, owner: Path | None, idle_days: float = 8.0) -> Path:
    root = node.state_root(owner) if owner is not None else base / "cccc"  # named as `state_root` names it
    (root / "gpu-node-1" / "containerd" / "root").mkdir(parents=True)
    (root / "gpu-node-1" / "containerd" / "root" / "blob").write_bytes(b"x" * 1024)
    if owner is not None:
        (root / node.OWNER_FILE).write_text(f"{owner}\n")
        then = time.time() - idle_days * 86400  # when a node last started from it
        os.utime(root / node.OWNER_FILE, (then, then))
    return root


def test_the_state_of_a_cluster_whose_directory_is_gone_is_removed_and_nothing_else(base: Path, tmp_path: Path) -> None:
    live_dir = tmp_path / "checkout" / ".cluster"
    live_dir.mkdir(parents=True)
    live = _root(base, live_dir)
    orphan = _root(base, tmp_path / "deleted-checkout" / ".cluster")
    legacy = _root(base, None)
    # A fresh clone at a path used before has no cluster directory until its cluster starts: kept while recent.
    recent = _root(base, tmp_path / "recloned" / ".cluster", idle_days=1)

    assert node.gc_state_roots() == [orphan]
    assert recent.exists()
    assert not orphan.exists()
    assert (live / "gpu-node-1" / "containerd" / "root" / "blob").exists()
    assert legacy.exists(), "a root without an owner file is not ours to judge"
    assert node.gc_state_roots() == []


def test_a_root_still_in_use_stays_even_if_its_directory_is_gone(base: Path, tmp_path: Path) -> None:
    orphan = _root(base, tmp_path / "gone" / ".cluster")
    # A process naming the root on its command line, as containerd and the kubelet do (--config <root>/...).
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(60)", f"{orphan}/gpu-node-1/x"])
    try:
        # The premise first: the process shows the root in /proc (a CI run under load once saw the collection
        # remove the root here; whether the premise held then is not known).
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        deadline = time.monotonic() + scaled(10)
        while str(orphan) not in cmdline.read_bytes().decode(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert str(orphan) in cmdline.read_bytes().decode(errors="replace"), "the process never showed the root"
        assert node.leftovers(tmp_path / "gone" / ".cluster"), "leftovers() does not see the process"
        assert node.gc_state_roots() == []
        assert orphan.exists()
    finally:
        proc.kill()
        proc.wait()
    assert node.gc_state_roots() == [orphan]


def test_a_node_records_its_cluster_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base: Path) -> None:
    cluster_dir = tmp_path / "c" / ".cluster"
    cluster_dir.mkdir(parents=True)
    n = node.Node("gpu-node-1", node.NodeNetwork("abcd", 0, 200), 4, cluster_dir, 1, 2)
    monkeypatch.setattr(node.NodeNetwork, "up", lambda self: None)
    monkeypatch.setattr(node.Node, "_cgroups_up", lambda self: None)
    monkeypatch.setattr(node, "overlay_supported", lambda d: False)
    n.prepare(tmp_path / "pki", "pause:1")
    assert (node.state_root(cluster_dir) / node.OWNER_FILE).read_text().strip() == str(cluster_dir.resolve())


def test_a_checkouts_own_state_is_kept_by_preflight_and_removed_at_its_end(base: Path, tmp_path: Path) -> None:
    checkout = tmp_path / "ci-checkout"
    # Its worker's cluster directory not made yet (a fresh clone at a path used before): the preflight keeps it.
    own = _root(base, checkout / ".cluster" / "gw0" / ".cluster")
    own_second = _root(base, checkout / ".cluster" / "gw0" / ".cluster" / "upgrade" / ".cluster", idle_days=0)
    other = _root(base, tmp_path / "other-deleted" / ".cluster")
    other_live_dir = tmp_path / "other-live" / ".cluster"
    other_live_dir.mkdir(parents=True)
    other_live = _root(base, other_live_dir, idle_days=0)

    assert node.gc_state_roots(idle_days=1 / 24, keep_under=checkout) == [other]
    assert own.exists() and own_second.exists() and other_live.exists()

    checkout.mkdir()
    # The end of the CI run: its own roots go, recent or not, its directory there or not; another checkout's stay.
    assert sorted(node.gc_state_roots(owned_under=checkout)) == sorted([own, own_second])
    assert other_live.exists()
    assert node.gc_state_roots(owned_under=checkout) == []


def test_preflight_refuses_a_disk_that_cannot_hold_the_runs_clusters(base: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from e2e import cluster

    checkout = tmp_path / "checkout"
    warm = _root(base, cluster.worker_cluster_dirs(2, checkout)[0], idle_days=0)
    big = _root(base, tmp_path / "someone-elses" / ".cluster", idle_days=0)
    (big / "gpu-node-1" / "containerd" / "root" / "layer").write_bytes(b"y" * (1 << 20))
    free = cluster.shutil.disk_usage(base).free

    monkeypatch.setattr(cluster, "WORKER_WARM_BYTES", 0)
    monkeypatch.setattr(cluster, "WORKER_COLD_BYTES", free + (1 << 40))  # the one cold worker cannot fit
    with pytest.raises(RuntimeError) as refused:
        cluster.preflight(2, checkout)
    message = str(refused.value)
    assert "GiB free on the filesystem of" in message and "1 cold" in message and "1 warm" in message, message
    # The largest node state first, with the cluster directory it belongs to.
    assert message.index(str(big)) < message.index(str(warm)), message
    assert f"cluster directory {tmp_path / 'someone-elses' / '.cluster'}" in message, message
    assert "gc --idle-days 0" in message and "TEST_WORKERS" in message, message

    monkeypatch.setattr(cluster, "WORKER_COLD_BYTES", 0)
    cluster.preflight(2, checkout)  # fits: no error
    assert warm.exists() and big.exists(), "preflight removed state whose cluster may still use it"
