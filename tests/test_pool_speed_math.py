"""bench/pool_speed_math.py: a real tritonserver 2.51's log read into load intervals by Triton's own timestamps, and
the arithmetic of the operator's share (benchmark `pool_speed`, issue 41 item 6).

The fixtures are real logs (tests/data/tritonserver-2.51/): `local-load-unload.log`, a local tritonserver (the
nvidia-pytriton wheel's) loading and unloading one Python model over HTTP, as written to its stdout; `pod-kubelet.log`,
a pool replica's tritonserver container in a bench run, as the kubelet keeps it (CRI format).
"""

from __future__ import annotations

import calendar
import logging
from pathlib import Path

import pytest

from bench import pool_speed_math as psm
from bench import pool_trace

DATA = Path(__file__).parent / "data" / "tritonserver-2.51"


def _at(text: str) -> float:
    """Epoch seconds of `YYYY-MM-DD HH:MM:SS.ffffff` (UTC)."""
    day, clock = text.split()
    hms, frac = clock.split(".")
    return calendar.timegm((*map(int, day.split("-")), *map(int, hms.split(":")), 0, 0, 0)) + int(frac) / 1e6


def test_a_local_tritonservers_log_gives_the_load_by_its_own_timestamps() -> None:
    tl = psm.parse((DATA / "local-load-unload.log").read_text(), year=2026)
    assert list(tl.loads) == ["m1"]
    [load] = tl.loads["m1"]
    assert load.start == pytest.approx(_at("2026-11-29 16:00:26.223018"), abs=1e-6)
    assert load.end == pytest.approx(_at("2026-11-29 16:00:28.242378"), abs=1e-6)
    assert load.seconds == pytest.approx(2.01936, abs=1e-6)
    assert tl.first == pytest.approx(_at("2026-11-29 16:00:26.075005"), abs=1e-6)
    assert tl.http == pytest.approx(_at("2026-11-29 16:00:26.077195"), abs=1e-6)
    assert not tl.failed
    # The tables and "Signal (15) received." are no lines of Triton's; the rest are, the unload's included.
    assert any(ln.message == "\"successfully unloaded 'm1' version 1\"" for ln in tl.lines)
    assert all(ln.cri is None for ln in tl.lines)


def test_a_pool_replicas_kubelet_log_gives_each_load_and_the_kubelets_times() -> None:
    raw = (DATA / "pod-kubelet.log").read_text()
    tl = psm.parse(raw)
    assert tl.lines and all(ln.cri is not None for ln in tl.lines)
    loading = raw.count('"loading: ')
    assert sum(len(v) for v in tl.loads.values()) + sum(len(v) for v in tl.failed.values()) == loading
    for ivs in tl.loads.values():
        for iv in ivs:
            assert 0 < iv.seconds < 60, iv
    # Triton's clock is the kubelet's, in UTC: each line reached the kubelet a moment after Triton stamped it.
    skew = tl.skew()
    assert skew is not None and 0 <= skew < 1.0, skew
    assert tl.first is not None and tl.http is not None and tl.first <= tl.http


def test_a_line_split_by_the_kubelet_is_joined_and_others_are_skipped() -> None:
    raw = ('2026-11-29T16:10:00.000000100Z stdout P I1129 16:10:00.000001 1 model_lifecycle.cc:472] "loading: '
           'long-name\n'
           '2026-11-29T16:10:00.000000200Z stdout F -model:1"\n'
           '2026-11-29T16:10:01.500000000Z stdout F some stub output\n'
           '2026-11-29T16:10:02.000000000Z stderr F I1129 16:10:01.900000 1 model_lifecycle.cc:839] '
           '"successfully loaded \'long-name-model\'"\n')
    tl = psm.parse(raw)
    [load] = tl.loads["long-name-model"]
    assert load.seconds == pytest.approx(1.899999, abs=1e-6)
    assert [ln.cri for ln in tl.lines] == [pytest.approx(_at("2026-11-29 16:10:00.000000")),
                                          pytest.approx(_at("2026-11-29 16:10:02.000000"))]


def test_a_failed_load_ends_its_interval_and_is_no_load() -> None:
    raw = ('I1129 16:10:00.000000 1 model_lifecycle.cc:472] "loading: bad:1"\n'
           'E1129 16:10:03.000000 1 model_lifecycle.cc:642] "failed to load \'bad\' version 1: Internal: boom"\n'
           'I1129 16:10:04.000000 1 model_lifecycle.cc:472] "loading: bad:1"\n'
           'I1129 16:10:05.500000 1 model_lifecycle.cc:839] "successfully loaded \'bad\'"\n')
    tl = psm.parse(raw, year=2026)
    assert [iv.seconds for iv in tl.failed["bad"]] == [pytest.approx(3.0)]
    assert [iv.seconds for iv in tl.loads["bad"]] == [pytest.approx(1.5)]
    assert tl.loads_of(["bad"], since=tl.loads["bad"][0].start + 1) == {"bad": []}


def test_union_and_gaps_of_intervals() -> None:
    ivs = [psm.Interval(5, 7), psm.Interval(0, 2), psm.Interval(1, 3), psm.Interval(10, 11)]
    assert psm.merged(ivs) == [psm.Interval(0, 3), psm.Interval(5, 7), psm.Interval(10, 11)]
    assert psm.union_seconds(ivs) == 6
    assert psm.union_seconds(ivs, 2, 10.5) == pytest.approx(3.5)
    assert psm.gaps(ivs, -1, 12) == [psm.Interval(-1, 0), psm.Interval(3, 5), psm.Interval(7, 10),
                                     psm.Interval(11, 12)]
    assert psm.gaps([], 1, 2) == [psm.Interval(1, 2)]


def test_a_new_models_share_is_what_is_not_triton_split_at_its_load() -> None:
    share = psm.new_model_share(100.0, psm.Interval(100.25, 101.75), 101.9)
    assert share == {"total_s": 1.9, "triton_s": 1.5, "before_s": 0.25, "after_s": 0.15, "operator_s": 0.4}


def test_a_kills_share_takes_out_restart_start_up_and_loads_once_each() -> None:
    # Killed at 0, Triton's first line at 1, pod Ready at 3; a load at 2.5-4 overlaps the start-up, then 4.5-6 and
    # 6-8 (back to back), every model serving at 8.5.
    loads = [psm.Interval(2.5, 4), psm.Interval(4.5, 6), psm.Interval(6, 8)]
    share = psm.kill_share(0.0, 3.0, loads, 8.5, triton_first=1.0)
    assert share["total_s"] == 8.5
    assert share["restart_s"] == 1.0 and share["triton_startup_s"] == 2.0
    assert share["triton_loads_s"] == 5.0 and share["triton_loads_sum_s"] == 5.0
    # Not the operator's: 0-4 and 4.5-8: 7.5 s; its share is the gap 4-4.5 and the tail 8-8.5.
    assert share["operator_s"] == 1.0
    assert share["operator_fraction"] == pytest.approx(1 / 8.5, abs=1e-4)
    assert share["pod_ready_to_first_load_s"] == -0.5
    assert share["between_loads_s"] == 0.5 and share["last_load_to_serving_s"] == 0.5


def test_a_replicas_time_is_its_loads_against_the_gaps() -> None:
    out = psm.replica_share([psm.Interval(1, 3), psm.Interval(2, 4), psm.Interval(7, 9)], 0.0, 10.0, top=2)
    assert out["window_s"] == 10 and out["triton_loading_s"] == 5 and out["operator_s"] == 5
    assert out["operator_fraction"] == 0.5 and out["gaps"] == 3
    assert out["longest_gaps"] == [{"at_s": 4.0, "seconds": 3.0}, {"at_s": 0.0, "seconds": 1.0}]


def test_the_traces_lines_are_read_back_and_added_up_by_phase(caplog: pytest.LogCaptureFixture) -> None:
    """bench/pool_trace.py writes what bench/pool_speed_math.py reads: the same line, both ways."""
    with caplog.at_level(logging.INFO, logger=pool_trace.log.name):
        pool_trace._emit(("ns", "warm", 7), "publish", 100.0, 0.25)
        pool_trace._emit(("ns", "warm", 7), "load", 100.25, 1.5)
        pool_trace._emit(("ns", "other", 8), "publish", 100.0, 9.0)
        pool_trace._emit(None, "served", 101.75, 0.5)
    found = psm.spans("\n".join(f"2026-11-29 16:10:00,000 INFO {r.name}: {r.getMessage()}" for r in caplog.records))
    assert [(s.pool, s.round, s.phase, s.start, s.seconds) for s in found] == [
        ("warm", 7, "publish", 100.0, 0.25), ("warm", 7, "load", 100.25, 1.5), ("other", 8, "publish", 100.0, 9.0),
        ("-", 0, "served", 101.75, 0.5)]
    assert psm.phase_seconds(found, 100.1, 101.0, "warm") == {"load": 0.75, "publish": 0.15}
    assert psm.totals([{"a": 1.0}, {"a": 0.5, "b": 2.0}]) == {"b": 2.0, "a": 1.5}


def test_services_applied_after_a_models_delete_are_found_by_the_operators_own_time() -> None:
    lines = ["2026-11-29 16:39:14,739 INFO triton_operator.pool: Applied Service namespace=ns name=gone",
             "2026-11-29 16:39:20,100 INFO triton_operator.pool: Applied EndpointSlice namespace=ns name=gone-ipv4",
             "2026-11-29 16:39:20,250 INFO triton_operator.pool: Applied Service namespace=ns name=gone",
             "2026-11-29 16:39:21,000 INFO triton_operator.pool: Applied Service namespace=ns name=kept"]
    assert psm.operator_time(lines[0]) == pytest.approx(_at("2026-11-29 16:39:14.739000"))
    deleted = {"gone": _at("2026-11-29 16:39:20.000000")}
    assert psm.services_applied_after(lines, deleted) == [lines[2]]
    assert psm.services_applied_after(lines, {"gone": _at("2026-11-29 16:39:21.000000")}) == []


def test_a_new_models_breakdown_follows_the_round_that_loaded_it_and_not_a_later_ones_queue() -> None:
    def span(rnd: int, phase: str, start: float, seconds: float) -> psm.Span:
        return psm.Span("ns", "warm", rnd, phase, start, seconds)

    found = [span(5, "queued", 100.02, 0.0), span(5, "members", 100.03, 0.01), span(5, "observe", 100.05, 0.1),
             span(5, "apply.Service", 100.16, 0.02), span(5, "publish", 100.15, 0.05),
             span(6, "queued", 100.2, 2.0),  # a later round's request, waiting while this one loads
             span(5, "load", 100.21, 1.5), span(5, "served", 101.71, 0.01), span(5, "listed", 101.72, 0.03),
             span(5, "round", 100.02, 2.0)]
    out = psm.round_breakdown(found, 100.0, 100.22, 101.7, 101.76, "warm")
    assert out is not None
    assert out["create_to_request_s"] == 0.02 and out["request_to_round_s"] == 0.0
    assert out["members_s"] == 0.01 and out["observe_s"] == 0.1 and out["publish_s"] == 0.05
    assert out["publish.apply.Service_s"] == 0.02
    assert out["rest_of_round_s"] == 0.03  # 0.19 s from the round's start to the load, 0.16 s of it in phases
    assert out["request_to_triton_s"] == 0.01 and out["triton_to_answer_s"] == 0.01
    assert out["served_s"] == 0.01 and out["listed_s"] == 0.03 and out["listed_to_seen_s"] == 0.01
    assert psm.round_breakdown(found, 100.0, 100.2, 101.7, 101.76, "other") is None
