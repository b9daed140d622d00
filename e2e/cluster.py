"""A local Kubernetes control plane for tests and demos: `python -m e2e.cluster up|down|restart|status`.

Owns the lifecycle of etcd, kube-apiserver, kube-controller-manager and kube-scheduler running
as background processes bound to 127.0.0.1, the certificates and keys they use (generated with
the openssl CLI), the admin kubeconfig in `.cluster/kubeconfig`, and the state in `.cluster/`:
`pids`, `state.json` (ports), `logs/<component>.log`. `up` is idempotent; `down` leaves no process
behind; `restart` (or `stop_components` + `start_components`) stops and starts components on the
same ports, certificates and etcd data while everything else keeps running. Binaries come from
`e2e/toolchain/build.sh` (cached by pins); `KUBEBUILDER_ASSETS` wins for etcd and kube-apiserver.
Optionally (`up --gpu-node NAME`) a node agent is started too.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "e2e" / "toolchain" / "build.sh"

#: Reserved benchmarking range (RFC 2544); pods get 198.18.0.0/16 (node agent), Services 198.19.0.0/16.
SERVICE_CIDR = "198.19.0.0/16"
KUBERNETES_SERVICE_IP = "198.19.0.1"
#: Address of the node agent's bridge: pods reach the API server here (proxied to 127.0.0.1).
POD_GATEWAY_IP = "198.18.0.1"

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def log(msg: str) -> None:
    print(f"[cluster] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv: list[str], **kw: object) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)  # noqa: S603


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


@dataclass
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def allocate(cls) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port(), free_port())


class Certs:
    """A cluster CA, serving and client certificates, and the service-account key pair (ECDSA P-256)."""

    def __init__(self, pki: Path) -> None:
        self.pki = pki

    def p(self, name: str) -> Path:
        return self.pki / name

    def exists(self) -> bool:
        names = ["ca.crt", "ca.key", "apiserver.crt", "sa.key", "sa.pub", "admin.crt"]
        names += ["kube-controller-manager.crt", "kube-scheduler.crt", "front-proxy-client.crt"]
        return all(self.p(n).exists() for n in names)

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
                f"IP:{POD_GATEWAY_IP}"]
        self._leaf("apiserver", "/CN=kube-apiserver", "serverAuth", sans)
        self._leaf("admin", "/O=system:masters/CN=kubernetes-admin", "clientAuth")
        self._leaf("kube-controller-manager", "/CN=system:kube-controller-manager", "clientAuth")
        self._leaf("kube-scheduler", "/CN=system:kube-scheduler", "clientAuth")
        self._leaf("front-proxy-client", "/CN=front-proxy-client", "clientAuth")
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


def agent_state_dir(cluster_dir: Path, name: str) -> Path:
    """Where a node agent keeps its pods' volumes: under the cluster directory, unless that is in /tmp.

    A pod that mounts a volume at /tmp would hide, inside its own mount namespace, any volume
    source that lives under /tmp; so a checkout in /tmp (a CI clone, say) keeps its agent's
    state in /var/lib/trop-e2e instead.
    """
    resolved = cluster_dir.resolve()
    if resolved == Path("/tmp") or Path("/tmp") in resolved.parents:
        import hashlib

        return Path("/var/lib/trop-e2e") / hashlib.sha256(str(resolved).encode()).hexdigest()[:12] / name
    return cluster_dir / name


class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler under `<root>/.cluster/`."""

    def __init__(self, root: Path | str = REPO_ROOT, bin_dir: Path | None = None) -> None:
        self.root = Path(root)
        self.dir = self.root / ".cluster"
        self.logs = self.dir / "logs"
        self.pids_file = self.dir / "pids"
        self.state_file = self.dir / "state.json"
        self.kubeconfig = self.dir / "kubeconfig"
        self.certs = Certs(self.dir / "pki")
        self._bin_dir = bin_dir

    # -- binaries -----------------------------------------------------------------------------

    def binaries(self) -> dict[str, Path]:
        """Paths of the four binaries; runs the (cached) toolchain build when needed."""
        bin_dir = self._bin_dir
        if bin_dir is None:
            env_dir = os.environ.get("TRITON_OPERATOR_CLUSTER_BIN")
            if env_dir:
                bin_dir = Path(env_dir)
            else:
                out = subprocess.run(  # noqa: S603
                    ["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
                )
                bin_dir = Path(out.stdout.strip().splitlines()[-1])
            self._bin_dir = bin_dir
        found = {name: bin_dir / name for name in COMPONENTS}
        assets = os.environ.get("KUBEBUILDER_ASSETS")
        if assets:
            for name in ("etcd", "kube-apiserver"):
                if os.access(Path(assets) / name, os.X_OK):
                    found[name] = Path(assets) / name
        missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
        if missing:
            raise FileNotFoundError(f"Control-plane binaries missing: {missing} (run `make cluster-bin`)")
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
        self.pids_file.write_text("".join(f"{n} {p}\n" for n, p in pids.items()))

    def _ports(self) -> Ports | None:
        if not self.state_file.exists():
            return None
        return Ports(**json.loads(self.state_file.read_text())["ports"])

    def server(self) -> str | None:
        ports = self._ports()
        return f"https://127.0.0.1:{ports.apiserver}" if ports else None

    def _owned(self, name: str, pid: int) -> bool:
        """The pid still runs our component (not a recycled pid)."""
        if not pid_alive(pid):
            return False
        argv = pid_cmdline(pid)
        if name.startswith("nodeagent"):
            return any("e2e.nodeagent" in a for a in argv)
        if name == "triton-operator":  # started by `make demo`
            return any(a.endswith("triton-operator") for a in argv) and "run" in argv
        return bool(argv) and Path(argv[0]).name == name

    def running(self) -> dict[str, int]:
        return {n: p for n, p in self.read_pids().items() if self._owned(n, p)}

    def healthy(self) -> bool:
        server = self.server()
        if not server or set(self.running()) < set(COMPONENTS):
            return False
        return self._get("/readyz") == 200

    def status(self) -> dict[str, object]:
        running = self.running()
        return {
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig.exists() else None,
            "server": self.server(),
            "components": {n: {"pid": p, "running": n in running} for n, p in self.read_pids().items()},
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
            with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:  # noqa: S310 - https to loopback
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, OSError):
            return 0

    # -- lifecycle ------------------------------------------------------------------------------

    def up(self, timeout: float = 120.0) -> Path:
        """Starts the control plane unless it already runs healthy; returns the kubeconfig path."""
        t0 = time.monotonic()
        if self.healthy():
            log(f"Control plane already running and healthy server={self.server()} kubeconfig={self.kubeconfig}")
            return self.kubeconfig
        if self.running():
            log("Found a partially running control plane; stopping it before a fresh start")
            self.down(quiet=True)
        bins = self.binaries()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        cold = not self.certs.exists()
        if cold:
            self.certs.generate()
            log(f"Generated certificates and service-account key dir={self.certs.pki}")
        ports = Ports.allocate()
        self.state_file.write_text(json.dumps({"ports": ports.__dict__}, indent=2) + "\n")
        server = f"https://127.0.0.1:{ports.apiserver}"
        self.certs.kubeconfig(server, "admin", self.kubeconfig)
        self.certs.kubeconfig(server, "kube-controller-manager", self.dir / "kube-controller-manager.kubeconfig")
        self.certs.kubeconfig(server, "kube-scheduler", self.dir / "kube-scheduler.kubeconfig")
        pids: dict[str, int] = {}
        try:
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
            self._wait(
                "kube-controller-manager /healthz",
                lambda: self._get("/healthz", ports.controller_manager, verify=False) == 200,
                pids,
                timeout,
            )
            self._wait(
                "kube-scheduler /healthz", lambda: self._get("/healthz", ports.scheduler, verify=False) == 200, pids, timeout
            )
            self._wait(
                "default ServiceAccount",
                lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default") == 200,
                pids,
                timeout,
            )
        except BaseException:
            log(f"Control plane failed to start; logs in {self.logs}")
            self.down(quiet=True)
            raise
        kind = "cold" if cold else "warm"
        log(f"Control plane ready start={kind} seconds={time.monotonic() - t0:.1f} server={server}")
        log(f"Wrote kubeconfig path={self.kubeconfig}  (export KUBECONFIG={self.kubeconfig})")
        return self.kubeconfig

    def _spawn(self, name: str, binary: Path, args: list[str]) -> int:
        logf = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        logf.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {binary} {' '.join(args)}\n".encode())
        logf.flush()
        proc = subprocess.Popen(  # noqa: S603 - argument array
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

    def _wait(self, what: str, probe, pids: dict[str, int], timeout: float) -> None:  # noqa: ANN001
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
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
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
            # Webhooks (and aggregated APIs) with a service clientConfig are dialled at an endpoint address
            # (a pod's 198.18.x), never at the ClusterIP: there is no kube-proxy.
            "--enable-aggregator-routing=true",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ]

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
        ]

    def _scheduler_args(self, ports: Ports) -> list[str]:
        return self._kube_common("kube-scheduler", ports.scheduler)

    def down(self, quiet: bool = False, grace: float = 15.0) -> None:
        """Stops every recorded process in reverse start order (node agents first, etcd last), wipes etcd data.

        Each process gets SIGTERM and `grace` seconds before SIGKILL; the next one is signalled only
        after it is gone, so the API server can still reach etcd while it shuts down.
        """
        t0 = time.monotonic()
        pids = self.read_pids()
        order = [n for n in pids if n not in COMPONENTS] + [n for n in reversed(COMPONENTS) if n in pids]
        stopped, killed = [], []
        for name in order:
            pid = pids[name]
            if not self._owned(name, pid):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            wait = grace + 45 if name.startswith("nodeagent") else grace  # the agent stops its pods first
            if _wait_gone([pid], wait):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                killed.append(name)
                if _wait_gone([pid], 5):
                    raise RuntimeError(f"{name} pid={pid} survived SIGKILL")
            stopped.append(name)
        if not quiet or stopped:
            log(f"Stopped control plane components={','.join(stopped) or 'none'} "
                f"killed={','.join(killed) or 'none'} seconds={time.monotonic() - t0:.1f}")
        self.pids_file.unlink(missing_ok=True)
        self.state_file.unlink(missing_ok=True)
        # A fresh etcd on every start: tests never see objects from an earlier run.
        subprocess.run(["rm", "-rf", str(self.dir / "etcd")], check=False)  # noqa: S603,S607

    def stop_components(self, components: tuple[str, ...] = ("etcd", "kube-apiserver"), hard: bool = False) -> float:
        """Stops control-plane components for a restart (`start_components`); returns the seconds it took.

        Unlike `down`, etcd's data stays, and everything else (the other components, node agents,
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

    def start_node_agent(
        self, nodes: list[str], gpus: int, extra: list[str] | None = None, name: str = "nodeagent"
    ) -> subprocess.Popen[bytes]:
        """Starts `python -m e2e.nodeagent` in the background for `nodes`, recorded in the pids file as `name`.

        A stale agent recorded under the same name (e.g. left by a killed test session) is stopped
        first, so two agents never drive the same node. `down` stops it before the control plane.
        """
        self.stop_component(name)
        args = [sys.executable, "-m", "e2e.nodeagent", "--kubeconfig", str(self.kubeconfig), "--gpus", str(gpus),
                "--state-dir", str(agent_state_dir(self.dir, name))]
        for n in nodes:
            args += ["--node", n]
        args += extra or []
        self.logs.mkdir(parents=True, exist_ok=True)
        logf = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(  # noqa: S603
            args, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
            start_new_session=True,
        )
        logf.close()
        pids = self.read_pids()
        pids[name] = proc.pid
        self._write_pids(pids)
        log(f"Started {name} pid={proc.pid} nodes={','.join(nodes)} gpus={gpus}")
        return proc

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
    deadline = time.monotonic() + timeout
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
    parser.add_argument("command", choices=["up", "down", "restart", "status"])
    parser.add_argument("--root", default=str(REPO_ROOT), help="directory holding .cluster/ (default: repo root)")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--gpu-node", action="append", default=[], help="also start a node agent for this node")
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per node for --gpu-node")
    args = parser.parse_args(argv)
    cluster = LocalCluster(Path(args.root))
    if args.command == "up":
        was_healthy = cluster.healthy()
        cluster.up(timeout=args.timeout)
        if args.gpu_node and not (was_healthy and "nodeagent" in cluster.running()):
            cluster.start_node_agent(args.gpu_node, args.gpus)
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
