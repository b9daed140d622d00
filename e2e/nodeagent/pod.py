"""One pod on a node agent node: its sandbox, containers, probes and status.

Owns a pod's whole life on the node, the way the kubelet's pod worker does: set up the sandbox
(network namespace + address, volumes), run init containers in order and then the containers as
local processes, probe them, restart them per restartPolicy with crash-loop back-off, write the
pod status (phase, IPs, container statuses, and the conditions the kubelet owns), and on deletion
stop the containers (each its preStop hook, then SIGTERM, then SIGKILL when the grace period is
up - see `lifecycle.py`), tear the sandbox down and delete the pod object with grace period 0.

Status is written with a strategic merge patch that names only the condition types the kubelet
owns (PodReadyToStartContainers, Initialized, ContainersReady, Ready), so conditions other
controllers write - readiness gates - are never clobbered. Ready is computed as the kubelet does:
all containers ready AND every readiness gate's condition present with status True.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e2e.kube import ApiError
from e2e.nodeagent import network
from e2e.nodeagent.images import ImageNotRunnable, Runnable, resolve
from e2e.nodeagent.lifecycle import MIN_GRACE, describe, pre_stop_handler, run_pre_stop
from e2e.nodeagent.probes import ProbeResult, ProbeTracker, run_probe
from e2e.nodeagent.volumes import PodVolumes, VolumeError, field_value, resource_value

if TYPE_CHECKING:
    from e2e.nodeagent.agent import NodeAgent

log = logging.getLogger("nodeagent.pod")

ENTER = str(Path(__file__).with_name("enter.py"))
OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
BACKOFF_CAP = 300.0


def rfc3339(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t if t is not None else time.time()))


class ConfigError(Exception):
    """A container's environment cannot be built yet (CreateContainerConfigError)."""


@dataclass
class ContainerRun:
    """One container (or init container) of the pod and its current process, if any."""

    spec: dict
    init: bool
    restart_count: int = 0
    proc: subprocess.Popen[bytes] | None = None
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict = field(default_factory=dict)
    ever_started: bool = False
    started: bool = False
    ready: bool = False
    final: bool = False  # terminated and will not be restarted
    backoff_until: float = 0.0
    probes: dict[str, ProbeTracker] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    generation: int = 0
    kill_deadline: float | None = None
    kill_message: str = ""
    started_wall: float = 0.0

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def running(self) -> bool:
        return self.proc is not None

    def status(self, pod_uid: str) -> dict:
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": f"e2e-nodeagent://{self.spec.get('image', '')}" if self.ever_started else "",
            "ready": bool(self.ready and self.running),
            "restartCount": self.restart_count,
            "started": bool(self.started and self.running),
            "state": self.state,
        }
        if self.ever_started:
            out["containerID"] = f"e2e://{pod_uid}/{self.name}/{self.restart_count}"
        if self.last_state:
            out["lastState"] = self.last_state
        return out


class PodWorker(threading.Thread):
    """Drives one pod toward its spec; woken by watch events and by its own timers."""

    def __init__(self, agent: NodeAgent, pod: dict) -> None:
        md = pod["metadata"]
        super().__init__(name=f"pod-{md['namespace']}/{md['name']}", daemon=True)
        self.agent = agent
        self.kube = agent.kube
        self.uid: str = md["uid"]
        self.key = f"{md['namespace']}/{md['name']}"
        self._pod = pod
        self._lock = threading.Lock()
        self.wake = threading.Event()
        self.dir = agent.state_dir / "pods" / self.uid
        self.host_network = bool(pod["spec"].get("hostNetwork"))
        self.netns = None if (self.host_network or not agent.use_netns) else agent.netns_name(self.uid)
        self.ip: str | None = None
        self.init_runs = [ContainerRun(c, True) for c in pod["spec"].get("initContainers") or []]
        self.runs = [ContainerRun(c, False) for c in pod["spec"]["containers"]]
        self.init_index = 0
        self.init_failed = False
        self.sandbox_ready = False
        self.sandbox_message = "sandbox not created yet"
        self.sandbox_torn_down = False
        self.volumes: PodVolumes | None = None
        self.start_time = rfc3339()
        self.gpus: list[str] = []
        self._conditions: dict[str, dict] = {
            c["type"]: c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] in OWN_CONDITIONS
        }
        self._last_status: str | None = None
        self._results: queue.Queue[tuple[ContainerRun, int, ProbeTracker, ProbeResult]] = queue.Queue()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"probe-{md['name']}")
        self._deleted = False
        self._shutdown = False
        self._last_refresh = 0.0
        self.finished = threading.Event()

    # -- inputs from the agent ------------------------------------------------------------------

    @property
    def pod(self) -> dict:
        with self._lock:
            return self._pod

    def update(self, pod: dict) -> None:
        with self._lock:
            if _rv(pod) >= _rv(self._pod):
                self._pod = pod
        self.wake.set()

    def mark_deleted(self) -> None:
        self._deleted = True
        self.wake.set()

    def shutdown(self) -> None:
        self._shutdown = True
        self.wake.set()

    # -- main loop ------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            while True:
                try:
                    if self._iterate():
                        return
                except Exception:  # keep the pod worker alive: the next tick retries
                    log.exception("Pod worker iteration failed pod=%s", self.key)
                    time.sleep(1)
                self.wake.wait(self._next_wakeup())
                self.wake.clear()
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self.finished.set()
            self.agent.forget(self.uid, self)

    def _iterate(self) -> bool:
        """One pass; returns True when the worker is done."""
        pod = self.pod
        if self._shutdown:
            self._stop_all(grace=min(self._grace(pod), 10.0), reason="node agent shutdown")
            self._teardown()
            return True
        if self._deleted:
            self._stop_all(grace=2.0, reason="pod deleted", hooks=False)  # gone from the API: no time for hooks
            self._teardown()
            return True
        if pod["metadata"].get("deletionTimestamp"):
            self._terminate_and_delete(pod)
            return True
        if not self.sandbox_ready:
            self._setup_sandbox(pod)
        if self.sandbox_ready and not self._terminal():
            self._step(pod)
            if time.monotonic() - self._last_refresh > 10 and self.volumes is not None:
                self._last_refresh = time.monotonic()
                self.volumes.pod = pod
                self.volumes.refresh()
        if self._terminal() and not self.sandbox_torn_down:
            self._teardown()
        self._sync_status(pod)
        return False

    def _next_wakeup(self) -> float:
        if not self.sandbox_ready:
            return 2.0
        now = time.monotonic()
        due = [5.0]
        for r in [*self.init_runs, *self.runs]:
            if r.proc is not None:
                due.append(0.2)  # process exits are polled
            elif not r.final and r.backoff_until:
                due.append(max(0.05, r.backoff_until - now))
            for t in r.probes.values():
                if not t.in_flight:
                    due.append(max(0.05, t.next_due - now))
        return min(due)

    # -- sandbox -------------------------------------------------------------------------------

    def _setup_sandbox(self, pod: dict) -> None:
        for sub in ("volumes", "logs", "run"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "pod.json").write_text(json.dumps({"namespace": pod["metadata"]["namespace"],
                                                       "name": pod["metadata"]["name"], "uid": self.uid,
                                                       "netns": self.netns}, indent=2))
        if self.ip is None:
            if self.netns:
                ip = network.allocate_ip(self.netns)
                try:
                    network.create_sandbox(self.netns, ip, pod["metadata"]["name"])
                except Exception:
                    network.release_ip(ip, self.netns)
                    raise
                self.ip = ip
                log.info("Created pod sandbox pod=%s netns=%s podIP=%s", self.key, self.netns, ip)
            else:
                self.ip = self.agent.host_ip
        if not self.gpus:
            self.gpus = self.agent.allocate_gpus(pod["spec"]["nodeName"], self.uid, _gpu_request(pod))
        self.volumes = PodVolumes(self.kube, pod, self.dir, self.agent.state_dir / "claims")
        try:
            self.volumes.setup()
        except (VolumeError, ApiError) as e:
            if self.sandbox_message != str(e):
                self.agent.event(pod, "Warning", "FailedMount", f"MountVolume.SetUp failed: {e}")
            self.sandbox_message = str(e)
            for r in [*self.init_runs, *self.runs]:
                r.state = {"waiting": {"reason": "ContainerCreating", "message": str(e)}}
            return
        self._last_refresh = time.monotonic()
        self.sandbox_ready = True
        self.sandbox_message = ""

    def _teardown(self) -> None:
        if self.sandbox_torn_down:
            return
        self.sandbox_torn_down = True
        if self.netns:
            network.teardown_sandbox(self.netns)
            if self.ip:
                network.release_ip(self.ip, self.netns)
        self.agent.release_gpus(self.uid)

    # -- containers ----------------------------------------------------------------------------

    def _step(self, pod: dict) -> None:
        now = time.monotonic()
        self._drain_probe_results(pod, now)
        policy = pod["spec"].get("restartPolicy", "Always")
        while self.init_index < len(self.init_runs):
            r = self.init_runs[self.init_index]
            self._enforce_kill(r, now)
            if r.proc is None:
                if r.backoff_until <= now:
                    self._start(pod, r)
                return
            code = r.proc.poll()
            if code is None:
                return
            self._on_exit(pod, r, code)
            if code == 0:
                r.final = True
                self.init_index += 1
                continue
            if policy == "Never":
                r.final = True
                self.init_failed = True
                return
            self._schedule_restart(pod, r, now)
            return
        for r in self.runs:
            self._enforce_kill(r, now)
            if r.proc is None:
                if not r.final and r.backoff_until <= now:
                    self._start(pod, r)
                continue
            code = r.proc.poll()
            if code is not None:
                self._on_exit(pod, r, code)
                if policy == "Always" or (policy == "OnFailure" and code != 0):
                    self._schedule_restart(pod, r, now)
                else:
                    r.final = True
                continue
            self._schedule_probes(r, now)

    def _start(self, pod: dict, r: ContainerRun) -> None:
        spec = r.spec
        image = spec.get("image", "")
        try:
            env = self._environment(pod, spec)
            command = [expand(a, env) for a in spec.get("command") or []]
            args = [expand(a, env) for a in spec.get("args") or []]
            runnable = resolve(image, command, args)
        except ImageNotRunnable as e:
            msg = str(e)
            if r.state.get("waiting", {}).get("message") != msg:
                log.warning("Failed to start container pod=%s container=%s reason=ErrImagePull message=%r",
                            self.key, r.name, msg)
                self.agent.event(pod, "Warning", "Failed", msg, r)
            r.state = {"waiting": {"reason": ImageNotRunnable.reason, "message": msg}}
            r.backoff_until = time.monotonic() + 30
            return
        except (ConfigError, VolumeError, ApiError) as e:
            r.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            r.backoff_until = time.monotonic() + 2
            return
        env = {**runnable.env, **env}  # the container's env overrides the image's, as in a runtime
        mounts = list(runnable.mounts)
        assert self.volumes is not None
        for vm in spec.get("volumeMounts") or []:
            src = self.volumes.paths.get(vm["name"])
            if src is None:
                r.state = {"waiting": {"reason": "CreateContainerConfigError",
                                       "message": f"volumeMount {vm['name']!r} names no volume"}}
                r.backoff_until = time.monotonic() + 30
                return
            if vm.get("subPath"):
                src = src / expand(vm["subPath"], env)
            mounts.append({"source": str(src), "target": vm["mountPath"], "readOnly": bool(vm.get("readOnly"))})
        if r.ever_started:
            r.restart_count += 1
        run_dir = self.dir / "run"
        error_file = run_dir / f"{r.name}.error"
        error_file.unlink(missing_ok=True)
        spec_file = run_dir / f"{r.name}.json"
        spec_file.write_text(json.dumps({
            "mounts": mounts,
            "argv": runnable.argv,
            "env": env,
            "workingDir": spec.get("workingDir") or runnable.working_dir,
            "errorFile": str(error_file),
        }, indent=2))
        if self.netns:
            prefix = ["ip", "netns", "exec", self.netns]
        else:
            prefix = ["unshare", "--mount", "--propagation", "slave", "--"]
        log_path = self.dir / "logs" / f"{r.name}.log"
        with open(log_path, "ab") as logf:
            logf.write(f"=== {rfc3339()} container={r.name} restart={r.restart_count} argv={runnable.argv}\n".encode())
            logf.flush()
            r.proc = subprocess.Popen(  # noqa: S603 - argument array, no shell
                [*prefix, sys.executable, ENTER, str(spec_file)],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={"PATH": os.environ.get("PATH", network_path())},
            )
        (run_dir / f"{r.name}.pid").write_text(f"{r.proc.pid}\n")
        r.env = env
        r.generation += 1
        r.ever_started = True
        r.started_wall = time.time()
        r.state = {"running": {"startedAt": rfc3339(r.started_wall)}}
        r.kill_deadline = None
        r.backoff_until = 0.0
        started_mono = time.monotonic()
        r.probes = {}
        for kind in ("startup", "readiness", "liveness"):
            probe = spec.get(f"{kind}Probe")
            if probe and not r.init:
                r.probes[kind] = ProbeTracker(kind, probe, started_mono)
        r.started = "startup" not in r.probes
        r.ready = r.started and "readiness" not in r.probes
        log.info("Started container pod=%s container=%s pid=%d image=%s restartCount=%d",
                 self.key, r.name, r.proc.pid, image, r.restart_count)
        self.agent.event(pod, "Normal", "Started", f"Started container {r.name}", r)

    def _on_exit(self, pod: dict, r: ContainerRun, code: int) -> None:
        exit_code = code if code >= 0 else 128 - code
        error_file = self.dir / "run" / f"{r.name}.error"
        terminated: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": rfc3339(r.started_wall),
            "finishedAt": rfc3339(),
            "containerID": f"e2e://{self.uid}/{r.name}/{r.restart_count}",
        }
        if error_file.exists():
            terminated["reason"] = "StartError"
            terminated["message"] = error_file.read_text()
        elif r.kill_message:
            terminated["message"] = r.kill_message
        r.state = {"terminated": terminated}
        r.last_state = {"terminated": terminated}
        r.proc = None
        r.ready = False
        r.started = False
        r.probes = {}
        r.kill_deadline = None
        r.kill_message = ""
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the container's helpers, if any
            os.killpg(self._pgid_of(r), signal.SIGKILL)
        log.info("Container exited pod=%s container=%s exitCode=%d reason=%s", self.key, r.name, exit_code,
                 terminated["reason"])

    def _pgid_of(self, r: ContainerRun) -> int:
        pid_file = self.dir / "run" / f"{r.name}.pid"
        return int(pid_file.read_text()) if pid_file.exists() else -1

    def _schedule_restart(self, pod: dict, r: ContainerRun, now: float) -> None:
        n = r.restart_count
        delay = 0.0 if n == 0 else min(self.agent.crash_backoff * 2 ** (n - 1), BACKOFF_CAP)
        r.backoff_until = now + delay
        if delay > 0:
            md = pod["metadata"]
            msg = f"back-off {delay:g}s restarting failed container={r.name} pod={md['name']}_{md['namespace']}({self.uid})"
            r.state = {"waiting": {"reason": "CrashLoopBackOff", "message": msg}}
            self.agent.event(pod, "Warning", "BackOff", "Back-off restarting failed container", r)

    def _kill(self, r: ContainerRun, grace: float, message: str) -> None:
        """Stops one container without blocking the worker (a failed probe): preStop, SIGTERM, SIGKILL by deadline."""
        if r.proc is None or r.kill_deadline is not None:
            return
        r.kill_message = message
        r.kill_deadline = math.inf  # set once SIGTERM is sent; until then no probe runs and no second kill starts
        proc, gen = r.proc, r.generation

        def stop() -> None:
            spent = self._pre_stop(self.pod, r, proc, grace)
            if r.proc is not proc or r.generation != gen:
                return  # exited by itself meanwhile
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            r.kill_deadline = time.monotonic() + max(grace - spent, MIN_GRACE)
            self.wake.set()

        threading.Thread(target=stop, name=f"kill-{self.key}/{r.name}", daemon=True).start()

    def _enforce_kill(self, r: ContainerRun, now: float) -> None:
        if r.proc is not None and r.kill_deadline is not None and now >= r.kill_deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(r.proc.pid, signal.SIGKILL)

    def _pre_stop(self, pod: dict, r: ContainerRun, proc: subprocess.Popen[bytes], grace: float) -> int:
        """Runs the container's preStop hook, if any, for at most `grace` seconds; returns whole seconds spent."""
        handler = pre_stop_handler(r.spec)
        if handler is None or r.init or grace <= 0:
            return 0
        log.info("Running preStop hook pod=%s container=%s handler=%r gracePeriod=%gs", self.key, r.name,
                 describe(handler), grace)
        outcome = run_pre_stop(r.spec, self.ip, proc.pid, r.env, grace)
        if not outcome.completed:
            log.info("PreStop hook not completed in grace period pod=%s container=%s gracePeriod=%gs", self.key,
                     r.name, grace)
        elif outcome.error:
            msg = f"PreStopHook failed: {describe(handler)}: {outcome.error}"
            log.warning("Failed preStop hook pod=%s container=%s message=%r", self.key, r.name, outcome.error)
            self.agent.event(pod, "Warning", "FailedPreStopHook", msg, r)
        return outcome.seconds

    def _stop_all(self, grace: float, reason: str, hooks: bool = True) -> None:
        """Stops every running container as the kubelet's killContainer does, all in parallel: the preStop hook
        (bounded by `grace`), then SIGTERM, then SIGKILL once the rest of the grace period - never less than
        MIN_GRACE seconds - has passed."""
        running = [r for r in [*self.init_runs, *self.runs] if r.proc is not None]
        pod = self.pod

        def stop(r: ContainerRun) -> None:
            proc = r.proc
            assert proc is not None
            spent = self._pre_stop(pod, r, proc, grace) if hooks else 0
            left = max(grace - spent, MIN_GRACE)
            log.info("Killing container pod=%s container=%s gracePeriod=%gs reason=%r", self.key, r.name, left, reason)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(left)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

        threads = [threading.Thread(target=stop, args=(r,), name=f"stop-{self.key}/{r.name}", daemon=True)
                   for r in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in running:
            assert r.proc is not None
            self._on_exit(pod, r, r.proc.returncode)
            r.final = True

    def _terminate_and_delete(self, pod: dict) -> None:
        md = pod["metadata"]
        grace = float(md.get("deletionGracePeriodSeconds", self._grace(pod)))
        self._stop_all(grace=grace, reason="pod deleted")
        self._teardown()
        with contextlib.suppress(ApiError):
            self.kube.delete("Pod", md["name"], md["namespace"], grace_period_seconds=0, uid=self.uid)
        log.info("Deleted pod pod=%s uid=%s", self.key, self.uid)

    @staticmethod
    def _grace(pod: dict) -> float:
        return float(pod["spec"].get("terminationGracePeriodSeconds", 30))

    # -- probes --------------------------------------------------------------------------------

    def _schedule_probes(self, r: ContainerRun, now: float) -> None:
        if r.proc is None or r.kill_deadline is not None or self.ip is None:
            return
        for kind, t in r.probes.items():
            if (kind == "startup") == r.started or not t.due(now):
                continue
            t.in_flight = True
            gen, pid, ip = r.generation, r.proc.pid, self.ip
            fut = self._pool.submit(run_probe, t.spec, r.spec, ip, pid, r.env)
            fut.add_done_callback(lambda f, r=r, gen=gen, t=t: self._probe_done(r, gen, t, f))

    def _probe_done(self, r: ContainerRun, gen: int, t: ProbeTracker, fut: Any) -> None:
        try:
            res = fut.result()
        except Exception as e:  # noqa: BLE001 - a probe bug is a failed probe
            res = ProbeResult(False, f"probe error: {e}")
        self._results.put((r, gen, t, res))
        self.wake.set()

    def _drain_probe_results(self, pod: dict, now: float) -> None:
        while True:
            try:
                r, gen, t, res = self._results.get_nowait()
            except queue.Empty:
                return
            if gen != r.generation or r.probes.get(t.kind) is not t:
                continue  # the container restarted since
            decided = t.record(res, now)
            if not res.ok:
                log.debug("Probe failed pod=%s container=%s probe=%s message=%r", self.key, r.name, t.kind, res.message)
            if decided is None:
                continue
            if t.kind == "startup":
                if decided:
                    r.started = True
                    r.ready = "readiness" not in r.probes
                else:
                    self._probe_kill(pod, r, "Startup", res)
            elif t.kind == "readiness":
                r.ready = decided
                log.info("Readiness changed pod=%s container=%s ready=%s", self.key, r.name, decided)
                if not decided:
                    self.agent.event(pod, "Warning", "Unhealthy", f"Readiness probe failed: {res.message}", r)
            elif t.kind == "liveness" and not decided:
                self._probe_kill(pod, r, "Liveness", res)

    def _probe_kill(self, pod: dict, r: ContainerRun, which: str, res: ProbeResult) -> None:
        msg = f"Container {r.name} failed {which.lower()} probe, will be restarted"
        log.info("Killing container pod=%s container=%s reason=%sProbeFailed message=%r", self.key, r.name, which,
                 res.message)
        self.agent.event(pod, "Warning", "Unhealthy", f"{which} probe failed: {res.message}", r)
        self.agent.event(pod, "Normal", "Killing", msg, r)
        probe = r.spec.get(f"{which.lower()}Probe") or {}
        grace = float(probe.get("terminationGracePeriodSeconds") or self._grace(pod))
        self._kill(r, grace, msg)

    # -- environment ---------------------------------------------------------------------------

    def _environment(self, pod: dict, spec: dict) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env: dict[str, str] = {"HOSTNAME": pod["metadata"]["name"]}
        if self.agent.relay is not None:
            host, port = network.GATEWAY, str(self.agent.relay.port)
            env.update({
                "KUBERNETES_SERVICE_HOST": host,
                "KUBERNETES_SERVICE_PORT": port,
                "KUBERNETES_SERVICE_PORT_HTTPS": port,
                "KUBERNETES_PORT": f"tcp://{host}:{port}",
                f"KUBERNETES_PORT_{port}_TCP": f"tcp://{host}:{port}",
            })
        if self.gpus and _container_gpus(spec):
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        for src in spec.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                data = self._source("ConfigMap", src["configMapRef"], ns)
            else:
                data = self._source("Secret", src["secretRef"], ns)
            for k, v in data.items():
                if re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", prefix + k):
                    env[prefix + k] = v
        for item in spec.get("env") or []:
            name = item["name"]
            if "value" in item or "valueFrom" not in item:
                env[name] = expand(item.get("value", ""), env)
                continue
            vf = item["valueFrom"]
            if "fieldRef" in vf:
                p = dict(pod)
                p["status"] = {**(pod.get("status") or {}), "podIP": self.ip, "podIPs": [{"ip": self.ip}],
                               "hostIP": self.agent.host_ip, "hostIPs": [{"ip": self.agent.host_ip}]}
                env[name] = field_value(p, vf["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in vf:
                env[name] = resource_value(pod, vf["resourceFieldRef"], spec["name"])
            elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
                kind, ref = ("ConfigMap", vf["configMapKeyRef"]) if "configMapKeyRef" in vf else ("Secret", vf["secretKeyRef"])
                data = self._source(kind, ref, ns)
                if ref["key"] in data:
                    env[name] = data[ref["key"]]
                elif not ref.get("optional"):
                    raise ConfigError(f"couldn't find key {ref['key']} in {kind} {ns}/{ref.get('name')}")
        return env

    def _source(self, kind: str, ref: dict, ns: str) -> dict[str, str]:
        import base64

        obj = self.kube.get_or_none(kind, ref.get("name", ""), ns)
        if obj is None:
            if ref.get("optional"):
                return {}
            raise ConfigError(f'{kind.lower()} "{ref.get("name")}" not found')
        if kind == "Secret":
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in (obj.get("data") or {}).items()}
        return dict(obj.get("data") or {})

    # -- status --------------------------------------------------------------------------------

    def _terminal(self) -> bool:
        return self._phase() in ("Succeeded", "Failed")

    def _phase(self) -> str:
        if self.init_failed:
            return "Failed"
        if self.init_index < len(self.init_runs) or not self.sandbox_ready:
            return "Pending"
        if all(r.final for r in self.runs):
            ok = all(r.state.get("terminated", {}).get("exitCode") == 0 for r in self.runs)
            return "Succeeded" if ok else "Failed"
        if any(r.ever_started for r in self.runs):
            return "Running"
        return "Pending"

    def _condition(self, type_: str, ok: bool, reason: str = "", message: str = "") -> dict:
        status = "True" if ok else "False"
        prev = self._conditions.get(type_)
        c: dict[str, Any] = {"type": type_, "status": status, "lastProbeTime": None}
        c["lastTransitionTime"] = prev["lastTransitionTime"] if prev and prev.get("status") == status else rfc3339()
        if not ok and reason:
            c["reason"] = reason
        if not ok and message:
            c["message"] = message
        if ok:
            c["reason"] = None
            c["message"] = None
        self._conditions[type_] = c
        return c

    def compute_status(self, pod: dict) -> dict:
        phase = self._phase()
        conditions = [self._condition("PodReadyToStartContainers", self.sandbox_ready and not self.sandbox_torn_down)]
        pending_init = [r.name for r in self.init_runs[self.init_index:]]
        conditions.append(self._condition("Initialized", not pending_init and self.sandbox_ready,
                                          "ContainersNotInitialized",
                                          f"containers with incomplete status: [{' '.join(pending_init)}]"))
        if phase == "Succeeded":
            conditions.append(self._condition("ContainersReady", False, "PodCompleted"))
            conditions.append(self._condition("Ready", False, "PodCompleted"))
        else:
            unready = [r.name for r in self.runs if not (r.ready and r.running)]
            msg = f"containers with unready status: [{' '.join(unready)}]"
            conditions.append(self._condition("ContainersReady", not unready, "ContainersNotReady", msg))
            if unready:
                conditions.append(self._condition("Ready", False, "ContainersNotReady", msg))
            else:
                gate_msg = readiness_gate_message(pod)
                conditions.append(self._condition("Ready", gate_msg is None, "ReadinessGatesNotReady", gate_msg or ""))
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.agent.host_ip,
            "hostIPs": [{"ip": self.agent.host_ip}],
            "startTime": self.start_time,
            "containerStatuses": [r.status(self.uid) for r in self.runs],
        }
        if self.init_runs:
            status["initContainerStatuses"] = [r.status(self.uid) for r in self.init_runs]
        if self.ip:
            status["podIP"] = self.ip
            status["podIPs"] = [{"ip": self.ip}]
        return status

    def _sync_status(self, pod: dict) -> None:
        status = self.compute_status(pod)
        encoded = json.dumps(status, sort_keys=True)
        if encoded == self._last_status:
            return
        md = pod["metadata"]
        try:
            updated = self.kube.patch("Pod", md["name"], {"metadata": {"uid": self.uid}, "status": status},
                                      md["namespace"], sub="status")
        except ApiError as e:
            if e.status == 404:
                self.mark_deleted()
                return
            if e.status == 409 or e.status == 422:
                log.warning("Failed to patch pod status pod=%s err=%s", self.key, e)
            raise
        self._last_status = encoded
        self.update(updated)
        log.debug("Patched pod status pod=%s phase=%s", self.key, status["phase"])


def readiness_gate_message(pod: dict) -> str | None:
    """None when every readiness gate's condition is True; else the kubelet's message."""
    conditions = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
    for gate in pod["spec"].get("readinessGates") or []:
        t = gate["conditionType"]
        c = conditions.get(t)
        if c is None:
            return f'corresponding condition of pod readiness gate "{t}" does not exist.'
        if c.get("status") != "True":
            return f'the status of pod readiness gate "{t}" is not "True", but {c.get("status")}'
    return None


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion: known names are replaced, $$ escapes, unknown stay as written."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR.sub(sub, s)


def _rv(pod: dict) -> int:
    try:
        return int(pod["metadata"].get("resourceVersion") or 0)
    except ValueError:
        return 0


def _container_gpus(spec: dict) -> int:
    res = spec.get("resources") or {}
    return int((res.get("limits") or {}).get("nvidia.com/gpu") or (res.get("requests") or {}).get("nvidia.com/gpu") or 0)


def _gpu_request(pod: dict) -> int:
    return sum(_container_gpus(c) for c in pod["spec"]["containers"])


def network_path() -> str:
    return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
