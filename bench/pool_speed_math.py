"""The pure half of benchmark `pool_speed` (bench/pool_speed.py): a tritonserver's log read into load intervals, by
Triton's own timestamps, and the arithmetic of the operator's share. Nothing here starts, reads or asks anything;
it imports nothing of e2e/ (the unit tier tests it: tests/test_pool_speed_math.py).

A container log as the kubelet keeps it is in CRI format, `<RFC 3339 time> <stream> <P|F> <text>` per line (`P`: a
part of a longer line); tritonserver's own lines start `I1129 15:55:01.123456 1 file.cc:123] ` (severity, month,
day, UTC time of day to the microsecond, thread), and 2.51 quotes the message. Triton writes no year: it is the
CRI time's (or the caller's).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: tritonserver's log prefix: severity, MMDD, HH:MM:SS.ffffff (UTC), thread id, source:line.
TRITON_LINE = re.compile(r"^[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\.(?P<us>\d{6}) +\d+ "
                         r"(?P<src>\S+)\] (?P<msg>.*)$")
CRI_LINE = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) (?:stdout|stderr) "
                      r"(?P<tag>[PF]) ?(?P<text>.*)$")
LOADING = re.compile(r"^\"?loading: (?P<model>.+):(?P<version>\d+)\"?$")
LOADED = re.compile(r"^\"?successfully loaded '(?P<model>[^']+)'(?: version (?P<version>\d+))?\"?$")
FAILED = re.compile(r"^\"?failed to load '(?P<model>[^']+)'(?: version (?P<version>\d+))?")
STARTED_HTTP = re.compile(r"Started HTTPService at")


@dataclass(frozen=True)
class Line:
    """One tritonserver log line: Triton's own time (epoch seconds, UTC), the kubelet's (None in plain text)."""

    triton: float
    cri: float | None
    message: str


@dataclass(frozen=True)
class Interval:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class TritonLog:
    """What one tritonserver container's log says: its lines, each model's loads (`loading:` -> `successfully
    loaded`, or -> `failed to load`), and when it started (its first line) and served HTTP."""

    lines: list[Line]
    loads: dict[str, list[Interval]] = field(default_factory=dict)
    failed: dict[str, list[Interval]] = field(default_factory=dict)
    first: float | None = None
    http: float | None = None

    def loads_of(self, models: Iterable[str], since: float | None = None) -> dict[str, list[Interval]]:
        """The successful loads of `models` that began at or after `since`."""
        want = set(models)
        return {m: [iv for iv in ivs if since is None or iv.start >= since]
                for m, ivs in self.loads.items() if m in want}

    def skew(self) -> float | None:
        """The median of kubelet time - Triton time over the lines that have both: how far Triton's clock (its log
        buffer) is behind the kubelet's; near 0 says Triton's times are UTC on the same clock."""
        ds = sorted(ln.cri - ln.triton for ln in self.lines if ln.cri is not None)
        return ds[len(ds) // 2] if ds else None


def _rfc3339(ts: str) -> float:
    """Epoch seconds of an RFC 3339 time with up to nanoseconds (kept to the microsecond)."""
    m = re.match(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", ts)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {ts!r}")
    y, mo, d, h, mi, s, frac, tz = m.groups()
    t = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0)) + float(f"0.{frac or 0}"[:8])
    if tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        t -= sign * (int(tz[1:3]) * 3600 + int(tz[4:6]) * 60)
    return t


def log_lines(raw: str, year: int | None = None) -> list[Line]:
    """Triton's lines of a container log, in CRI format or plain; others (the Python stubs' own output, a table's
    rows) are skipped. `year`: for plain text, which has no kubelet time (default: this year)."""
    out: list[Line] = []
    part, part_ts = "", None
    for raw_line in raw.splitlines():
        cri = CRI_LINE.match(raw_line)
        if cri:
            part += cri.group("text")
            part_ts = part_ts or cri.group("ts")
            if cri.group("tag") == "P":
                continue
            text, ts = part, part_ts
            part, part_ts = "", None
        else:
            text, ts = raw_line, None
        m = TRITON_LINE.match(text)
        if not m:
            continue
        cri_t = _rfc3339(ts) if ts else None
        y = year if year is not None else (int(ts[:4]) if ts else _this_year())
        t = calendar.timegm((y, int(m.group("mo")), int(m.group("d")), int(m.group("h")), int(m.group("mi")),
                             int(m.group("s")), 0, 0, 0)) + int(m.group("us")) / 1e6
        out.append(Line(t, cri_t, m.group("msg").strip()))
    return out


def _this_year() -> int:
    import time

    return time.gmtime().tm_year


def parse(raw: str, year: int | None = None) -> TritonLog:
    """A tritonserver container's log (`log_lines`) read into its loads: each `loading: M:V` begins one, the next
    `successfully loaded 'M'` (or `failed to load 'M'`) ends it."""
    lines = log_lines(raw, year)
    tl = TritonLog(lines, first=lines[0].triton if lines else None)
    began: dict[str, float] = {}
    for ln in lines:
        if (m := LOADING.match(ln.message)) is not None:
            began.setdefault(m.group("model"), ln.triton)
        elif (m := LOADED.match(ln.message)) is not None and m.group("model") in began:
            tl.loads.setdefault(m.group("model"), []).append(Interval(began.pop(m.group("model")), ln.triton))
        elif (m := FAILED.match(ln.message)) is not None and m.group("model") in began:
            tl.failed.setdefault(m.group("model"), []).append(Interval(began.pop(m.group("model")), ln.triton))
        elif tl.http is None and STARTED_HTTP.search(ln.message):
            tl.http = ln.triton
    return tl


# -- intervals ------------------------------------------------------------------------------------


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of intervals as disjoint ones, in order."""
    out: list[Interval] = []
    for iv in sorted(intervals, key=lambda i: (i.start, i.end)):
        if out and iv.start <= out[-1].end:
            if iv.end > out[-1].end:
                out[-1] = Interval(out[-1].start, iv.end)
        else:
            out.append(iv)
    return out


def union_seconds(intervals: Iterable[Interval], start: float | None = None, end: float | None = None) -> float:
    """Seconds covered by at least one interval (clipped to [start, end] when given)."""
    total = 0.0
    for iv in merged(intervals):
        a = iv.start if start is None else max(iv.start, start)
        b = iv.end if end is None else min(iv.end, end)
        total += max(0.0, b - a)
    return total


def gaps(intervals: Iterable[Interval], start: float, end: float) -> list[Interval]:
    """The parts of [start, end] that no interval covers, in order."""
    out: list[Interval] = []
    at = start
    for iv in merged(intervals):
        if iv.end <= at:
            continue
        if iv.start >= end:
            break
        if iv.start > at:
            out.append(Interval(at, iv.start))
        at = max(at, iv.end)
    if at < end:
        out.append(Interval(at, end))
    return out


# -- the operator's share ---------------------------------------------------------------------------


def new_model_share(applied: float, load: Interval, ready: float) -> dict[str, float]:
    """A new model on a warm pool: `applied` (the create sent), Triton's load (`loading:` -> `successfully
    loaded`), `ready` (its first ready endpoint seen in its Service's slices). The operator's share is the rest,
    split into before Triton starts the load and after Triton's READY."""
    before, after = load.start - applied, ready - load.end
    return {"total_s": round(ready - applied, 4), "triton_s": round(load.seconds, 4), "before_s": round(before, 4),
            "after_s": round(after, 4), "operator_s": round(before + after, 4)}


def kill_share(killed: float, pod_ready: float, loads: Sequence[Interval], serving: float,
               triton_first: float | None = None) -> dict[str, float | None]:
    """A replica's tritonserver killed at `killed`; the pod Ready again at `pod_ready`; Triton's loads of the models
    it held (its new container's log); every one of them serving all its copies again at `serving`. Taken out of the
    total: the kubelet's restart and Triton's start-up (`killed` -> `pod_ready`) and Triton's loads, as their union
    (loads at once, or beside the start-up, count once). The operator's share is the rest; its parts: pod Ready ->
    the first load, the gaps between loads, the last load's end -> all serving."""
    total = serving - killed
    triton = [Interval(killed, pod_ready), *loads]
    not_ours = union_seconds(triton, killed, serving)
    ld = merged(loads)
    first_load = ld[0].start if ld else None
    last_load = ld[-1].end if ld else None
    between = sum(g.seconds for g in gaps(ld, ld[0].start, ld[-1].end)) if ld else 0.0
    return {
        "total_s": round(total, 3),
        "restart_s": None if triton_first is None else round(triton_first - killed, 3),
        "triton_startup_s": None if triton_first is None else round(pod_ready - triton_first, 3),
        "killed_to_pod_ready_s": round(pod_ready - killed, 3),
        "triton_loads_s": round(union_seconds(loads), 3),
        "triton_loads_sum_s": round(sum(iv.seconds for iv in loads), 3),
        "pod_ready_to_first_load_s": None if first_load is None else round(first_load - pod_ready, 3),
        "between_loads_s": round(between, 3),
        "last_load_to_serving_s": None if last_load is None else round(serving - last_load, 3),
        "operator_s": round(total - not_ours, 3),
        "operator_fraction": round((total - not_ours) / total, 4) if total > 0 else None,
    }


def replica_share(loads: Sequence[Interval], start: float, end: float, top: int = 5) -> dict[str, Any]:
    """Where one replica's time went from `start` (the models created) to `end` (its last model serving): Triton
    loading (the union of its loads) against the rest, the gaps, the longest `top` of them (from `start`)."""
    window = end - start
    busy = union_seconds(loads, start, end)
    gs = gaps(loads, start, end)
    longest = sorted(gs, key=lambda g: -g.seconds)[:top]
    return {"window_s": round(window, 3), "triton_loading_s": round(busy, 3), "operator_s": round(window - busy, 3),
            "operator_fraction": round((window - busy) / window, 4) if window > 0 else None,
            "loads": len(loads), "gaps": len(gs),
            "longest_gaps": [{"at_s": round(g.start - start, 3), "seconds": round(g.seconds, 3)} for g in longest]}


# -- the operator's log ------------------------------------------------------------------------------

OPERATOR_TIME = re.compile(r"^(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d),(\d{3}) ")
APPLIED_SERVICE = re.compile(r"Applied Service namespace=\S+ name=(\S+)")


def operator_time(line: str) -> float | None:
    """Epoch seconds of an operator log line's time (`2026-11-29 16:39:14,739`, the operator's text format; the
    machine's clock is UTC)."""
    m = OPERATOR_TIME.match(line)
    if not m:
        return None
    y, mo, d, h, mi, s, msec = map(int, m.groups())
    return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) + msec / 1000


def services_applied_after(lines: Iterable[str], deleted: Mapping[str, float]) -> list[str]:
    """The operator's `Applied Service` lines for a model after it was deleted (`deleted`: name -> when)."""
    out = []
    for ln in lines:
        m = APPLIED_SERVICE.search(ln)
        t = operator_time(ln) if m else None
        if m and t is not None and m.group(1) in deleted and t >= deleted[m.group(1)]:
            out.append(ln)
    return out


# -- the operator's trace (bench/pool_trace.py) -----------------------------------------------------

TRACE = re.compile(r"Traced pool phase namespace=(?P<ns>\S+) pool=(?P<pool>\S+) round=(?P<round>\d+) "
                   r"phase=(?P<phase>\S+) start=(?P<start>[0-9.]+) seconds=(?P<seconds>[0-9.]+)")


@dataclass(frozen=True)
class Span:
    namespace: str
    pool: str
    round: int
    phase: str
    start: float
    seconds: float

    @property
    def end(self) -> float:
        return self.start + self.seconds


def spans(text: str) -> list[Span]:
    """The operator's traced phases (bench/pool_trace.py's lines), in the order they ended."""
    return [Span(m.group("ns"), m.group("pool"), int(m.group("round")), m.group("phase"), float(m.group("start")),
                 float(m.group("seconds"))) for m in (TRACE.search(ln) for ln in text.splitlines()) if m]


def phase_seconds(found: Iterable[Span], start: float, end: float, pool: str | None = None) -> dict[str, float]:
    """Seconds each phase ran inside [start, end] (clipped; phases that run at once each count their own)."""
    out: dict[str, float] = {}
    for s in found:
        if pool is not None and s.pool != pool:
            continue
        a, b = max(s.start, start), min(s.end, end)
        if b > a:
            out[s.phase] = round(out.get(s.phase, 0.0) + b - a, 4)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def totals(rows: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Phase seconds added up over several windows, largest first."""
    out: dict[str, float] = {}
    for r in rows:
        for k, v in r.items():
            out[k] = round(out.get(k, 0.0) + v, 4)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


#: The phases of a round one after the other before its loads (bench/pool_trace.py), and inside `publish`.
BEFORE_LOAD = ("members", "apply_children", "round_of", "observe", "in_flight", "fetch_phase", "plan", "publish")
IN_PUBLISH = ("apply.Service", "model_status", "pool_status")


def round_breakdown(found: Sequence[Span], sent: float, loading: float, loaded: float, ready: float,
                    pool: str) -> dict[str, float] | None:
    """A new model's time, in order, from the round that loaded it (its `load` request, sent between `sent` and
    Triton's `loading:` line): the create -> the operator's request for a round (the watch event), -> the round's
    start (the work queue), each phase of the round before the load, -> Triton's `loading:` (the request on its
    way); after Triton's `successfully loaded`: -> the load request answered, the READY question, the slices
    written (`listed`), -> the watch saw the endpoint. Phases are the round's own (a later round's `queued`, which
    overlaps, is not counted). None when the trace has no such load."""
    loads = [s for s in found if s.pool == pool and s.phase == "load" and sent <= s.start <= loading]
    if not loads:
        return None
    load = loads[-1]
    mine = [s for s in found if s.pool == pool and s.round == load.round]
    rnd = next((s for s in mine if s.phase == "round"), None)
    if rnd is None:
        return None
    queued = next((s for s in mine if s.phase == "queued"), None)
    asked = queued.start if queued is not None and queued.start >= sent else rnd.start
    out = {"create_to_request_s": asked - sent, "request_to_round_s": rnd.start - asked}
    done = 0.0
    for p in BEFORE_LOAD:
        secs = sum(s.seconds for s in mine if s.phase == p and s.end <= load.start + 1e-6)
        out[f"{p}_s"] = secs
        done += secs
    for p in IN_PUBLISH:
        out[f"publish.{p}_s"] = sum(s.seconds for s in mine if s.phase == p and s.end <= load.start + 1e-6)
    out["rest_of_round_s"] = load.start - rnd.start - done
    out["request_to_triton_s"] = loading - load.start
    out["triton_to_answer_s"] = load.end - loaded
    served = next((s for s in mine if s.phase == "served" and s.start >= load.end - 1e-6), None)
    listed = next((s for s in mine if s.phase == "listed" and s.start >= load.end - 1e-6), None)
    out["served_s"] = served.seconds if served else 0.0
    out["listed_s"] = listed.seconds if listed else 0.0
    out["listed_to_seen_s"] = ready - listed.end if listed else 0.0
    out["rest_after_s"] = ready - loaded - out["triton_to_answer_s"] - out["served_s"] - out["listed_s"] \
        - out["listed_to_seen_s"]
    return {k: round(v, 4) for k, v in out.items()}
