"""A local Kubernetes cluster for tests and demos: `python -m e2e.cluster up|down|restart|status`.

Owns the lifecycle of etcd, kube-apiserver, kube-controller-manager and kube-scheduler (bound to
127.0.0.1; the API server also listens on the first node's bridge address so pods reach it through
the `kubernetes` Service), of the real nodes under them (`e2e/node.py`: containerd, a kubelet and
our fake-GPU device plugin per node, one kube-proxy), the certificates and keys they use (openssl
CLI), the admin kubeconfig in `.cluster/kubeconfig`, and the state in `.cluster/`: `pids`,
`state.json` (ports, subnet block), `logs/<component>.log`. `up` is idempotent; `down` leaves no
process, mount, cgroup, bridge, route or KUBE-* chain behind; `restart` (or `stop_components` +
`start_components`) stops and starts control-plane components on the same ports, certificates and
etcd data while everything else keeps running. Binaries come from `e2e/toolchain/build.sh` (cached
by pins; `KUBEBUILDER_ASSETS` wins for etcd and kube-apiserver); images from `e2e/images.py`. The Kubernetes release
is the one every test runs (`e2e/toolchain/kube/go.mod`), or another the project claims with `TROP_KUBE_MINOR=X.Y`
(or `LocalCluster(kube_minor=...)`, `up --kube-minor`): `kube-X.Y/go.mod`, e.g. 1.30, the oldest (`make
test-k8s-oldest`).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from e2e import node as node_mod
from e2e.node import Node, NodeNetwork
from e2e.ports import free_port
from tests.timing import scaled

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "e2e" / "toolchain" / "build.sh"
#: Selects the Kubernetes release to build and run: X.Y, a module e2e/toolchain/kube-X.Y/ (build.sh reads it too).
KUBE_MINOR_ENV = "TROP_KUBE_MINOR"

#: Reserved benchmarking range (RFC 2544): node bridges and pods in 198.18.0.0/16, Services in 198.19.0.0/16.
SERVICE_CIDR = node_mod.SERVICE_CIDR
KUBERNETES_SERVICE_IP = "198.19.0.1"

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
NODE_BINARIES = ("kubelet", "kube-proxy", "fake-gpu-plugin")
#: The nodes `up` starts by default: two GPU nodes with 4 (fake) GPUs each.
DEFAULT_NODES = ("gpu-node-1", "gpu-node-2")
DEFAULT_GPUS = 4


def kube_module_dir(minor: str | None = None) -> Path:
    """The Go module the Kubernetes binaries of `minor` (X.Y; default: $TROP_KUBE_MINOR, else the release every test
    runs) are built from, chosen as `e2e/toolchain/build.sh` chooses it: kube/, or kube-X.Y/ for another minor."""
    minor = minor or os.environ.get(KUBE_MINOR_ENV) or None
    default = BUILD_SCRIPT.parent / "kube"
    if minor is None or pinned_kubernetes(default).removeprefix("v").rsplit(".", 1)[0] == minor:
        return default
    other = BUILD_SCRIPT.parent / f"kube-{minor}"
    if not (other / "go.mod").is_file():
        raise FileNotFoundError(f"{KUBE_MINOR_ENV}={minor}: no Go module {other}/go.mod pins Kubernetes {minor}")
    return other


def pinned_kubernetes(module_dir: Path | None = None) -> str:
    """The `k8s.io/kubernetes` version (vX.Y.Z) a toolchain module pins (default: `kube_module_dir()`)."""
    go_mod = (module_dir or kube_module_dir()) / "go.mod"
    found = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\d+\.\d+\.\d+\S*)", go_mod.read_text(), re.M)
    if not found:
        raise ValueError(f"{go_mod} requires no k8s.io/kubernetes version")
    return found.group(1)


def binary_version(binary: Path) -> str:
    """What a Kubernetes binary says it is (`kubelet --version`: "Kubernetes v1.30.14" gives "v1.30.14")."""
    out = subprocess.run([str(binary), "--version"], check=True, capture_output=True, text=True, timeout=30).stdout
    return out.split()[-1]


def session_root() -> Path:
    """The directory holding this test process's `.cluster/`: the repository root, or `.cluster/<worker>/` for a
    pytest-xdist worker. `make test` runs its workers each in a network namespace of its own (`e2e/netns-python`),
    so each has its own cluster: its own control plane, nodes, bridges, kube-proxy rules and state directories."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return REPO_ROOT / ".cluster" / worker if worker else REPO_ROOT


def log(msg: str) -> None:
    print(f"[cluster] {msg}", flush=True)


def _run(argv: list[str], **kw: object) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is gone for our purposes.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def pid_cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


#: The least free space a cluster starts with: its nodes' image stores take about 1.2 GiB each, their pods' files
#: and logs some more, and below 256 MiB the kubelets stop admitting pods.
MIN_FREE_BYTES = 4 << 30


def _state_filesystem() -> Path:
    """Where node state goes (`node.STATE_BASE`, or its parent before the first node made it): its free space."""
    return node_mod.STATE_BASE if node_mod.STATE_BASE.exists() else node_mod.STATE_BASE.parent


def check_free_space(minimum: int = MIN_FREE_BYTES) -> None:
    """Refuses to start nodes on a nearly full disk, naming the space and what frees it, instead of failing later
    on images the kubelet cannot pull (there is no registry here)."""
    where = _state_filesystem()
    free = shutil.disk_usage(where).free
    if free < minimum:
        raise RuntimeError(
            f"only {free / 2**30:.1f} GiB free on the filesystem of {where}; a local cluster needs {minimum >> 30} GiB "
            f"(its nodes' image stores and pods). `python -m e2e.cluster gc --idle-days 0` removes the node state of "
            f"clusters whose directory is gone (du -sh {node_mod.STATE_BASE}/* shows them)")


#: What one test worker's clusters take on the disk when their node state is cold: its cluster's two nodes' image
#: stores (the images' layers and their unpacked snapshots, 1.2 to 2.1 GB a node), its pods' files and logs, and the
#: short-lived second cluster some of its tests start. Warm (its state root there already), the images are in place.
#: Measured (`.ci/run` logs each cluster's state at its end): a run from a fresh clone with every node state cold left
#: 11.7 GiB in 6 clusters, the most for one worker 4.75 GiB (its cluster 2.37, two second clusters 1.19 each); with
#: room for the layers being unpacked and the pods' files while they run:
WORKER_COLD_BYTES = 6 << 30
WORKER_WARM_BYTES = 2 << 30
#: `preflight` collects the state of clusters whose directory is gone once no node has started from it for this long
#: (a crashed CI run's, a deleted rehearsal clone's), never sooner: a clone at the same path may be starting.
PREFLIGHT_IDLE_DAYS = 1 / 24


def worker_cluster_dirs(workers: int, repo: Path = REPO_ROOT) -> list[Path]:
    """The cluster directories `make test`'s workers use (`session_root`): .cluster/gw<N>/.cluster, or .cluster."""
    if workers == 0:
        return [repo / ".cluster"]
    return [repo / ".cluster" / f"gw{i}" / ".cluster" for i in range(workers)]


def preflight(workers: int, repo: Path = REPO_ROOT) -> None:
    """Before a test run starts its clusters: collects the node state left by clusters whose directory is gone
    (never this checkout's), then refuses to start when the disk cannot hold the run's clusters, naming the space,
    the largest state roots and what frees them. Every worker checks 4 GiB for itself at `up`; all of them starting
    together on 10 GiB passed that check and then filled the disk importing images (a CI run: 109 errors)."""
    for gone in node_mod.gc_state_roots(idle_days=PREFLIGHT_IDLE_DAYS, keep_under=repo):
        log(f"Removed the node state of a cluster whose directory is gone path={gone}")
    dirs = worker_cluster_dirs(workers, repo)
    warm = sum(node_mod.state_root(d).is_dir() for d in dirs)
    need = warm * WORKER_WARM_BYTES + (len(dirs) - warm) * WORKER_COLD_BYTES
    where = _state_filesystem()
    free = shutil.disk_usage(where).free
    log(f"Disk free={free / 2**30:.1f}GiB need={need / 2**30:.0f}GiB workers={len(dirs)} warm={warm} "
        f"filesystem-of={where}")
    if free >= need:
        return
    roots = [(node_mod.disk_usage(root), root, owner or "(no owner file)") for root, owner in node_mod.state_roots()]
    largest = "\n".join(f"  {size / 2**30:5.1f} GiB {root} cluster directory {owner}"
                         for size, root, owner in sorted(roots, reverse=True)[:8])
    raise RuntimeError(
        f"only {free / 2**30:.1f} GiB free on the filesystem of {where}; this run's {len(dirs)} clusters need about "
        f"{need >> 30} GiB ({len(dirs) - warm} cold at {WORKER_COLD_BYTES >> 30} GiB, {warm} warm at "
        f"{WORKER_WARM_BYTES >> 30} GiB). The largest node states:\n{largest or '  (none)'}\n"
        f"`python -m e2e.cluster gc --idle-days 0` removes those whose cluster directory is gone; "
        f"`python -m e2e.cluster gc --owned-by DIR` those of a checkout DIR whose clusters are stopped; "
        f"TEST_WORKERS=N runs fewer clusters")


#: inotify instances a user may hold. Each node takes about ten (the kubelet's cAdvisor, certificate and plugin
#: watchers, containerd's CNI watcher), and the kernel's default, 128, ran out with seven clusters on one machine
#: (three test workers, their short-lived second clusters, a demo): "inotify_init: too many open files", and the
#: kubelet exited. kind and k3d ask their users to raise it the same way.
INOTIFY_INSTANCES = 1024
INOTIFY_SYSCTL = Path("/proc/sys/fs/inotify/max_user_instances")


def raise_inotify_instances(want: int = INOTIFY_INSTANCES) -> None:
    """Raises fs.inotify.max_user_instances to `want` when it is lower and this process may (root); never lowers
    it. Logged, since it is a setting of the host."""
    try:
        have = int(INOTIFY_SYSCTL.read_text())
    except (OSError, ValueError):
        return
    if have >= want or os.geteuid() != 0:
        return
    try:
        INOTIFY_SYSCTL.write_text(f"{want}\n")
    except OSError as e:
        log(f"Could not raise fs.inotify.max_user_instances from {have} to {want}: {e}")
        return
    log(f"Raised fs.inotify.max_user_instances from={have} to={want} (each node holds about ten)")


@dataclass
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kube_proxy_healthz: int = 0
    kube_proxy_metrics: int = 0
    #: node name -> [kubelet port, kubelet healthz port]
    nodes: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def allocate(cls, nodes: tuple[str, ...] = ()) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port(), free_port(), free_port(), free_port(),
                   {n: [free_port(), free_port()] for n in nodes})


class Certs:
    """A cluster CA, serving and client certificates, and the service-account key pair (ECDSA P-256)."""

    def __init__(self, pki: Path) -> None:
        self.pki = pki

    def p(self, name: str) -> Path:
        return self.pki / name

    def exists(self) -> bool:
        names = ["ca.crt", "ca.key", "apiserver.crt", "sa.key", "sa.pub", "admin.crt"]
        names += ["kube-controller-manager.crt", "kube-scheduler.crt", "front-proxy-client.crt", "kube-proxy.crt",
                  "apiserver-kubelet-client.crt"]
        return all(self.p(n).exists() for n in names)

    def node(self, name: str) -> str:
        """The kubelet's client certificate (the Node authorizer's `system:node:<name>`); returns its user name."""
        user = f"kubelet-{name}"
        if not self.p(f"{user}.crt").exists():
            self._leaf(user, f"/O=system:nodes/CN=system:node:{name}", "clientAuth")
        return user

    def generate(self) -> None:
        self.pki.mkdir(parents=True, exist_ok=True)
        os.chmod(self.pki, 0o700)
        self._key("ca.key")
        _run(
            ["openssl", "req", "-x509", "-new", "-key", str(self.p("ca.key")), "-out", str(self.p("ca.crt")),
             "-days", "3650", "-subj", "/CN=triton-operator-e2e-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
        )
        sans = ["DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local", "IP:127.0.0.1", f"IP:{KUBERNETES_SERVICE_IP}",
                *(f"IP:198.18.{block}.1" for block in node_mod.SUBNET_BLOCKS)]
        self._leaf("apiserver", "/CN=kube-apiserver", "serverAuth", sans)
        self._leaf("admin", "/O=system:masters/CN=kubernetes-admin", "clientAuth")
        self._leaf("kube-controller-manager", "/CN=system:kube-controller-manager", "clientAuth")
        self._leaf("kube-scheduler", "/CN=system:kube-scheduler", "clientAuth")
        self._leaf("front-proxy-client", "/CN=front-proxy-client", "clientAuth")
        self._leaf("kube-proxy", "/CN=system:kube-proxy", "clientAuth")
        # The API server's client certificate towards kubelets (logs, exec, port-forward).
        self._leaf("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "clientAuth")
        self._key("sa.key")
        _run(["openssl", "ec", "-in", str(self.p("sa.key")), "-pubout", "-out", str(self.p("sa.pub"))])

    def _key(self, name: str) -> None:
        _run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(self.p(name))])
        os.chmod(self.p(name), 0o600)

    def _leaf(self, name: str, subject: str, usage: str, sans: list[str] | None = None) -> None:
        self._key(f"{name}.key")
        csr = self.p(f"{name}.csr")
        _run(["openssl", "req", "-new", "-key", str(self.p(f"{name}.key")), "-out", str(csr), "-subj", subject])
        ext = self.p(f"{name}.ext")
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
                 f"extendedKeyUsage={usage}"]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        _run(
            ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(self.p("ca.crt")), "-CAkey", str(self.p("ca.key")),
             "-CAcreateserial", "-out", str(self.p(f"{name}.crt")), "-days", "3650", "-extfile", str(ext)]
        )
        csr.unlink()
        ext.unlink()

    def kubeconfig(self, server: str, user: str, path: Path) -> Path:
        def b64(name: str) -> str:
            return base64.b64encode(self.p(name).read_bytes()).decode()

        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "triton-e2e", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
            "users": [{"name": user, "user": {"client-certificate-data": b64(f"{user}.crt"),
                                               "client-key-data": b64(f"{user}.key")}}],
            "contexts": [{"name": "triton-e2e", "context": {"cluster": "triton-e2e", "user": user}}],
            "current-context": "triton-e2e",
        }
        path.write_text(json.dumps(cfg, indent=2) + "\n")  # JSON is YAML: kubectl and clients read it
        os.chmod(path, 0o600)
        return path


class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler under `<root>/.cluster/`, and real nodes.

    `nodes` are started by `up` (each a containerd, a kubelet and the fake-GPU plugin with `gpus`
    devices); `kube_proxy` adds one kube-proxy. Two clusters on one machine each get their own
    subnet block, bridges and cgroups, but only one may run kube-proxy: its iptables chains are
    host-wide.
    """

    def __init__(self, root: Path | str = REPO_ROOT, bin_dir: Path | None = None,
                 nodes: tuple[str, ...] = DEFAULT_NODES, gpus: int = DEFAULT_GPUS, kube_proxy: bool = True,
                 kube_minor: str | None = None) -> None:
        self.root = Path(root)
        self.dir = self.root / ".cluster"
        self.logs = self.dir / "logs"
        self.pids_file = self.dir / "pids"
        self.state_file = self.dir / "state.json"
        self.kubeconfig = self.dir / "kubeconfig"
        self.certs = Certs(self.dir / "pki")
        self._bin_dir = bin_dir
        self.node_names = tuple(nodes)
        self.gpus = gpus
        self.kube_proxy = kube_proxy
        #: The Kubernetes minor to build and run (X.Y), None for the release every test runs; see `kube_module_dir`.
        self.kube_minor = kube_minor or os.environ.get(KUBE_MINOR_ENV) or None
        self._pids_lock = threading.Lock()

    # -- binaries -----------------------------------------------------------------------------

    def binaries(self) -> dict[str, Path]:
        """Paths of the control-plane and node binaries; runs the (cached) toolchain build when needed."""
        bin_dir = self._bin_dir
        if bin_dir is None:
            env_dir = os.environ.get("TRITON_OPERATOR_CLUSTER_BIN")
            if env_dir:
                bin_dir = Path(env_dir)
            else:
                env = {**os.environ, **({KUBE_MINOR_ENV: self.kube_minor} if self.kube_minor else {})}
                out = subprocess.run(
                    ["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True, env=env
                )
                bin_dir = Path(out.stdout.strip().splitlines()[-1])
            self._bin_dir = bin_dir
        found = {name: bin_dir / name for name in (*COMPONENTS, *NODE_BINARIES)}
        assets = os.environ.get("KUBEBUILDER_ASSETS")
        if assets:
            for name in ("etcd", "kube-apiserver"):
                if os.access(Path(assets) / name, os.X_OK):
                    found[name] = Path(assets) / name
        missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
        if missing:
            raise FileNotFoundError(f"Cluster binaries missing: {missing} (run `make cluster-bin`)")
        return found

    # -- state --------------------------------------------------------------------------------

    def read_pids(self) -> dict[str, int]:
        pids: dict[str, int] = {}
        if self.pids_file.exists():
            for line in self.pids_file.read_text().splitlines():
                name, _, pid = line.partition(" ")
                if pid.strip().isdigit():
                    pids[name] = int(pid)
        return pids

    def _write_pids(self, pids: dict[str, int]) -> None:
        with self._pids_lock:  # the nodes start in threads of their own
            self.pids_file.write_text("".join(f"{n} {p}\n" for n, p in list(pids.items())))

    def _state(self) -> dict:
        return json.loads(self.state_file.read_text()) if self.state_file.exists() else {}

    def _ports(self) -> Ports | None:
        state = self._state()
        return Ports(**state["ports"]) if state else None

    def server(self) -> str | None:
        ports = self._ports()
        return f"https://127.0.0.1:{ports.apiserver}" if ports else None

    def nodes(self) -> list[Node]:
        """The cluster's nodes as recorded at `up` (empty before)."""
        state = self._state()
        if not state:
            return []
        ports = Ports(**state["ports"])
        cid = node_mod.short_id(self.dir)
        return [Node(name, NodeNetwork(cid, i + 1, state["block"] + i), state.get("gpus", self.gpus), self.dir,
                     *ports.nodes[name], kubernetes=state.get("kubernetes", ""))
                for i, name in enumerate(state.get("nodes", []))]

    def node(self, name: str) -> Node:
        for n in self.nodes():
            if n.name == name:
                return n
        raise LookupError(f"no node {name} in {self.dir}")

    @property
    def apiserver_address(self) -> str:
        """The address pods reach the API server at: the first node's bridge (`--advertise-address`)."""
        return f"198.18.{self._state()['block']}.1"

    def _owned(self, name: str, pid: int) -> bool:
        """The pid still runs our component (not a recycled pid)."""
        if not pid_alive(pid):
            return False
        argv = pid_cmdline(pid)
        if name == "triton-operator":  # started by `make demo` before the chart existed
            return any(a.endswith("triton-operator") for a in argv) and "run" in argv
        return bool(argv) and Path(argv[0]).name == name.rsplit("/", 1)[-1]

    def running(self) -> dict[str, int]:
        return {n: p for n, p in self.read_pids().items() if self._owned(n, p)}

    def healthy(self) -> bool:
        server = self.server()
        expected = set(COMPONENTS) | {f"{n}/{b}" for n in self._state().get("nodes", [])
                                      for b in ("containerd", "kubelet", "fake-gpu-plugin")}
        if not server or not expected <= set(self.running()):
            return False
        return self._get("/readyz") == 200

    def reusable(self) -> bool:
        """Healthy, and running the Kubernetes release this cluster is asked for (a cluster started with another
        `kube_minor` is not it)."""
        if not self.healthy():
            return False
        running = self._state().get("kubernetes")
        return running is None or running == binary_version(self.binaries()["kubelet"])

    def status(self) -> dict[str, object]:
        running = self.running()
        return {
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig.exists() else None,
            "server": self.server(),
            "kubernetes": self._state().get("kubernetes"),
            "components": {n: {"pid": p, "running": n in running} for n, p in self.read_pids().items()},
            "nodes": [{"name": n.name, "ip": n.ip, "gpus": n.gpus, "containerd": n.containerd_address}
                      for n in self.nodes()],
            "healthy": self.healthy(),
        }

    # -- HTTP checks ----------------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs.p("ca.crt")))
        ctx.load_cert_chain(str(self.certs.p("admin.crt")), str(self.certs.p("admin.key")))
        return ctx

    def _get(self, path: str, port: int | None = None, verify: bool = True) -> int:
        ports = self._ports()
        assert ports is not None
        url = f"https://127.0.0.1:{port or ports.apiserver}{path}"
        ctx = self._ssl() if verify else ssl._create_unverified_context()  # noqa: S323 - self-signed component certs
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, OSError):
            return 0

    # -- lifecycle ------------------------------------------------------------------------------

    def up(self, timeout: float = 180.0) -> Path:
        """Starts the control plane and the nodes unless they already run healthy; returns the kubeconfig path."""
        t0 = time.monotonic()
        if self.reusable():
            log(f"Cluster already running and healthy server={self.server()} kubeconfig={self.kubeconfig}")
            return self.kubeconfig
        if self.running() or self.nodes():
            log("Found a partially running cluster (or one of another Kubernetes release); stopping it before a "
                "fresh start")
            self.down(quiet=True)
        bins = self.binaries()
        kubernetes = binary_version(bins["kubelet"])
        if self.node_names:
            check_free_space()
            raise_inotify_instances()
        from e2e import images

        built = images.build_all(log=lambda m: print(m, flush=True)) if self.node_names else []
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        cold = not self.certs.exists()
        if cold:
            self.certs.generate()
            log(f"Generated certificates and service-account key dir={self.certs.pki}")
        ports = Ports.allocate(self.node_names)
        block = node_mod.pick_block()
        self.state_file.write_text(json.dumps({"ports": ports.__dict__, "block": block, "nodes": list(self.node_names),
                                               "gpus": self.gpus, "kube_proxy": self.kube_proxy,
                                               "kubernetes": kubernetes}, indent=2) + "\n")
        server = f"https://127.0.0.1:{ports.apiserver}"
        self.certs.kubeconfig(server, "admin", self.kubeconfig)
        self.certs.kubeconfig(server, "kube-controller-manager", self.dir / "kube-controller-manager.kubeconfig")
        self.certs.kubeconfig(server, "kube-scheduler", self.dir / "kube-scheduler.kubeconfig")
        self.certs.kubeconfig(server, "kube-proxy", self.dir / "kube-proxy.kubeconfig")
        nodes = self.nodes()
        pids: dict[str, int] = {}
        try:
            for n in nodes:  # the first bridge carries the API server's advertised address
                n.network.up()
            pids["etcd"] = self._spawn("etcd", bins["etcd"], self._etcd_args(ports))
            self._write_pids(pids)
            self._wait("etcd", lambda: _http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"), pids, timeout)
            pids["kube-apiserver"] = self._spawn("kube-apiserver", bins["kube-apiserver"], self._apiserver_args(ports))
            self._write_pids(pids)
            self._wait("kube-apiserver /readyz", lambda: self._get("/readyz") == 200, pids, timeout)
            pids["kube-controller-manager"] = self._spawn(
                "kube-controller-manager", bins["kube-controller-manager"], self._controller_manager_args(ports)
            )
            pids["kube-scheduler"] = self._spawn("kube-scheduler", bins["kube-scheduler"], self._scheduler_args(ports))
            self._write_pids(pids)
            # The nodes start side by side (containerd's start and the image check are most of each): one node's
            # start took about 10 s of a worker's cluster start, the second waiting for the first.
            with concurrent.futures.ThreadPoolExecutor(max(1, len(nodes))) as starting:
                for started in [starting.submit(self._start_node, n, bins, built, pids, timeout) for n in nodes]:
                    started.result()
            if self.kube_proxy and nodes:
                pids["kube-proxy"] = self._spawn("kube-proxy", bins["kube-proxy"], self._kube_proxy_args(ports, nodes[0]))
                self._write_pids(pids)
            self._wait(
                "kube-controller-manager /healthz",
                lambda: self._get("/healthz", ports.controller_manager, verify=False) == 200,
                pids,
                timeout,
            )
            self._wait(
                "kube-scheduler /healthz", lambda: self._get("/healthz", ports.scheduler, verify=False) == 200, pids, timeout
            )
            if self.kube_proxy and nodes:
                self._wait("kube-proxy /healthz",
                           lambda: _http_ok(f"http://127.0.0.1:{ports.kube_proxy_healthz}/healthz"), pids, timeout)
            self._wait(
                "default ServiceAccount",
                lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default") == 200,
                pids,
                timeout,
            )
            for n in nodes:
                self._wait(f"node {n.name} Ready with {n.gpus} nvidia.com/gpu", lambda n=n: self._node_ready(n), pids,
                           timeout)
        except BaseException:
            log(f"Cluster failed to start; logs in {self.logs}")
            self.down(quiet=True)
            raise
        kind = "cold" if cold else "warm"
        log(f"Cluster ready start={kind} kubernetes={kubernetes} nodes={len(nodes)} "
            f"seconds={time.monotonic() - t0:.1f} server={server}")
        log(f"Wrote kubeconfig path={self.kubeconfig}  (export KUBECONFIG={self.kubeconfig})")
        return self.kubeconfig

    @contextlib.contextmanager
    def running_fresh(self) -> Iterator[Path]:
        """A cluster of a test's own: whatever a killed run left is stopped, a fresh `up`, and `down` afterwards
        whatever happens; yields the kubeconfig."""
        self.down(quiet=True)
        kubeconfig = self.up()
        try:
            yield kubeconfig
        finally:
            self.down()

    def _start_node(self, n: Node, bins: dict[str, Path], built: list, pids: dict[str, int], timeout: float) -> None:
        from e2e import images

        n.prepare(self.certs.pki, images.PAUSE_IMAGE)
        pids[f"{n.name}/containerd"] = self._spawn(f"{n.name}/containerd", Path(shutil.which("containerd") or "containerd"),
                                                   n.containerd_args())
        self._write_pids(pids)
        n.wait_containerd(timeout)
        images.import_into(built, n.containerd_address, log=lambda m: print(m, flush=True), snapshotter=n.snapshotter)
        user = self.certs.node(n.name)
        kubeconfig = self.certs.kubeconfig(self.server() or "", user, self.dir / f"{user}.kubeconfig")
        pids[f"{n.name}/fake-gpu-plugin"] = self._spawn(f"{n.name}/fake-gpu-plugin", bins["fake-gpu-plugin"],
                                                        n.plugin_args())
        pids[f"{n.name}/kubelet"] = self._spawn(f"{n.name}/kubelet", bins["kubelet"], n.kubelet_args(kubeconfig))
        self._write_pids(pids)

    def stop_kubelet(self, name: str) -> None:
        """Stops one node's kubelet (SIGKILL: a node that vanished); its containers keep running in containerd."""
        pids = self.read_pids()
        pid = pids.get(f"{name}/kubelet")
        if pid is not None and self._owned(f"{name}/kubelet", pid):
            os.kill(pid, signal.SIGKILL)
            _wait_gone([pid], 10)
        log(f"Stopped the kubelet of node {name}")

    def start_kubelet(self, name: str, timeout: float = 120.0) -> None:
        """Starts a stopped kubelet again with its config and root dir; returns once the node is Ready."""
        n = self.node(name)
        bins = self.binaries()
        user = self.certs.node(name)
        pids = self.read_pids()
        pids[f"{name}/kubelet"] = self._spawn(f"{name}/kubelet", bins["kubelet"],
                                              n.kubelet_args(self.dir / f"{user}.kubeconfig"))
        self._write_pids(pids)
        self._wait(f"node {name} Ready again", lambda: self._node_ready(n), {f"{name}/kubelet": pids[f"{name}/kubelet"]},
                   timeout)

    def _node_ready(self, n: Node) -> bool:
        try:
            node = self._get_json(f"/api/v1/nodes/{n.name}")
        except OSError:
            return False
        ready = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        gpus = node.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu", "0")
        return bool(ready and ready[0]["status"] == "True" and int(gpus) == n.gpus)

    def _get_json(self, path: str) -> dict:
        ports = self._ports()
        assert ports is not None
        with urllib.request.urlopen(f"https://127.0.0.1:{ports.apiserver}{path}", context=self._ssl(),
                                    timeout=5) as resp:
            return json.loads(resp.read())

    def _kube_proxy_args(self, ports: Ports, first: Node) -> list[str]:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(self.dir / "kube-proxy.kubeconfig")},
            "hostnameOverride": first.name,
            "healthzBindAddress": f"127.0.0.1:{ports.kube_proxy_healthz}",
            "metricsBindAddress": f"127.0.0.1:{ports.kube_proxy_metrics}",
            "clusterCIDR": "198.18.0.0/16",
            "nodePortAddresses": [node_mod.TEST_RANGE],
            # No sysctl writes: conntrack limits and route_localnet stay as the machine has them.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False, "minSyncPeriod": "0s", "syncPeriod": "30s"},
        }
        path = self.dir / "kube-proxy.yaml"
        path.write_text(json.dumps(config, indent=2) + "\n")
        return [f"--config={path}", "--v=1"]

    def _spawn(self, name: str, binary: Path, args: list[str]) -> int:
        (self.logs / f"{name}.log").parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        logf.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {binary} {' '.join(args)}\n".encode())
        logf.flush()
        proc = subprocess.Popen(
            [str(binary), *args],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.dir,
            start_new_session=True,  # survives the `up` command; `down` signals it by pid
        )
        logf.close()
        log(f"Started {name} pid={proc.pid} log={self.logs / (name + '.log')}")
        return proc.pid

    def _wait(self, what: str, probe, pids: dict[str, int], timeout: float) -> None:
        t0 = time.monotonic()
        while not probe():
            for name, pid in pids.items():
                if not pid_alive(pid):
                    tail = _tail(self.logs / f"{name}.log")
                    raise RuntimeError(f"{name} exited while waiting for {what}; log tail:\n{tail}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"Timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.1)
        log(f"Ready {what} seconds={time.monotonic() - t0:.1f}")

    def _etcd_args(self, ports: Ports) -> list[str]:
        client = f"http://127.0.0.1:{ports.etcd_client}"
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        return [
            "--name=e2e",
            f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=e2e={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",
            "--log-level=warn",
            "--quota-backend-bytes=2147483648",
        ]

    def _apiserver_args(self, ports: Ports) -> list[str]:
        c = self.certs.p
        return [
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            *self._apiserver_address_args(),
            f"--secure-port={ports.apiserver}",
            f"--kubelet-client-certificate={c('apiserver-kubelet-client.crt')}",
            f"--kubelet-client-key={c('apiserver-kubelet-client.key')}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            f"--client-ca-file={c('ca.crt')}",
            f"--tls-cert-file={c('apiserver.crt')}",
            f"--tls-private-key-file={c('apiserver.key')}",
            f"--cert-dir={self.dir / 'apiserver-certs'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={c('sa.pub')}",
            f"--service-account-signing-key-file={c('sa.key')}",
            # Front-proxy (aggregation layer) trust: also stops components complaining about a missing CA.
            f"--requestheader-client-ca-file={c('ca.crt')}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={c('front-proxy-client.crt')}",
            f"--proxy-client-key-file={c('front-proxy-client.key')}",
            # Webhooks and aggregated APIs are dialled at an endpoint address (a pod's 198.18.x), not through
            # the ClusterIP: the API server then works without kube-proxy too (an isolated cluster has none).
            "--enable-aggregator-routing=true",
            "--allow-privileged=true",
            # On SIGTERM, watches are ended (within 2 s) rather than left open: the HTTP server's graceful shutdown
            # waits for every open stream, up to the request timeout (60 s), and every client here (the operator,
            # the controllers, kubelets, tests) holds watches. Measured: 48 s after it stopped listening, the API
            # server was still there at each cluster's `down` (SIGKILLed at the end of its grace).
            "--shutdown-watch-termination-grace-period=2s",
            # A lost node's pods are evicted after 10 s, not the default 5 minutes (node-loss tests).
            "--default-not-ready-toleration-seconds=10",
            "--default-unreachable-toleration-seconds=10",
            "--profiling=false",
            "--v=1",
        ]

    def _apiserver_address_args(self) -> list[str]:
        """With nodes, the API server also listens on the first node's bridge and advertises that address, so the
        `kubernetes` Service leads pods to it; without nodes it stays on loopback."""
        if not self._state().get("nodes"):
            return ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"]
        return ["--bind-address=0.0.0.0", f"--advertise-address={self.apiserver_address}"]

    def _kube_common(self, name: str, port: int) -> list[str]:
        kubeconfig = self.dir / f"{name}.kubeconfig"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.dir / (name + '-certs')}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ]

    def _controller_manager_args(self, ports: Ports) -> list[str]:
        c = self.certs.p
        return [
            *self._kube_common("kube-controller-manager", ports.controller_manager),
            "--controllers=*",
            f"--service-account-private-key-file={c('sa.key')}",
            f"--root-ca-file={c('ca.crt')}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={c('ca.crt')}",
            f"--cluster-signing-key-file={c('ca.key')}",
            "--allocate-node-cidrs=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # A node whose kubelet stopped renewing its Lease (every 2.5 s here) is NotReady after 12 s.
            "--node-monitor-grace-period=12s",
            # The HPA controller every 5 s (Kubernetes' default is 15 s): e2e/test_autoscaling.py waits on it.
            "--horizontal-pod-autoscaler-sync-period=5s",
        ]

    def _scheduler_args(self, ports: Ports) -> list[str]:
        return self._kube_common("kube-scheduler", ports.scheduler)

    def down(self, quiet: bool = False, grace: float = 15.0) -> None:
        """Stops everything recorded and removes what the nodes left on the machine; wipes etcd data.

        Order: other processes (a demo's operator), the controller-manager and scheduler (no new pods),
        kube-proxy (and its rules), each node's kubelet and plugin, then every container, shim, pod network
        namespace, mount and cgroup of the node, its containerd and bridge; the API server, etcd last.
        Each process gets SIGTERM and `grace` seconds before SIGKILL. Imported images stay in each node's
        containerd root, so the next `up` of this cluster does not import them again.
        """
        t0 = time.monotonic()
        pids = self.read_pids()
        nodes = self.nodes()
        node_procs = [f"{n.name}/{b}" for n in nodes for b in ("kubelet", "fake-gpu-plugin")]
        control = ["kube-controller-manager", "kube-scheduler"]
        order = [n for n in pids if n not in COMPONENTS and "/" not in n and n != "kube-proxy"]
        order += control + ["kube-proxy"] + node_procs
        stopped, killed = [], []

        def stop(name: str) -> None:
            pid = pids.get(name)
            if pid is None or not self._owned(name, pid):
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if _wait_gone([pid], grace):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                killed.append(name)
                if _wait_gone([pid], 5):
                    raise RuntimeError(f"{name} pid={pid} survived SIGKILL")
            stopped.append(name)

        for name in order:
            stop(name)
        kube_proxy = self._bin_dir_or_none("kube-proxy") if "kube-proxy" in pids else None
        if kube_proxy is not None:
            subprocess.run([str(kube_proxy), "--cleanup"], check=False, capture_output=True)
        swept = {}
        for n in nodes:
            swept[n.name] = n.sweep()
            stop(f"{n.name}/containerd")
            n.sweep()  # what containerd's own exit left mounted
            n.remove_state()
        for name in [c for c in reversed(COMPONENTS) if c not in control]:
            stop(name)
        if nodes:
            node_mod.host_routes_down()
            node_mod.kubelet_chains_cleanup()
        if not quiet or stopped:
            log(f"Stopped cluster components={','.join(stopped) or 'none'} killed={','.join(killed) or 'none'} "
                f"swept={swept} seconds={time.monotonic() - t0:.1f}")
        self.pids_file.unlink(missing_ok=True)
        self.state_file.unlink(missing_ok=True)
        # A fresh etcd on every start: tests never see objects from an earlier run.
        subprocess.run(["rm", "-rf", str(self.dir / "etcd")], check=False)

    def _bin_dir_or_none(self, name: str) -> Path | None:  # a binary's path, None where it cannot be had
        try:
            return self.binaries()[name]
        except (FileNotFoundError, subprocess.CalledProcessError):
            return None

    def stop_components(self, components: tuple[str, ...] = ("etcd", "kube-apiserver"), hard: bool = False) -> float:
        """Stops control-plane components for a restart (`start_components`); returns the seconds it took.

        Unlike `down`, etcd's data stays, and everything else (the other components, the nodes,
        operators) keeps running and must ride it out. In reverse start order (the API server before
        etcd), each once the previous is gone; `hard` sends SIGKILL (a crash) instead of SIGTERM. The
        pids file keeps the stopped pids until `start_components` records the new ones.
        """
        unknown = set(components) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"not control-plane components: {sorted(unknown)}")
        t0 = time.monotonic()
        running = self.running()
        for name in [n for n in reversed(COMPONENTS) if n in components and n in running]:
            pid = running[name]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if hard else signal.SIGTERM)
            if _wait_gone([pid], 5 if hard else 15):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                if _wait_gone([pid], 5):
                    raise RuntimeError(f"{name} pid={pid} survived SIGKILL")
        took = time.monotonic() - t0
        log(f"Stopped {','.join(components)} signal={'KILL' if hard else 'TERM'} seconds={took:.1f}")
        return took

    def start_components(self, components: tuple[str, ...] = ("etcd", "kube-apiserver"),
                         timeout: float = 120.0) -> float:
        """Starts stopped components again with the same binaries, ports, certificates and etcd data, in start
        order, each waited for as in `up`; records the new pids. Returns the seconds until all were ready."""
        ports = self._ports()
        if ports is None:
            raise RuntimeError(f"no control plane under {self.dir} (no {self.state_file.name})")
        bins = self.binaries()
        args = {"etcd": self._etcd_args, "kube-apiserver": self._apiserver_args,
                "kube-controller-manager": self._controller_manager_args, "kube-scheduler": self._scheduler_args}
        probes = {
            "etcd": lambda: _http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"),
            "kube-apiserver": lambda: self._get("/readyz") == 200,
            "kube-controller-manager": lambda: self._get("/healthz", ports.controller_manager, verify=False) == 200,
            "kube-scheduler": lambda: self._get("/healthz", ports.scheduler, verify=False) == 200,
        }
        t0 = time.monotonic()
        pids = self.read_pids()
        for name in [n for n in COMPONENTS if n in components]:
            if self._owned(name, pids.get(name, 0)):
                raise RuntimeError(f"{name} pid={pids[name]} is still running")
            pids[name] = self._spawn(name, bins[name], args[name](ports))
            self._write_pids(pids)
            self._wait(f"{name} (restarted)", probes[name], {name: pids[name]}, timeout)
        took = time.monotonic() - t0
        log(f"Restarted {','.join(components)} seconds={took:.1f}")
        return took

    def restart(self, components: tuple[str, ...] = ("etcd", "kube-apiserver"), hard: bool = False,
                downtime: float = 0.0) -> float:
        """`stop_components`, `downtime` seconds, `start_components`; returns the seconds from stop to ready."""
        t0 = time.monotonic()
        self.stop_components(components, hard)
        time.sleep(downtime)
        self.start_components(components)
        return time.monotonic() - t0

    def stop_component(self, name: str, grace: float = 60.0) -> None:
        """SIGTERM one recorded process (SIGKILL after `grace`) and drop it from the pids file."""
        pids = self.read_pids()
        pid = pids.pop(name, None)
        if pid is not None and self._owned(name, pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            for left in _wait_gone([pid], grace):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(left, signal.SIGKILL)
                _wait_gone([left], 5)
            log(f"Stopped {name} pid={pid}")
        if pid is not None and self.pids_file.exists():
            self._write_pids(pids)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + scaled(timeout)
    left = [p for p in pids if pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if pid_alive(p)]
    return left


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "restart", "status", "gc", "preflight"],
                        help="gc: remove the node state of clusters whose directory is gone (see "
                             "e2e.node.gc_state_roots); preflight: gc, then check the disk holds a test run's clusters")
    parser.add_argument("--root", default=str(REPO_ROOT), help="directory holding .cluster/ (default: repo root)")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--node", action="append", default=[],
                        help=f"a node to start (repeatable; default: {', '.join(DEFAULT_NODES)})")
    parser.add_argument("--gpus", type=int, default=DEFAULT_GPUS, help="fake GPUs per node")
    parser.add_argument("--no-kube-proxy", action="store_true", help="no kube-proxy (another cluster runs one)")
    parser.add_argument("--kube-minor", default=None,
                        help=f"the Kubernetes minor X.Y to build and run (a module e2e/toolchain/kube-X.Y; default: "
                             f"${KUBE_MINOR_ENV}, else the release every test runs)")
    parser.add_argument("--idle-days", type=float, default=7.0,
                        help="gc: only state no node has started from for this long (0: any whose directory is gone)")
    parser.add_argument("--owned-by", default=None, metavar="DIR",
                        help="gc: instead, the node state of every stopped cluster whose directory is under DIR")
    parser.add_argument("--workers", type=int, default=0,
                        help="preflight: the test run's cluster workers (0: one cluster on .cluster/)")
    args = parser.parse_args(argv)
    if args.command == "gc":
        owned_under = Path(args.owned_by) if args.owned_by else None
        if owned_under is not None:  # what a run's clusters took, for WORKER_COLD_BYTES
            sizes = {d: node_mod.disk_usage(r) for d, r in node_mod.state_roots_owned_under(owned_under).items()}
            for d, size in sizes.items():
                log(f"Node state size={size / 2**30:.2f}GiB cluster-directory={d}")
            log(f"Node state total={sum(sizes.values()) / 2**30:.2f}GiB clusters={len(sizes)}")
        for gone in node_mod.gc_state_roots(idle_days=args.idle_days, owned_under=owned_under):
            log(f"Removed the node state of a cluster path={gone} cluster-directory-gone={owned_under is None}")
        return 0
    if args.command == "preflight":
        if os.environ.get("KUBECONFIG"):
            log("Disk check skipped: KUBECONFIG names a cluster of your own")
            return 0
        try:
            preflight(args.workers, Path(args.root))
        except RuntimeError as e:
            print(f"[cluster] {e}", file=sys.stderr, flush=True)
            return 1
        return 0
    cluster = LocalCluster(Path(args.root), nodes=tuple(args.node) or DEFAULT_NODES, gpus=args.gpus,
                           kube_proxy=not args.no_kube_proxy, kube_minor=args.kube_minor)
    if args.command == "up":
        cluster.up(timeout=args.timeout)
        return 0
    if args.command == "down":
        cluster.down()
        return 0
    if args.command == "restart":  # etcd and the API server, keeping their data
        cluster.restart()
        return 0
    status = cluster.status()
    print(json.dumps(status, indent=2))
    return 0 if status["healthy"] else 1


if __name__ == "__main__":
    sys.exit(main())
