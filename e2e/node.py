"""Real Kubernetes nodes on this machine: containerd, a kubelet, our fake-GPU device plugin, and kube-proxy.

Owns everything a node needs below the API server and everything it leaves behind:

- `NodeNetwork`: the node's bridge (its address is the node IP and the pods' gateway), the host's
  `unreachable 198.18.0.0/15` guard route, the Service CIDR route and `net.ipv4.ip_forward`.
- `Node`: one containerd (own root, state, socket and CNI config), the images imported into it,
  one kubelet (own root dir, ports, `cgroupRoot`, pod log dir) built from the pinned
  `k8s.io/kubernetes` module, and `fake-gpu-plugin` advertising `nvidia.com/gpu` through the
  kubelet's device-plugin API; `teardown()` leaves no shim, mount, netns, cgroup or bridge behind.
- `KubeProxy`: one kube-proxy (iptables mode) for all nodes of a cluster (they share the host's
  network namespace); `cleanup` removes its KUBE-* rules.

Processes are started detached and recorded by `LocalCluster` in its pids file; this module only
builds their command lines, configs and the host state around them. Each kubelet and containerd
setting a node needs on this machine kind is set in `Node` below, with the reason beside it.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.timing import scaled

#: The reserved benchmarking range (RFC 2544): every address of a local cluster lies inside it.
TEST_RANGE = "198.18.0.0/15"
SERVICE_CIDR = "198.19.0.0/16"


def _subnet_blocks() -> tuple[int, ...]:
    """The blocks this process's clusters may use: 198.18.200-239.x on the host, four blocks of their own below
    that for each pytest-xdist worker of `make test` (gw0: 160-199, gw1: 120-159, ...). Workers run in network
    namespaces of their own and could share addresses, but the pod network namespaces they leave are all in the
    host's `/run/netns`, and a node's teardown finds its own by address (`Node._remove_netns`): a pod address is
    therefore unique on the machine."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not re.fullmatch(r"gw\d+", worker):
        return (200, 210, 220, 230)
    index = int(worker[2:])
    if index > 4:
        raise RuntimeError(f"xdist worker {worker}: at most 5 workers (gw0-gw4) have subnet blocks of their own")
    first = 160 - 40 * index
    return (first, first + 10, first + 20, first + 30)


#: Nodes of one cluster take consecutive /24s from a block; blocks of clusters running at once differ.
SUBNET_BLOCKS = _subnet_blocks()
CGROUP_ROOT = Path("/sys/fs/cgroup")
CNI_BIN = "/usr/lib/cni"
#: Labels NVIDIA's GPU feature discovery puts on a GPU node (the values describe a CPU stand-in).
GFD_LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "Tesla-T4-FAKE",
    "nvidia.com/gpu.memory": "15360",
    "nvidia.com/gpu.family": "turing",
    "nvidia.com/gpu.compute.major": "7",
    "nvidia.com/gpu.compute.minor": "5",
    "nvidia.com/gpu.machine": "triton-operator-e2e",
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/mig.capable": "false",
    "nvidia.com/gfd.timestamp": "0",
}


def log(msg: str) -> None:
    print(f"[node] {msg}", flush=True)


def run(argv: list[str], check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kw)


def short_id(path: Path) -> str:
    """Four hex digits naming a cluster directory in host-wide names (bridges, cgroups, state)."""
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:4]


#: Where every local cluster keeps its nodes' state, one short directory per cluster (`state_root`).
STATE_BASE = Path("/var/lib/trop")
#: In a cluster's state root: the cluster directory it belongs to, for `gc_state_roots`.
OWNER_FILE = "cluster-dir"


def state_root(cluster_dir: Path) -> Path:
    """Short host paths for node state: unix sockets must stay under 108 bytes."""
    return STATE_BASE / short_id(cluster_dir)


def _entered_netns() -> set[int]:
    """The inodes of every network namespace a process is in."""
    inodes = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                inodes.add(os.stat(proc / "ns" / "net").st_ino)
    return inodes


def gc_state_roots(idle_days: float = 7.0, *, keep_under: Path | None = None,
                   owned_under: Path | None = None) -> list[Path]:
    """Removes the node state of clusters whose directory is gone (a deleted checkout, a temporary root) and which no
    node has started from for `idle_days`: mostly each node's containerd image store, 1.2 to 2.1 GB a node (the images'
    layers and their unpacked snapshots), kept between runs of a cluster so that its next start imports nothing. A
    state root its cluster still uses (anything `leftovers` finds: a process, a mount, a bridge, a cgroup), or without
    an owner file (made before there was one), stays.

    `keep_under`: a root whose cluster directory lies under it stays too (`preflight` keeps its own checkout's, which
    its clusters are about to reuse). `owned_under`: instead, every root whose cluster directory lies under it goes,
    whether that directory is still there or not, however recently used (the end of a CI run, whose checkout is thrown
    away: its clusters' state could only serve a later clone at the very same path).

    Never run by `up`: a fresh clone at a path used before (a CI checkout) has no cluster directory until its cluster
    starts, and a collection racing that start removed the image store under a running containerd (seen in a CI
    rehearsal with three workers). The idle time keeps such a root."""
    removed: list[Path] = []
    owned_under = owned_under.resolve() if owned_under is not None else None
    keep_under = keep_under.resolve() if keep_under is not None else None
    for root, owner in state_roots():
        try:
            idle = time.time() - (root / OWNER_FILE).stat().st_mtime
        except OSError:
            continue
        if owner is None or state_root(owner) != root:
            continue
        if owned_under is not None:
            if not owner.is_relative_to(owned_under):
                continue
        elif owner.exists() or idle < idle_days * 86400 or (keep_under is not None and owner.is_relative_to(keep_under)):
            continue
        if leftovers(owner):  # last: it reads every process's command line
            continue
        shutil.rmtree(root, ignore_errors=True)
        removed.append(root)
    return removed


def state_roots() -> list[tuple[Path, Path | None]]:
    """Every state root, with the cluster directory its owner file names (None: it has none)."""
    found: list[tuple[Path, Path | None]] = []
    for root in sorted(STATE_BASE.iterdir()) if STATE_BASE.is_dir() else []:
        try:
            found.append((root, Path((root / OWNER_FILE).read_text().strip())))
        except OSError:
            found.append((root, None))
    return found


def state_roots_owned_under(directory: Path) -> dict[Path, Path]:
    """The state roots whose cluster directory lies under `directory`, by cluster directory."""
    directory = directory.resolve()
    return {owner: root for root, owner in state_roots()
            if owner is not None and owner.is_relative_to(directory) and state_root(owner) == root}


def disk_usage(path: Path) -> int:
    """Bytes allocated under `path`, as `du -sx` counts them (hard links once)."""
    proc = subprocess.run(["du", "-sxB1", str(path)], capture_output=True, text=True, check=False)
    with contextlib.suppress(ValueError, IndexError):
        return int(proc.stdout.split()[0])
    return 0


def _used_blocks() -> set[int]:
    out = run(["ip", "-4", "-o", "addr"], check=False).stdout
    return {int(m.group(1)) // 10 * 10 for m in re.finditer(r"inet 198\.18\.(\d+)\.1/24", out)}


def pick_block(preferred: int | None = None) -> int:
    """A block of /24s (198.18.<block+i>.0/24 for node i) no running cluster uses."""
    used = _used_blocks()
    if preferred is not None and preferred not in used:
        return preferred
    for block in SUBNET_BLOCKS:
        if block not in used:
            return block
    raise RuntimeError(f"every subnet block {SUBNET_BLOCKS} of {TEST_RANGE} is in use by another local cluster")


@dataclass(frozen=True)
class NodeNetwork:
    """The node's bridge and subnet: 198.18.<third>.0/24, the bridge holding .1 (the node IP)."""

    cluster_id: str
    index: int
    third: int

    @property
    def bridge(self) -> str:
        return f"trop{self.cluster_id}n{self.index}"  # IFNAMSIZ: 15

    @property
    def ip(self) -> str:
        return f"198.18.{self.third}.1"

    @property
    def subnet(self) -> str:
        return f"198.18.{self.third}.0/24"

    @property
    def mac(self) -> str:
        """The bridge's own MAC: locally administered, from the cluster id, the node index and the subnet.

        A Linux bridge without an address of its own takes the lowest MAC of its ports and changes it when
        that port goes, i.e. whenever that pod's veth is deleted. The node IP (every pod's gateway, the source
        of the kubelet's probes) then answers under a new MAC and the node's other pods must re-learn it. On
        this machine they do at once (an ARP exchange updates them), but a node must not depend on it: an
        address set explicitly stays.
        """
        return f"02:74:{self.cluster_id[:2]}:{self.cluster_id[2:4]}:{self.index:02x}:{self.third:02x}"

    def up(self) -> None:
        if run(["ip", "link", "show", self.bridge], check=False).returncode != 0:
            run(["ip", "link", "add", self.bridge, "address", self.mac, "type", "bridge"])
        # Also on a bridge left by an earlier run: its address must be set, not inherited from a port.
        run(["ip", "link", "set", self.bridge, "address", self.mac])
        if self.ip not in run(["ip", "-4", "-o", "addr", "show", "dev", self.bridge]).stdout:
            run(["ip", "addr", "add", f"{self.ip}/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        host_routes_up(self.bridge)

    def down(self) -> None:
        # Each pod's veth first: deleting one end removes the pair at once. A veth left on the bridge outlives it,
        # with no master, until the kernel finishes tearing down its pod's network namespace (seen: a minute, while
        # orphaned TCP sockets in that namespace timed out).
        ports = run(["ip", "-o", "link", "show", "master", self.bridge], check=False).stdout
        for veth in re.findall(r"^\d+: ([^:@\s]+)", ports, re.M):
            run(["ip", "link", "del", veth], check=False)
        run(["ip", "link", "del", self.bridge], check=False)


def host_routes_up(bridge: str) -> None:
    """The guard route (nothing in the test range ever follows the default route), the Service CIDR
    route (a local connect() looks a route up before kube-proxy's DNAT) and forwarding between bridges."""
    routes = run(["ip", "-4", "route", "show", "table", "main"]).stdout
    if "unreachable 198.18.0.0/15" not in routes:
        run(["ip", "route", "add", "unreachable", TEST_RANGE])
    if f"{SERVICE_CIDR} dev" not in routes:
        run(["ip", "route", "add", SERVICE_CIDR, "dev", bridge])
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")


def host_routes_down() -> None:
    """Removes the Service CIDR route once no bridge of any local cluster is left. The guard route stays: nothing
    sent to the test range may ever leave the machine, also between clusters and after the last one."""
    links = run(["ip", "-o", "link", "show", "type", "bridge"], check=False).stdout
    if re.search(r"\btrop[0-9a-f]{4}n\d+\b", links):
        # Another cluster's bridge: it still needs the guard; the Service route may point at a gone bridge.
        routes = run(["ip", "-4", "route", "show", SERVICE_CIDR], check=False).stdout
        if not routes.strip():
            bridge = re.search(r"\b(trop[0-9a-f]{4}n\d+)\b", links)
            if bridge:
                run(["ip", "route", "add", SERVICE_CIDR, "dev", bridge.group(1)], check=False)
        return
    run(["ip", "route", "del", SERVICE_CIDR], check=False)
    Path("/proc/sys/net/ipv4/ip_forward").write_text("0\n")



_OVERLAY: dict[str, bool] = {}


def overlay_supported(directory: Path) -> bool:
    """Whether an overlay mount works on `directory`'s filesystem (it does not on every machine: an overlay
    root filesystem cannot be an overlay's upper directory, some sandboxes refuse the mount). Tried once per
    directory and process, in a scratch directory that is removed afterwards."""
    key = str(directory)
    if key not in _OVERLAY:
        directory.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".overlay-probe-", dir=directory))
        try:
            for sub in ("lower", "upper", "work", "merged"):
                (scratch / sub).mkdir()
            opts = f"lowerdir={scratch / 'lower'},upperdir={scratch / 'upper'},workdir={scratch / 'work'}"
            mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(scratch / "merged")],
                                     capture_output=True).returncode == 0
            if mounted:
                subprocess.run(["umount", str(scratch / "merged")], capture_output=True)
            _OVERLAY[key] = mounted
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return _OVERLAY[key]

@dataclass
class Node:
    """One real node: containerd + kubelet + device plugin, under `state_root(cluster_dir)/<name>`."""

    name: str
    network: NodeNetwork
    gpus: int
    cluster_dir: Path
    kubelet_port: int
    healthz_port: int
    #: The kubelet's version (vX.Y.Z, from `kubelet --version`); empty: the release every test runs. Its config
    #: leaves out what that release does not know.
    kubernetes: str = ""

    # -- paths ------------------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return state_root(self.cluster_dir) / self.name

    @property
    def containerd_address(self) -> str:
        return str(self.root / "containerd.sock")

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs_dir(self) -> Path:
        return self.root / "pod-logs"

    @property
    def cgroup_name(self) -> str:
        return f"trop{self.network.cluster_id}n{self.network.index}"

    @property
    def logs(self) -> Path:
        return self.cluster_dir / "logs"

    @property
    def ip(self) -> str:
        return self.network.ip

    @property
    def snapshotter(self) -> str:
        """containerd's snapshotter: overlayfs where the node's filesystem can carry overlay mounts, else native.

        native copies the whole image into a new directory for every container (about 1 GB for tritonserver,
        containerd busy at 100% of a core for tens of seconds per replica start on this machine kind);
        overlayfs mounts the image's layers read-only under a per-container upper directory, as real nodes do.
        """
        return "overlayfs" if overlay_supported(self.root) else "native"

    def kube_at_least(self, major: int, minor: int) -> bool:
        """The node's kubelet is release major.minor or newer (the release every test runs, when unknown)."""
        if not self.kubernetes:
            return True
        have = tuple(int(x) for x in self.kubernetes.removeprefix("v").split(".")[:2])
        return have >= (major, minor)

    # -- configuration ------------------------------------------------------------------------------

    def prepare(self, pki: Path, pause_image: str) -> None:
        """Bridge, cgroups and the config files of containerd, CNI and the kubelet."""
        self.network.up()
        for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "certs.d"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (state_root(self.cluster_dir) / OWNER_FILE).write_text(f"{self.cluster_dir.resolve()}\n")
        self._cgroups_up()
        self._image_store_for(self.snapshotter)
        (self.root / "containerd.toml").write_text(self._containerd_config(pause_image))
        # No registry is reachable from here, and no pull may try one: every registry host resolves to a
        # closed loopback port, so a missing image fails at once (ErrImagePull) instead of leaving the machine.
        # The `host` table is needed: containerd 1.6 refuses a hosts.toml without one ("invalid `host` tree") and
        # falls back to its defaults (docker.io's registry over HTTPS; plain HTTP to any loopback registry). A
        # registry a test serves gets a directory of its own (e2e/test_install_from_registry.py).
        (self.root / "certs.d/_default").mkdir(parents=True, exist_ok=True)
        (self.root / "certs.d/_default/hosts.toml").write_text(
            'server = "http://127.0.0.1:1"\n\n[host."http://127.0.0.1:1"]\n  capabilities = ["pull", "resolve"]\n')
        (self.root / "cni/net.d/10-trop.conflist").write_text(json.dumps(self._cni_config(), indent=2) + "\n")
        (self.root / "kubelet.yaml").write_text(json.dumps(self._kubelet_config(pki), indent=2) + "\n")

    def _image_store_for(self, snapshotter: str) -> None:
        """containerd's root (its image store, kept between runs) unpacked for another snapshotter is dropped:
        the images are imported again, once, rather than kept twice."""
        store = self.root / "containerd" / "root"
        marker = self.root / "containerd" / "snapshotter"
        if store.exists() and (not marker.exists() or marker.read_text().strip() != snapshotter):
            shutil.rmtree(store, ignore_errors=True)
        marker.write_text(snapshotter + "\n")

    def _containerd_config(self, pause_image: str) -> str:
        r = self.root
        return f"""version = 2
root = "{r}/containerd/root"
state = "{r}/containerd/state"
oom_score = 0
[grpc]
  address = "{self.containerd_address}"
[ttrpc]
  address = "{self.containerd_address}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{r}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{self.snapshotter}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{r}/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{r}/cni/net.d"
    max_conf_num = 1
"""

    def _cni_config(self) -> dict:
        net = self.network
        return {
            "cniVersion": "1.0.0",
            "name": f"trop-{net.cluster_id}-{self.name}",
            "plugins": [{
                "type": "bridge",
                "bridge": net.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": net.subnet, "gateway": net.ip}]],
                    # Pods get no default route: only the test range (pods, nodes, Services) is reachable.
                    "routes": [{"dst": TEST_RANGE}],
                    "dataDir": str(self.root / "cni/ipam"),
                },
            }],
        }

    def _kubelet_config(self, pki: Path) -> dict:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_name}",
            # cgroup v1 here: from 1.31 the kubelet refuses it unless told (the field is new in 1.31).
            **({"failCgroupV1": False} if self.kube_at_least(1, 31) else {}),
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_address}",
            "podLogsDir": str(self.pod_logs_dir),
            # No DNS server for pods: they reach nothing outside the test range anyway.
            "resolvConf": "",
            # Images are imported, never pulled: the kubelet must not garbage-collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # Nor may disk pressure make it delete them (its eviction manager frees the image filesystem by
            # removing every image no running container uses, the sandbox image included): a shared disk with
            # 2% free (5 GiB of 252) made every new pod of three clusters fail on a missing pause image. Absolute
            # thresholds, below which nothing would work anyway; e2e.cluster checks the free space before a start.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "256Mi", "imagefs.available": "256Mi",
                             "nodefs.inodesFree": "1%"},
            # ConfigMap volume updates reach pods on the pod's next sync.
            "syncFrequency": "10s",
            "nodeStatusUpdateFrequency": "4s",
            # The Lease is renewed every quarter of this: a stopped kubelet is noticed within seconds.
            "nodeLeaseDurationSeconds": 10,
            "serializeImagePulls": False,
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "protectKernelDefaults": False,
            "makeIPTablesUtilChains": True,
            "shutdownGracePeriod": "0s",
            "maxPods": 110,
        }

    def kubelet_args(self, kubeconfig: Path) -> list[str]:
        labels = {**GFD_LABELS, "nvidia.com/gpu.count": str(self.gpus)} if self.gpus else {}
        return [
            f"--config={self.root / 'kubelet.yaml'}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.kubelet_dir}",
            f"--cert-dir={self.kubelet_dir / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            *([f"--node-labels={','.join(f'{k}={v}' for k, v in labels.items())}"] if labels else []),
            f"--v={os.environ.get('TROP_KUBELET_V', '1')}",  # 4 traces its sync loop, probes and status writes
        ]

    def containerd_args(self) -> list[str]:
        return ["--config", str(self.root / "containerd.toml"), "--log-level", "warn"]

    def plugin_args(self) -> list[str]:
        return ["--registry-dir", str(self.kubelet_dir / "plugins_registry"), "--count", str(self.gpus),
                "--prefix", self.name]

    def wait_containerd(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + scaled(timeout)
        while run(["ctr", "--address", self.containerd_address, "version"], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"containerd of {self.name} did not answer on {self.containerd_address}")
            time.sleep(0.1)

    # -- cgroups ------------------------------------------------------------------------------------

    def _hierarchies(self, v2: bool = False) -> list[Path]:
        """The cgroup v1 hierarchies (and with `v2`, a hybrid host's unified one, where the kubelet also writes)."""
        out = []
        for line in Path("/proc/self/mounts").read_text().splitlines():
            _, mnt, fstype, *_ = line.split()
            if fstype == "cgroup" or (v2 and fstype == "cgroup2"):
                out.append(Path(mnt))
        return out

    def _cgroups_up(self) -> None:
        """`cgroupRoot` must exist in every v1 hierarchy before the kubelet starts; cpuset needs cpus and mems."""
        for h in self._hierarchies():
            d = h / self.cgroup_name
            d.mkdir(exist_ok=True)
            if (h / "cpuset.cpus").exists():
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (d / f).read_text().strip():
                        (d / f).write_text((h / f).read_text())

    def _cgroup_dirs(self) -> list[Path]:
        return [h / self.cgroup_name for h in self._hierarchies(v2=True) if (h / self.cgroup_name).is_dir()]

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for d in self._cgroup_dirs():
            # os.walk, not rglob: the kubelet and runc remove cgroups while we look, and a directory gone between
            # its listing and its scan is skipped (onerror=None) instead of failing the sweep (CI teardown error).
            for root, _dirs, files in os.walk(d):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError):
                        pids.update(int(p) for p in Path(root, "cgroup.procs").read_text().split())
        return pids

    # -- what tests look at ---------------------------------------------------------------------

    def ctr(self, *args: str, check: bool = True) -> str:
        return run(["ctr", "--address", self.containerd_address, "-n", "k8s.io", *args], check=check).stdout

    def container_id(self, pod: dict, container: str) -> str:
        for st in (pod.get("status") or {}).get("containerStatuses") or []:
            if st["name"] == container and st.get("containerID"):
                return st["containerID"].split("://", 1)[1]
        raise LookupError(f"no running container {container} in pod {pod['metadata']['name']}")

    def container_pid(self, pod: dict, container: str) -> int:
        """The host pid of a container's main process (containerd's task)."""
        cid = self.container_id(pod, container)
        for line in self.ctr("tasks", "ls").splitlines()[1:]:
            parts = line.split()
            if parts and parts[0] == cid:
                return int(parts[1])
        raise LookupError(f"container {container} ({cid[:12]}) of pod {pod['metadata']['name']} has no task")

    def container_log(self, pod: dict, container: str) -> Path:
        """The newest log file the kubelet keeps for a container (restarts get a new file)."""
        meta = pod["metadata"]
        d = self.pod_logs_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container
        files = sorted(d.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
        if not files:
            raise FileNotFoundError(f"no log of container {container} under {d}")
        return files[-1]

    # -- teardown ---------------------------------------------------------------------------------

    def sweep(self) -> dict[str, int]:
        """After the kubelet is stopped: stop every container and sandbox, then containerd's leftovers.

        Returns counts of what was removed. Safe to call when nothing runs.
        """
        counts = {"tasks": 0, "netns": 0, "mounts": 0, "cgroups": 0, "processes": 0}
        answering = Path(self.containerd_address).exists() and run(
            ["ctr", "--address", self.containerd_address, "version"], check=False, timeout=10).returncode == 0
        if answering:
            tasks = [ln.split()[0] for ln in self.ctr("tasks", "ls", check=False).splitlines()[1:] if ln.strip()]
            for t in tasks:
                self.ctr("tasks", "kill", "--signal", "SIGKILL", t, check=False)
            counts["tasks"] = len(tasks)
        # Whatever is still in the node's cgroups (containers, shims, pause) is SIGKILLed, and looked for again (up to
        # 50 times, 0.1 s apart): a killed process leaves the cgroup only once it has exited, and a shim may start
        # another process (or a parent's orphans appear) between the read and the kill.
        for _ in range(50):
            pids = self._cgroup_pids() | self._shim_pids()
            if not pids:
                break
            counts["processes"] += len(pids)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        if answering:  # containers (and their snapshots) go; images stay for the next start
            for c in self.ctr("containers", "ls", "-q", check=False).split():
                self.ctr("tasks", "delete", "--force", c, check=False)
                self.ctr("containers", "rm", c, check=False)
        counts["netns"] = self._remove_netns()
        counts["mounts"] = self._unmount_all()
        counts["cgroups"] = self._remove_cgroups()
        return counts

    def _shim_pids(self) -> set[int]:
        pids = set()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if argv and argv[0].endswith(b"containerd-shim-runc-v2") and self.containerd_address.encode() in argv:
                    pids.add(int(proc.name))
        return pids

    def _remove_netns(self) -> int:
        """Pod network namespaces (`/run/netns/cni-*`) holding an address of this node's subnet, and orphans: a
        namespace with no address but loopback's, no process in it, made over a minute ago. That is a sandbox whose
        interface went before its namespace did (seen about once in a `make test` run); it can no longer be told
        apart by address. A minute spares another cluster's sandbox that is being set up (namespace first, then
        its interface, then its pause process)."""
        removed = 0
        netns_dir = Path("/run/netns")
        subnet = ipaddress.ip_network(self.network.subnet)
        entered: set[int] | None = None
        for ns in sorted(netns_dir.glob("cni-*")) if netns_dir.is_dir() else []:
            out = run(["ip", "-n", ns.name, "-4", "-o", "addr"], check=False).stdout
            addrs = [ipaddress.ip_address(m) for m in re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out)]
            orphan = False
            if all(a.is_loopback for a in addrs):
                with contextlib.suppress(OSError):
                    st = ns.stat()
                    if time.time() - st.st_mtime > 60:
                        entered = _entered_netns() if entered is None else entered
                        orphan = st.st_ino not in entered
            if orphan or any(a in subnet for a in addrs):
                run(["ip", "netns", "delete", ns.name], check=False)
                removed += 1
        return removed

    def _unmount_all(self) -> int:
        mounts = []
        for line in Path("/proc/self/mounts").read_text().splitlines():
            mnt = line.split()[1].replace("\\040", " ")
            if mnt == str(self.root) or mnt.startswith(str(self.root) + "/"):
                mounts.append(mnt)
        for mnt in sorted(mounts, key=len, reverse=True):
            if run(["umount", mnt], check=False).returncode != 0:
                run(["umount", "-l", mnt], check=False)
        return len(mounts)

    def _remove_cgroups(self) -> int:
        removed = 0
        for d in self._cgroup_dirs():
            for root, dirs, _files in os.walk(d, topdown=False):  # deepest first; one gone meanwhile is skipped
                for sub in dirs:
                    with contextlib.suppress(OSError):
                        Path(root, sub).rmdir()
                        removed += 1
            with contextlib.suppress(OSError):
                d.rmdir()
                removed += 1
        return removed

    def remove_state(self) -> None:
        """The bridge and everything under the node's root but containerd's image store."""
        self.network.down()
        for p in self.root.iterdir() if self.root.is_dir() else []:
            if p.name != "containerd":
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        for p in (self.root / "containerd").iterdir() if (self.root / "containerd").is_dir() else []:
            if p.name not in ("root", "snapshotter"):
                shutil.rmtree(p, ignore_errors=True)


def kubelet_chains_cleanup() -> None:
    """The chains every kubelet installs (KUBE-FIREWALL drops non-loopback sources to 127.0.0.0/8, the
    canaries), in IPv4 and IPv6; only once no kubelet of any local cluster runs any more."""
    if run(["pgrep", "-x", "kubelet"], check=False).returncode == 0:
        return
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = run([tool, "-t", table, "-S"], check=False).stdout.splitlines()
            for rule in rules:
                if rule.startswith("-A ") and "KUBE-" in rule and not rule.startswith("-A KUBE-"):
                    run([tool, "-t", table, *rule.replace("-A ", "-D ", 1).split()], check=False)
            chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
            for chain in chains:
                run([tool, "-t", table, "-F", chain], check=False)
            for chain in chains:
                run([tool, "-t", table, "-X", chain], check=False)


def leftovers(cluster_dir: Path | None = None) -> list[str]:
    """What a torn-down cluster must not leave on the machine, one line per leftover (empty when clean): its
    processes, mounts, bridges and cgroups, and - for every cluster (`cluster_dir` None) - KUBE-* rules."""
    cid = short_id(cluster_dir) if cluster_dir is not None else "[0-9a-f]{4}"
    root = str(state_root(cluster_dir)) if cluster_dir is not None else "/var/lib/trop/"
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if root in args:
                    found.append(f"process {proc.name}: {args[:160]}")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        if line.split()[1].startswith(root):
            found.append(f"mount: {line.split()[1]}")
    links = run(["ip", "-o", "link", "show"], check=False).stdout
    found += [f"link: {m}" for m in re.findall(rf"\b(trop{cid}n\d+)\b", links)]
    for h in CGROUP_ROOT.iterdir():
        found += [f"cgroup: {d}" for d in h.iterdir() if d.is_dir() and re.fullmatch(rf"trop{cid}n\d+", d.name)]
    if cluster_dir is None:
        for tool in ("iptables", "ip6tables"):
            for table in ("filter", "nat", "mangle"):
                found += [f"{tool} {table}: {r}" for r in run([tool, "-t", table, "-S"], check=False).stdout.splitlines()
                          if "KUBE-" in r]
    return found


def cri_log_text(raw: str) -> str:
    """A container's output from the kubelet's CRI log format (`<time> <stream> <P|F> <text>` per line;
    `P` lines are parts of one longer line)."""
    out: list[str] = []
    part = ""
    for line in raw.splitlines():
        fields = line.split(" ", 3)
        if len(fields) < 4:
            continue
        part += fields[3]
        if fields[2] == "F":
            out.append(part)
            part = ""
    return "\n".join(out) + ("\n" if out else "")


class LogFollower:
    """Copies a container's log file on its node while it grows, so the output outlives the pod (the kubelet
    removes a deleted pod's logs, and the API server no longer serves them)."""

    def __init__(self, node: Node, pod: dict, container: str) -> None:
        import threading

        self.path = node.container_log(pod, container)
        self._raw = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"follow-{container}")
        self._thread.start()

    def _run(self) -> None:
        offset = 0
        while not self._stop.is_set():
            try:
                with open(self.path, encoding="utf-8", errors="replace") as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset += len(chunk.encode())
                    self._raw += chunk
            except OSError:
                return  # removed with its pod: everything before is kept
            self._stop.wait(0.05)

    def text(self) -> str:
        return cri_log_text(self._raw)

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(5)
        return self.text()
