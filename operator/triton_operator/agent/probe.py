"""`triton-operator probe`: the readiness endpoint of a gated Triton replica, a small container beside tritonserver.
Its contract with the operator (port, paths, key, the words of `/status`) is in `api.pod`; the operator's client of
it is `triton.probe`.

With the warm-up gate, the container's readiness only has to say "tritonserver is up": it opens its ports only once
the models it loads at start are loaded and warm (gRPC first, then HTTP), and the gate says what it serves. A TCP
probe says that, but only on the kubelet's ticks (period 1 s, the shortest there is), so a replica waited up to a
second after READY for its container to turn ready.

This server answers the kubelet's HTTP probe by long-polling instead. While tritonserver's HTTP port refuses
connections, it holds the probe request (up to `hold` seconds, under the probe's timeout) and connects every
`interval`; the answer comes as soon as the port accepts one. The kubelet starts its next probe at once after a
long one (its ticker has fired meanwhile), so a probe is nearly always waiting.

When it passes. A readiness probe's success sets the pod's Ready at once from the gate as the kubelet last synced
it, and is itself a pod sync; the kubelet runs at most one sync of a pod per PLEG relist (1 s). So if the probe
passed before the kubelet had the operator's gate, Ready waited up to a second for the next relist. The operator
sets the gate once both ports are open and Triton answers READY, then tells this server (`POST /gate`, see
`triton.probe.notify_gate`); a held probe passes `settle` later, time for the kubelet to receive the gate's pod update and
sync it first. Without that notice (an operator that cannot reach the pod, a gate already True when tritonserver
restarted) the probe passes `head_start` after the port opened.

A port that closes after a success is answered at once (503): that is tritonserver exiting. On SIGTERM the server
keeps answering until tritonserver's port refuses (its drain is over) and then exits, so that the pod's termination
does not wait for it.

Serving, not only up (issue 33). Triton's own readiness misses faults clients meet: a Python model whose stub
process died (killed, out of memory) stays READY while every request to it fails ("Stub process ... is not healthy"),
and a model unloaded from a running replica left the endpoint ready for seconds. So with `--model` names (the
replica's model and every ensemble step) a thread (`Health`) asks tritonserver every `--check-interval` (0.1 s) for
the statistics of every model it serves, one request (`GET /v2/models/stats`, on a kept-alive connection). From that
answer:

- a model missing from it is not loaded (unloaded, a reload that failed, still loading): broken at once;
- a model whose failed-request count rose by `--fail-threshold` (3) since its success count last rose is a suspect
  (a dead stub fails every request while Triton calls the model READY), and broken once a request of the probe's own
  fails too (issue 39): a Python model raises on inputs it refuses, and Triton counts those requests as failed exactly
  as a dead stub's, so failures alone would let any client sending bad inputs take the replica out. The probe's
  request is the model's warm-up sample (`agent.confirm`: an ensemble through its steps' samples), sent from a thread
  of its own (`Confirmer`, a 5 s deadline) so the 0.1 s check and the hang rule keep their pace; at most one per model
  every `--confirm-every` (1 s), the model keeping its last verdict in between, so a flood of bad requests meets one
  request of ours a second. Served: the suspicion is dropped (its success shows in the next statistics); failed:
  broken; no answer in time or a full queue (503): no verdict, asked again a second later (slow is not broken). A
  model with nothing to send (no warm-up sample, samples that read `input_data_file` from a repository this
  container does not mount, a decoupled model that Triton's HTTP endpoint refuses) keeps the old rule: its failures
  alone break it. Slow is not broken: a slow model's requests succeed late (its success count rises), and only failed
  executions count (Triton counts neither a request it refused as malformed, nor one a client gave up waiting for).
  It stays broken until its success count rises again or its counters restart (Triton zeroes them when the model is
  loaded again: the operator's heal). `--fail-threshold 0` (the TritonModel's `warmupGate.failedRequestThreshold: 0`)
  turns this rule off; `--confirm-every 0` turns confirmation off (failures alone decide);
- no answer within `--hang-seconds` (2 s; a stopped or deadlocked tritonserver whose port still accepts): broken.

A failed request says so late: the Python backend gives a dead stub a second to answer each request before it fails
it (measured, 2.51), so the first failure comes a second after the fault, and with one instance one a second. So when
the pod shares its process namespace (the renderer asks for it when a model runs the Python backend), the same check
also looks at tritonserver's Python stubs in /proc: a stub that has exited while tritonserver has not reaped it
(a zombie, seen on two checks in a row) is a stub that died under a loaded model, since Triton reaps the stubs of a
model it unloads itself. That model is broken at once, until it is loaded again (its counters restart, or a new stub
of it starts: Triton 2.51 never reaps the dead one). The stub's model is the directory of the `model.py` its command
line names, remembered while it ran (a zombie has no command line).

While a model is broken every probe fails at once (a held probe returns), and so does each probe after it, until it
serves again; while all is well, a probe is held (up to `hold`) and answered as soon as something breaks, so the
kubelet learns within a check interval, not on its next period. `GET /status` says what is broken, as JSON, for the
operator (which heals it). Decoupled and sequence models are covered by the same counters (a request counts once,
however many responses it streams); an ensemble's failures count on the ensemble and on the step that failed, which
is how the operator knows to reload the step. Only the confirmation needs a sample input, and a model without one
falls back on its failures alone, so it is covered as well; a model no client calls cannot fail a request, and is
covered by its readiness alone.

Bounds, and who may ask what (issue 39). Anything that reaches the pod can connect here, and the kubelet cannot send
a secret. So `agent.probe_server` answers the kubelet whatever other clients do: one thread owns every socket (no
thread per connection), a request must arrive whole within a couple of seconds of its connect, and a full server
makes room by closing the connection with least claim rather than refusing the newcomer (its docstring has the
reasoning). `/ready` is keyless; `GET /status` (what is broken, a map of the replica's faults) and `POST /gate`
(which moves the probe's verdict) need the replica's key (header KEY_HEADER, from the variable REPOSITORY_KEY_ENV: the
repository key tritonserver holds, from the same Secret), so only the operator reads or pokes them. Each probe is
judged by what its client address was last told (`Readiness.answer`), so an outsider's probe neither takes the news
of a break from the kubelet's held one nor holds the kubelet's pass back.

Standard library only (and the pod contract, `api.pod`, which is too): it runs in every replica, and starts in a
fraction of a second, without pydantic (tests/test_agent.py).
"""

from __future__ import annotations

import hmac
import http.client
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..api.pod import GATE_PATH, KEY_HEADER, NOT_LOADED, READY_PATH, REPOSITORY_KEY_ENV, STATUS_PATH
from .confirm import FAILED, SERVED, UNKNOWN, Verdict, confirm
from .probe_server import MAX_CONNECTIONS, Answer, ProbeServer, Request, Work

#: Clients (addresses) whose last verdict `Readiness` remembers: the kubelet is one.
TOLD_CLIENTS = 64
#: The longest a `GET /status?since=N&wait=S` is held.
MAX_WAIT = 4.0
#: The readiness's defaults (the command's; the renderer passes its own, `render.kubernetes.Options`): how long a
#: probe is held while tritonserver is not up, how long after the operator's POST GATE_PATH it passes, and how long
#: after tritonserver's port opened without that notice.
HOLD_SECONDS = 8.0
GATE_SETTLE_SECONDS = 0.03
HEAD_START_SECONDS = 0.5
#: The health check's defaults (see the module's docstring).
CHECK_INTERVAL = 0.1
FAIL_THRESHOLD = 3
HANG_SECONDS = 2.0
#: At most one confirmation (the probe's own request) per model this often, each within this deadline.
CONFIRM_EVERY = 1.0
CONFIRM_TIMEOUT = 5.0

#: (success, fail) request counts of each model Triton has loaded, summed over its versions; None: no answer in time.
Counts = dict[str, tuple[int, int]]


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something listens on the port. A connect that times out counts as open: a closed local port refuses
    at once, and a listener whose accept queue is full (tritonserver overloaded) drops the SYN instead."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except TimeoutError:
        return True
    except OSError:
        return False


class Refused(Exception):
    """tritonserver's HTTP port refused the connection: it is not up (the readiness's port check says so)."""


@dataclass
class Health:
    """What the last statistics of tritonserver say about the models this replica serves: `observe` takes one
    answer (or its absence), `broken` says which model (or "tritonserver") cannot serve and why. Pure: tests pass
    counts and a fake clock."""

    models: tuple[str, ...]
    fail_threshold: int = FAIL_THRESHOLD
    hang_seconds: float = HANG_SECONDS
    clock: Callable[[], float] = time.monotonic
    last_answer: float | None = None  # when tritonserver last answered (None: not since its port opened)
    counts: Counts = field(default_factory=dict)
    since_success: dict[str, int] = field(default_factory=dict)  # fails since the model's success count last rose
    failing: dict[str, str] = field(default_factory=dict)  # model -> why, sticky until it serves again
    missing: dict[str, str] = field(default_factory=dict)
    hung: str | None = None
    dead_stubs: dict[str, str] = field(default_factory=dict)  # model -> why: a stub seen dead on two checks
    zombies: set[int] = field(default_factory=set)  # stub pids seen dead on the last check
    forgiven: set[int] = field(default_factory=set)  # dead stubs of a model loaded again since
    live_stubs: set[int] | None = None  # stub pids running at the last check (None: no check yet)
    _reloaded: set[str] = field(default_factory=set)  # models whose counters restarted on this check
    checks: int = 0
    # A pool replica's probe (`--every-model`): every model Triton has statistics for is watched (none is "missing":
    # the operator loads and unloads them), and a stub is known by its instance name (`Stubs.instances`).
    every: bool = False
    version: int = 0  # rises each time what is broken changes (`changed`): what a long-polling reader waits on
    _stub_model: dict[int, str] = field(default_factory=dict)  # every-model mode: stub pid -> its model, resolved once
    _first_seen: dict[int, int] = field(default_factory=dict)  # every-model mode: stub pid -> the check it was first seen
    _model_started: dict[str, int] = field(default_factory=dict)  # every-model mode: the last check a stub of it started
    # Confirmation (issue 39; see the module's docstring): with `confirm_every` over 0, a model past its threshold is a
    # suspect until the probe's own request (`agent.confirm`) fails (broken) or serves (cleared); at most one request
    # per model every `confirm_every` seconds. 0: the failures alone break it (the old rule).
    confirm_every: float = 0.0
    thresholds: dict[str, int] = field(default_factory=dict)  # model -> its own threshold (else `fail_threshold`)
    suspects: dict[str, str] = field(default_factory=dict)  # model -> its failures, awaiting the probe's own request
    _asked: dict[str, float] = field(default_factory=dict)  # model -> when its last confirmation was asked for
    _pending: dict[str, int] = field(default_factory=dict)  # model -> the token of its confirmation in flight
    _tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _news: threading.Condition = field(default_factory=threading.Condition)

    def observe(self, counts: Counts | None, refused: bool = False, dead: dict[int, str] | None = None,
                live: dict[int, str] | None = None) -> None:
        """One check's outcome: the counts, None for no answer in time, or `refused` (the port is closed); and the
        Python stubs (pid -> model) that have exited unreaped, and those running, when the probe can see them."""
        with self._lock:
            self.checks += 1
            self._reloaded = set()
            self._observe(counts, refused)
            if self.every:
                dead, live = self._resolve(dead or {}), self._resolve(live or {})
                self._stub_model = {pid: m for pid, m in self._stub_model.items() if pid in dead or pid in live}
            dead = {pid: m for pid, m in (dead or {}).items() if m in self.models}
            live = live or {}
            started = {m for pid, m in live.items() if pid not in self.live_stubs} if self.live_stubs is not None else set()
            self.live_stubs = set(live)
            again = started | self._reloaded
            self.forgiven = {pid for pid in self.forgiven | {p for p, m in dead.items() if m in again} if pid in dead}
            dead = {pid: m for pid, m in dead.items() if pid not in self.forgiven}
            if self.every:
                dead = self._not_replaced(dead, live)
            self.dead_stubs = {m: f"the Python stub of model {m} (pid {pid}) has exited; every request to it fails"
                               for pid, m in sorted(dead.items()) if pid in self.zombies}
            self.zombies = set(dead)

    def _not_replaced(self, dead: dict[int, str], live: dict[int, str]) -> dict[int, str]:
        """The dead stubs but those a reload replaced: in-place updates (Swap) start a model's new stubs before its old
        ones exit, so an old stub exiting after a stub of its model started is not a break (a killed stub, with no
        load since it started, still is). Every-model mode: the operator reloads models there at any time."""
        for pid, m in live.items():
            if pid not in self._first_seen:
                self._first_seen[pid] = self.checks
                self._model_started[m] = self.checks
        replaced = {pid for pid, m in dead.items()
                    if self._model_started.get(m, 0) > self._first_seen.get(pid, self.checks)}
        self._first_seen = {pid: n for pid, n in self._first_seen.items() if pid in live or pid in dead}
        return {pid: m for pid, m in dead.items() if pid not in replaced}

    def _resolve(self, stubs: dict[int, str]) -> dict[int, str]:
        """pid -> model, of stubs known by instance name: each resolved once, while its model is served (a zombie
        of an unloaded model must not be taken for another model whose name its own starts with)."""
        out: dict[int, str] = {}
        for pid, instance in stubs.items():
            if pid not in self._stub_model and (m := self._model_of(instance)) is not None:
                self._stub_model[pid] = m
            if pid in self._stub_model:
                out[pid] = self._stub_model[pid]
        return out

    def _model_of(self, instance: str) -> str | None:
        """The model a stub's instance name (`<model>_<group>_<n>`, Triton's default names) belongs to: the longest
        model Triton serves that it starts with."""
        found = [m for m in self.models if instance == m or instance.startswith(f"{m}_")]
        return max(found, key=len) if found else None

    def changed(self) -> None:
        """What is broken changed: a long-polling reader (`wait_news`) answers now."""
        with self._news:
            self.version += 1
            self._news.notify_all()

    def wait_news(self, since: int, timeout: float) -> None:
        """Waits until `version` is not `since`, or `timeout` seconds."""
        with self._news:
            self._news.wait_for(lambda: self.version != since, timeout)

    def _observe(self, counts: Counts | None, refused: bool) -> None:
        now = self.clock()
        if refused:  # a tritonserver that exits or restarts: counters start again with the next one
            self.last_answer, self.hung = None, None
            self.counts, self.since_success, self.failing, self.missing = {}, {}, {}, {}
            self.suspects, self._pending = {}, {}
            return
        if counts is None:
            if self.last_answer is not None and now - self.last_answer >= self.hang_seconds:
                self.hung = f"tritonserver did not answer for {now - self.last_answer:.1f}s"
            return
        self.last_answer, self.hung = now, None
        if self.every:
            gone = set(self.models) - set(counts)
            self.models = tuple(sorted(counts))
            for m in gone:  # unloaded: its counts start again with its next load
                self._clear(m)
                self.counts.pop(m, None)
                self.thresholds.pop(m, None)
        self.missing = {m: f"model {m} {NOT_LOADED}"
                        for m in self.models if m not in counts}
        self._reloaded |= set(self.missing)
        for m in self.models:
            if m not in counts:
                self._clear(m)
                self.counts.pop(m, None)
                self.since_success.pop(m, None)
                continue
            success, fail = counts[m]
            before = self.counts.get(m)
            self.counts[m] = (success, fail)
            if before is None or success < before[0] or fail < before[1] or success > before[0]:
                # first seen, or counters that went back (the model was loaded again), or a success
                if before is not None and (success < before[0] or fail < before[1]):
                    self._reloaded.add(m)
                    if self.every:
                        self.thresholds.pop(m, None)  # its config may say another now
                self._clear(m)
                continue
            self.since_success[m] = self.since_success.get(m, 0) + fail - before[1]
            threshold = self._threshold(m)
            if threshold is None:
                threshold = 1  # not known yet: its first failure asks (the confirmation reads its config)
            if threshold and self.since_success[m] >= threshold:
                why = f"model {m} failed {self.since_success[m]} requests in a row and served none (Triton's statistics)"
                if not self.confirm_every:
                    self.failing[m] = why
                elif m not in self.failing:
                    self.suspects[m] = why

    def _threshold(self, m: str) -> int | None:
        """A model's failed-request threshold: its own, else the replica's; None on a pool replica (every-model mode)
        that confirms, until the model's config was read (`confirmed`): each pooled model may carry its own there."""
        if m in self.thresholds:
            return self.thresholds[m]
        return None if self.every and self.confirm_every else self.fail_threshold

    def _clear(self, m: str) -> None:
        """A model that served (or was loaded again, or went): no failures count against it any more."""
        self.since_success[m] = 0
        self.failing.pop(m, None)
        self.suspects.pop(m, None)
        self._pending.pop(m, None)  # a confirmation in flight is about what came before

    def due(self) -> list[tuple[str, int]]:
        """The suspects to confirm now, each with the token its verdict comes back with (`confirmed`): those with no
        confirmation in flight and none asked for in the last `confirm_every` seconds."""
        with self._lock:
            now, out = self.clock(), []
            for m in sorted(self.suspects):
                if m not in self._pending and now - self._asked.get(m, now - self.confirm_every) >= self.confirm_every:
                    self._tokens += 1
                    self._asked[m], self._pending[m] = now, self._tokens
                    out.append((m, self._tokens))
            self._asked = {m: t for m, t in self._asked.items() if m in self.counts}
            return out

    def confirmed(self, model: str, token: int, verdict: Verdict) -> None:
        """The probe's own request to a suspect answered: it serves (cleared), it failed (broken), it has nothing to
        send (the old rule: broken on its failures), or no verdict (it stays a suspect, asked again later). A verdict
        about a model that served or was loaded again since it was asked for is dropped."""
        with self._lock:
            if self._pending.get(model) != token:
                return
            del self._pending[model]
            if self.every and verdict.config:
                self.thresholds[model] = self.fail_threshold if verdict.threshold is None else verdict.threshold
            why = self.suspects.get(model)
            threshold = self._threshold(model)
            under = threshold is not None and (threshold == 0 or self.since_success.get(model, 0) < threshold)
            if why is not None and under:
                del self.suspects[model]  # under its own threshold (just read), or that rule off: not a suspect
                return
            if why is None or verdict.kind == UNKNOWN:
                return
            del self.suspects[model]
            if verdict.kind == SERVED:
                self.since_success[model] = 0  # its success is in the next statistics too
            elif verdict.kind == FAILED:
                self.failing[model] = f"{why}; the probe's own request (its warm-up sample) failed too: {verdict.why}"
            else:
                self.failing[model] = f"{why}; nothing to confirm it with ({verdict.why}): failures alone decide"

    def broken(self) -> dict[str, str]:
        """What cannot serve, and why: model names, or "tritonserver" when it does not answer."""
        with self._lock:
            return self._broken()

    def _broken(self) -> dict[str, str]:  # under the lock
        if self.hung is not None:
            return {"tritonserver": self.hung}
        return {**self.failing, **self.dead_stubs, **self.missing}

    def status(self) -> dict[str, Any]:
        """`GET /status`: what is broken, and the counts the verdict rests on."""
        with self._lock:
            return {"models": list(self.models), "broken": self._broken(), "checks": self.checks, "version": self.version,
                    "counts": {m: {"success": c[0], "fail": c[1]} for m, c in self.counts.items()},
                    "failsSinceSuccess": dict(self.since_success), "suspects": sorted(self.suspects)}

    def why(self) -> str | None:
        broken = self.broken()
        return "; ".join(broken.values()) if broken else None


#: The most of tritonserver's statistics answer the probe reads (issue 39: the image is the spec's author's, and an
#: endless answer OOM-killed the probe container at its 64Mi). A model's entry is about 1 KiB per version: a pool replica
#: of hundreds of models stays far under it.
MAX_STATS_BYTES = 4 << 20


def fetch_counts(conn: http.client.HTTPConnection) -> Counts:
    """`GET /v2/models/stats` on `conn` (kept alive across calls): (success, fail) by model name. Raises OSError
    (TimeoutError when tritonserver does not answer in the connection's timeout, or answers more than
    MAX_STATS_BYTES; Refused when its port is closed)."""
    try:
        conn.request("GET", "/v2/models/stats")
        resp = conn.getresponse()
        body = resp.read(MAX_STATS_BYTES + 1)
        if len(body) > MAX_STATS_BYTES:
            conn.close()  # the rest is never read: this connection cannot carry another request
            raise TimeoutError(f"tritonserver's statistics answer is over {MAX_STATS_BYTES} bytes")
    except ConnectionRefusedError as exc:
        conn.close()
        raise Refused() from exc
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise TimeoutError(str(exc)) if not isinstance(exc, TimeoutError) else exc from None
    if resp.status != 200:
        raise TimeoutError(f"tritonserver answered {resp.status} for its statistics")
    out: Counts = {}
    for entry in json.loads(body).get("model_stats") or ():
        stats = entry.get("inference_stats") or {}
        s, f = out.get(entry.get("name", ""), (0, 0))
        out[entry.get("name", "")] = (s + int((stats.get("success") or {}).get("count", 0)),
                                      f + int((stats.get("fail") or {}).get("count", 0)))
    return out


STUB = "triton_python_backend_stub"


@dataclass
class Stubs:
    """tritonserver's Python backend stubs, as this process sees them in /proc (a pod that shares its process
    namespace; otherwise it sees none): `scan()` lists those that exited unreaped, and those that run."""

    proc: Path = Path("/proc")
    repository: str | None = None  # only the stubs of models under this directory (None: any)
    models: dict[int, str] = field(default_factory=dict)  # pid -> model, learned while the stub ran
    # Know a stub by its instance name (its command line's 8th argument, `<model>_<group>_<n>`) instead of its
    # model directory: a model loaded from a request runs from a directory Triton made (`/tmp/folderXXXXXX/1/model.py`,
    # measured on 2.51), which does not say the model.
    instances: bool = False

    def scan(self) -> tuple[dict[int, str], dict[int, str]]:
        out: dict[int, str] = {}
        alive: set[int] = set()
        running: dict[int, str] = {}
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state in ("Z", "X"):
                    if pid in self.models:
                        out[pid] = self.models[pid]
                        alive.add(pid)
                    continue
                if pid not in self.models:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if not argv[0].endswith(STUB.encode()) or len(argv) < 2:
                        continue
                    path = Path(argv[1].decode(errors="replace"))  # <repository>/<model>/<version>/model.py
                    parts = path.parts
                    if self.instances:
                        if len(argv) < 9 or not argv[8]:
                            continue
                        self.models[pid] = argv[8].decode(errors="replace")
                        alive.add(pid)
                        running[pid] = self.models[pid]
                        continue
                    if len(parts) < 3 or (self.repository is not None and not path.is_relative_to(self.repository)):
                        continue
                    self.models[pid] = parts[-3]
                alive.add(pid)
                running[pid] = self.models[pid]
            except (OSError, IndexError):
                continue
        self.models = {pid: m for pid, m in self.models.items() if pid in alive}
        return out, running


class Confirmer:
    """Runs the probe's own requests (`agent.confirm`) off the checking thread, on `workers` threads of its own, so a
    slow model's confirmation never delays the statistics check or the hang rule; each verdict goes to `health`, then
    `on_verdict` (what is broken may have changed). `Health.due` hands out at most one request per model at a time."""

    def __init__(self, health: Health, target: tuple[str, int], timeout: float, on_verdict: Callable[[], object],
                 workers: int = 2, send: Callable[[tuple[str, int], str, float], Verdict] = confirm) -> None:
        self.health, self.target, self.timeout, self.on_verdict, self.send = health, target, timeout, on_verdict, send
        self._jobs: list[tuple[str, int]] = []
        self._cond = threading.Condition()
        for n in range(workers):
            threading.Thread(target=self._work, daemon=True, name=f"confirm-{n}").start()

    def submit(self, jobs: list[tuple[str, int]]) -> None:
        if jobs:
            with self._cond:
                self._jobs.extend(jobs)
                self._cond.notify(len(jobs))

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs))
                model, token = self._jobs.pop(0)
            try:
                verdict = self.send(self.target, model, self.timeout)
            except Exception as exc:  # noqa: BLE001 - a bug here must not kill the worker: no verdict, asked again
                verdict = Verdict(UNKNOWN, f"{exc.__class__.__name__}: {exc}")
            print(f"probe: confirmed model {model}: {verdict.kind}{f' ({verdict.why})' if verdict.why else ''}",
                  file=sys.stderr, flush=True)
            self.health.confirmed(model, token, verdict)
            self.on_verdict()


class Reporter:
    """Says when what is broken changed (the log, `Health.changed`, `on_change`): from the checking thread and from
    the confirmations' threads, one at a time."""

    def __init__(self, health: Health, on_change: Callable[[], None]) -> None:
        self.health, self.on_change = health, on_change
        self.last: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        """Whether it changed (and was told)."""
        with self._lock:
            broken = self.health.broken()
            if broken == self.last:
                return False
            print(f"probe: health changed; broken={json.dumps(broken)}" if broken else
                  f"probe: health changed; nothing broken (was {', '.join(sorted(self.last))})", file=sys.stderr,
                  flush=True)
            self.last = broken
            self.health.changed()
            self.on_change()
            return True


def watch_health(health: Health, target: tuple[str, int], interval: float, on_change: Callable[[], None],
                 stop: threading.Event, repository: str | None = None, confirm_timeout: float = 5.0) -> None:
    """The checking thread: `fetch_counts` every `interval` into `health`; `on_change` when what is broken changes;
    the suspects it finds go to a `Confirmer` (with `health.confirm_every` over 0)."""
    timeout = max(interval, min(1.0, health.hang_seconds / 2))
    conn = http.client.HTTPConnection(*target, timeout=timeout)
    report = Reporter(health, on_change)
    confirmer = Confirmer(health, target, confirm_timeout, report) if health.confirm_every > 0 else None
    was_refused = True
    stubs = Stubs(repository=None if health.every else repository, instances=health.every)
    while not stop.is_set():
        started = time.monotonic()
        refused = False
        try:
            dead, live = stubs.scan()
        except OSError:
            dead, live = {}, {}
        try:
            health.observe(fetch_counts(conn), dead=dead, live=live)
        except Refused:
            refused = True
            health.observe(None, refused=True)
        except (OSError, ValueError):
            health.observe(None, dead=dead, live=live)
        if confirmer is not None:
            confirmer.submit(health.due())
        if not report() and refused != was_refused:
            on_change()  # the port closed (or opened): a held probe looks at it now
        was_refused = refused
        stop.wait(max(0.0, interval - (time.monotonic() - started)))


@dataclass
class Readiness:
    """When tritonserver's port is open, when the operator set the gate, and what the last answer was: shared by the
    request threads. `sleep` None waits on a condition a gate notice wakes; tests pass a fake clock and sleep."""

    check: Callable[[], bool]
    hold: float = 8.0
    head_start: float = 0.5
    settle: float = 0.03
    interval: float = 0.005
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] | None = None
    # With a health check: why the replica cannot serve (None: it can), and a ready probe is held until that
    # changes (or `hold` passes), so a break fails the probe the kubelet holds open.
    broken: Callable[[], str | None] | None = None
    open_since: float | None = None
    gate_at: float | None = None
    last_ready: bool = False  # the last verdict given to anyone
    _told: dict[str, bool] = field(default_factory=dict)  # the last verdict given to each client, oldest first
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def _observe(self) -> bool:
        is_open = self.check()
        with self._cond:
            if not is_open:
                self.open_since = self.gate_at = None  # a notice is about the tritonserver that answered it
            elif self.open_since is None:
                self.open_since = self.clock()
        return is_open

    def gate_set(self) -> bool:
        """The operator set the pod's readiness gate True: probes pass `settle` from now. Counts only while
        tritonserver's port is open (the gate is about the tritonserver behind it); False if it is not."""
        is_open = self._observe()
        with self._cond:
            if is_open:
                self.gate_at = self.clock()
                self._cond.notify_all()
        return is_open

    def poke(self) -> None:
        """Something changed (the health check): held probes look again now."""
        with self._cond:
            self._cond.notify_all()

    def _passes_at(self) -> float | None:
        """When a probe may pass (under the lock): `settle` after the gate's notice, else `head_start` after the
        port opened. None while the port is closed."""
        if self.open_since is None:
            return None
        at = self.open_since + self.head_start
        return at if self.gate_at is None else min(at, self.gate_at + self.settle)

    def answer(self, cut: threading.Event | None = None, client: str = "") -> tuple[bool, str]:
        """Wait, within `hold`, until a probe may pass (or, with a health check, until a passing replica breaks);
        say ready or why not. `cut` set: answer now, as at the end of the hold (the server needs the room).

        Each probe is judged by what its `client` (the caller's address) was last told, not by what anyone was:
        one that follows a pass to that client is held while passing and fails the moment the replica breaks; one
        that follows a failure passes as soon as it may. So another client's probes (a curious pod, an attacker)
        neither take the news of a break from the kubelet's held probe nor hold back its pass."""
        deadline = self.clock() + self.hold
        with self._cond:
            was_ready = self._told.get(client, False)
        while True:
            is_open = self._observe()
            why = self.broken() if self.broken is not None and is_open else None
            with self._cond:
                now = self.clock()
                expired = now >= deadline or (cut is not None and cut.is_set())
                if not is_open and was_ready:
                    # It was ready: a closed port is news the kubelet should have now, not after a hold.
                    return self._tell(client, False, "tritonserver's HTTP port refuses connections")
                if why is not None and was_ready:
                    return self._tell(client, False, why)  # a break: news at once, too
                at = self._passes_at() if is_open else None
                # Passing. With a health check, a probe that follows a pass is held, to fail the moment something
                # breaks, and passes when the hold is over.
                passing = at is not None and why is None and now >= at
                if passing and (self.broken is None or not was_ready or expired):
                    return self._tell(client, True, "tritonserver is up")
                if expired:
                    return self._tell(client, False, why or "tritonserver's HTTP port refuses connections")
                if why is not None or (at is not None and now >= at):
                    until = deadline  # broken, or passing and held: the health check's poke wakes it
                else:
                    until = now + self.interval if at is None else at
                wait = max(0.001, min(until, deadline) - now)
                if self.sleep is None:
                    self._cond.wait(wait)  # a gate notice (or a change of health, or a cut) wakes it early
                    continue
            self.sleep(wait)

    def now(self, client: str = "") -> tuple[bool, str]:
        """The verdict a probe gets at the end of its hold, at once and from the last check of the port (no new one):
        what a held probe cut short is told (the server needs its place; `agent.probe_server`)."""
        with self._cond:
            is_open = self.open_since is not None
        why = self.broken() if self.broken is not None and is_open else None
        with self._cond:
            at = self._passes_at() if is_open else None
            if at is not None and why is None and self.clock() >= at:
                return self._tell(client, True, "tritonserver is up")
            return self._tell(client, False, why or "tritonserver's HTTP port refuses connections")

    def _tell(self, client: str, ready: bool, why: str) -> tuple[bool, str]:
        """Records the verdict given to `client` (under the lock); the most recent `TOLD_CLIENTS` are kept."""
        self.last_ready = ready
        self._told.pop(client, None)
        self._told[client] = ready
        while len(self._told) > TOLD_CLIENTS:
            del self._told[next(iter(self._told))]
        return ready, why


def _authorized(request: Request, key: str | None) -> bool:
    """Whether the request carries the replica's key (constant time; no key configured: nothing is)."""
    given = request.headers.get(KEY_HEADER)
    return key is not None and given is not None and hmac.compare_digest(given.encode(), key.encode())


def _route(readiness: Readiness, health: Health | None, settle: float,
           key: str | None) -> Callable[[Request], Answer | Work]:
    """The probe server's requests: GET READY_PATH (the kubelet's probe, keyless), and with the replica's key GET
    STATUS_PATH (the models' health) and POST GATE_PATH (the operator's notice that it has set the gate)."""

    def verdict(is_ready: bool, why: str) -> Answer:
        return Answer(200 if is_ready else 503, why)

    def gate(_: threading.Event) -> Answer:
        if not readiness.gate_set():
            return Answer(409, "tritonserver's HTTP port refuses connections")
        print(f"probe: the operator set the readiness gate; passing in {settle:g} s", file=sys.stderr, flush=True)
        return Answer(200, f"passing readiness probes in {settle:g} s")

    def route(request: Request) -> Answer | Work:
        path, _, query = request.path.partition("?")
        if path in ("/", READY_PATH) and request.method == "GET":
            return Work(lambda cut: verdict(*readiness.answer(cut, request.peer)), held=True, wake=readiness.poke,
                        now=lambda: verdict(*readiness.now(request.peer)))
        if (path, request.method) not in ((STATUS_PATH, "GET"), (GATE_PATH, "POST")):
            return Answer(404, "not found")
        if not _authorized(request, key):
            return Answer(401, f"this path needs the replica's key in header {KEY_HEADER}")
        if path == GATE_PATH:
            return Work(gate)
        return Work(lambda _: _status(health, query))

    return route


def _status(health: Health | None, query: str) -> Answer:
    """`GET /status[?since=N&wait=S]`: held until what is broken changes from version N, or S seconds (a pool
    replica's operator learns of a break at once, with one request waiting at a time)."""
    if health is not None:
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        try:
            since, wait = int(params.get("since", "")), min(float(params.get("wait", "0")), MAX_WAIT)
        except ValueError:
            since, wait = -1, 0.0
        if wait > 0:
            health.wait_news(since, wait)
    body = health.status() if health is not None else {"models": [], "broken": {}}
    return Answer(200, json.dumps(body), "application/json")


def serve(listen: tuple[str, int], target: tuple[str, int], hold: float, head_start: float, settle: float,
          stop_poll: float = 0.1, models: tuple[str, ...] = (), check_interval: float = CHECK_INTERVAL,
          fail_threshold: int = FAIL_THRESHOLD, hang_seconds: float = HANG_SECONDS, repository: str | None = None,
          every: bool = False, confirm_every: float = CONFIRM_EVERY, confirm_timeout: float = CONFIRM_TIMEOUT,
          key: str | None = None, max_connections: int = MAX_CONNECTIONS) -> int:
    """Answers on `listen` until SIGTERM (then until tritonserver's port at `target` closes). `key`: the replica's,
    which GET /status and POST /gate need (None: they are refused)."""
    # SIGTERM and SIGINT are blocked from here on, in this thread and every thread it starts, and taken with
    # sigwait below: no handler runs inside a wait that holds a lock the handler would need, and a signal sent as
    # soon as the port listens stays pending instead of killing the process.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    health = (Health(models, fail_threshold=fail_threshold, hang_seconds=hang_seconds, every=every,
                     confirm_every=confirm_every) if models or every else None)
    # A pool replica's readiness says its tritonserver is up, nothing per model: a broken model is the operator's to
    # take out of that model's slices (it reads `GET /status`), not a reason to take every model on the replica out.
    readiness = Readiness(check=lambda: port_open(*target), hold=hold, head_start=head_start, settle=settle,
                          broken=health.why if health is not None and not every else None)
    stop_health = threading.Event()
    server = ProbeServer(listen, _route(readiness, health, settle, key), max_connections=max_connections)
    if key is None:  # said before the first answer (tests/test_probe.py read it after one: a race under load)
        print(f"probe: warning: no {REPOSITORY_KEY_ENV} in the environment: GET {STATUS_PATH} and POST {GATE_PATH} are refused",
              file=sys.stderr, flush=True)
    threading.Thread(target=server.serve_forever, daemon=True, name="probe-server").start()
    if health is not None:
        threading.Thread(target=watch_health, args=(health, target, check_interval, readiness.poke, stop_health, repository,
                                                    confirm_timeout), daemon=True, name="health").start()
        confirming = (f" and a failed request of the probe's own, at most one every {confirm_every:g} s"
                      if confirm_every > 0 else "")
        print(f"probe: checking every {check_interval:g} s that models "
              f"{'(every model Triton serves)' if every else ', '.join(models)} serve (broken after "
              f"{fail_threshold} failed requests with no success{confirming}, or {hang_seconds:g} s without an answer)",
              file=sys.stderr, flush=True)
    print(f"probe: answering readiness on {listen[0]}:{listen[1]} for tritonserver's HTTP port {target[0]}:{target[1]}"
          f" (hold {hold:g} s; passes {settle:g} s after the operator's POST {GATE_PATH}, else {head_start:g} s after the"
          " port opens)", file=sys.stderr, flush=True)
    signal.sigwait(stop_signals)
    # tritonserver drains after the preStop sleep: keep answering until its port refuses, then go.
    print("probe: SIGTERM; waiting for tritonserver's HTTP port to close", file=sys.stderr, flush=True)
    while port_open(*target, timeout=stop_poll):
        time.sleep(stop_poll)
    stop_health.set()
    server.shutdown()
    print("probe: tritonserver's HTTP port is closed; exiting", file=sys.stderr, flush=True)
    return 0


def address(text: str, default_host: str) -> tuple[str, int]:
    """`HOST:PORT` or `:PORT` or `PORT`."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return (host or default_host), int(port)
