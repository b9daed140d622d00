"""The benchmarks' pictures: `bench/results/<name>.png`, drawn from `<name>.json` alone.

`write_plot(json_path)` draws one result's main figure next to its JSON; `write_all()` redraws every committed
result (`python -m bench.run --plots-only`). bench/run.py calls `write_plot` after each benchmark writes its JSON.

Nothing here measures or invents a figure: each picture shows series the JSON holds. Where a result lacks a series
its picture needs (a run from before the bench recorded it), the picture draws what is there and its title says
what is missing.

The output is meant to be reproducible: the Agg renderer, one fixed size and DPI for every picture, the fonts
matplotlib ships, and no metadata (no date, no matplotlib version) in the PNG, so the same JSON drawn by the same
matplotlib gives the same bytes (tests/test_bench_plots.py checks it).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; set before anything imports pyplot (nothing here does)

from matplotlib import style as mpl_style  # after the backend is chosen
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .common import RESULTS, percentile

#: Every picture's size: 12 x 6.75 inches at 100 DPI, 1200 x 675 pixels.
SIZE_INCHES = (12.0, 6.75)
DPI = 100
PIXELS = (int(SIZE_INCHES[0] * DPI), int(SIZE_INCHES[1] * DPI))

#: Colours by role, the same in every picture: ours, ours on another model, the baseline, a second baseline, the floor.
OURS, OURS_ALT, BASELINE, BASELINE_ALT, FLOOR = "tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:gray"

#: The settings every picture shares, on top of matplotlib's defaults (style "default": whatever a matplotlibrc on
#: this machine says does not count).
STYLE: dict[str, Any] = {"font.size": 10, "axes.titlesize": 10, "figure.titlesize": 12, "legend.fontsize": 9,
                         "axes.grid": True, "grid.alpha": 0.3}

Json = dict[str, Any]
Drawer = Callable[[Figure, Json], list[str]]


# -- helpers -------------------------------------------------------------------------------------


def _num(x: Any) -> float | None:
    """A finite number, or None (JSON nulls, NaN, strings)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _stats_label(values: Sequence[float], unit: str = "ms") -> str:
    """'n=20: p50 1310 ms, p95 2043 ms, max 2061 ms', with the percentile method of the results' tables."""
    if not values:
        return "n=0"
    def f(x: float) -> str:
        return f"{x:.0f} {unit}" if abs(x) >= 10 else f"{x:.3g} {unit}"
    return (f"n={len(values)}: p50 {f(percentile(values, 50))}, p95 {f(percentile(values, 95))}, "
            f"max {f(max(values))}")


def _ecdf(ax: Axes, values: Sequence[float], label: str, color: str) -> None:
    xs = sorted(values)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", color=color, label=label)
    ax.plot(xs, ys, "o", color=color, markersize=3)


def _log_x_if_positive(ax: Axes, values: Iterable[float]) -> None:
    """A log x axis, ticked 1-2-5 with plain numbers, where the values span more than a factor of 20."""
    vs = list(values)
    if not vs or min(vs) <= 0 or max(vs) / min(vs) <= 20:
        return
    ax.set_xscale("log")
    lo, hi = min(vs), max(vs)
    ticks = [m * 10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in (1, 2, 5)]
    ticks = [t for t in ticks if lo / 1.5 <= t <= hi * 1.5]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()


def _strip(ax: Axes, rows: Sequence[tuple[str, Sequence[float], str]], unit: str) -> None:
    """One row of dots per (label, values, colour), top to bottom, with a tick at each row's p50."""
    for i, (_label, values, color) in enumerate(rows):
        y = len(rows) - 1 - i
        if values:
            # Spread equal values a little in y, by rank: deterministic, and no dot hides another.
            k = len(values)
            ys = [y + (j - (k - 1) / 2) * min(0.3 / max(k - 1, 1), 0.04) for j in range(k)]
            ax.plot(sorted(values), ys, "o", color=color, markersize=4, alpha=0.75)
            ax.plot([percentile(values, 50)] * 2, [y - 0.3, y + 0.3], "-", color="black", linewidth=1.5)
        else:
            ax.text(0.5, y, "no samples", transform=ax.get_yaxis_transform(), ha="center", va="center", color="gray")
    ax.set_yticks(range(len(rows)), [f"{lab}\n{_stats_label(v, unit)}".strip() for lab, v, _ in reversed(rows)])
    ax.set_ylim(-0.6, len(rows) - 0.4)


def _legend(ax: Axes, **kwargs: Any) -> None:
    """The axes' legend, if anything on them has a label (an empty result draws none)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _target(d: Json, figure_prefix: str) -> tuple[float, str] | None:
    """A 'p95 <= N ms|s' target of the row whose figure starts with `figure_prefix`, in seconds."""
    for r in d.get("rows") or ():
        if str(r.get("figure", "")).startswith(figure_prefix):
            m = re.search(r"(p\d+)\s*<=\s*([\d.]+)\s*(ms|s)\b", str(r.get("target", "")))
            if m:
                return float(m.group(2)) / (1000 if m.group(3) == "ms" else 1), m.group(0)
    return None


# -- gate ----------------------------------------------------------------------------------------


def _gate_role(key: str) -> tuple[str, str]:
    known = {"gated": ("ours, add-sub", OURS), "warm": ("ours, examples/warmup.yaml", OURS_ALT),
             "plain": ("baseline: a Deployment with a readiness probe, no gate", BASELINE),
             "onprem": ("baseline: the k8s-onprem chart's probes (startup probe first), add-sub", BASELINE_ALT),
             "plainwarm": ("baseline: a readiness probe, examples/warmup.yaml", "tab:brown"),
             "kubelet_floor": ("floor: a readiness gate's condition patched by the bench (no operator) -> pod Ready",
                               FLOOR)}
    if key in known:
        return known[key]
    if "floor" in key:
        return f"floor: {key}", FLOOR
    return key, BASELINE_ALT


def gate(fig: Figure, d: Json) -> list[str]:
    """READY -> pod Ready per replica, ours against the baseline (and any other series the run recorded)."""
    data, missing = d.get("data") or {}, []
    ax = fig.subplots()
    timelines = data.get("timelines") or {}
    drawn: list[float] = []
    for key, pods in timelines.items():
        ms = []
        for p in pods:
            ready, model_ready = _num(p.get("ready_at")), _num(p.get("model_ready_at"))
            if ready is not None and model_ready is not None:
                ms.append((ready - model_ready) * 1000)
        if ms:
            label, color = _gate_role(key)
            _ecdf(ax, ms, f"{label} ({_stats_label(ms)})", color)
            drawn += ms
    if not drawn:
        missing.append("per-replica READY and Ready times (data.timelines)")
        ax.text(0.5, 0.5, "no per-replica samples in this result", transform=ax.transAxes, ha="center")
    _log_x_if_positive(ax, drawn)
    target = _target(d, "model READY -> pod Ready")
    if target and drawn:
        ax.axvline(target[0] * 1000, color="red", linestyle="--", linewidth=1, label=f"target: {target[1]}")
    ax.set_xlabel("Triton model READY (first gRPC ModelReady true) -> pod Ready (watch), ms")
    ax.set_ylabel("fraction of replicas")
    ax.set_ylim(0, 1.05)
    _legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ax.set_title("Distribution of READY -> pod Ready, one dot per replica")
    return missing


# -- scale ---------------------------------------------------------------------------------------


def _scale_role(impl: str) -> tuple[str, str]:
    known = {"ours": ("triton-operator", OURS), "usual": ("baseline: kopf-default operator", BASELINE)}
    if impl in known:
        return known[impl]
    if "floor" in impl:
        return "floor: a bare client, no controller", FLOOR
    return impl, BASELINE_ALT


def _scale_metrics(p: Json) -> dict[str, float | None]:
    n = _num(p.get("models"))
    cpu = _num((p.get("cpu_seconds_until_converged") or {}).get("operator"))
    return {
        "converge": _num(p.get("converge_seconds")),
        "requests": _num(p.get("operator_requests_per_model")),
        "rss": _num(p.get("peak_rss_mb")),
        "cpu": cpu / n * 1000 if cpu is not None and n else None,
    }


def scale(fig: Figure, d: Json) -> list[str]:
    """Converge time, API requests, peak RSS and CPU per model against the number of models, per implementation."""
    phases = [p for p in (d.get("data") or {}).get("phases") or () if _num(p.get("models"))]
    impls = list(dict.fromkeys(str(p.get("impl")) for p in phases))
    missing = [] if any("floor" in i for i in impls) else ["the floor (no floor row in this result)"]
    axes = fig.subplots(2, 2).flatten()
    panels = (("converge", "time until every model converged, s"),
              ("requests", "operator API requests per model"),
              ("rss", "operator peak RSS (VmHWM), MB"),
              ("cpu", "operator CPU per model until converged, ms"))
    sizes = sorted({int(p["models"]) for p in phases})
    for ax, (metric, title) in zip(axes, panels, strict=True):
        top = 0.0
        for impl in impls:
            pts = sorted((float(p["models"]), v) for p in phases if str(p.get("impl")) == impl
                         and (v := _scale_metrics(p)[metric]) is not None)
            if pts:
                label, color = _scale_role(impl)
                ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", color=color, label=label)
                below = impl == "ours"  # ours is the lowest line in every panel so far: its figures go under it
                for x, y in pts:
                    ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(5, -11 if below else 4),
                                fontsize=8, color=color)
                top = max(top, *(y for _, y in pts))
        ax.set_ylim(0, top * 1.15 or 1)
        ax.set_xscale("log")
        ax.set_xticks(sizes, [str(s) for s in sizes])
        if sizes:
            ax.set_xlim(sizes[0] / 1.3, sizes[-1] * 1.3)
        ax.minorticks_off()
        ax.set_title(title)
    axes[2].set_xlabel("TritonModels created together")
    axes[3].set_xlabel("TritonModels created together")
    _legend(axes[0], loc="upper left")
    return missing


# -- autoscale -----------------------------------------------------------------------------------


def _autoscale_role(key: str) -> tuple[str, str]:
    known = {"queue": ("ours: HPA on Triton's queue time (spec.autoscaling)", OURS),
             "cpu": ("baseline: HPA on CPU utilisation", BASELINE)}
    if key in known:
        return known[key]
    if "keda" in key:
        return f"baseline: KEDA's Prometheus scaler ({key})", BASELINE_ALT
    return key, FLOOR


def _autoscale_phases(data: Json) -> dict[str, Json]:
    """The approaches' results: data["phases"] if the run nests them, else every dict in data with latency figures."""
    nested = data.get("phases")
    source: Json = nested if isinstance(nested, dict) else data
    return {k: v for k, v in source.items() if isinstance(v, dict) and ("p50_ms" in v or "timeline" in v)}


def _autoscale_series(fig: Figure, phases: dict[str, Json]) -> list[str]:
    ax_r, ax_q, ax_l = fig.subplots(3, 1, sharex=True)
    missing = []
    handles: list[Line2D] = []
    any_failed = False

    def points(entries: list[Json], field: str) -> tuple[list[float], list[float]]:
        pts = [(t, v) for e in entries if (t := _num(e.get("t"))) is not None and (v := _num(e.get(field))) is not None]
        return [t for t, _ in pts], [v for _, v in pts]

    for key, ph in phases.items():
        label, color = _autoscale_role(key)
        handles.append(Line2D([], [], color=color, label=label))
        tl, series = ph.get("timeline") or [], ph.get("load_series") or []
        ts, asked = points(tl, "replicas")
        if ts:
            ax_r.step(ts, asked, where="post", color=color)
        ts, warmed = points(tl, "warmed")
        if ts:
            ax_r.step(ts, warmed, where="post", color=color, linestyle=":")
        if not tl:
            missing.append(f"{key}: replicas over time")
        ts, queue = points(tl, "queue_ms")
        if ts:
            ax_q.plot(ts, queue, "-", color=color)
        else:
            missing.append(f"{key}: queue time")
        ts, p50 = points(series, "p50_ms")
        if ts:
            ax_l.plot(ts, p50, "-", color=color)
            ax_l.plot(*points(series, "p95_ms"), "--", color=color)
        else:
            missing.append(f"{key}: latency per second")
        for t, f in zip(*points(series, "failed"), strict=True):
            if f:
                any_failed = True
                ax_l.axvline(t, color="red", alpha=min(1.0, 0.2 + 0.1 * f), linewidth=1)
    if any_failed:
        handles.append(Line2D([], [], color="red", label="a second with failed requests"))
    ax_r.set_ylabel("replicas")
    ax_r.set_title("replicas: asked for by the HPA (solid), warmed (dotted)")
    ax_r.set_ylim(bottom=0)
    ax_q.set_ylabel("queue time, ms")
    ax_q.set_title("Triton's queue time per request (every replica's statistics, between two polls)")
    ax_q.set_ylim(bottom=0)
    ax_l.set_ylabel("latency, ms")
    ax_l.set_title("client latency per second of the step: p50 (solid), p95 (dashed)")
    ax_l.set_ylim(bottom=0)
    ax_l.set_xlabel("seconds since the step's first request")
    ax_l.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.4), ncol=min(len(handles), 3))
    return missing


def _autoscale_summary(fig: Figure, phases: dict[str, Json]) -> None:
    """The committed figures only (no time series): when the HPA asked and an added replica answered, latency,
    replicas."""
    ax_t, ax_l, ax_r = fig.subplots(1, 3)
    keys = list(phases)
    roles = [_autoscale_role(k) for k in keys]
    width = 0.8 / max(len(keys), 1)
    for metrics, ax, unit in (((("hpa_asked_seconds", "HPA asked\nfor more"),
                                 ("first_added_answer_seconds", "an added replica\nanswered")), ax_t, "s"),
                               ((("p50_ms", "p50"), ("p99_ms", "p99")), ax_l, "ms"),
                               ((("replicas_max", "most"), ("replicas_end", "at the end")), ax_r, "")):
        top = 0.0
        for i, (key, (_, color)) in enumerate(zip(keys, roles, strict=True)):
            for j, (field, _) in enumerate(metrics):
                v = _num(phases[key].get(field))
                x = j + (i - (len(keys) - 1) / 2) * width
                if v is None:
                    ax.text(x, 0, " never", rotation=90, ha="center", va="bottom", color=color, fontsize=9)
                else:
                    ax.bar(x, v, width, color=color)
                    ax.annotate(f"{v:.3g}{' ' + unit if unit else ''}", (x, v), textcoords="offset points",
                                xytext=(0, 2), ha="center", fontsize=8)
                    top = max(top, v)
        ax.set_xticks(range(len(metrics)), [m[1] for m in metrics])
        ax.set_xlim(-0.6, len(metrics) - 0.4)
        ax.set_ylim(0, top * 1.12 or 1)
    ax_t.set_title("seconds into the step")
    ax_l.set_title("latency during the step, ms")
    ax_r.set_title("replicas during the step")
    ax_l.legend([Patch(color=c) for _, c in roles], [lab for lab, _ in roles], loc="upper center",
                bbox_to_anchor=(0.5, -0.12))


def autoscale(fig: Figure, d: Json) -> list[str]:
    """Replicas, queue time and latency over the load step for each approach; the summary figures where the run
    recorded no time series."""
    phases = _autoscale_phases(d.get("data") or {})
    if any(ph.get("timeline") or ph.get("load_series") for ph in phases.values()):
        return _autoscale_series(fig, phases)
    _autoscale_summary(fig, phases)
    return ["time series (this run recorded no replicas, queue time or latency over time: summary figures only)"]


# -- rollout -------------------------------------------------------------------------------------


CHANGE = re.compile(r"\+([\d.]+)s (left|joined) (\S+)")


def _ready_steps(ph: Json) -> list[tuple[float, int]]:
    """(seconds since the patch, ready endpoints) from the EndpointSlice watch's changes; the phase began with
    every old pod ready (the bench asserts it)."""
    n = len(ph.get("old_pods") or {})
    steps = [(0.0, n)]
    for change in ph.get("endpoint_changes") or ():
        m = CHANGE.match(change)
        if m:
            n += 1 if m.group(2) == "joined" else -1
            steps.append((float(m.group(1)), n))
    end = _num(ph.get("endpoints_seconds"))
    if end is not None:
        steps.append((end, n))
    return steps


def rollout(fig: Figure, d: Json) -> list[str]:
    """Per phase (Swap, Drain, new pods): ready endpoints and failed requests from the patch to the end."""
    phases = (d.get("data") or {}).get("phases") or {}
    titles = {"swap": "in place, Swap", "drain": "in place, Drain", "new_pods": "new pods (baseline)"}
    colors = {"swap": OURS, "drain": OURS_ALT, "new_pods": BASELINE}
    axes = fig.subplots(2, max(len(phases), 1), sharex=True, sharey="row", squeeze=False)
    missing: list[str] = []
    unbinned: list[str] = []
    top_failed = 1.0
    for col, (key, ph) in enumerate(phases.items()):
        ax_e, ax_f = axes[0][col], axes[1][col]
        color = colors.get(key, BASELINE_ALT)
        steps = _ready_steps(ph)
        ax_e.step([t for t, _ in steps], [n for _, n in steps], where="post", color=color)
        done = _num(ph.get("done_seconds"))
        for ax in (ax_e, ax_f):
            if done is not None:
                ax.axvline(done, color="black", linestyle="--", linewidth=1)
        ax_e.set_title(f"{titles.get(key, key)}: done at {done:.1f} s" if done is not None else titles.get(key, key))
        load = ph.get("load") or {}
        sent, failed = _num(load.get("sent")), _num(load.get("failed"))
        series = load.get("series") or []
        if series:
            ax_f.bar([float(e["t"]) for e in series], [float(e.get("failed") or 0) for e in series], width=1.0,
                     align="edge", color="red")
            top_failed = max(top_failed, *(float(e.get("failed") or 0) for e in series))
        elif failed == 0 and steps:
            # No per-second record, but none failed in the whole phase: zero at every moment is what the run saw.
            ax_f.plot([0, steps[-1][0]], [0, 0], "-", color="red", linewidth=2)
            unbinned.append(key)
        else:
            unbinned.append(key)
            missing.append(f"{key}: when its requests failed" if failed else f"{key}: its failed requests")
        ax_f.text(0.02, 0.95, f"{failed:.0f} failed of {sent:.0f} sent" if sent is not None and failed is not None
                  else "failures not recorded", transform=ax_f.transAxes, va="top", fontsize=9)
        ax_f.set_xlabel("seconds since the patch")
    if unbinned:
        missing.insert(0, f"requests per second ({', '.join(unbinned)}; a phase with no failure is drawn at 0)")
    axes[0][0].plot([], [], "k--", linewidth=1, label="done: every replica serves the new config, gate True")
    _legend(axes[0][0], loc="lower left", fontsize=8)
    axes[0][0].set_ylabel("ready endpoints")
    axes[1][0].set_ylabel("failed requests per second" if any((ph.get("load") or {}).get("series")
                                                               for ph in phases.values()) else "failed requests")
    axes[0][0].set_ylim(bottom=0)
    axes[1][0].set_ylim(-0.05 * top_failed, top_failed * 1.15)  # the rows share y; a zero line shows above the axis
    if top_failed == 1.0:
        axes[1][0].set_yticks([0, 1])
    return missing


# -- the others: each result's main figure -------------------------------------------------------


def first_request(fig: Figure, d: Json) -> list[str]:
    """Per replica: the first request after it joined the endpoints, against the steady p50 and a request after
    1 s of quiet, ours and the baseline."""
    results = (d.get("data") or {}).get("results") or {}
    roles = {"lazy": ("ours", OURS), "lazy-plain": ("baseline", BASELINE)}
    rows: list[tuple[str, list[float], str]] = []
    for key, reps in results.items():
        who, color = roles.get(key, (key, BASELINE_ALT))
        firsts = [x * 1000 for r in reps if (x := _num(r.get("first_s"))) is not None]
        steady = [x * 1000 for r in reps if (x := _num((r.get("steady") or {}).get("p50"))) is not None]
        idle = [x * 1000 for r in reps if (x := _num((r.get("after_idle") or {}).get("p50"))) is not None]
        rows += [(f"{who}: first request", firsts, color), (f"{who}: after 1 s of quiet, p50", idle, color),
                 (f"{who}: steady p50", steady, color)]
    ax = fig.subplots()
    _strip(ax, rows, "ms")
    _log_x_if_positive(ax, [v for _, vs, _ in rows for v in vs])
    ax.set_xlabel("latency, ms (one dot per replica; the black tick is the p50)")
    ax.set_title("first request after a replica joins the endpoints, against its steady requests")
    return [] if results else ["per-replica results (data.results)"]


def batching(fig: Figure, d: Json) -> list[str]:
    """Throughput and latency against concurrency, with and without the dynamic batcher."""
    runs = (d.get("data") or {}).get("runs") or []
    ax_t, ax_l = fig.subplots(1, 2)
    for on, label, color in ((True, "ours: dynamic batching", OURS), (False, "baseline: batching off", BASELINE)):
        rs = sorted((r for r in runs if bool(r.get("batching")) == on), key=lambda r: float(r.get("concurrency", 0)))
        cs = [float(r["concurrency"]) for r in rs]
        if not rs:
            continue
        ax_t.plot(cs, [float(r["throughput_rps"]) for r in rs], "o-", color=color, label=label)
        for field, style, what in (("p50_s", "o-", "p50"), ("p99_s", "s--", "p99")):
            pts = [(c, v * 1000) for c, r in zip(cs, rs, strict=True) if (v := _num(r.get(field))) is not None]
            ax_l.plot([c for c, _ in pts], [v for _, v in pts], style, color=color, label=f"{label}, {what}")
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        cs = sorted({int(r["concurrency"]) for r in runs})
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.minorticks_off()
        ax.set_xlabel("concurrent clients")
        _legend(ax, loc="upper left")
    ax_t.set_ylabel("requests per second")
    ax_t.set_ylim(bottom=0)
    ax_t.set_title("throughput")
    ax_l.set_yscale("log")
    ax_l.set_ylabel("latency, ms")
    ax_l.set_title("latency")
    return [] if runs else ["the runs (data.runs)"]


def faults(fig: Figure, d: Json) -> list[str]:
    """Per fault: the time until the replica left the ready endpoints, and until it served again."""
    outcomes = (d.get("data") or {}).get("outcomes") or {}
    suffix = ": fault -> endpoint ready false"
    titles = [str(r["figure"])[: -len(suffix)] for r in d.get("rows") or () if str(r.get("figure", "")).endswith(suffix)]
    names = titles if len(titles) == len(outcomes) else list(outcomes)
    ax_left, ax_back = fig.subplots(1, 2)
    left = [(textwrap.fill(name, 34), [x for o in outs if (x := _num(o.get("left"))) is not None], OURS)
            for name, outs in zip(names, outcomes.values(), strict=True)]
    back = [("", [x for o in outs if (x := _num(o.get("served"))) is not None], OURS_ALT)
            for outs in outcomes.values()]
    _strip(ax_left, left, "s")
    _strip(ax_back, back, "s")
    ax_back.yaxis.tick_right()  # its labels (the figures) on the outer side, the faults' names on the left
    for i, name in enumerate(names):
        target = _target(d, name + suffix)
        if target:  # on the rows it is a target for only
            y = len(names) - 1 - i
            ax_left.plot([target[0]] * 2, [y - 0.4, y + 0.4], "--", color="red", linewidth=1.5)
    if any(_target(d, name + suffix) for name in names):
        ax_left.plot([], [], "--", color="red", label="target: p95 <= 1 s")
        _legend(ax_left, loc="lower right")
    for ax, vals in ((ax_left, left), (ax_back, back)):
        _log_x_if_positive(ax, [v for _, vs, _ in vals for v in vs])
        ax.set_xlabel("seconds after the fault")
    ax_left.set_title("fault -> out of the ready endpoints\n(a dot per injection; black: p50)")
    ax_back.set_title("fault -> answering again (healed)\n(a dot per injection; black: p50)")
    return [] if outcomes else ["the outcomes (data.outcomes)"]


def pool(fig: Figure, d: Json) -> list[str]:
    """GPUs that 40 models take in one pool against a Deployment each; apply -> first ready endpoint."""
    data = d.get("data") or {}
    gpu, apply = data.get("gpu") or {}, data.get("apply") or {}
    ax_g, ax_a = fig.subplots(1, 2)
    fields = (("gpus_asked", "GPUs\nasked"), ("gpus_allocated_to_running_pods", "GPUs\nallocated"),
              ("pods_running", "pods\nRunning"), ("pods_pending_for_gpu", "pods Pending\nfor a GPU"))
    for i, (key, label, color) in enumerate((("pool", "ours: one TritonPool", OURS),
                                             ("deployments", "baseline: a Deployment per model", BASELINE))):
        counts = gpu.get(key) or {}
        for j, (field, _) in enumerate(fields):
            v = _num(counts.get(field))
            if v is not None:
                x = j + (i - 0.5) * 0.4
                ax_g.bar(x, v, 0.4, color=color, label=label if j == 0 else None)
                ax_g.annotate(f"{v:.0f}", (x, v), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=8)
    ax_g.set_xticks(range(len(fields)), [f[1] for f in fields])
    ax_g.set_title(f"{gpu.get('models', '?')} models, one copy each, on a node with "
                   f"{(gpu.get('pool') or {}).get('node_gpus_allocatable', '?')} GPUs")
    _legend(ax_g, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    def seconds(kind: str, field: str) -> list[float]:
        return [v for r in apply.get(kind) or () if (v := _num(r.get(field))) is not None]

    rows = [("ours: apply -> ready endpoint", seconds("pool", "apply_to_ready_s"), OURS),
            ("  of which Triton's load + warm-up", seconds("pool", "triton_load_s"), OURS_ALT),
            ("baseline: apply -> ready endpoint", seconds("deployment", "apply_to_ready_s"), BASELINE)]
    _strip(ax_a, rows, "s")
    ax_a.set_xlim(left=0)
    ax_a.set_xlabel("seconds (one dot per new model)")
    ax_a.set_title("kubectl apply of a new model -> its first ready endpoint")
    return [] if gpu or apply else ["the GPU count and the applies (data.gpu, data.apply)"]


def stale(fig: Figure, d: Json) -> list[str]:
    """Per approach: answers per second by the config that gave them, from the change, with "completed" marked."""
    sides = (d.get("data") or {}).get("sides") or {}
    titles = {"ours": ("ours: TritonModel, in place (Swap)", OURS),
              "usual": ("baseline: Triton poll mode on a ConfigMap volume", BASELINE)}
    axes = fig.subplots(1, max(len(sides), 1), sharey=True, squeeze=False)[0]
    missing: list[str] = []
    for ax, (key, side) in zip(axes, sides.items(), strict=False):
        title, color = titles.get(key, (key, BASELINE_ALT))
        per = side.get("generations") or []
        if per:
            t = [float(e["t"]) for e in per]
            ax.bar(t, [float(e.get("new") or 0) for e in per], width=1.0, align="edge", color=color, alpha=0.5,
                   label="answered by the new config")
            ax.bar(t, [float(e.get("old") or 0) for e in per], width=1.0, align="edge", color="red",
                   bottom=[float(e.get("new") or 0) for e in per], label="answered by the old config")
        else:
            missing.append(f"{key}: answers per second (data.sides.{key}.generations)")
        done = _num(side.get("completed_s"))
        st = side.get("stale") or {}
        if done is not None:
            ax.axvline(done, color="black", linestyle="--", linewidth=1, label="the change counts as completed")
        old_after, after = st.get("old_after"), st.get("answers_after")
        ax.set_title(f"{title}\n{old_after} of {after} answers after completed came from the old config"
                     if old_after is not None else title)
        ax.set_xlabel("seconds since the change was applied")
        _legend(ax, loc="lower right", fontsize=8)
    axes[0].set_ylabel("answers per second")
    return missing


def pool_routing(fig: Figure, d: Json) -> list[str]:
    """Per phase: requests that reached a pool replica without the model ready, ours against the baseline."""
    phases = (d.get("data") or {}).get("phases") or []
    ax = fig.subplots()
    width = 0.38
    for i, (side, label, color) in enumerate((("ours", "ours: the model's Service (the operator's EndpointSlices)",
                                               OURS),
                                              ("usual", "baseline: a Service selecting the pool's pods by readiness",
                                               BASELINE))):
        xs, ys = [], []
        for j, ph in enumerate(phases):
            v = _num(((ph.get("failed") or {}).get(side) or {}).get("not loaded"))
            if v is not None:
                xs.append(j + (i - 0.5) * width)
                ys.append(v)
        ax.bar(xs, ys, width, color=color, label=label)
        for x, y, ph in zip(xs, ys, phases, strict=False):
            sent = (ph.get("sent") or {}).get(side)
            ax.annotate(f"{y:.0f} of {sent}", (x, y), textcoords="offset points", xytext=(0, 2), ha="center",
                        fontsize=8)
    ax.set_xticks(range(len(phases)), [textwrap.fill(str(ph.get("title", ph.get("key"))), 30) for ph in phases])
    ax.set_ylabel("requests answered \"model not ready / unknown\"")
    ax.set_title("requests that reached a replica without the model ready, per phase (and of all sent in it)")
    _legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    return [] if phases else ["the phases (data.phases)"]


def placement(fig: Figure, d: Json) -> list[str]:
    """Per model: throughput and p95 latency under Spread and under Pack (a dot per round, a bar for their mean)."""
    runs = (d.get("data") or {}).get("runs") or []
    ax_t, ax_l = fig.subplots(1, 2)
    sides = (("Spread", OURS), ("Pack", BASELINE))
    # Models are named <tag>-mNN: the same NN is the same slot of the load in every round.
    slots = sorted({name.rsplit("-", 1)[-1] for r in runs for name in (r.get("models") or {})})
    width = 0.4
    for ax, key, unit in ((ax_t, "infer_per_s", "infer/s"), (ax_l, "p95_ms", "ms")):
        for i, (strategy, color) in enumerate(sides):
            rs = [r for r in runs if r.get("strategy") == strategy]
            per_slot = {s: [v for r in rs for name, m in (r.get("models") or {}).items()
                            if name.rsplit("-", 1)[-1] == s and (v := _num(m.get(key))) is not None] for s in slots}
            xs = [j + (i - 0.5) * width for j in range(len(slots))]
            means = [sum(v) / len(v) if v else 0.0 for v in per_slot.values()]
            totals = [_num(r.get("total_infer_per_s")) for r in rs]
            label = strategy + (f": {', '.join(f'{t:.0f}' for t in totals if t is not None)} infer/s in all"
                                if key == "infer_per_s" and rs else "")
            ax.bar(xs, means, width, color=color, alpha=0.6, label=label)
            for x, vs in zip(xs, per_slot.values(), strict=True):
                ax.plot([x] * len(vs), vs, "o", color="black", markersize=3)
        ax.set_xticks(range(len(slots)), slots)
        ax.set_xlabel("model (the same slot of the load in each round)")
        ax.set_ylabel(unit)
        _legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    ax_t.set_title("throughput per model (perf_analyzer; bar: mean of rounds, dot: a round)")
    ax_l.set_title("p95 latency per model (perf_analyzer; bar: mean of rounds, dot: a round)")
    return [] if runs else ["the runs (data.runs)"]


def pool_speed(fig: Figure, d: Json) -> list[str]:
    """A new model's time beside Triton's load; a killed replica's and each big-pool replica's time split into
    Triton's (its log) and the operator's share."""
    data = d.get("data") or {}
    samples = [s for s in (data.get("warm") or {}).get("samples") or () if _num(s.get("operator_s")) is not None]
    ax_n, ax_s = fig.subplots(1, 2)

    def col(key: str) -> list[float]:
        return [v for s in samples if (v := _num(s.get(key))) is not None]

    _strip(ax_n, [("ours: the operator's share", col("operator_s"), OURS),
                  ("  before Triton begins the load", col("before_s"), OURS),
                  ("  after Triton's READY", col("after_s"), OURS),
                  ("Triton's load + warm-up (its log)", col("triton_s"), OURS_ALT)], "s")
    target = _target(d, "new model")
    if target:
        ax_n.axvline(target[0], linestyle="--", color="red", label=f"target: {target[1]}")
        _legend(ax_n, loc="lower right")
    ax_n.set_xlim(left=0)
    ax_n.set_xlabel("seconds (a dot per new model)")
    ax_n.set_title("a new model on a warm pool:\ncreate -> first ready endpoint")
    bars: list[tuple[str, float, float, float]] = []  # label, kill -> pod Ready, Triton loading, operator
    for r in (data.get("kill") or {}).get("runs") or ():
        total, op, up = _num(r.get("total_s")), _num(r.get("operator_s")), _num(r.get("killed_to_pod_ready_s"))
        if total is not None and op is not None and up is not None:
            bars.append((f"killed, {r.get('held')} models", up, total - op - up, op))
    for name, r in sorted(((data.get("big") or {}).get("per_replica") or {}).items()):
        busy, op = _num(r.get("triton_loading_s")), _num(r.get("operator_s"))
        if busy is not None and op is not None:
            bars.append((f"{(data.get('big') or {}).get('models')} models: {name[-5:]} ({r.get('models')})", 0.0, busy,
                         op))
    for i, (_label, up, busy, op) in enumerate(bars):
        y = len(bars) - 1 - i
        ax_s.barh(y, up, color=FLOOR, label="kill -> pod Ready" if i == 0 else None)
        ax_s.barh(y, busy, left=up, color=OURS_ALT, label="Triton loading (its log)" if i == 0 else None)
        ax_s.barh(y, op, left=up + busy, color=OURS, label="the operator's share (%)" if i == 0 else None)
        total = up + busy + op
        ax_s.annotate(f"{op / total:.0%}" if total else "-", (total, y), textcoords="offset points", xytext=(3, -3),
                      fontsize=8)
    ax_s.set_yticks(range(len(bars)), [b[0] for b in reversed(bars)])
    ax_s.set_xlabel("seconds")
    ax_s.set_title("a killed replica until all its models serve again;\neach replica of the big pool until its last serves")
    _legend(ax_s, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    missing = [] if samples else ["the new models (data.warm.samples)"]
    return missing + ([] if bars else ["the kills and the big pool (data.kill, data.big)"])


def upgrade(fig: Figure, d: Json) -> list[str]:
    """Per variant (the chart's bound, no bound): when each model's Deployment rolled, and how many rolled, waited for a
    slot and had a pod Pending for a GPU, from the helm upgrade's start to every model serving on the new image."""
    variants = (d.get("data") or {}).get("variants") or {}
    colors = {"bounded": OURS, "plain": BASELINE}
    axes = fig.subplots(2, max(len(variants), 1), sharex=True, sharey="row", squeeze=False)
    missing: list[str] = []
    models = sorted({m for v in variants.values() for m in v.get("spans") or {}})
    for col, (key, v) in enumerate(variants.items()):
        ax_g, ax_n = axes[0][col], axes[1][col]
        for model, span in (v.get("spans") or {}).items():
            start, end = _num(span[0]) if span else None, _num(span[1]) if len(span) > 1 else None
            if start is not None and end is not None:
                ax_g.barh(models.index(model), end - start, left=start, color=colors.get(key, BASELINE_ALT), height=0.6)
        done = _num(v.get("seconds"))
        for ax in (ax_g, ax_n):
            if done is not None:
                ax.axvline(done, color="black", linestyle="--", linewidth=1)
        load = v.get("load") or {}
        failed, sent = (sum(int(m.get(k) or 0) for m in load.values()) for k in ("failed", "sent"))
        ax_g.set_title(f"{v.get('title', key)}: done at {done:.1f} s, {failed} of {sent} requests failed"
                       if done is not None else str(v.get("title", key)))
        timeline = [p for p in v.get("timeline") or () if len(p) == 4]
        if not timeline:
            missing.append(f"{key}: its timeline")
        end = max(done or 0.0, *(float(p[0]) for p in timeline)) if timeline else 0.0
        for index, label, style in ((1, "rolling", "-"), (2, "waiting for a slot", "--"), (3, "pods Pending for a GPU", ":")):
            xs = [float(p[0]) for p in timeline] + ([end] if timeline else [])
            ys = [int(p[index]) for p in timeline] + ([int(timeline[-1][index])] if timeline else [])
            ax_n.step(xs, ys, where="post", linestyle=style, color=colors.get(key, BASELINE_ALT), label=label)
        ax_n.set_xlabel("seconds since helm upgrade")
    axes[0][0].set_yticks(range(len(models)), models)
    axes[0][0].set_ylabel("model (its Deployment rolling)")
    axes[1][0].set_ylabel("models (pods Pending)")
    axes[1][0].set_ylim(bottom=0)
    axes[0][0].plot([], [], "k--", linewidth=1, label="every model serving on the new image")
    _legend(axes[0][0], loc="lower right", fontsize=8)
    _legend(axes[1][0], loc="upper right", fontsize=8)
    return missing


DRAWERS: dict[str, Drawer] = {"gate": gate, "scale": scale, "autoscale": autoscale, "rollout": rollout,
                              "first_request": first_request, "batching": batching, "faults": faults, "pool": pool,
                              "stale": stale, "pool_routing": pool_routing, "placement": placement,
                              "pool_speed": pool_speed, "upgrade": upgrade}


def drawer_for(name: str) -> Drawer | None:
    """A result's drawer by its name; a variant run kept beside it (`pool-latency`) by the part before '-'."""
    return DRAWERS.get(name) or DRAWERS.get(name.split("-", 1)[0])


# -- files ---------------------------------------------------------------------------------------


def render(doc: Json, name: str) -> Figure | None:
    """The figure for one result document, or None when no drawer knows the benchmark."""
    draw = drawer_for(name)
    if draw is None:
        return None
    with mpl_style.context(["default", STYLE]):
        fig = Figure(figsize=SIZE_INCHES, dpi=DPI, layout="constrained")
        missing = draw(fig, doc)
        title = str(doc.get("title") or name)
        if missing:
            title += "\nNot in this result, so not drawn: " + "; ".join(missing)
        fig.suptitle(title)
        m = doc.get("machine") or {}
        # A supxlabel: the layout makes room for it (under any legend below the axes: legends go on axes, since a
        # figure legend "outside" would sit on it).
        fig.supxlabel(f"drawn from bench/results/{name}.json: commit {m.get('commit', '?')}, run {m.get('date', '?')}",
                      x=0.995, ha="right", fontsize=7, color="gray")
    return fig


def write_plot(json_path: Path) -> Path | None:
    """Draws `<name>.png` next to `<name>.json`; returns its path, or None for a benchmark without a picture."""
    doc = json.loads(json_path.read_text())
    fig = render(doc, json_path.stem)
    if fig is None:
        return None
    out = json_path.with_suffix(".png")
    tmp = out.with_suffix(".png.tmp")
    with mpl_style.context(["default", STYLE]):
        fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None})
    tmp.replace(out)
    return out


def write_all(results: Path = RESULTS) -> list[Path]:
    """Redraws the picture of every result in `results`."""
    return [p for j in sorted(results.glob("*.json")) if (p := write_plot(j)) is not None]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="*", type=Path, help="result files (default: every bench/results/*.json)")
    args = p.parse_args(argv)
    written = [w for j in args.json if (w := write_plot(j)) is not None] if args.json else write_all()
    for w in written:
        print(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
