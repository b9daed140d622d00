"""Placing pooled models on a pool's replicas (`plan.placement`, issue 29): best fit, distinct replicas per copy,
node spread, an ensemble with its steps, stickiness, and the figures of a shortfall; then properties over random
pools, models and histories (hypothesis): never over capacity, copies distinct, closures together, previous copies
kept when they still fit, and a shortfall only where no replica could take the copy."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triton_operator.api.pool import TritonPool
from triton_operator.api.v1alpha1 import API_VERSION, TritonModel
from triton_operator.plan.placement import (
    Demand,
    Placement,
    PoolReplica,
    format_bytes,
    place,
    place_demands,
    replica_status,
)

GI = 1 << 30


def replicas(*nodes: str | None) -> list[PoolReplica]:
    return [PoolReplica(f"r{i}", node) for i, node in enumerate(nodes)]


def one(name: str, gib: int, copies: int = 1) -> Demand:
    return Demand(name, copies, {name: gib * GI})


def test_best_fit_puts_a_copy_where_it_leaves_the_least_room() -> None:
    got = place_demands(10 * GI, replicas("n0", "n0"), [one("big", 7), one("small", 2)], {})
    assert got.copies["big"] == ("r0",)
    assert got.copies["small"] == ("r0",), "r0 has 3Gi left, r1 10Gi: the tighter fit"
    assert got.used == {"r0": 9 * GI, "r1": 0}


def test_copies_go_on_distinct_replicas_spread_across_nodes() -> None:
    got = place_demands(10 * GI, replicas("n0", "n0", "n1"), [one("m", 1, copies=2)], {})
    (first, second) = got.copies["m"]
    assert first != second
    assert {first, second} & {"r2"}, f"one copy on each node: {got.copies}"


def test_more_copies_than_replicas_is_a_shortfall_saying_so() -> None:
    got = place_demands(10 * GI, replicas("n0", "n1"), [one("m", 1, copies=3)], {})
    assert len(got.copies["m"]) == 2
    short = got.shortfalls["m"]
    assert (short.wanted, short.placed, short.replicas) == (3, 2, 2)
    assert "distinct replicas, and the pool has 2" in short.message


def test_a_model_larger_than_any_room_left_reports_the_figures() -> None:
    got = place_demands(4 * GI, replicas("n0", "n1"), [one("a", 3), one("b", 3), one("c", 2)], {})
    assert got.copies["c"] == ()
    short = got.shortfalls["c"]
    assert (short.needed, short.largest_free) == (2 * GI, 1 * GI)
    assert "a copy needs 2Gi, and the most any replica without one has free is 1Gi" in short.message


def test_an_ensemble_loads_its_steps_with_it_and_a_shared_step_counts_once() -> None:
    ens = Demand("ens", 1, {"ens": 0, "pre": 1 * GI, "net": 3 * GI})
    pre = Demand("pre", 1, {"pre": 1 * GI})
    got = place_demands(5 * GI, replicas("n0", "n1"), [ens, pre], {})
    (where,) = got.copies["ens"]
    assert {"ens", "pre", "net"} <= got.loaded[where]
    assert got.copies["pre"] == (where,), "the step's own copy joins the replica that loads it already: no new bytes"
    assert got.used[where] == 4 * GI


def test_a_placed_copy_stays_where_it_is() -> None:
    """Best fit alone would put m on r1 (the tighter fit); the recorded copy on r0 stays."""
    got = place_demands(10 * GI, replicas("n0", "n1"), [one("m", 2), one("other", 7)], {"m": ["r0"], "other": ["r1"]})
    assert got.copies == {"m": ("r0",), "other": ("r1",)}


def test_a_copy_on_a_replica_that_is_gone_is_placed_again_and_the_rest_stay() -> None:
    previous = {"m": ["r0", "gone"], "n": ["r1"]}
    got = place_demands(10 * GI, replicas("n0", "n1"), [one("m", 1, copies=2), one("n", 1)], previous)
    assert got.copies["m"] == ("r0", "r1") and got.copies["n"] == ("r1",)


def test_fewer_copies_drop_the_ones_placed_last() -> None:
    got = place_demands(10 * GI, replicas("n0", "n1", "n2"), [one("m", 1, copies=1)], {"m": ["r2", "r0", "r1"]})
    assert got.copies["m"] == ("r2",)


def test_a_recorded_copy_that_no_longer_fits_is_placed_again() -> None:
    """The pool's capacity went down under what r0 held (the webhook refuses it, but a forced change happens)."""
    got = place_demands(3 * GI, replicas("n0", "n1"), [one("a", 2), one("b", 2)], {"a": ["r0"], "b": ["r0"]})
    assert got.copies == {"a": ("r0",), "b": ("r1",)}


def test_bytes_are_shown_as_quantities() -> None:
    assert [format_bytes(n) for n in (0, 100, 1536 << 20, 2 * GI, 1 << 40)] == ["0", "100", "1536Mi", "2Gi", "1Ti"]


def _model(name: str, **spec: Any) -> TritonModel:
    return TritonModel.model_validate({
        "apiVersion": API_VERSION, "kind": "TritonModel", "metadata": {"name": name},
        "spec": {"backend": "python", "source": {"inline": {"model.py": "#"}}, **spec}})


def test_place_reads_the_pool_and_the_models() -> None:
    pool = TritonPool.model_validate({"apiVersion": API_VERSION, "kind": "TritonPool", "metadata": {"name": "p"},
                                      "spec": {"replicas": 2, "capacity": {"memoryPerReplica": "4Gi"}}})
    ensemble = TritonModel.model_validate({
        "apiVersion": API_VERSION, "kind": "TritonModel", "metadata": {"name": "ens"},
        "spec": {"platform": "ensemble", "pool": "p", "replicas": 2, "ensemble": {"steps": [
            {"model": "step", "inputMap": {"I": "I"}, "outputMap": {"O": "O"}}]}}})
    models = [ensemble, _model("step", pool="p", memory="1Gi", replicas=0), _model("mine", pool="p", memory="3Gi"),
              _model("elsewhere", pool="q", memory="1Gi"), _model("own")]
    got = place(pool, replicas("n0", "n1"), models, {})
    assert set(got.copies) == {"ens", "mine", "step"}
    assert len(got.copies["ens"]) == 2 and got.copies["step"] == ()
    assert sorted(got.used.values()) == [1 * GI, 4 * GI]
    status = replica_status(got, replicas("n0", "n1"))
    assert {s["used"] for s in status} == {"1Gi", "4Gi"} and all(s["node"] for s in status)


# ---------------------------------------------------------------- properties


@st.composite
def worlds(draw: st.DrawFn) -> tuple[int, list[PoolReplica], list[Demand]]:
    capacity = draw(st.integers(1, 16)) * GI
    nodes = draw(st.integers(1, 3))
    pool = [PoolReplica(f"r{i}", draw(st.sampled_from([f"n{j}" for j in range(nodes)] + [None])))
            for i in range(draw(st.integers(0, 6)))]
    sizes = {f"s{i}": draw(st.integers(0, 6)) * GI for i in range(draw(st.integers(0, 4)))}
    demands = []
    for i in range(draw(st.integers(0, 8))):
        name = f"m{i}"
        steps = draw(st.lists(st.sampled_from(sorted(sizes)), unique=True)) if sizes else []
        demands.append(Demand(name, draw(st.integers(0, 4)),
                              {name: draw(st.integers(0, 8)) * GI, **{s: sizes[s] for s in steps}}))
    demands.extend(Demand(s, draw(st.integers(0, 2)), {s: size}) for s, size in sizes.items())
    return capacity, pool, demands


def _check_invariants(got: Placement, pool: list[PoolReplica], demands: list[Demand]) -> None:
    names = {r.name for r in pool}
    size = {m: b for d in demands for m, b in d.closure.items()}
    for replica, used in got.used.items():
        assert used <= got.capacity, f"{replica} over capacity: {used} > {got.capacity}"
        assert used == sum(size[m] for m in got.loaded[replica]), f"{replica}: used is not what it loads"
    for d in demands:
        where = got.copies[d.name]
        assert len(set(where)) == len(where) <= d.copies, f"{d.name}: copies not distinct or too many: {where}"
        assert set(where) <= names
        for replica in where:
            assert set(d.closure) <= got.loaded[replica], f"{d.name}'s closure is not all on {replica}"
        if len(where) < d.copies:
            short = got.shortfalls[d.name]
            assert short.placed == len(where)
            for r in names - set(where):  # a shortfall is real: no replica without a copy had the room
                missing = sum(b for m, b in d.closure.items() if m not in got.loaded[r])
                assert got.used[r] + missing > got.capacity, f"{d.name} would fit on {r}: {got}"
        else:
            assert d.name not in got.shortfalls


_SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))


@_SETTINGS
@given(world=worlds())
def test_every_placement_holds_its_invariants_and_placing_again_changes_nothing(
        world: tuple[int, list[PoolReplica], list[Demand]]) -> None:
    capacity, pool, demands = world
    first = place_demands(capacity, pool, demands, {})
    _check_invariants(first, pool, demands)
    again = place_demands(capacity, pool, demands, {k: list(v) for k, v in first.copies.items()})
    assert again.copies == first.copies, "a placement read back from the statuses is kept as it is"


@_SETTINGS
@given(world=worlds(), lost=st.sets(st.integers(0, 5)), more=st.integers(0, 2), shrink=st.booleans(), data=st.data())
def test_copies_whose_replica_is_left_are_kept_after_replicas_go_and_come(
        world: tuple[int, list[PoolReplica], list[Demand]], lost: set[int], more: int, shrink: bool,
        data: st.DataObject) -> None:
    """Replicas die (a node is lost) and new ones come; copies change; the capacity may fall (what the webhook
    refuses, forced): the invariants hold, and with the capacity as it was every copy still wanted on a replica that
    is still there stays where it was."""
    capacity, pool, demands = world
    before = place_demands(capacity, pool, demands, {})
    left = [r for i, r in enumerate(pool) if i not in lost] + [PoolReplica(f"new{i}", "n9") for i in range(more)]
    changed = [Demand(d.name, data.draw(st.integers(max(0, d.copies - 1), d.copies + 1)), d.closure) for d in demands]
    after_capacity = max(GI, capacity // 2) if shrink else capacity
    after = place_demands(after_capacity, left, changed, {k: list(v) for k, v in before.copies.items()})
    _check_invariants(after, left, changed)
    if shrink:
        return
    names = {r.name for r in left}
    for d in changed:
        kept = [r for r in before.copies[d.name] if r in names][:d.copies]
        assert after.copies[d.name][:len(kept)] == tuple(kept), f"{d.name} moved: {before.copies[d.name]} -> " \
            f"{after.copies[d.name]} (replicas left: {sorted(names)})"
